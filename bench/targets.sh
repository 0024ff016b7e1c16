#!/usr/bin/env bash
# Runs the core-broker target scenarios against a broker this script starts on a free loopback
# port, and prints the median of several runs per scenario. Stops only the broker it started.
#   bench/targets.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
cargo build --release -q -p ferrymq
bin=target/release/ferrymq
data=$(mktemp -d)
log="$data/serve.log"
$bin serve --tcp-addr 127.0.0.1:0 --data-dir "$data" --log warn,ferrymq=info 2>"$log" &
broker=$!
trap 'kill $broker 2>/dev/null || true; wait $broker 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "tcp=" "$log" && break; sleep 0.05; done
export FERRYMQ_ADDR=$(grep -o 'tcp=[0-9.:]*' "$log" | head -1 | cut -d= -f2)

# Runs `ferrymq bench ARGS --json` $runs times and prints the median of the fields asked for.
median() {
    local label=$1 fields=$2; shift 2
    for _ in $(seq "$runs"); do $bin bench "$@" --json 2>/dev/null; echo; done | python3 -c '
import json, statistics, sys
label, fields = sys.argv[1], sys.argv[2].split(",")
runs = [json.loads(l) for l in sys.stdin if l.strip()]
def get(d, path):
    for k in path.split("."): d = d[k]
    return d
out = []
for f in fields:
    values = [get(r, f) for r in runs]
    m = statistics.median(values)
    out.append(f"{f}={m/1e6:.2f}M" if "msgs_per_s" in f else f"{f}={m:.0f}")
missing = sum(r["missing"] for r in runs)
print(f"| {label} | {len(runs)} | " + ", ".join(out) + f" | missing {missing} |")
' "$label" "$fields"
}

echo "| scenario | runs | median | |"
echo "| --- | --- | --- | --- |"
median "memory, 100 B, 1 -> 1, acked" consumer.msgs_per_s,producer.msgs_per_s --count 20000000
median "memory, 100 B, 4 -> 4, acked" consumer.msgs_per_s --producers 4 --consumers 4 --count 5000000
median "memory, 100 B, 4 -> 4, 4 partitions" consumer.msgs_per_s --producers 4 --consumers 4 --partitions 4 --count 5000000
median "latency at 10 k msg/s, confirmed + acked (us)" latency_us.p50,latency_us.p90,latency_us.p99,latency_us.p99_9,latency_us.max --rate 10000 --batch 1 --duration 10s
median "latency at 10 k msg/s, unconfirmed + auto-ack (us)" latency_us.p50,latency_us.p90,latency_us.p99,latency_us.p99_9,latency_us.max --rate 10000 --batch 1 --duration 10s --no-confirm --no-ack
# Both hold the same backlog (10 M messages in total, drop-oldest), so only the topic count differs.
median "publish only, 1 topic (10 M retained)" producer.msgs_per_s --consumers 0 --max-messages-total 10000000 --count 20000000
median "publish only, 10 000 topics (1 000 retained each)" producer.msgs_per_s --consumers 0 --topics 10000 --max-messages-total 10000000 --count 20000000
