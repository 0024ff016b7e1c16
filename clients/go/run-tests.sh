#!/usr/bin/env bash
# Runs the Go client's whole test suite against the real broker.
#
# Needs the Go toolchain (1.22 or later); modules come through the Go module proxy. Runs go vet
# and staticcheck (pinned, installed into .bin/) before the tests. The broker is
# $FERRYMQ_BIN, else target/release/ferrymq, else target/debug/ferrymq (see broker_test.go).
# With cargo on the PATH it builds the Rust bus peer of the cross-language test (the example
# bus_peer of crates/ferrymq-client, a debug build); without it that test is skipped.
# Ends with a `go: N passed, N failed` line (top-level tests and examples) for
# scripts/test-all.sh. Extra arguments go to go test, e.g. ./run-tests.sh -run Vectors
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
go mod download
go vet ./...
# staticcheck, pinned, installed into .bin/ on first use: release 2026.2.2 is the module version
# v0.8.2 (the module proxy knows it by the latter only).
staticcheck_module=v0.8.2
staticcheck_release=2026.2.2
if [[ "$(.bin/staticcheck -version 2>/dev/null)" != "staticcheck $staticcheck_release "* ]]; then
    GOBIN="$here/.bin" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_module"
fi
.bin/staticcheck ./...
if command -v cargo >/dev/null; then
    (cd ../.. && cargo build --quiet --locked -p ferrymq-client --example bus_peer) ||
        echo "note: the Rust bus peer did not build; its cross-language test will be skipped"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
go test ./... -count=1 -v -timeout 600s "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -c '^--- PASS' "$log" || true)
failed=$(grep -c '^--- FAIL' "$log" || true)
echo "go: $passed passed, $failed failed"
exit "$rc"
