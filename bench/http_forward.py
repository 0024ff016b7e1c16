#!/usr/bin/env python3
"""What passing an HTTP publish on costs in a cluster: the same publishes sent to a partition's
leader and to a follower (which passes each on to the leader over the peers' connection).

Starts three nodes of FERRYMQ_BIN (default target/release/ferrymq) on free loopback ports, creates
the replicated topic `fwd` (1 partition, 3 replicas), then per round publishes COUNT 100-byte JSON
messages to partition 0 through the leader and through a follower, each over CONNECTIONS
keep-alive connections (one thread each), alternating which goes first. Prints each round's
rates and the median of each round's follower / leader ratio. Stops only the nodes it started.

    bench/http_forward.py [rounds] [count] [connections]
    FERRYMQ_BIN=target/debug/ferrymq bench/http_forward.py 5 2000 1
"""
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"content-type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), data


def start(binary, work):
    nodes = [
        {"id": i, "tcp": free_port(), "cluster": free_port(), "http": free_port()}
        for i in (1, 2, 3)
    ]
    peers = ",".join(f"{n['id']}=127.0.0.1:{n['cluster']}" for n in nodes)
    for n in nodes:
        data = os.path.join(work, f"node{n['id']}")
        args = [
            binary, "serve", "--data-dir", data,
            "--tcp-addr", f"127.0.0.1:{n['tcp']}",
            "--http-addr", f"127.0.0.1:{n['http']}",
            "--node-id", str(n["id"]),
            "--cluster-addr", f"127.0.0.1:{n['cluster']}",
            "--peers", peers, "--log", "warn",
        ]
        log = open(os.path.join(work, f"node{n['id']}.log"), "w")
        n["process"] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    return nodes


def until(what, check, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.1)
    sys.exit(f"gave up waiting for {what}")


def created(port):
    body = json.dumps({"name": "fwd", "partitions": 1, "replicas": 3})
    status, _, reply = request(port, "POST", "/topics", body)
    return status in (201, 409) or None


def leader_of(port):
    status, _, reply = request(port, "GET", "/cluster")
    if status != 200:
        return None
    for p in json.loads(reply)["partitions"]:
        if p["topic"] == "fwd" and p["leader"]:
            return p["leader"]
    return None


def publish_all(port, count, connections):
    """Publishes `count` messages through `port`; messages per second."""
    body = json.dumps({"body": "x" * 88})
    per = count // connections
    errors = []

    def one():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"content-type": "application/json"}
        for _ in range(per):
            conn.request("POST", "/topics/fwd/messages?partition=0", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 201:
                errors.append(response.status)
                return
        conn.close()

    threads = [threading.Thread(target=one) for _ in range(connections)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - began
    if errors:
        sys.exit(f"publishes through port {port} failed: {errors[:5]}")
    return per * connections / took


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    connections = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    binary = os.environ.get("FERRYMQ_BIN", "target/release/ferrymq")
    work = tempfile.mkdtemp(prefix="ferrymq-http-forward-")
    nodes = start(binary, work)
    try:
        until("the topic", lambda: created(nodes[0]["http"]))
        leader = until("a leader", lambda: leader_of(nodes[0]["http"]))
        at_leader = next(n for n in nodes if n["id"] == leader)
        follower = next(n for n in nodes if n["id"] != leader)
        # Warm-up, and a check that the follower passes the publish on.
        _, headers, _ = request(follower["http"], "POST", "/topics/fwd/messages?partition=0",
                                json.dumps({"body": "warm-up"}))
        served = {k.lower(): v for k, v in headers.items()}.get("ferrymq-node")
        print(f"leader node {leader}, follower node {follower['id']} (served by {served})")
        publish_all(at_leader["http"], min(count, 500), connections)
        publish_all(follower["http"], min(count, 500), connections)
        ratios, leads, follows = [], [], []
        for r in range(rounds):
            order = [("leader", at_leader), ("follower", follower)]
            if r % 2:
                order.reverse()
            rates = {name: publish_all(node["http"], count, connections) for name, node in order}
            leads.append(rates["leader"])
            follows.append(rates["follower"])
            ratios.append(rates["follower"] / rates["leader"])
            print(f"round {r + 1}: leader {rates['leader']:.0f}/s, follower "
                  f"{rates['follower']:.0f}/s, ratio {ratios[-1]:.3f}")
        print(f"medians: leader {statistics.median(leads):.0f}/s, follower "
              f"{statistics.median(follows):.0f}/s, ratio of rounds "
              f"{statistics.median(ratios):.3f} ({count} publishes x {connections} "
              f"connection(s) per run, {rounds} rounds)")
    finally:
        for n in nodes:
            n["process"].send_signal(signal.SIGTERM)
        for n in nodes:
            try:
                n["process"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                n["process"].kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
