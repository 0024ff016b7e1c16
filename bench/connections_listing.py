#!/usr/bin/env python3
"""Time `GET /connections` with N client connections open (default 10 000).

Starts `ferrymq serve` (target/release/ferrymq, or $FERRYMQ_BIN) on free loopback ports with room
for the connections, opens N binary protocol connections that each say HELLO with a client name,
then walks every page of `GET /connections?limit=1000` several times and prints the time of each
page and of the whole walk. Stops what it started.

    python3 bench/connections_listing.py [connections] [runs]
"""

import os
import re
import resource
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 1000


def hello(name: str) -> bytes:
    def str16(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<H", len(b)) + b

    payload = struct.pack("<HHI", 3, 3, 60_000) + str16(name) + str16("") + str16("")
    return struct.pack("<IHHI", len(payload), 0x01, 0, 1) + payload


def start(binary: str, data: str, connections: int):
    log = open(os.path.join(data, "serve.log"), "w+")
    child = subprocess.Popen(
        [binary, "serve", "--data-dir", data, "--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--max-connections", str(connections + 100)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    tcp = http = None
    for _ in range(400):  # at most 20 s
        text = open(log.name).read()
        tcp = tcp or (re.search(r"tcp=(\S+)", text) or [None, None])[1]
        http = http or (re.search(r"http=(\S+)", text) or [None, None])[1]
        if tcp and http:
            return child, tcp, http
        time.sleep(0.05)
    child.kill()
    sys.exit(f"the broker did not start:\n{open(log.name).read()}")


def open_connections(tcp: str, count: int):
    host, port = tcp.rsplit(":", 1)
    sockets = []
    selector = selectors.DefaultSelector()
    for i in range(count):
        s = socket.create_connection((host, int(port)))
        s.sendall(hello(f"bench/{i}"))
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        sockets.append(s)
    # Read each HELLO_OK, so every connection is past its handshake before the timing.
    answered = 0
    deadline = time.time() + 60
    while answered < count and time.time() < deadline:
        for key, _ in selector.select(timeout=1):
            if key.fileobj.recv(4096):
                selector.unregister(key.fileobj)
                answered += 1
    return sockets, answered


def get(http: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=30) as response:
        return response.read()


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    binary = os.environ.get("FERRYMQ_BIN", os.path.join(ROOT, "target", "release", "ferrymq"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1000), hard))
    data = tempfile.mkdtemp(prefix="ferrymq-bench-connections-")
    child, tcp, http = start(binary, data, count)
    try:
        sockets, answered = open_connections(tcp, count)
        import json
        total = json.loads(get(http, "/connections?limit=1"))["total"]
        print(f"{answered} of {count} connections past HELLO; the broker lists {total}")
        get(http, f"/connections?limit={PAGE}")  # warm up
        for run in range(runs):
            pages = []
            after = 0
            walk_started = time.perf_counter()
            for _ in range(count // PAGE + 2):
                started = time.perf_counter()
                body = json.loads(get(http, f"/connections?limit={PAGE}&after={after}"))
                pages.append((time.perf_counter() - started) * 1000)
                if body["next_after"] is None:
                    break
                after = body["next_after"]
            walk = (time.perf_counter() - walk_started) * 1000
            print(f"run {run + 1}: {len(pages)} pages of {PAGE}: page p50 {sorted(pages)[len(pages) // 2]:.1f} ms, "
                  f"max {max(pages):.1f} ms; all {total} in {walk:.1f} ms")
        for s in sockets:
            s.close()
    finally:
        child.terminate()
        child.wait(timeout=10)
        subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()
