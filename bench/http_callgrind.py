#!/usr/bin/env python3
"""Instructions per HTTP request, counted by callgrind: the broker (one worker, a memory topic)
serves N1 and then N2 sequential requests over one keep-alive connection, and the difference
divided by N2 - N1 cancels start-up and shutdown. Prints the count over all threads and over the
busiest one (the worker), which varies less between runs.

Usage: bench/http_callgrind.py <ferrymq binary> json|raw|ping [N1 N2]   (default 2000 6000)"""
import http.client, os, re, signal, socket, subprocess, sys, tempfile, time, json
binary, kind = sys.argv[1], sys.argv[2]  # kind: json | raw | ping
n1, n2 = int(sys.argv[3]) if len(sys.argv) > 3 else 2000, int(sys.argv[4]) if len(sys.argv) > 4 else 6000
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def run(n):
    d = tempfile.mkdtemp(prefix="s4cg-")
    hp, tp = free_port(), free_port()
    out = os.path.join(d, "cg.out")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}", binary, "serve",
        "--data-dir", d + "/data", "--http-addr", f"127.0.0.1:{hp}", "--tcp-addr", f"127.0.0.1:{tp}",
        "--worker-threads", "1", "--log", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", hp, timeout=60); c.request("GET", "/ping"); c.getresponse().read(); break
        except OSError:
            if time.time() > deadline: p.kill(); raise
            time.sleep(0.5)
    c.request("POST", "/topics", json.dumps({"name": "bench-mem", "storage": "memory", "max_messages": 100000000, "max_bytes": 17179869184}), {"content-type": "application/json"})
    r = c.getresponse(); r.read(); assert r.status in (200, 201), r.status
    body_json = '{"body":"' + "x" * 89 + '"}'
    for _ in range(n):
        if kind == "json":
            c.request("POST", "/topics/bench-mem/messages", body_json, {"content-type": "application/json"})
        elif kind == "raw":
            c.request("POST", "/topics/bench-mem/messages", "x" * 100, {"content-type": "application/octet-stream"})
        else:
            c.request("GET", "/ping")
        r = c.getresponse(); r.read(); assert r.status in (201, 204), r.status
    c.close()
    p.send_signal(signal.SIGTERM); p.wait(timeout=120)
    totals = []
    for f in os.listdir(d):
        if f.startswith("cg.out-"):
            text = open(os.path.join(d, f)).read()
            m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
            totals.append(int(m.group(1)))
    subprocess.run(["rm", "-rf", d])
    return sum(totals), max(totals)
(a, wa), (b, wb) = run(n1), run(n2)
print(f"{kind}: all threads {(b - a) / (n2 - n1):.0f} Ir per request; busiest thread {(wb - wa) / (n2 - n1):.0f}")
