#!/usr/bin/env bash
# Broker RSS with N idle consumer connections (default 1000): starts a broker on a free loopback
# port, opens the connections, samples the broker's resident memory, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
connections=${1:-1000}
ulimit -n 8192 2>/dev/null || true
cargo build --release -q -p ferrymq -p ferrymq-client --example idle_consumers
data=$(mktemp -d)
log="$data/serve.log"
target/release/ferrymq serve --tcp-addr 127.0.0.1:0 --data-dir "$data" --log info 2>"$log" &
broker=$!
trap 'kill $broker 2>/dev/null || true; wait $broker 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "tcp=" "$log" && break; sleep 0.05; done
addr=$(grep -o 'tcp=[0-9.:]*' "$log" | head -1 | cut -d= -f2)
rss() { awk '/VmRSS/ {print $2}' "/proc/$broker/status"; }
before=$(rss)
target/release/examples/idle_consumers "$addr" "$connections" 4 &
load=$!
sleep 3
during=$(rss)
wait $load
echo "broker RSS: ${before} KiB at start, ${during} KiB with ${connections} idle consumer connections" \
     "($(( (during - before) / connections )) KiB per connection)"
