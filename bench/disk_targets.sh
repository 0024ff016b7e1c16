#!/usr/bin/env bash
# Runs the durable-topic target scenarios against a broker this script starts on a free loopback
# port with a data dir on the same disk as the dd reference, and prints medians of several runs.
#   bench/disk_targets.sh [runs] [backlog_messages]
# The backlog scenario writes backlog_messages x 100 B (default 100 M = 10 GB) to the data dir;
# pass 0 to skip it. Stops only the broker it started.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
backlog=${2:-100000000}
cargo build --release -q -p ferrymq
bin=$PWD/target/release/ferrymq
data=$(mktemp -d "${TMPDIR:-/tmp}/ferrymq-disk-bench.XXXXXX")
log="$data/serve.log"
broker=
start_broker() {
    : >"$log"
    $bin serve --tcp-addr 127.0.0.1:0 --data-dir "$data/data" --log warn,ferrymq=info 2>>"$log" &
    broker=$!
    for _ in $(seq 400); do grep -q "tcp=" "$log" && break; sleep 0.05; done
    FERRYMQ_ADDR=$(grep -o 'tcp=[0-9.:]*' "$log" | tail -1 | cut -d= -f2)
    export FERRYMQ_ADDR
}
stop_broker() {
    kill "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
}
trap 'stop_broker; rm -rf "$data"' EXIT

echo "## dd reference (1 GiB, conv=fdatasync, same file system as the data dir)"
for _ in $(seq "$runs"); do
    dd if=/dev/zero of="$data/dd" bs=1M count=1024 conv=fdatasync 2>&1 | tail -1
    rm -f "$data/dd"
done | python3 -c '
import re, statistics, sys
rates = []
for line in sys.stdin:
    m = re.search(r"copied, ([0-9.]+) s", line)
    if m: rates.append(1073741824 / float(m.group(1)) / 1e6)
print(f"dd MB/s: runs {[round(r) for r in rates]}, median {statistics.median(rates):.0f}")
'

start_broker

median() {
    local label=$1 fields=$2; shift 2
    for _ in $(seq "$runs"); do $bin bench --storage disk "$@" --json 2>/dev/null; echo; done | python3 -c '
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
    if "msgs_per_s" in f: out.append(f"{f}={m/1e6:.2f}M")
    elif "mb_per_s" in f: out.append(f"{f}={m:.0f}MB/s")
    else: out.append(f"{f}={m:.0f}")
missing = sum(r["missing"] for r in runs)
print(f"| {label} | {len(runs)} | " + ", ".join(out) + f" | missing {missing} |")
' "$label" "$fields"
}

echo
echo "| scenario | runs | median | |"
echo "| --- | --- | --- | --- |"
median "disk fsync=always, 100 B, 1 -> 1, acked" consumer.msgs_per_s,producer.msgs_per_s --count 5000000
median "disk fsync=always, 100 B, 4 -> 4, acked" consumer.msgs_per_s,producer.msgs_per_s --producers 4 --consumers 4 --count 2000000
median "disk fsync=always, 1 KiB, 2 -> 0, publish only" producer.msgs_per_s,producer.mb_per_s --producers 2 --consumers 0 --size 1024 --count 1000000
median "disk fsync=always, 1 KiB, 1 -> 1, acked" consumer.msgs_per_s,consumer.mb_per_s --size 1024 --count 1000000
median "latency at 10 k msg/s, fsync=always, confirmed + acked (us)" latency_us.p50,latency_us.p90,latency_us.p99,latency_us.p99_9,latency_us.max --rate 10000 --batch 1 --pipeline 256 --duration 10s

if [ "$backlog" -gt 0 ]; then
    echo
    echo "## backlog of $backlog x 100 B, publish only (no subscription, so nothing is deleted)"
    rss() { awk '/VmRSS/ {print $2 " kB"}' "/proc/$broker/status"; }
    $bin topic create backlog --storage disk --retention forever >/dev/null
    echo "broker RSS before: $(rss)"
    start=$(date +%s.%N)
    $bin bench --storage disk --topic backlog --consumers 0 --count "$backlog" --json 2>/dev/null >"$data/fill.json"
    end=$(date +%s.%N)
    echo "filled in $(python3 -c "print(round($end - $start, 1))") s; data dir $(du -sh "$data/data" | cut -f1); broker RSS after: $(rss)"
    # Let the kernel write the backlog back first, so both topics are measured in the same state
    # of the disk and page cache; then alternate between an empty topic and the full one.
    sync
    rate() { $bin bench --storage disk --topic "$1" --consumers 0 --count 5000000 --json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["producer"]["msgs_per_s"]))'; }
    empties=(); fulls=()
    for i in $(seq "$runs"); do
        empties+=("$(rate "empty-$i")")
        fulls+=("$(rate backlog)")
        $bin topic delete "empty-$i" >/dev/null
    done
    python3 -c '
import statistics, sys
e = [int(x) for x in sys.argv[1].split()]; f = [int(x) for x in sys.argv[2].split()]
print(f"publish msg/s, 5 M x 100 B, empty topic: {e}, median {statistics.median(e):.0f}")
print(f"publish msg/s, 5 M x 100 B, topic holding the backlog: {f}, median {statistics.median(f):.0f} ({100 * statistics.median(f) / statistics.median(e):.0f} % of empty)")
' "${empties[*]}" "${fulls[*]}"
    echo "broker RSS after: $(rss)"
    echo
    echo "## restart with the backlog on disk (SIGTERM, start, time until a publish is acknowledged)"
    stop_broker
    t0=$(date +%s.%N)
    start_broker
    $bin pub backlog "after restart" >/dev/null
    t1=$(date +%s.%N)
    echo "serving again after $(python3 -c "print(round($t1 - $t0, 2))") s (broker start + connect + one fsync'd publish); RSS $(rss)"
fi
