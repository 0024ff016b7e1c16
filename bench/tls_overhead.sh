#!/usr/bin/env bash
# What TLS costs: the same workloads against a plaintext broker and a TLS broker (the same
# binary), run alternately so that both see the same machine, and optionally against a second
# binary on plaintext (BEFORE_BIN, the previous main) to show the plaintext path unchanged.
#   binary: ferrymq bench, memory topic, 100 B, 1 producer -> 1 consumer (consumer msg/s)
#   http:   wrk -t1 -c100 (keep-alive), POST a 100 B JSON message to a memory topic (req/s)
# Each round runs every broker once per workload; at the end, medians and the median of each
# round's TLS / plaintext ratio, for the rate and for the broker's CPU time per message or
# request (from /proc/<pid>/stat over the run), which the machine's noise moves far less. The certificate is made here with openssl. Stops only the
# brokers it started.
#   bench/tls_overhead.sh [rounds] [seconds]
#   BEFORE_BIN=path/to/older/ferrymq COUNT=2000000 bench/tls_overhead.sh 5 5
# FERRYMQ_BIN names the binary to measure instead of building target/release/ferrymq.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-5}
if [ -z "${FERRYMQ_BIN:-}" ]; then
    cargo build --release -q -p ferrymq
fi
bin=${FERRYMQ_BIN:-target/release/ferrymq}
before=${BEFORE_BIN:-}
count=${COUNT:-2000000}
# shellcheck source=peers/common.sh
. bench/peers/common.sh
# shellcheck source=http_common.sh
. bench/http_common.sh

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$work/ca.key" -out "$work/ca.pem" -subj "/CN=FerryMQ bench CA" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$work/server.key" -out "$work/server.csr" -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$work/server.ext"
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 2 -extfile "$work/server.ext" -out "$work/server.pem" 2>/dev/null

# start name binary [serve flags...]: starts a broker with memory topics on free ports.
start() {
    local name=$1 binary=$2
    shift 2
    mkdir -p "$work/$name"
    "$binary" serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$work/$name/data" \
        --default-storage memory --log warn,ferrymq=info "$@" 2>"$work/$name/serve.log" &
    pids+=($!)
    echo $! >"$work/$name/pid"
    wait_log "$work/$name/serve.log" "http="
}
# utime + stime of a broker, in clock ticks.
cpu_of() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1/pid")/stat"; }
tcp_of() { grep -o 'tcp=[0-9.:]*' "$work/$1/serve.log" | head -1 | cut -d= -f2; }
http_of() { grep -o 'http=[0-9.:]*' "$work/$1/serve.log" | head -1 | cut -d= -f2; }

start plain "$bin"
start tls "$bin" --tls-cert "$work/server.pem" --tls-key "$work/server.key"
brokers=(plain tls)
if [ -n "$before" ]; then
    start before "$before"
    brokers+=(before)
fi
tls_flags=(--tls --ca-file "$work/ca.pem")
for name in "${brokers[@]}"; do
    scheme=http
    curl_flags=()
    if [ "$name" = tls ]; then scheme=https curl_flags=(--cacert "$work/ca.pem"); fi
    curl -sf "${curl_flags[@]}" -X POST "$scheme://$(http_of "$name")/topics" \
        -H 'content-type: application/json' -d "$http_memory_topic" >/dev/null
done
http_wrk_scripts "$work" 'done = function(s, latency, r)
  io.write(string.format("RESULT %.1f %d\n", s.requests / (s.duration / 1e6), s.requests))
end'

binary_rate() { # name: prints "rate count"
    local flags=()
    [ "$1" = tls ] && flags=("${tls_flags[@]}")
    local binary=$bin
    [ "$1" = before ] && binary=$before
    "$binary" bench --addr "$(tcp_of "$1")" "${flags[@]}" --count "$count" --storage memory \
        --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["consumer"]["msgs_per_s"], r["delivered"])'
}
http_rate() { # name
    local scheme=http
    [ "$1" = tls ] && scheme=https
    wrk -t1 -c100 -d"${seconds}s" -s "$work/json.lua" \
        "$scheme://$(http_of "$1")/topics/bench-mem/messages" | grep '^RESULT' | cut -d' ' -f2-3
}

results="$work/results.txt"
for round in $(seq "$rounds"); do
    for workload in binary http; do
        line="round $round $workload"
        for name in "${brokers[@]}"; do
            cpu0=$(cpu_of "$name")
            read -r rate done_count < <("${workload}_rate" "$name")
            cpu1=$(cpu_of "$name")
            us=$(python3 -c "print(f'{($cpu1 - $cpu0) / $(getconf CLK_TCK) * 1e6 / $done_count:.3f}')")
            line="$line $name=${rate%.*}/s,${us}us"
            echo "$round $workload $name $rate $us" >>"$results"
        done
        echo "$line"
    done
done
python3 - "$results" <<'PY'
import collections, statistics, sys
rates = collections.defaultdict(dict)
cpus = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    round_, workload, name, rate, us = line.split()
    rates[(workload, name)][int(round_)] = float(rate)
    cpus[(workload, name)][int(round_)] = float(us)
for workload in ("binary", "http"):
    unit = "msg/s" if workload == "binary" else "req/s"
    names = [n for (w, n) in rates if w == workload]
    medians = {n: statistics.median(rates[(workload, n)].values()) for n in names}
    print(f"{workload}: " + ", ".join(f"{n} {medians[n]/1e3:.1f} k {unit}" for n in names))
    for other in ("tls", "before"):
        if other not in names:
            continue
        ratios = [rates[(workload, other)][r] / rates[(workload, "plain")][r]
                  for r in rates[(workload, "plain")]]
        print(f"  {other} / plain: median of round ratios {statistics.median(ratios):.3f}, "
              f"rounds {' '.join(f'{x:.2f}' for x in ratios)}")
    print(f"  broker CPU per {'message' if workload == 'binary' else 'request'}: " + ", ".join(
        f"{n} {statistics.median(cpus[(workload, n)].values()):.3f} us" for n in names))
PY
