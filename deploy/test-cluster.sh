#!/usr/bin/env bash
# Three FerryMQ containers as one cluster, as compose.cluster.yaml runs them (its own volume,
# read-only root and no capabilities for each node, peers named by host name): a node alone is
# not ready; all three become ready; a replicated topic takes publishes and serves a
# subscription; kill -9 of the container leading a partition, publishing and consuming go on;
# the container started again is ready only once it caught up, and its groups' applied indexes
# reach their leaders'; SIGTERM stops every node with exit 0.
#
# Run by deploy/test-container.sh, which builds the image and the static binary and sets
# FERRYMQ_IMAGE, FERRYMQ_BINARY_PATH, PM_ROOT, PM_RUNROOT and CONTAINERS_CONF. Every address is
# loopback: the containers share the host's network, each node on its own 127.0.0.1 ports,
# and the names node1..node3 resolve to 127.0.0.1 through each container's /etc/hosts.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${FERRYMQ_IMAGE:?run through deploy/test-container.sh}"
: "${FERRYMQ_BINARY_PATH:?run through deploy/test-container.sh}"
: "${PM_ROOT:?run through deploy/test-container.sh}" "${PM_RUNROOT:?}"
bin=$FERRYMQ_BINARY_PATH

fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pm() { podman --root "$PM_ROOT" --runroot "$PM_RUNROOT" --storage-driver vfs --runtime runc "$@"; }
passed=0
pass() { echo "ok: $*"; passed=$((passed + 1)); }

work=$(mktemp -d /tmp/ferrymq-cluster.XXXXXX)
password=cluster-test-admin-pw
declare -A tcp http peer
for i in 1 2 3; do
    tcp[$i]=$(free_port); http[$i]=$(free_port); peer[$i]=$(free_port)
