#!/usr/bin/env bash
# Builds the container image from a static binary built on this host and runs it as a user
# would: publish and consume through it, its health check, a SIGTERM stop (exit 0, nothing
# lost), a restart on the same volume; then three containers as one cluster (deploy/test-cluster.sh:
# kill -9 of one, publishing and consuming go on, it comes back and catches up). compose.yaml,
# compose.cluster.yaml and the systemd unit are checked statically first.
#
# Needs podman and runc (Debian: apt-get install podman runc); skips the container part with a
# message when they are missing and FERRYMQ_REQUIRE_CONTAINER is not set. Every network use is
# loopback: the container shares the host's network and listens on 127.0.0.1 ephemeral ports.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

checks_passed=0
pass() { echo "ok: $*"; checks_passed=$((checks_passed + 1)); }

static_checks() {
    # compose.yaml: parses, and keeps the hardening the docs promise.
    local venv=$repo/target/deploy-venv
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    "$venv/bin/python" -c 'import yaml' 2>/dev/null || "$venv/bin/pip" install -q pyyaml
    "$venv/bin/python" - "$repo/compose.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
broker = doc["services"]["ferrymq"]
assert broker["read_only"] is True, "read_only root"
assert broker["cap_drop"] == ["ALL"], "cap_drop ALL"
assert "no-new-privileges:true" in broker["security_opt"], "no-new-privileges"
assert broker["healthcheck"]["test"] == ["CMD", "/ferrymq", "healthcheck"], "health check"
assert any(v.startswith("ferrymq-data:") for v in broker["volumes"]), "named volume"
assert "ferrymq-data" in doc["volumes"], "volume declared"
assert "ferrymq_admin_password" in broker["secrets"], "credentials from a secret"
assert doc["secrets"]["ferrymq_admin_password"]["file"], "secret file"
bench = doc["services"]["bench"]
assert bench["entrypoint"][-1] == "bench", "load-test service runs ferrymq bench"
assert bench["depends_on"]["ferrymq"]["condition"] == "service_healthy"
print("compose.yaml: parsed, hardening and services as documented")
PY
    pass "compose.yaml"

    "$venv/bin/python" - "$repo/compose.cluster.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
nodes = {name: s for name, s in doc["services"].items() if name.startswith("node")}
assert sorted(nodes) == ["node1", "node2", "node3"], sorted(nodes)
peers = None
for name, node in nodes.items():
    env = node["environment"]
    assert env["FERRYMQ_NODE_ID"] == name[4:], (name, "node id")
    assert env["FERRYMQ_CLUSTER_ADDR"] == "0.0.0.0:7090", name
    listed = dict(item.split("=") for item in env["FERRYMQ_PEERS"].split(","))
    assert listed == {str(i): f"node{i}:7090" for i in (1, 2, 3)}, (name, listed)
    assert peers in (None, env["FERRYMQ_PEERS"]), "the same peers everywhere"
    peers = env["FERRYMQ_PEERS"]
    assert env["FERRYMQ_ADMIN_PASSWORD_FILE"] == "/run/secrets/ferrymq_admin_password"
    assert node["volumes"] == [f"{name}-data:/data"], (name, "its own volume")
    assert f"{name}-data" in doc["volumes"], (name, "volume declared")
    assert node["read_only"] is True and node["cap_drop"] == ["ALL"], name
    assert "no-new-privileges:true" in node["security_opt"], name
    assert node["healthcheck"]["test"] == ["CMD", "/ferrymq", "healthcheck"], name
cli = doc["services"]["cli"]
assert cli["environment"]["FERRYMQ_ADDR"] == "node1:7070,node2:7070,node3:7070"
assert all(cli["depends_on"][n]["condition"] == "service_healthy" for n in nodes)
print("compose.cluster.yaml: three nodes, their volumes, peers by service name, health checks")
PY
    pass "compose.cluster.yaml"

    # The systemd unit: systemd-analyze verify, with ExecStart pointed at a real binary.
    if command -v systemd-analyze >/dev/null 2>&1; then
        local unit_dir
        unit_dir=$(mktemp -d)
        sed "s#/usr/local/bin/ferrymq#$binary#" deploy/ferrymq.service > "$unit_dir/ferrymq.service"
        # systemd-analyze reports an unknown or misspelt key as a warning with exit 0, and,
        # outside a booted systemd, may complain about the manager itself: any line naming the
        # unit fails the check, whatever the exit code.
        local out
        out=$(systemd-analyze verify "$unit_dir/ferrymq.service" 2>&1) || true
        if grep -q "ferrymq.service:" <<<"$out"; then
            echo "$out" >&2
            fail "systemd-analyze verify deploy/ferrymq.service"
        fi
        rm -rf "$unit_dir"
        pass "deploy/ferrymq.service verifies"
    else
        echo "skipped: systemd-analyze not installed"
    fi
}

deploy/build-static.sh --rootfs
binary=$repo/target/x86_64-unknown-linux-gnu/container/ferrymq-static
static_checks

if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    if [[ -n "${FERRYMQ_REQUIRE_CONTAINER:-}" ]]; then fail "podman and runc are required"; fi
    echo "skipped: the container test needs podman and runc (apt-get install podman runc)"
    echo "deploy: $checks_passed passed, 0 failed"
    exit 0
