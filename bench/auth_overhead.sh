#!/usr/bin/env bash
# The cost of authentication and permission checks on the hot path: the same memory-topic
# scenario (100 B, 1 -> 1, binary protocol) against two brokers this script starts on free
# loopback ports, one without users and one where the bench logs in as a user holding a pattern
# grant, run alternately so that both see the same machine. Prints each round and the medians.
# Stops only the brokers it started.
#   bench/auth_overhead.sh [rounds] [extra ferrymq bench flags...]
# FERRYMQ_BIN names a ferrymq binary to use instead of building target/release/ferrymq.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
if [ -z "${FERRYMQ_BIN:-}" ]; then
    cargo build --release -q -p ferrymq
fi
bin=${FERRYMQ_BIN:-target/release/ferrymq}
open_dir=$(mktemp -d)
auth_dir=$(mktemp -d)
$bin serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$open_dir" --default-storage memory --log warn,ferrymq=info 2>"$open_dir/serve.log" &
open_pid=$!
FERRYMQ_ADMIN_PASSWORD=bench-admin-password $bin serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$auth_dir" --default-storage memory --log warn,ferrymq=info 2>"$auth_dir/serve.log" &
auth_pid=$!
trap 'kill $open_pid $auth_pid 2>/dev/null || true; wait $open_pid $auth_pid 2>/dev/null || true; rm -rf "$open_dir" "$auth_dir"' EXIT
addr() {
    for _ in $(seq 200); do grep -q "tcp=" "$1" && break; sleep 0.05; done
    grep -o 'tcp=[0-9.:]*' "$1" | head -1 | cut -d= -f2
}
open_addr=$(addr "$open_dir/serve.log")
auth_addr=$(addr "$auth_dir/serve.log")
admin=(--addr "$auth_addr" --user admin --password bench-admin-password)
echo 'bench-user-password' | $bin user add bencher "${admin[@]}" >/dev/null
$bin user grant bencher 'bench*' all "${admin[@]}" >/dev/null

run() {
    $bin bench --count "${COUNT:-5000000}" --storage memory "$@" --json 2>/dev/null | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(r["consumer"]["msgs_per_s"])'
}
open_rates=()
auth_rates=()
for round in $(seq "$rounds"); do
    o=$(run --addr "$open_addr" "$@")
    a=$(FERRYMQ_PASSWORD=bench-user-password run --addr "$auth_addr" --user bencher "$@")
    echo "round $round: no users $o msg/s, user with a pattern grant $a msg/s"
    open_rates+=("$o")
    auth_rates+=("$a")
done
python3 - "${open_rates[*]}" "${auth_rates[*]}" <<'PY'
import statistics, sys
o = [float(x) for x in sys.argv[1].split()]
a = [float(x) for x in sys.argv[2].split()]
mo, ma = statistics.median(o), statistics.median(a)
print(f"median: no users {mo/1e6:.3f} M msg/s, with a user {ma/1e6:.3f} M msg/s, ratio {ma/mo:.3f}")
PY
