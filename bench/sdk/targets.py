"""The SDK targets of issue 38, measured against a release broker on this machine:

- shutdown under load: 2 workers with 1 000 messages in flight between them (concurrency 125
  and prefetch 500 each, 50 ms handlers) get SIGTERM; then 2 fresh workers take the rest.
  Counted over both rounds: duplicates (a message handled twice) and attempts spent on
  unstarted messages (a message whose first handling was not its attempt 1), and lost ones;
- sharing: 2 workers (concurrency 1, default prefetch) on a 10 000-message backlog, 1 ms
  handlers: each one's share;
- bus receive throughput: 1 worker on a backlog of 100 B JSON messages on a disk topic, a
  trivial handler;
- send_many throughput (Python), 100 B JSON messages.

    python3 bench/sdk/targets.py [--sdk python,typescript,rust] [--only shutdown,share,throughput,send]

Needs a release build (`cargo build --release -p ferrymq -p ferrymq-client --example
bus_worker`, CARGO_TARGET_DIR honoured), clients/typescript built (`npm ci`), and Python 3.11.
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients/python/src"))

import ferrymq  # noqa: E402
from ferrymq import bus  # noqa: E402

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / os.environ.get("FERRYMQ_PROFILE", "release")
#: How long any awaited state may take before the run fails instead of hanging.
DEADLINE_S = 300
PAD = "x" * 58  # a Job's JSON body is then 100 bytes for ids of 5 digits


@bus.message(key="customer", name="Job")
@dataclass
class Job:
    id: int
    customer: str
    pad: str


def start_broker(data: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, FERRYMQ_HTTP_ADDR="127.0.0.1:0", FERRYMQ_LOG="info")
    proc = subprocess.Popen(
        [str(TARGET / "ferrymq"), "serve", "--tcp-addr", "127.0.0.1:0", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving the binary protocol" in line:
            addr = line.split("tcp=")[1].split()[0]
            # Keep draining the log so the broker never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, addr
    raise RuntimeError("the broker did not start")


def worker_command(sdk: str, args: list[str]) -> list[str]:
    here = Path(__file__).parent
    if sdk == "python":
        return [sys.executable, str(here / "worker.py"), *args]
    if sdk == "typescript":
        return ["node", str(here / "worker.mjs"), *args]
    return [str(TARGET / "examples/bus_worker"), *args]


class Worker:
    def __init__(self, sdk: str, addr: str, topic: str, identity: str, concurrency: int, prefetch: int, work_ms: int, out: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "clients/python/src"))
        args = [addr, topic, identity, str(concurrency), str(prefetch), str(work_ms), str(out)]
        self.out = out
        self.proc = subprocess.Popen(worker_command(sdk, args), stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"{sdk} worker did not start: {line!r}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def summary(self) -> dict:
        out, _ = self.proc.communicate(timeout=DEADLINE_S)
        return json.loads(out.strip().splitlines()[-1])

    def seen(self) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in (line.split() for line in self.out.read_text().splitlines())]


async def fill(client: ferrymq.Client, addr: str, topic: str, n: int) -> float:
    """Publishes n Jobs through the bus's send_many, 20 000 a call; returns messages per second
    of the time spent in send_many (building the Job objects is the application's, not
    counted: until 2026-11-29 it was, about 1 us a message)."""
    await bus.ensure_topic(client, topic, 10, "disk", create=True, inspect=False)
    sender = bus.Sender(client, bus.Settings(addr=addr, identity="filler", topic_template=topic))
    chunk = 20_000
    spent = 0.0
    for base in range(0, n, chunk):
        jobs = [Job(i, f"c{i % 97}", PAD) for i in range(base, min(n, base + chunk))]
        started = time.perf_counter()
        await sender.send_many(jobs)
        spent += time.perf_counter() - started
    return n / spent


async def subscription(client: ferrymq.Client, topic: str, name: str):
    for t in await client.stats(topic):
        for s in t.subscriptions:
            if s.name == name:
                return s
    return None


async def wait_for(what: str, check) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def idle(client: ferrymq.Client, topic: str, name: str) -> bool:
    s = await subscription(client, topic, name)
    return s is not None and s.backlog == 0 and s.in_flight == 0


async def shutdown(client: ferrymq.Client, addr: str, sdk: str, tmp: Path) -> dict:
    topic, name, total = f"Drain{sdk}", "drainer", 20_000
    await fill(client, addr, topic, total)
    first = [Worker(sdk, addr, topic, name, 125, 500, 50, tmp / f"{sdk}-drain-{i}") for i in range(2)]

    async def loaded() -> bool:
        s = await subscription(client, topic, name)
        return s is not None and s.in_flight >= 1000 and s.acked >= 1000

    await wait_for("1 000 in flight", loaded)
    in_flight = (await subscription(client, topic, name)).in_flight
    for w in first:
        w.stop()
    summaries = [w.summary() for w in first]
    second = [Worker(sdk, addr, topic, name, 125, 500, 0, tmp / f"{sdk}-rest-{i}") for i in range(2)]
    await wait_for("the rest handled", lambda: idle(client, topic, name))
    for w in second:
        w.stop()
    for w in second:
        w.summary()
    seen = [x for w in first + second for x in w.seen()]
    counts = Counter(i for i, _ in seen)
    first_attempt: dict[int, int] = {}
    for i, attempt in seen:
        first_attempt.setdefault(i, attempt)
    return {
        "in_flight_at_sigterm": in_flight,
        "handled_before": sum(s["handled"] for s in summaries),
        "released": sum(s["released"] for s in summaries),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "attempts_spent_unstarted": sum(1 for a in first_attempt.values() if a != 1),
        "lost": total - len(counts),
    }


async def share(client: ferrymq.Client, addr: str, sdk: str, tmp: Path) -> dict:
    topic, name, total = f"Share{sdk}", "sharer", 10_000
    await fill(client, addr, topic, total)
    workers = [Worker(sdk, addr, topic, name, 1, 4, 1, tmp / f"{sdk}-share-{i}") for i in range(2)]
    await wait_for("the backlog handled", lambda: idle(client, topic, name))
    for w in workers:
        w.stop()
    handled = [w.summary()["handled"] for w in workers]
    return {"handled": handled, "shares_pct": [round(100 * h / sum(handled), 1) for h in handled]}


async def throughput(client: ferrymq.Client, addr: str, sdk: str, tmp: Path, total: int, concurrency: int, prefetch: int) -> dict:
    topic, name = f"Tput{sdk}{concurrency}x{prefetch}", "reader"
    await fill(client, addr, topic, total)
    w = Worker(sdk, addr, topic, name, concurrency, prefetch, 0, tmp / f"{sdk}-tput")
    await wait_for("the backlog handled", lambda: idle(client, topic, name))
    w.stop()
    s = w.summary()
    return {"messages": s["handled"], "concurrency": concurrency, "prefetch": prefetch, "msg_per_s": round(s["rate"])}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdk", default="python,typescript,rust")
    parser.add_argument("--only", default="shutdown,share,throughput,send")
    parser.add_argument("--messages", type=int, default=500_000, help="backlog of a throughput run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=2048)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrymq-sdk-targets-") as tmp_name:
        tmp = Path(tmp_name)
        broker, addr = start_broker(tmp / "data")
        try:
            async with ferrymq.Client(addr) as client:
                if "send" in opts.only:
                    rates = [round(await fill(client, addr, f"Send{i}", opts.messages)) for i in range(3)]
                    print(json.dumps({"scenario": "send_many", "sdk": "python", "msg_per_s": rates}), flush=True)
                for sdk in opts.sdk.split(","):
                    if "shutdown" in opts.only:
                        print(json.dumps({"scenario": "shutdown", "sdk": sdk, **await shutdown(client, addr, sdk, tmp)}), flush=True)
                    if "share" in opts.only:
                        print(json.dumps({"scenario": "share", "sdk": sdk, **await share(client, addr, sdk, tmp)}), flush=True)
                    if "throughput" in opts.only:
                        r = await throughput(client, addr, sdk, tmp, opts.messages, opts.concurrency, opts.prefetch)
                        print(json.dumps({"scenario": "throughput", "sdk": sdk, **r}), flush=True)
        finally:
            broker.terminate()
            broker.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
