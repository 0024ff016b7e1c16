#!/usr/bin/env bash
# Runs the work-queue target scenarios (issue 4) against a broker this script starts on a free
# loopback port with a fresh data dir, prints every run and the median per scenario, with the
# exact command. Stops only the broker it started.
#   bench/work_queue_targets.sh [runs]      (default 3)
#
# T1: one consumer drains a queue PRE-LOADED with 500 000 messages of 100 B, acking every message
#     (one ack call per message; the client merges them into pipelined ACK frames); disk topic with
#     the server's default fsync=always. The rate is the consume phase's: from the consumer's start
#     until all 500 000 were delivered and its acks confirmed by the broker. Target >= 1 M msg/s.
#     Also: the same on a memory topic, and with one ack call per DELIVER frame.
# T2: an ordered subscription (at most one message per key in flight), 10 000 keys, 4 consumers
#     sharing it, 100 B, acking every message, disk topic with one partition. PRE-LOADED with
#     500 000 messages like T1 (the consume phase's rate); plus a live variant where 1 producer
#     publishes 500 000 while the consumers drain (the delivered rate, from the first publish to
#     the last delivery). Target >= 300 k msg/s. Both with the bench's default credit window
#     (32 768 per consumer); then pre-loaded with the client library's default window (1 024).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cargo build --release -q -p ferrymq
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/ferrymq
data=$(mktemp -d "${TMPDIR:-/tmp}/ferrymq-wq-bench.XXXXXX")
log="$data/serve.log"
$bin serve --tcp-addr 127.0.0.1:0 --data-dir "$data/data" --log warn,ferrymq=info 2>"$log" &
broker=$!
trap 'kill "$broker" 2>/dev/null || true; wait "$broker" 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 400); do grep -q "tcp=" "$log" && break; sleep 0.05; done
FERRYMQ_ADDR=$(grep -o 'tcp=[0-9.:]*' "$log" | head -1 | cut -d= -f2)
export FERRYMQ_ADDR
echo "broker pid $broker on $FERRYMQ_ADDR, data dir $data/data; $(nproc) CPUs; commit $(git rev-parse --short HEAD)"

# scenario LABEL TARGET_MSGS_PER_S ARGS...: runs `ferrymq bench ARGS --json` $runs times, prints
# each run (the rate of consumer.msgs_per_s: the consume phase with --preload, else deliveries)
# and the median against the target.
scenario() {
    local label=$1 target=$2; shift 2
    echo
    echo "## $label"
    echo "command: ferrymq bench $* --json"
    for _ in $(seq "$runs"); do
        "$bin" bench "$@" --json 2>/dev/null || true
        echo
    done | python3 -c '
import json, statistics, sys
label, target = sys.argv[1], float(sys.argv[2])
rates = []
for i, line in enumerate(l for l in sys.stdin if l.strip()):
    r = json.loads(line)
    c = r["consumer"]
    rates.append(c["msgs_per_s"])
    if "phases" in r:
        pre, con = r["phases"]["preload"], r["phases"]["consume"]
        extra = "; preload %d msgs at %.0f k msg/s; last delivery at %.3f s, acks confirmed %s" % (
            pre["messages"], pre["msgs_per_s"] / 1e3, con["last_delivery_s"], con["acks_confirmed"])
    else:
        extra = "; published at %.0f k msg/s" % (r["producer"]["msgs_per_s"] / 1e3)
    print("run %d: %8.0f k msg/s consumed (%d msgs in %.3f s)%s; missing %d, redelivered %d, error %s" % (
        i + 1, c["msgs_per_s"] / 1e3, r["delivered"], c["elapsed_s"], extra, r["missing"],
        r["redelivered"], r["error"]))
if rates:
    m = statistics.median(rates)
    verdict = ""
    if target > 0:
        verdict = " -> target %.0f k msg/s %s" % (target / 1e3, "MET" if m >= target else "MISSED")
    print("median of %d: %.0f k msg/s%s" % (len(rates), m / 1e3, verdict))
else:
    print("no successful run")
' "$label" "$target"
}

scenario "T1: disk (fsync=always), 500 000 pre-loaded x 100 B, 1 consumer, ack per message" 1000000 \
    --storage disk --preload 500000 --consumers 1 --ack-each
scenario "T1 on a memory topic (comparison)" 0 \
    --storage memory --preload 500000 --consumers 1 --ack-each
scenario "T1 with one ack call per DELIVER frame (ranges) instead of per message (comparison)" 0 \
    --storage disk --preload 500000 --consumers 1
scenario "T2: disk, ordered, 10 000 keys, 4 consumers, 500 000 pre-loaded x 100 B, ack per message" 300000 \
    --storage disk --preload 500000 --keys 10000 --ordered --consumers 4 --ack-each
scenario "T2 live: the same while 1 producer publishes 500 000 (delivered rate)" 300000 \
    --storage disk --count 500000 --keys 10000 --ordered --consumers 4 --ack-each
# The bench's default credit window (32 768 per consumer) lets the consumers hold every key's
# message at once; with the client library's default (1 024 per consumer, 4 096 in all, fewer
# than the keys) the broker always has keys ready in log order.
scenario "T2 with the client's default credit window (1 024 per consumer), pre-loaded" 300000 \
    --storage disk --preload 500000 --keys 10000 --ordered --consumers 4 --ack-each --credit 1024
