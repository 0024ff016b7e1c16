#!/usr/bin/env bash
# A/B of ferrymq binaries on the HTTP API's hot paths: what each request costs the broker in CPU,
# besides the requests/s that `bench/http_targets.sh` reports. Requests/s on two vCPUs shared with
# the load generator move 10-20 % from run to run; the broker's CPU per request (from its
# /proc/<pid>/stat over the run) moves far less, so a change of a few tenths of a microsecond
# shows within a handful of rounds.
#
# Each round starts every binary in turn on a fresh data dir and free loopback ports, creates a
# memory topic and a disk topic (fsync=always), and runs `wrk -t1 -c100` for each scenario:
#   ping  GET /ping (the no-op)
#   json  POST one 100 B JSON message to the memory topic
#   raw   POST a 100 B raw body to the memory topic
#   disk  POST one 100 B JSON message to the disk topic
# Per run it prints req/s, wrk's p99, the broker's user and system CPU per request, the rest of
# the machine's busy CPU per request (wrk and the kernel's work on its behalf), idle and steal.
# At the end, per binary and scenario: medians, and the median of each round's ratio to the
# same binary's no-op.
#   bench/http_ab.sh rounds seconds binary...
#   WORKERS=1 SCENARIOS="ping json disk" bench/http_ab.sh 4 5 target/release/ferrymq /tmp/ferrymq-old
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:?rounds}
seconds=${2:?seconds}
shift 2
[ $# -gt 0 ] || { echo "usage: $0 rounds seconds binary..." >&2; exit 2; }
scenarios=${SCENARIOS:-ping json raw}
command -v wrk >/dev/null 2>&1 || apt-get install -y wrk >/dev/null 2>&1 || {
    echo "cannot install wrk: install it (apt-get install wrk) and run again" >&2
    exit 1
}
# shellcheck source=peers/common.sh
. bench/peers/common.sh
# shellcheck source=http_common.sh
. bench/http_common.sh

work=$(mktemp -d)
broker=""
cleanup() {
    [ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

http_wrk_scripts "$work" 'done = function(s, latency, r)
  io.write(string.format("RESULT %.1f %d %d\n", s.requests / (s.duration / 1e6), latency:percentile(99), s.requests))
end'

# utime and stime of a process, in clock ticks.
proc_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# busy and idle (idle + iowait) ticks of the machine.
machine_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat; }

results="$work/results.txt"
for round in $(seq "$rounds"); do
    for bin in "$@"; do
        data="$work/data"
        rm -rf "$data"
        "$bin" serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$data" \
            ${WORKERS:+--worker-threads "$WORKERS"} --log warn,ferrymq=info 2>"$work/serve.log" &
        broker=$!
        wait_log "$work/serve.log" "http="
        base="http://$(grep -o 'http=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2)"
        http_create_topics "$base"
        for scenario in $scenarios; do
            case $scenario in
                ping) url=$base/ping script=ping ;;
                json) url=$base/topics/bench-mem/messages script=json ;;
                raw) url=$base/topics/bench-mem/messages script=raw ;;
                disk) url=$base/topics/bench-disk/messages script=json ;;
                *) echo "unknown scenario $scenario" >&2; exit 2 ;;
            esac
            read -r user0 sys0 < <(proc_ticks "$broker")
            read -r busy0 idle0 < <(machine_ticks)
            steal0=$(cpu_ticks)
            line=$(wrk -t1 -c100 -d"${seconds}s" -s "$work/$script.lua" "$url" | grep '^RESULT')
            read -r user1 sys1 < <(proc_ticks "$broker")
            read -r busy1 idle1 < <(machine_ticks)
            steal=$(steal_pct "$steal0" "$(cpu_ticks)")
            python3 - "$bin" "$scenario" "$round" "$(getconf CLK_TCK)" "$line" \
                "$user0 $sys0 $user1 $sys1 $busy0 $idle0 $busy1 $idle1" "$steal" <<'EOF' | tee -a "$results"
import sys
bin, scenario, round_, tck, line, ticks, steal = sys.argv[1:]
_, rps, p99_us, requests = line.split()
rps, requests, tck = float(rps), int(requests), int(tck)
u0, s0, u1, s1, b0, i0, b1, i1 = map(int, ticks.split())
per_request = lambda ticks: ticks / tck / requests * 1e6
user, system = per_request(u1 - u0), per_request(s1 - s0)
others = per_request((b1 - b0) - (u1 - u0) - (s1 - s0))
idle = 100 * (i1 - i0) / max(1, (b1 - b0) + (i1 - i0))
print(f"RUN {bin} {scenario} {round_} {rps:.1f} {int(p99_us)} {user:.3f} {system:.3f} {others:.3f} {idle:.1f} {steal}")
EOF
        done
        kill "$broker"
        wait "$broker" 2>/dev/null || true
        broker=""
    done
done

echo
echo "wrk -t1 -c100 -d${seconds}s, $rounds rounds, workers: ${WORKERS:-one per CPU}; $(nproc) CPUs"
python3 - "$results" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (bin, scenario) -> round -> fields
for line in open(sys.argv[1]):
    _, bin, scenario, round_, rps, p99, user, system, others, idle, steal = line.split()
    runs[(bin, scenario)][round_] = dict(rps=float(rps), p99=int(p99) / 1000, broker=float(user) + float(system),
                                         user=float(user), others=float(others), steal=float(steal))
med = statistics.median
print("| binary | scenario | req/s (median) | p99 (median) | broker CPU / request | of it user | rest of the machine / request | vs its no-op (median of rounds) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (bin, scenario), by_round in runs.items():
    rows = list(by_round.values())
    ping = runs.get((bin, "ping"), {})
    ratios = [r["rps"] / ping[k]["rps"] for k, r in by_round.items() if k in ping]
    print(f"| {bin} | {scenario} | {med(r['rps'] for r in rows) / 1000:.1f} k | {med(r['p99'] for r in rows):.2f} ms "
          f"| {med(r['broker'] for r in rows):.2f} µs | {med(r['user'] for r in rows):.2f} µs "
          f"| {med(r['others'] for r in rows):.2f} µs | {med(ratios):.0%} |")
EOF
