#!/usr/bin/env python3
"""Throughput of the Python client against a FerryMQ broker on the same machine.

    python bench.py                      # starts $FERRYMQ_BIN (or target/release/ferrymq) itself
    python bench.py --addr 127.0.0.1:7070 --messages 2000000
    python bench.py --nats-server /usr/sbin/nats-server   # also nats-py + JetStream, same run
    python bench.py --storage disk       # disk topics, synced every second
    python bench.py --cluster --storage disk   # a single node, then three nodes, same run

Runs, with 100-byte bodies on a topic of one partition (memory, or disk with --storage disk):

- publish: batches of 1 000 with receipts, several batches in flight (the publish window);
- consume: messages published beforehand, consumed with acks (credit window, ack ranges);
- single: one message at a time, each receipt awaited before the next publish.

With --cluster the runs go to a single node, then to a cluster of three nodes started on
loopback (topics of 3 replicas), and the cluster's rate is printed as a share of the single
node's. Every run is bounded by its message count and by --seconds. Prints one line per run and, with
--json, the numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "src"))

import ferrymq  # noqa: E402

BODY = b"x" * 100


def start_broker() -> tuple[subprocess.Popen, str, Path]:
    binary = os.environ.get("FERRYMQ_BIN") or str(HERE.parents[1] / "target" / "release" / "ferrymq")
    data = Path(tempfile.mkdtemp(prefix="ferrymq-bench-"))
    log = open(data / "broker.log", "wb")
    proc = subprocess.Popen(
        [binary, "serve", "--data-dir", str(data / "d"), "--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--log", "warn,ferrymq=info", "--topic-max-messages", "50000000", "--topic-max-bytes", "8000000000"],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"tcp=(\S+)", (data / "broker.log").read_text(errors="replace"))
        if m:
            return proc, m.group(1), data
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("the broker did not start")


STORAGE = {"storage": "memory"}


def start_cluster(size: int = 3) -> tuple[list[subprocess.Popen], str, Path]:
    """``size`` nodes of one cluster on loopback; returns them, their client addresses joined
    by commas, and their directory."""
    import socket

    binary = os.environ.get("FERRYMQ_BIN") or str(HERE.parents[1] / "target" / "release" / "ferrymq")
    data = Path(tempfile.mkdtemp(prefix="ferrymq-bench-cluster-"))
    ports = []
    base = 20000 + (os.getpid() * 131 + 5000) % 10000
    for port in range(base, base + 2000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == 2 * size:
            break
    tcp = [f"127.0.0.1:{p}" for p in ports[:size]]
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports[size:]))
    procs = []
    for i in range(size):
        log = open(data / f"node{i + 1}.log", "wb")
        procs.append(subprocess.Popen(
            [binary, "serve", "--data-dir", str(data / f"node{i + 1}"), "--tcp-addr", tcp[i], "--http-addr", "127.0.0.1:0",
             "--log", "warn,ferrymq=info", "--topic-max-messages", "50000000", "--topic-max-bytes", "8000000000",
             "--node-id", str(i + 1), "--cluster-addr", f"127.0.0.1:{ports[size + i]}", "--peers", peers],
            stdout=subprocess.DEVNULL, stderr=log,
        ))  # fmt: skip

    async def ready() -> bool:
        try:
            async with ferrymq.Client(tcp, connect_timeout=2) as c:
                return (await c.cluster_info()).metadata_leader != 0
        except ferrymq.FerryMQError:
            return False

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if asyncio.run(ready()):
            return procs, ",".join(tcp), data
        time.sleep(0.1)
    for p in procs:
        p.kill()
    raise RuntimeError("the cluster did not start")


def start_nats(binary: str, data: Path) -> tuple[subprocess.Popen, str]:
    """nats-server with JetStream on file storage in ``data``, on a free loopback port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "-js", "-sd", str(data / "nats"), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nats-server did not start")


async def bench_publish(addr: str, n: int, batch: int, seconds: float) -> dict[str, Any]:
    async with ferrymq.Client(addr, publish_window=64 * batch) as client:
        await client.create_topic("bench.publish", partitions=1, if_not_exists=True, **STORAGE)
        bodies = [BODY] * batch
        sent = 0
        futures = []
        t0 = time.perf_counter()
        end = t0 + seconds
        while sent < n and time.perf_counter() < end:
            futures.append(await client.start_publish_batch("bench.publish", bodies))
            sent += batch
            if len(futures) >= 256:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        dt = time.perf_counter() - t0
    return {"run": "publish", "messages": sent, "seconds": dt, "rate": sent / dt}