done
peers="1=node1:${peer[1]},2=node2:${peer[2]},3=node3:${peer[3]}"
name() { echo "ferrymq-cluster-$$-$1"; }
cleanup() {
    for i in 1 2 3; do
        pm rm -f -t 0 "$(name "$i")" >/dev/null 2>&1 || true
        pm volume rm -f "$(name "$i")" >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

logs() { for i in 1 2 3; do echo "--- node $i" >&2; pm logs --tail 30 "$(name "$i")" >&2 2>&1 || true; done; }

start_node() {
    local i=$1
    pm run -d --name "$(name "$i")" --network host \
        --add-host node1:127.0.0.1 --add-host node2:127.0.0.1 --add-host node3:127.0.0.1 \
        --read-only --cap-drop ALL --security-opt no-new-privileges \
        -v "$(name "$i"):/data" \
        -e FERRYMQ_NODE_ID="$i" -e FERRYMQ_CLUSTER_ID=ferrymq \
        -e FERRYMQ_CLUSTER_ADDR="127.0.0.1:${peer[$i]}" -e FERRYMQ_PEERS="$peers" \
        -e FERRYMQ_TCP_ADDR="127.0.0.1:${tcp[$i]}" -e FERRYMQ_HTTP_ADDR="127.0.0.1:${http[$i]}" \
        -e FERRYMQ_ADMIN_PASSWORD="$password" \
        "$FERRYMQ_IMAGE" >/dev/null
}

# GET path on node i's HTTP listener as the admin: the body, and the status in $work/status.
get() {
    python3 - "http://127.0.0.1:${http[$1]}$2" "admin:$password" "$work/status" <<'PY'
import base64, sys, urllib.error, urllib.request
url, credentials, status_file = sys.argv[1:]
request = urllib.request.Request(
    url, headers={"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()})
try:
    with urllib.request.urlopen(request, timeout=5) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read()
except OSError:
    status, body = 0, b""
open(status_file, "w").write(str(status))
sys.stdout.write(body.decode())
PY
}

# Polls (at most `limit` seconds) until node i answers /readyz 200.
wait_ready() {
    local i=$1 limit=$2 started
    started=$(date +%s)
    while (( $(date +%s) - started < limit )); do
        if "$bin" healthcheck --http-addr "127.0.0.1:${http[$i]}" >/dev/null 2>&1; then
            echo "node $i ready after $(( $(date +%s) - started )) s"
            return 0
        fi
        sleep 0.1
    done
    get "$i" /readyz >&2; echo >&2
    logs
    fail "node $i not ready within $limit s"
}

# Node 1 alone serves but is not ready: once its recovery is done (`starting` before), /readyz
# says it has no metadata leader to join, and never 200.
start_node 1
for _ in $(seq 1 300); do
    alone=$(get 1 /readyz)
    [[ $(cat "$work/status") == 200 ]] && fail "node 1 alone is ready: $alone"
    grep -q '"cluster: the metadata group' <<<"$alone" && break
    sleep 0.1
done
grep -q '"cluster: the metadata group' <<<"$alone" || { logs; fail "node 1 alone: $alone"; }
[[ $(cat "$work/status") == 503 ]] || fail "node 1 alone answers /readyz $(cat "$work/status")"
pass "a node alone serves but is not ready ($alone)"

start_node 2
start_node 3
for i in 1 2 3; do wait_ready "$i" 60; done
for i in 1 2 3; do pm healthcheck run "$(name "$i")" || fail "node $i's HEALTHCHECK"; done
pass "three nodes joined: /readyz and the image's HEALTHCHECK pass on each"

export FERRYMQ_ADDR="127.0.0.1:${tcp[1]},127.0.0.1:${tcp[2]},127.0.0.1:${tcp[3]}"
export FERRYMQ_USER=admin FERRYMQ_PASSWORD=$password
"$bin" topic create events --partitions 2 --replicas 3 >/dev/null
touch "$work/published" "$work/consumed"

# Publishes `count` lines tagged `tag` to each partition (`ferrymq pub` goes to the leader of
# the partition it names) under the dedup id `tag-pN`, retrying (bounded) while a leader is
# elected: a retried batch stores each line once.
publish() {
    local tag=$1 count=$2 partition attempt
    for partition in 0 1; do
        seq 1 "$count" | sed "s/^/$tag-p$partition-/" > "$work/batch"
        for attempt in $(seq 1 61); do
            (( attempt <= 60 )) || { logs; fail "publishing $tag to partition $partition"; }
            if "$bin" pub events --partition "$partition" --dedup-id "$tag-p$partition" -q \
                < "$work/batch" >/dev/null 2>"$work/pub.err"; then
                cat "$work/batch" >> "$work/published"
                break
            fi
            echo "publish $tag to $partition, attempt $attempt: $(tail -1 "$work/pub.err")" >&2
            sleep 0.5
        done
    done
}

# Consumes until `total` distinct messages have been read through the subscription, retrying
# (bounded) while a leader is elected; a message acked by no one comes again, so duplicates
# are allowed and only the distinct count matters.
consume_until() {
    local total=$1 have
    for attempt in $(seq 1 60); do
        have=$(sort -u "$work/consumed" | wc -l)
        (( have >= total )) && return 0
        "$bin" sub events --subscription billing --from earliest --count $((total - have)) \
            --timeout 10s >> "$work/consumed" 2>"$work/sub.err" \
            || echo "consume, attempt $attempt: $(tail -1 "$work/sub.err")" >&2
    done
    logs
    fail "consumed $(sort -u "$work/consumed" | wc -l) of $total"
}

publish a 50
consume_until 40
pass "publish and consume through the cluster"

# The leader of events/0, as node 1 sees it.
leader=$(get 1 /node | python3 -c '
import json, sys
groups = json.load(sys.stdin)["cluster"]["groups"]
print(next(g["leader"] for g in groups if g["topic"] == "events" and g["partition"] == 0))')
[[ $leader =~ ^[123]$ ]] || fail "no leader of events/0: $leader"
pm kill --signal KILL "$(name "$leader")" >/dev/null
pass "kill -9 of node $leader, the leader of events/0"

publish b 50
consume_until 120
pass "publishing and consuming go on with node $leader down"

pm start "$(name "$leader")" >/dev/null
wait_ready "$leader" 60
pm healthcheck run "$(name "$leader")" || fail "node $leader's HEALTHCHECK after its restart"
publish c 25

# Every group on the restarted node reaches the applied index of its leader (the metadata
# group and both partitions), as GET /node on each says.
caught_up() {
    local nodes=()
    for i in 1 2 3; do nodes+=("$(get "$i" /node)"); done
    python3 - "$leader" "${nodes[@]}" <<'PY'
import json, sys
back = int(sys.argv[1])
nodes = {n["cluster"]["node_id"]: n["cluster"] for n in map(json.loads, sys.argv[2:])}
key = lambda g: (g["topic"], g["partition"])
mine = nodes[back]["groups"]
assert {key(g) for g in mine} >= {(None, None), ("events", 0), ("events", 1)}, mine
for group in mine:
    leader = group["leader"]
    assert leader is not None, f"no leader: {group}"
    theirs = next(g for g in nodes[leader]["groups"] if key(g) == key(group))
    assert group["applied_index"] >= theirs["applied_index"], (
        f"{key(group)}: applied {group['applied_index']} here, {theirs['applied_index']} on node {leader}")
    assert group["caught_up"], group
print(", ".join(f"{key(g)}: {g['applied_index']}" for g in mine))
PY
}
for attempt in $(seq 1 300); do
    if caught_up > "$work/caught" 2>"$work/caught.err"; then break; fi
    (( attempt < 300 )) || { cat "$work/caught.err" >&2; fail "node $leader never caught up"; }
    sleep 0.1
done
pass "node $leader back: ready, and its groups applied up to their leaders' ($(cat "$work/caught"))"

consume_until 250
sort -u "$work/consumed" > "$work/consumed.set"
sort -u "$work/published" > "$work/published.set"
cmp -s "$work/consumed.set" "$work/published.set" \
    || fail "consumed $(wc -l < "$work/consumed.set") distinct, published $(wc -l < "$work/published.set")"
pass "every one of the 250 published messages consumed"

for i in 1 2 3; do
    pm stop -t 30 "$(name "$i")" >/dev/null
    code=$(pm inspect --format '{{.State.ExitCode}}' "$(name "$i")")
    [[ $code == 0 ]] || { pm logs "$(name "$i")" >&2; fail "node $i exited with $code after SIGTERM"; }
done
pass "SIGTERM stops every node with exit 0"
echo "cluster: $passed passed, 0 failed"
