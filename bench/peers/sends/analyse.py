#!/usr/bin/env python3
"""The publisher thread's send calls (write, writev, sendto, sendmsg), from
`perf script -F comm,tid,time,event,trace`.

    analyse.py NAME ROUND RUN_JSONL STEAL < perf-script-output  -> one JSON line for that run
    analyse.py --table RESULTS_JSONL                             -> the markdown table of all runs

A send "woke a thread" when the publisher thread emitted a sched_waking event between its
sys_enter and sys_exit: its data found the server's thread asleep. Otherwise the server was
already awake and the call only ran the TCP send and the receiving socket's input.
"""
import json
import re
import statistics
import sys

PUBLISHER = "paced-publisher"
LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def summary(values):
    return {
        "n": len(values),
        "mean_us": statistics.mean(values) if values else None,
        "p50_us": percentile(values, 0.50),
        "p90_us": percentile(values, 0.90),
        "p99_us": percentile(values, 0.99),
    }


def one_run(name, round_, run_jsonl, steal):
    calls = {"no_wake": [], "woke": []}
    open_call = {}  # tid -> (start µs, woke a thread)
    first = last = None
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        comm, tid, t, event = m.group(1), int(m.group(2)), float(m.group(3)) * 1e6, m.group(4)
        first = t if first is None else first
        last = t
        if comm != PUBLISHER:
            continue
        if event.startswith("syscalls:sys_enter_"):
            open_call[tid] = (t, False)
        elif event == "sched:sched_waking" and tid in open_call:
            open_call[tid] = (open_call[tid][0], True)
        elif event.startswith("syscalls:sys_exit_") and tid in open_call:
            start, woke = open_call.pop(tid)
            calls["woke" if woke else "no_wake"].append(t - start)
    runs = [json.loads(l) for l in open(run_jsonl) if l.strip()]
    latency = runs[-1]["runs"][0]
    seconds = (last - first) / 1e6 if first is not None and last > first else 0
    print(json.dumps({
        "system": name,
        "round": int(round_),
        "run_p99_us": latency["p99_us"],
        "steal_pct": float(steal),
        "sends_per_s": (len(calls["no_wake"]) + len(calls["woke"])) / seconds if seconds else None,
        "no_wake": summary(calls["no_wake"]),
        "woke": summary(calls["woke"]),
    }))


LABELS = {
    "ferrymq": "FerryMQ (its client sets TCP_NODELAY)",
    "redis": "Redis everysec (client: Nagle on, the redis-rs default)",
    "redis-nodelay": "Redis everysec (client: TCP_NODELAY)",
    "nats": "NATS core (client: TCP_NODELAY)",
}


def table(results_jsonl):
    rows = [json.loads(l) for l in open(results_jsonl) if l.strip()]
    systems = []
    for r in rows:
        if r["system"] not in systems:
            systems.append(r["system"])

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def us(v):
        return "-" if v is None else f"{v:.0f} µs"

    print("| system | send calls per s (median) | sends that woke no thread: share, p50 / p90 / "
          "p99 (median) | sends that woke one: p50 / p99 (median) | p99 of the sends that woke "
          "no thread, each round | end-to-end p99 (steal), each round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in systems:
        mine = [r for r in rows if r["system"] == s]
        rate = med([r.get("sends_per_s") for r in mine])
        share = med([r["no_wake"]["n"] / max(1, r["no_wake"]["n"] + r["woke"]["n"]) for r in mine])
        quiet = " / ".join(us(med([r["no_wake"][k] for r in mine])) for k in ("p50_us", "p90_us", "p99_us"))
        woke = " / ".join(us(med([r["woke"][k] for r in mine])) for k in ("p50_us", "p99_us"))
        each = ", ".join(us(r["no_wake"]["p99_us"]) for r in mine)
        runs = ", ".join(f"{r['run_p99_us'] / 1000:.1f} ms ({r['steal_pct']:.0f} %)" for r in mine)
        rate_cell = "-" if rate is None else f"{rate / 1000:.1f} k"
        print(f"| {LABELS.get(s, s)} | {rate_cell} | {share:.0%}: {quiet} | {woke} | {each} | {runs} |")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        one_run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
