#!/usr/bin/env bash
# Property-based check of the HTTP API against its own OpenAPI document: schemathesis generates
# requests from GET /openapi.json of a real `ferrymq serve` and checks that no answer is a 5xx,
# that every status and body is one the document lists, and that a request the document calls
# valid is accepted (the schema is no looser than the server).
#
#   crates/ferrymq-http/tests/schemathesis.sh [ferrymq binary] [seconds]
#
# The binary defaults to target/debug/ferrymq (built if missing); the run is bounded to
# `seconds` (default 120) of generation. The broker listens on free loopback ports with its own
# data dir; schemathesis lives in a venv under target/ (created once, then reused). The streaming
# routes (Server-Sent Events, WebSocket) are left out: they answer with a stream that does not
# end, which a request-response checker cannot judge; tests/http_consume.rs covers them. One
# worker: requests are sequential, so the run checks the API, not races between a delete and a
# publish of the same topic.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=${1:-target/debug/ferrymq}
seconds=${2:-120}
version=4.32.5
venv=target/schemathesis-venv
if [ ! -x "$bin" ]; then
    cargo build -p ferrymq
fi
if [ ! -x "$venv/bin/schemathesis" ] || ! "$venv/bin/schemathesis" --version | grep -q "$version"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$version"
fi

work=$(mktemp -d)
broker=""
cleanup() {
    if [ -n "$broker" ]; then
        kill "$broker" 2>/dev/null || true
        wait "$broker" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# With an admin user: the generated requests add users (which would close an open broker to the
# rest of the run), so the run authenticates from the start, with an admin's API token. A token,
# not a password: schemathesis would take the user name of Basic credentials for the `{user}` of
# the generated requests, and revoke its own rights or change its own password.
admin=schemathesis-admin
password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
printf '%s\n' "$password" >"$work/admin-password"
"$bin" serve --tcp-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --data-dir "$work/data" \
    --admin-user "$admin" --admin-password-file "$work/admin-password" \
    --log warn,ferrymq=info 2>"$work/serve.log" &
broker=$!
# The HTTP listener answers 503 while the broker starts ("HTTP answering while the broker
# starts ... http="): wait for the line that says it serves.
for _ in $(seq 300); do
    grep -q 'serving HTTP' "$work/serve.log" && break
    kill -0 "$broker" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.1
done
addr=$(grep 'serving HTTP' "$work/serve.log" | grep -o 'http=[0-9.:]*' | head -1 | cut -d= -f2)
[ -n "$addr" ] || { echo "the broker did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }

# A topic and a subscription for the generated requests to find, so that more of them reach the
# handlers' own checks rather than stop at 404.
basic="Authorization: Basic $(printf '%s:%s' "$admin" "$password" | base64 -w0)"
token=$(curl -sf -X POST "http://$addr/users/$admin/tokens" -H "$basic" \
    -H 'content-type: application/json' -d '{"name": "schemathesis"}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')
credentials="Authorization: Bearer $token"
curl -sf -X POST "http://$addr/topics" -H "$credentials" -H 'content-type: application/json' \
    -d '{"name": "orders"}' >/dev/null
curl -sf -X POST "http://$addr/topics/orders/messages" -H "$credentials" -d 'one' >/dev/null
curl -sf -X POST "http://$addr/topics/orders/subscriptions/billing/poll?wait_ms=0" \
    -H "$credentials" >/dev/null

# The failures accepted: schema-valid requests the server refuses with a documented 400 for a rule
# no static schema can state (docs/http.md, "Routes"): a partition the topic does not have,
# `max_messages` below `partitions` (or a skip-damaged request's), a requeue range's `last` below
# its `first`, `ordered` with `auto_ack`, a page token the listing did not hand out, a token expiry
# already past; a revoke of a grant the user does not hold (the pattern is named, to catch a
# mistyped one); a login to this broker, which has no users to log in as. Anything else fails the
# run. A baseline
# entry covers its operation's 400s to valid data as a whole (schemathesis keys it by operation,
# check and status), so tests/http_api.rs asserts the accepted edge cases one by one.
baseline=$PWD/crates/ferrymq-http/tests/schemathesis-baseline.json
schemathesis=$PWD/$venv/bin/schemathesis
status=0
# From the scratch directory: schemathesis keeps its cache (.schemathesis/) where it runs.
cd "$work"
timeout $((seconds + 60)) "$schemathesis" run "http://$addr/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,positive_data_acceptance \
    --exclude-path-regex '/(stream|ws)$' \
    --phases examples,coverage,fuzzing \
    --max-time "$seconds" \
    --request-timeout 10 \
    --header "$credentials" \
    --workers 1 \
    --seed 1 \
    --suppress-health-check all \
    --baseline "$baseline" ${SCHEMATHESIS_BASELINE_UPDATE:+--baseline-update} || status=$?
if ! kill -0 "$broker" 2>/dev/null; then
    echo "the broker exited during the run:" >&2
    tail -50 "$work/serve.log" >&2
    exit 1
fi
if grep -q 'panicked' "$work/serve.log"; then
    echo "the broker panicked:" >&2
    grep -A5 'panicked' "$work/serve.log" >&2
    exit 1
fi
exit "$status"
