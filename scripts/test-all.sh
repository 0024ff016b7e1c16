#!/usr/bin/env bash
# Every test of every language, against the real broker: the Rust workspace, then the Python and
# TypeScript clients, the dashboard in a real browser, and the container image. Installs what the
# non-Rust suites need (a Python venv, npm packages, Debian's chromium, podman and runc) the first
# time; later runs reuse them.
#
#     scripts/test-all.sh            # everything
#     FERRYMQ_SKIP=container,ui scripts/test-all.sh   # leave some suites out
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

skip=",${FERRYMQ_SKIP:-},"
results=()
failed_suites=()
total_passed=0
total_failed=0

# Runs one suite, keeps its output, and adds up the counts its runner printed.
run_suite() {
    local name=$1; shift
    if [[ $skip == *",$name,"* ]]; then
        echo "== $name: skipped (FERRYMQ_SKIP)"
        return
    fi
    echo "== $name: $*"
    local log
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local counts
    counts=$(python3 "$repo/scripts/count-results.py" "$log")
    local passed=${counts% *} failed=${counts#* }
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    if [[ $rc -ne 0 ]]; then
        failed_suites+=("$name")
        # A suite that failed without a counted failure still counts as one.
        [[ $failed -eq 0 ]] && total_failed=$((total_failed + 1))
    fi
    results+=("$name: $passed passed, $failed failed (exit $rc)")
    rm -f "$log"
}

apt_install() {
    local missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "note: missing Debian packages ${missing[*]} (not root: not installing)"
        return 0
    fi
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

run_suite rust cargo test --workspace --locked --no-fail-fast

# One static release binary serves every other suite, and is the one the image ships.
echo "== building the static broker for the client, browser and container suites"
deploy/build-static.sh --rootfs || { echo "static build failed"; exit 1; }
export FERRYMQ_BIN=$repo/target/x86_64-unknown-linux-gnu/container/ferrymq-static

run_suite python clients/python/run-tests.sh
run_suite typescript clients/typescript/run-tests.sh
run_suite go clients/go/run-tests.sh
if [[ $skip != *",ui,"* ]]; then apt_install chromium; fi
run_suite ui ui/run-tests.sh
if [[ $skip != *",container,"* ]]; then apt_install podman runc; fi
FERRYMQ_REQUIRE_CONTAINER=${CI:+1} run_suite container deploy/test-container.sh

echo
echo "== results"
for line in "${results[@]}"; do echo "$line"; done
echo "all: $total_passed passed, $total_failed failed"
[[ ${#failed_suites[@]} -eq 0 ]]