fi

work=$(mktemp -d /tmp/ferrymq-container.XXXXXX)
image=localhost/ferrymq-test:latest
name=ferrymq-test-$$
volume=ferrymq-test-data-$$
# crun fails on setrlimit and the cgroup mode in this kind of sandbox: runc, no default ulimits.
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
pm() { podman --root "$work/root" --runroot "$work/runroot" --storage-driver vfs --runtime runc "$@"; }
cleanup() {
    pm rm -f -t 0 "$name" >/dev/null 2>&1 || true
    pm volume rm -f "$volume" >/dev/null 2>&1 || true
    pm rmi -f "$image" >/dev/null 2>&1 || true
    rm -rf "$work" 2>/dev/null || true
}
trap cleanup EXIT

pm build --format docker --build-arg FERRYMQ_BINARY=host --target runtime -t "$image" . >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; fail "podman build"; }
size=$(pm image inspect --format '{{.Size}}' "$image")
echo "image size: $size bytes"
(( size <= 15 * 1024 * 1024 )) || fail "image is $size bytes, over 15 MB"
pass "image built ($size bytes)"

[[ $(pm image inspect --format '{{.Config.User}}' "$image") == "65532:65532" ]] || fail "image user"
pm image inspect --format '{{json .Config.Healthcheck}}' "$image" | grep -q healthcheck || fail "HEALTHCHECK kept"
pass "image runs as 65532 and has a health check"

# Without credentials and without FERRYMQ_INSECURE the image refuses to start, naming both ways out.
tcp=$(free_port); http=$(free_port)
set +e
refusal=$(pm run --rm --network host -e FERRYMQ_TCP_ADDR=0.0.0.0:$tcp -e FERRYMQ_HTTP_ADDR=0.0.0.0:$http "$image" 2>&1)
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "started without credentials"
grep -q "FERRYMQ_INSECURE" <<<"$refusal" || { echo "$refusal" >&2; fail "refusal names FERRYMQ_INSECURE"; }
grep -q "FERRYMQ_ADMIN_PASSWORD" <<<"$refusal" || { echo "$refusal" >&2; fail "refusal names FERRYMQ_ADMIN_PASSWORD"; }
pass "refuses to start without credentials"

start_broker() {
    pm run -d --name "$name" --network host -v "$volume:/data" \
        -e FERRYMQ_TCP_ADDR=127.0.0.1:$tcp -e FERRYMQ_HTTP_ADDR=127.0.0.1:$http \
        -e FERRYMQ_ADMIN_PASSWORD=container-test-admin-pw "$image" >/dev/null
    local started=$(date +%s%N)
    for _ in $(seq 1 200); do
        if "$binary" healthcheck --http-addr 127.0.0.1:$http >/dev/null 2>&1; then
            echo "ready after $(( ($(date +%s%N) - started) / 1000000 )) ms (podman start included)"
            return 0
        fi
        sleep 0.05
    done
    pm logs "$name" >&2 || true
    fail "broker in the container did not become ready"
}
export FERRYMQ_ADDR=127.0.0.1:$tcp FERRYMQ_USER=admin FERRYMQ_PASSWORD=container-test-admin-pw

start_broker
"$binary" topic create orders --partitions 2 >/dev/null
for i in $(seq 1 100); do echo "order-$i"; done | "$binary" pub orders >/dev/null
"$binary" sub orders --subscription billing --from earliest --count 40 --timeout 10s > "$work/first.txt"
[[ $(wc -l < "$work/first.txt") -eq 40 ]] || fail "consumed 40 through the container"
pass "publish and consume through the container"

pm healthcheck run "$name" || fail "the image's HEALTHCHECK"
pass "health check passes"

pm stop -t 30 "$name" >/dev/null
[[ $(pm inspect --format '{{.State.ExitCode}}' "$name") == 0 ]] || { pm logs "$name" >&2; fail "exit code after SIGTERM"; }
pm rm "$name" >/dev/null
pass "SIGTERM stops it with exit 0"

start_broker
"$binary" sub orders --subscription billing --count 60 --timeout 10s > "$work/second.txt"
[[ $(wc -l < "$work/second.txt") -eq 60 ]] || fail "the other 60 after the restart"
sort "$work/first.txt" "$work/second.txt" | uniq | wc -l | grep -qx 100 || fail "all 100 orders, once"
pass "restart on the same volume keeps every message and the subscription's place"

pm stop -t 30 "$name" >/dev/null
pm rm "$name" >/dev/null

# A three-node cluster: deploy/test-cluster.sh, with this image and binary.
export PM_ROOT=$work/root PM_RUNROOT=$work/runroot
FERRYMQ_IMAGE=$image FERRYMQ_BINARY_PATH=$binary deploy/test-cluster.sh | tee "$work/cluster.log"
cluster_passed=$(sed -n 's/^cluster: \([0-9]*\) passed, 0 failed$/\1/p' "$work/cluster.log")
[[ -n $cluster_passed ]] || fail "the three-node cluster scenario"
checks_passed=$((checks_passed + cluster_passed))
echo "deploy: $checks_passed passed, 0 failed"
