#!/usr/bin/env python3
"""Start-up time of a broker holding many disk topics.

    bench/many_topics.py [--bin target/release/ferrymq] [--topics 10000] [--messages 3]

Fills a fresh data dir with `--topics` disk topics of `--messages` messages each (over HTTP,
one keep-alive connection, `--fsync never` while filling), stops the broker with SIGTERM, then
starts it again twice: after the clean stop, and after a SIGKILL of a running broker (whose
logs then need their syncs at start). Each start prints the time from spawn until the HTTP
listener answers (`/livez`) and until `/readyz` answers 200, and the run checks that every topic
still holds its messages. Bounded: every wait has a deadline; the data dir is removed at the end.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time


def start(binary, data_dir, extra=()):
    proc = subprocess.Popen(
        [binary, "serve", "--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--data-dir", data_dir, "--log", "warn,ferrymq=info", *extra],
        stderr=subprocess.PIPE, text=True)
    return proc


def http_addr(proc, deadline_s=120):
    """Reads the log until the HTTP listener's address is printed."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("the broker exited: " + str(proc.wait()))
        found = re.search(r"http=([0-9.]+):([0-9]+)", line)
        if found:
            # The rest of the log is read and dropped, so that a full pipe never stalls the broker.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return found.group(1), int(found.group(2))
    raise SystemExit("no HTTP address within the deadline")


def get(conn, path):
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def wait_ready(host, port, started, deadline_s=300):
    live_s = None
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            status, _ = get(conn, "/livez")
            if live_s is None and status == 200:
                live_s = time.monotonic() - started
            status, _ = get(conn, "/readyz")
            conn.close()
            if status == 200:
                return live_s, time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit("not ready within the deadline")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/ferrymq")
    parser.add_argument("--topics", type=int, default=10000)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="fill DIR (new) and keep it, for profiling")
    args = parser.parse_args()
    if args.keep:
        os.makedirs(args.keep)
        data_dir = args.keep
    else:
        data_dir = tempfile.mkdtemp(prefix="ferrymq-many-topics-")
    try:
        proc = start(args.bin, data_dir, ["--fsync", "never"])
        host, port = http_addr(proc)
        conn = http.client.HTTPConnection(host, port, timeout=30)
        began = time.monotonic()
        for i in range(args.topics):
            body = json.dumps({"name": f"t{i}", "storage": "disk"})
            conn.request("POST", "/topics", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 201, response.status
            batch = json.dumps({"messages": [{"body": f"m{j}"} for j in range(args.messages)]})
            conn.request("POST", f"/topics/t{i}/messages", batch, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 201, response.status
        print(f"filled {args.topics} topics x {args.messages} messages in {time.monotonic() - began:.1f} s")
        conn.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)

        for label in ("after a clean stop", "after SIGKILL"):
            started = time.monotonic()
            proc = start(args.bin, data_dir)
            host, port = http_addr(proc)
            live_s, ready_s = wait_ready(host, port, started)
            conn = http.client.HTTPConnection(host, port, timeout=30)
            status, body = get(conn, "/topics")
            assert status == 200
            topics = json.loads(body)["topics"]
            assert len(topics) == args.topics, len(topics)
            short = [t["name"] for t in topics if t["messages"] != args.messages]
            assert not short, f"topics without their messages: {short[:5]}"
            conn.close()
            print(f"start {label}: HTTP answers after {live_s:.2f} s, ready after {ready_s:.2f} s; "
                  f"{len(topics)} topics, each with its {args.messages} messages")
            if label == "after a clean stop":
                proc.send_signal(signal.SIGKILL)
            else:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