async def bench_consume(addr: str, n: int, seconds: float) -> dict[str, Any]:
    async with ferrymq.Client(addr) as client:
        await client.create_topic("bench.consume", partitions=1, if_not_exists=True, **STORAGE)
        futures = [await client.start_publish_batch("bench.consume", [BODY] * 1000) for _ in range(n // 1000)]
        await asyncio.gather(*futures)
        sub = await client.subscribe("bench.consume", "bench", start="earliest", credit=20_000)
        got = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while got < n and time.perf_counter() < end:
            msgs = await sub.next_batch(10_000, timeout=5)
            if not msgs:
                break
            sub.ack_all(msgs)
            got += len(msgs)
        dt = time.perf_counter() - t0
        await asyncio.sleep(0.1)
        [stats] = await client.stats("bench.consume")
        acked = stats.subscriptions[0].acked
    return {"run": "consume", "messages": got, "seconds": dt, "rate": got / dt, "acked_by_broker": acked}


async def bench_single(addr: str, n: int, seconds: float) -> dict[str, Any]:
    async with ferrymq.Client(addr) as client:
        await client.create_topic("bench.single", partitions=1, if_not_exists=True, **STORAGE)
        sent = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while sent < n and time.perf_counter() < end:
            await client.publish("bench.single", BODY)
            sent += 1
        dt = time.perf_counter() - t0
    return {"run": "single", "messages": sent, "seconds": dt, "rate": sent / dt}


async def nats_runs(url: str, n: int, single_n: int, seconds: float) -> list[dict[str, Any]]:
    """nats-py against NATS JetStream (file storage): publish with acks, pull-consume with acks."""
    import nats  # type: ignore[import-not-found]
    from nats.js.api import StorageType  # type: ignore[import-not-found]

    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.delete_stream("BENCH")
    except Exception:
        pass
    await js.add_stream(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE)
    out = []
    # Publish with acks, many in flight (the same shape as the FerryMQ publish run).
    sent = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while sent < n and time.perf_counter() < end:
        futs = [await js.publish_async("bench.p", BODY) for _ in range(1000)]
        await asyncio.gather(*futs)
        sent += 1000
    dt = time.perf_counter() - t0
    out.append({"run": "nats publish", "messages": sent, "seconds": dt, "rate": sent / dt})
    sent = min(sent, n)
    # Pull-consume with acks.
    psub = await js.pull_subscribe("bench.p", "bench-consumer")
    got = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while got < sent and time.perf_counter() < end:
        msgs = await psub.fetch(1000, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    dt = time.perf_counter() - t0
    out.append({"run": "nats consume", "messages": got, "seconds": dt, "rate": got / dt})
    sent = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while sent < single_n and time.perf_counter() < end:
        await js.publish("bench.s", BODY)
        sent += 1
    dt = time.perf_counter() - t0
    out.append({"run": "nats single", "messages": sent, "seconds": dt, "rate": sent / dt})
    await js.delete_stream("BENCH")
    await nc.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", help="a running broker; default: start one")
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--consume-messages", type=int, default=1_000_000)
    ap.add_argument("--single-messages", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=20.0, help="bound on each run")
    ap.add_argument("--runs", default="publish,consume,single")
    ap.add_argument("--nats", help="also run nats-py against this NATS JetStream server URL")
    ap.add_argument("--nats-server", help="also run nats-py against a nats-server started from this binary")
    ap.add_argument("--storage", choices=["memory", "disk"], default="memory")
    ap.add_argument("--cluster", action="store_true", help="also run against a cluster of three nodes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.storage == "disk":
        STORAGE.clear()
        STORAGE.update(storage="disk", fsync="interval", fsync_interval_ms=1000)
    proc: Optional[subprocess.Popen] = None
    nats_proc: Optional[subprocess.Popen] = None
    data: Optional[Path] = None
    addr = args.addr
    nats_url = args.nats
    nats_dir: Optional[Path] = None
    if addr is None:
        proc, addr, data = start_broker()
    results = []
    try:
        runs = args.runs.split(",")
        if "publish" in runs:
            results.append(asyncio.run(bench_publish(addr, args.messages, 1000, args.seconds)))
        if "consume" in runs:
            results.append(asyncio.run(bench_consume(addr, args.consume_messages, args.seconds)))
        if "single" in runs:
            results.append(asyncio.run(bench_single(addr, args.single_messages, args.seconds)))
        if args.cluster:
            if proc is not None:  # one machine: the single node stops before the cluster starts
                proc.terminate()
                proc.wait(10)
                proc = None
            procs, seeds, cluster_dir = start_cluster()
            try:
                alone = {r["run"]: r["rate"] for r in results}
                for run, go in (("publish", lambda: bench_publish(seeds, args.messages, 1000, args.seconds)),
                                ("consume", lambda: bench_consume(seeds, args.consume_messages, args.seconds)),
                                ("single", lambda: bench_single(seeds, args.single_messages, args.seconds))):
                    if run in runs:
                        r = asyncio.run(go())
                        r["run"] = f"cluster {run}"
                        if alone.get(run):
                            r["of_single_node"] = r["rate"] / alone[run]
                        results.append(r)
            finally:
                for p in procs:
                    p.terminate()
                    p.wait(10)
                shutil.rmtree(cluster_dir, ignore_errors=True)
        if args.nats_server:
            nats_dir = Path(tempfile.mkdtemp(prefix="nats-bench-"))
            nats_proc, nats_url = start_nats(args.nats_server, nats_dir)
        if nats_url:
            results += asyncio.run(nats_runs(nats_url, args.consume_messages, args.single_messages, args.seconds))
    finally:
        for p in (proc, nats_proc):
            if p is not None:
                p.terminate()
                p.wait(10)
        for d in (data, nats_dir):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
    print(f"# python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}, FerryMQ {args.storage}")
    for r in results:
        share = f" ({r['of_single_node']:.0%} of a single node)" if "of_single_node" in r else ""
        print(f"{r['run']:>15}: {r['messages']:>9} messages in {r['seconds']:6.2f} s = {r['rate']:>10,.0f} msg/s{share}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
