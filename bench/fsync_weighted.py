#!/usr/bin/env python3
"""What a group commit over the broker's own fsyncs would make messages wait, against what they did.

Reads two scrapes of /metrics taken around a run (before.txt, after.txt) and compares the
`sync_wait` stage (append to covering fsync, as publishers saw it) with a model built from the
`fsync` stage of the same run: a message arriving at a random moment falls into an fsync with a
probability proportional to its duration (time weighting), waits for the rest of it, then for
the next one (drawn by count). Where sync_wait's p99 exceeds the model's, the broker added the
difference (queueing for a sync thread, wake-ups, the gap between two syncs); where they match,
the disk's own stalls are the tail. Durations are bucket midpoints (within 12.5 %).

    curl -s http://$FERRYMQ_HTTP_ADDR/metrics > before.txt
    ferrymq bench --storage disk --rate 10000 --batch 1 --pipeline 256 --duration 10s
    curl -s http://$FERRYMQ_HTTP_ADDR/metrics > after.txt
    bench/fsync_weighted.py before.txt after.txt
"""
import random
import re
import sys

SAMPLES = 200_000


def parse(path):
    stages = {}
    pattern = r'ferrymq_stage_latency_seconds_bucket\{stage="(\w+)",le="([^"]+)"\} (\d+)'
    for line in open(path):
        m = re.match(pattern, line)
        if m:
            le = float("inf") if m.group(2) == "+Inf" else float(m.group(2)) * 1e6
            stages.setdefault(m.group(1), []).append((le, int(m.group(3))))
    return stages


def between(before, after, stage):
    """(low, high, count) of each non-empty bucket, for the run alone."""
    out, below, low = [], 0, 0.0
    for (le, n_after), (_, n_before) in zip(after[stage], before[stage]):
        cumulative = n_after - n_before
        if cumulative > below:
            out.append((low, le, cumulative - below))
        below, low = cumulative, le
    return out


def top_at(buckets, p):
    total = sum(n for _, _, n in buckets)
    seen = 0
    for _, high, n in buckets:
        seen += n
        if seen >= p * total:
            return high
    return None


def main():
    before, after = parse(sys.argv[1]), parse(sys.argv[2])
    fsyncs = between(before, after, "fsync")
    waits = between(before, after, "sync_wait")
    if not fsyncs or not waits:
        sys.exit("no fsync in the run: was it a disk topic with fsync=always?")
    mid = [(low + (high if high != float("inf") else 2 * low)) / 2 for low, high, _ in fsyncs]
    counts = [n for _, _, n in fsyncs]
    by_time = [d * n for d, n in zip(mid, counts)]
    random.seed(1)
    model = sorted(
        random.random() * random.choices(mid, weights=by_time)[0]
        + random.choices(mid, weights=counts)[0]
        for _ in range(SAMPLES)
    )
    quantiles = (0.5, 0.99, 0.999)
    print(f"fsyncs {sum(counts)}, by count (bucket tops, µs):",
          [top_at(fsyncs, p) for p in quantiles])
    print("group commit over them, by message (µs):",
          [round(model[min(SAMPLES - 1, int(p * SAMPLES))]) for p in quantiles])
    print("sync_wait, by publish (bucket tops, µs):", [top_at(waits, p) for p in quantiles])


if __name__ == "__main__":
    main()
