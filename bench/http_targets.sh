#!/usr/bin/env bash
# HTTP API targets: requests/s and p99 of a no-op (`GET /ping`) and of publishing one 100 B JSON
# message per request to a memory topic and to a disk topic (fsync=always), 100 keep-alive
# connections, against a broker this script starts on free loopback ports with a temporary data
# dir. Each scenario runs `runs` times, interleaved; medians are printed. Also a raw (non-JSON)
# 100 B body to the memory topic. Stops only the broker it started.
# In the same rounds, NSQ 1.3 (nsqd, the reference of the targets, built once from the Go module
# proxy into target/peers-bin/) answers `GET /ping` and `POST /pub` with the same 100 B body, so
# that "1.5x NSQ's /pub" is measured on the machine at hand; NSQ=0 leaves it out. A second
# broker with one worker thread (`--worker-threads 1`, the setting for a small host that also runs
# its clients) answers the no-op and the JSON memory publish in the same rounds; ONE_WORKER=0
# leaves it out.
#   bench/http_targets.sh [runs] [seconds] [connections] [load-generator threads]
#   FERRYMQ_BIN=path/to/ferrymq bench/http_targets.sh ...   (skip the build)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
seconds=${2:-10}
connections=${3:-100}
threads=${4:-1}

if ! command -v wrk >/dev/null 2>&1; then
    echo "installing wrk (apt-get)..." >&2
    apt-get install -y wrk >/dev/null 2>&1 || sudo apt-get install -y wrk >/dev/null 2>&1 || {
        echo "cannot install wrk: install it (apt-get install wrk) and run again" >&2
        exit 1
    }
fi

# FERRYMQ_BIN: a ferrymq binary to run instead of building target/release/ferrymq.
if [ -n "${FERRYMQ_BIN:-}" ]; then
    bin=$FERRYMQ_BIN
else
    cargo build --release -q -p ferrymq
    bin=target/release/ferrymq
fi
# shellcheck source=peers/common.sh
. bench/peers/common.sh
# shellcheck source=peers/nsq.sh
. bench/peers/nsq.sh
# shellcheck source=http_common.sh
. bench/http_common.sh
with_nsq=${NSQ:-1}
if [ "$with_nsq" != 0 ] && ! nsq_build; then
    echo "could not build nsqd $nsq_version (see target/peers-bin/nsqd-$nsq_version.log): NSQ left out" >&2
    with_nsq=0
fi

data=$(mktemp -d)
log="$data/serve.log"
$bin serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$data/data" \
    --log warn,ferrymq=info 2>"$log" &
broker=$!
with_one=${ONE_WORKER:-1}
one_log="$data/serve-one.log"
if [ "$with_one" != 0 ]; then
    $bin serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$data/data-one" \
        --worker-threads 1 --log warn,ferrymq=info 2>"$one_log" &
    one=$!
fi
stop() {
    kill $broker ${one:-} ${nsq_pid:-} 2>/dev/null || true
    wait $broker ${one:-} ${nsq_pid:-} 2>/dev/null || true
    rm -rf "$data"
}
trap stop EXIT
if [ "$with_nsq" != 0 ]; then
    nsq_start "$data/nsq"
    # The topic exists before the first run, as FerryMQ's do.
    curl -sf -X POST "http://$nsq_http/topic/create?topic=bench" >/dev/null
fi
wait_log "$log" "http="
http=$(grep -o 'http=[0-9.:]*' "$log" | head -1 | cut -d= -f2)
base="http://$http"
http_create_topics "$base"
if [ "$with_one" != 0 ]; then
    wait_log "$one_log" "http="
    one_base="http://$(grep -o 'http=[0-9.:]*' "$one_log" | head -1 | cut -d= -f2)"
    http_create_topics "$one_base" memory-only
fi

