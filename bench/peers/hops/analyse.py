"""Reads the hop logs of bench/peers/hops/run and prints where the messages waited."""
import bisect
import collections
import glob
import sys

# Hop ids written by instrument.patch.
DUE, TICK, ENQUEUED = 0, 11, 10          # load generator: scheduled, its turn, publish call done
B_READ, B_APPENDED, B_POLLED, B_WRITTEN = 1, 2, 5, 4   # broker
C_READ, C_ROUTED, RECEIVED = 13, 14, 12  # subscriber side: client read, routed, subscriber task
W_START, W_END = 21, 22                  # the publisher's client writer: each write call

FERRYMQ_HOPS = [
    ("load generator: publisher thread late (due → its turn)", DUE, TICK),
    ("client: publish call", TICK, ENQUEUED),
    ("client writer + loopback + broker read", ENQUEUED, B_READ),
    ("broker: decode + append", B_READ, B_APPENDED),
    ("broker: delivery task wakes and polls", B_APPENDED, B_POLLED),
    ("broker: encode + write to the subscriber", B_POLLED, B_WRITTEN),
    ("loopback + client reader", B_WRITTEN, C_READ),
    ("client: decode + route", C_READ, C_ROUTED),
    ("subscriber task wakes", C_ROUTED, RECEIVED),
]
SPLIT = [
    ("total (due → received)", DUE, RECEIVED),
    ("publisher thread late (due → its turn)", DUE, TICK),
    ("after the publish call (→ received)", ENQUEUED, RECEIVED),
]


def load(path):
    messages = collections.defaultdict(dict)
    writes = collections.defaultdict(dict)
    for line in open(path):
        kind, key, t = map(int, line.split())
        if kind in (W_START, W_END):
            writes[key][kind] = t
        else:
            messages[key].setdefault(kind, t)
    return messages, sorted((w[W_START], w[W_END]) for w in writes.values() if len(w) == 2)


def measured(messages, needed):
    rows = sorted((m for m in messages.values() if needed <= m.keys()), key=lambda m: m[DUE])
    if not rows:
        return []
    warm_up_end = rows[0][DUE] + 1_000_000_000  # the first second is warm-up
    return [m for m in rows if m[DUE] >= warm_up_end]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def split_table(label, rows):
    if not rows:
        print(f"| {label} | no complete records | | | | |")
        return
    slow = [m for m in rows if m[RECEIVED] - m[DUE] > 1_000_000]
    slow_total = sum(m[RECEIVED] - m[DUE] for m in slow) or 1
    for name, a, b in SPLIT:
        xs = [(m[b] - m[a]) / 1e3 for m in rows]
        share = 100 * sum(m[b] - m[a] for m in slow) / slow_total
        print(f"| {label} | {name} | {pct(xs, .5):.0f} µs | {pct(xs, .99) / 1e3:.1f} ms "
              f"| {pct(xs, .999) / 1e3:.1f} ms | {share:.0f} % |")


def main(tmp):
    ferrymq_rows, redis_rows, late, late_in_writes = [], [], 0, 0
    for path in sorted(glob.glob(f"{tmp}/ferrymq-*.log")):
        messages, writes = load(path)
        rows = measured(messages, {k for _, a, b in FERRYMQ_HOPS for k in (a, b)})
        ferrymq_rows += rows
        # How much of the publisher thread's lateness it spent inside the client's write calls.
        starts = [w[0] for w in writes]
        for m in rows:
            lo, hi = m[DUE], m[TICK]
            if hi - lo < 1_000_000:
                continue
            late += hi - lo
            i = max(bisect.bisect_left(starts, lo) - 1, 0)
            while i < len(writes) and writes[i][0] < hi:
                overlap = min(writes[i][1], hi) - max(writes[i][0], lo)
                late_in_writes += max(overlap, 0)
                i += 1
    for path in sorted(glob.glob(f"{tmp}/redis-*.log")):
        messages, _ = load(path)
        redis_rows += measured(messages, {DUE, TICK, ENQUEUED, RECEIVED})
    if not ferrymq_rows:
        sys.exit(f"no complete FerryMQ records in {tmp}")
    print()
    print(f"FerryMQ, hop by hop ({len(ferrymq_rows)} messages):")
    print()
    slow = [m for m in ferrymq_rows if m[RECEIVED] - m[DUE] > 1_000_000]
    slow_total = sum(m[RECEIVED] - m[DUE] for m in slow) or 1
    print("| hop | p50 | p99 | share of the time of messages over 1 ms |")
    print("| --- | --- | --- | --- |")
    for name, a, b in FERRYMQ_HOPS:
        xs = [(m[b] - m[a]) / 1e3 for m in ferrymq_rows]
        share = 100 * sum(m[b] - m[a] for m in slow) / slow_total
        print(f"| {name} | {pct(xs, .5):.0f} µs | {pct(xs, .99):.0f} µs | {share:.0f} % |")
    if late:
        print()
        print(f"Of the publisher thread's lateness in messages over 1 ms late, "
              f"{100 * late_in_writes / late:.0f} % was inside the client's write calls.")
    print()
    print("Both systems, the load generator's part and the rest:")
    print()
    print("| system | part | p50 | p99 | p99.9 | share of the time of messages over 1 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    split_table("FerryMQ", ferrymq_rows)
    split_table("Redis everysec", redis_rows)


main(sys.argv[1])
