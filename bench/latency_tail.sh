#!/usr/bin/env bash
# The latency tail at 10 k msg/s, one message per publish, against a broker this script starts
# on free loopback ports with its data dir under $TMPDIR: for each round, a disk topic with
# fsync=always (beside the disk's own fsync floor in the same data dir, measured by the bench
# before the load) and a memory topic, each with the per-stage breakdown from /metrics.
#   bench/latency_tail.sh [rounds] [seconds]           (default 3 rounds of 10 s)
#   FERRYMQ_BIN=...                                    a binary to use instead of building one
#   CONTEND=1                                          while each run lasts, a bounded loop of
#                                                      `dd oflag=dsync` (4 KiB writes) in the
#                                                      same file system, as another tenant
# Stops only the broker and the dd it started; removes its data dir.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-10}
if [ -z "${FERRYMQ_BIN:-}" ]; then
    cargo build --release -q -p ferrymq
fi
bin=${FERRYMQ_BIN:-$PWD/target/release/ferrymq}
data=$(mktemp -d "${TMPDIR:-/tmp}/ferrymq-latency.XXXXXX")
log="$data/serve.log"
broker=
contender=
stop_all() {
    [ -n "$contender" ] && kill "$contender" 2>/dev/null && wait "$contender" 2>/dev/null
    [ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
    return 0
}
trap 'stop_all; rm -rf "$data"' EXIT

$bin serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$data/data" \
    --log warn,ferrymq=info 2>>"$log" &
broker=$!
for _ in $(seq 400); do grep -q "http=.*https" "$log" && grep -q "tcp=" "$log" && break; sleep 0.05; done
FERRYMQ_ADDR=$(grep -o 'tcp=[0-9.:]*' "$log" | tail -1 | cut -d= -f2)
FERRYMQ_HTTP_ADDR=$(grep -o 'http=[0-9.:]*' "$log" | tail -1 | cut -d= -f2)
export FERRYMQ_ADDR FERRYMQ_HTTP_ADDR

# Another writer on the same disk: 4 KiB synchronous writes into a file it rewrites, at most
# 64 MiB per dd and at most as long as one run (the loop ends with the run).
contend() {
    local until=$((SECONDS + seconds + 5))
    while [ $SECONDS -lt $until ]; do
        dd if=/dev/zero of="$data/contender" bs=4k count=16384 oflag=dsync conv=notrunc status=none
    done
    rm -f "$data/contender"
}

run() {
    local label=$1; shift
    if [ "${CONTEND:-0}" = 1 ]; then contend & contender=$!; fi
    echo "## $label"
    $bin bench --rate 10000 --batch 1 --pipeline 256 --duration "${seconds}s" --breakdown "$@" \
        2>/dev/null | grep -v '^topic'
    if [ -n "$contender" ]; then kill "$contender" 2>/dev/null; wait "$contender" 2>/dev/null || true; contender=; fi
    rm -f "$data/contender"
}

for round in $(seq "$rounds"); do
    echo "# round $round, $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
    run "disk, fsync=always" --storage disk --fsync always --fsync-floor "$data/data"
    run "memory" --storage memory
done