# wrk scripts (bench/http_common.sh), each ending with a JSON summary line (errors count non-2xx
# replies too).
http_wrk_scripts "$data" '
done = function(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout
  io.write(string.format("{\"rps\": %.1f, \"p50_us\": %d, \"p99_us\": %d, \"requests\": %d, \"errors\": %d}\n",
      summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
      summary.requests, errors))
end'

# Each run reports the hypervisor's steal over it (steal_pct, bench/peers/common.sh).
run() { # round name script url
    local before after line
    before=$(cpu_ticks)
    line=$(wrk -t"$threads" -c"$connections" -d"${seconds}s" --latency -s "$data/$3.lua" "$4" | grep "^{")
    after=$(cpu_ticks)
    echo "$line" | sed "s#^{#{\"scenario\": \"$2\", \"round\": $1, \"steal_pct\": $(steal_pct "$before" "$after"), #"
}

results="$data/results.jsonl"
for round in $(seq "$runs"); do
    run "$round" "GET /ping (no-op)" ping "$base/ping" >>"$results"
    run "$round" "POST JSON 100 B, memory topic" json "$base/topics/bench-mem/messages" >>"$results"
    run "$round" "POST raw 100 B, memory topic" raw "$base/topics/bench-mem/messages" >>"$results"
    run "$round" "POST JSON 100 B, disk topic fsync=always" json "$base/topics/bench-disk/messages" >>"$results"
    if [ "$with_one" != 0 ]; then
        run "$round" "GET /ping (no-op), 1 worker" ping "$one_base/ping" >>"$results"
        run "$round" "POST JSON 100 B, memory topic, 1 worker" json "$one_base/topics/bench-mem/messages" >>"$results"
    fi
    if [ "$with_nsq" != 0 ]; then
        run "$round" "NSQ GET /ping (no-op)" ping "http://$nsq_http/ping" >>"$results"
        run "$round" "NSQ POST /pub 100 B" raw "http://$nsq_http/pub?topic=bench" >>"$results"
    fi
done

echo "wrk -t$threads -c$connections -d${seconds}s, $runs runs each, interleaved; $(nproc) CPUs; commit $(git rev-parse --short HEAD)"
[ "$with_nsq" != 0 ] && echo "NSQ: nsqd $nsq_version ($("$nsq_bin" --version 2>&1 | head -1)), its defaults"
python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
order = []
for r in rows:
    if r["scenario"] not in order:
        order.append(r["scenario"])
# "vs no-op": each round's req/s over the no-op's of the same round, the median of those (the
# machine's speed drifts between rounds; within one it is closer to even).
# Each system's publishes are compared with its own no-op; FerryMQ's also with NSQ's /pub.
def per_round(scenario):
    return {r["round"]: r["rps"] for r in rows if r["scenario"] == scenario}
noop = {
    "ferrymq": per_round("GET /ping (no-op)"),
    "one": per_round("GET /ping (no-op), 1 worker"),
    "nsq": per_round("NSQ GET /ping (no-op)"),
}
def system(scenario):
    return "nsq" if scenario.startswith("NSQ ") else "one" if scenario.endswith(", 1 worker") else "ferrymq"
nsq_pub = per_round("NSQ POST /pub 100 B")
def ratio(rs, by):
    pairs = [r["rps"] / by[r["round"]] for r in rs if by.get(r["round"])]
    return statistics.median(pairs) if pairs else None
print("| scenario | req/s (median) | runs | p50 | p99 (median) | errors | steal (median) | vs its no-op | vs NSQ /pub |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for s in order:
    rs = [r for r in rows if r["scenario"] == s]
    nsq = system(s) == "nsq"
    rps = statistics.median(r["rps"] for r in rs)
    p50 = statistics.median(r["p50_us"] for r in rs)
    p99 = statistics.median(r["p99_us"] for r in rs)
    errors = sum(r["errors"] for r in rs)
    steal = statistics.median(r["steal_pct"] for r in rs)
    vs_noop = ratio(rs, noop[system(s)])
    vs_nsq = None if nsq or "no-op" in s else ratio(rs, nsq_pub)
    runs = ", ".join(f"{r['rps']/1000:.1f} k" for r in rs)
    cells = [f"{vs_noop:.0%}" if vs_noop is not None else "", f"{vs_nsq:.2f}x" if vs_nsq is not None else ""]
    print(f"| {s} | {rps/1000:.1f} k | {runs} | {p50/1000:.2f} ms | {p99/1000:.2f} ms | {errors} | {steal:.1f} % | {cells[0]} | {cells[1]} |")
EOF
