# The HTTP benchmarks' workload, shared by bench/http_targets.sh and bench/http_ab.sh so that an
# A/B measures exactly the requests the targets are measured with. Sourced, not run.

# The two topics: one in memory (bounded far above what a run publishes), one on disk with
# fsync=always.
http_memory_topic='{"name":"bench-mem","storage":"memory","max_messages":100000000,"max_bytes":17179869184}'
http_disk_topic='{"name":"bench-disk","storage":"disk","fsync":"always"}'

# 100 bytes of request body: JSON ({"body":"xxx..."}) and raw.
http_json_body=$(python3 -c 'print("{\"body\":\"" + "x" * (100 - 11) + "\"}", end="")')
http_raw_body=$(python3 -c 'print("x" * 100, end="")')
[ ${#http_json_body} -eq 100 ] && [ ${#http_raw_body} -eq 100 ]

# Creates both topics on the broker at base URL $1, or only the memory one with $2 = memory-only.
http_create_topics() { # base [memory-only]
    curl -sf -X POST "$1/topics" -H 'content-type: application/json' -d "$http_memory_topic" >/dev/null
    [ "${2:-}" = memory-only ] && return 0
    curl -sf -X POST "$1/topics" -H 'content-type: application/json' -d "$http_disk_topic" >/dev/null
}

# Writes wrk scripts ping.lua, json.lua and raw.lua into $1, each ending with the Lua in $2 (a
# `done` callback; no per-response callback, which would cost the load generator more than the
# server).
http_wrk_scripts() { # dir done-lua
    printf 'wrk.method = "GET"\n%s\n' "$2" >"$1/ping.lua"
    printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n%s\n' \
        "'$http_json_body'" "$2" >"$1/json.lua"
    printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/octet-stream"\nwrk.body = %s\n%s\n' \
        "'$http_raw_body'" "$2" >"$1/raw.lua"
}
