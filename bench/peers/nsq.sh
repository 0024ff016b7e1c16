# NSQ for the HTTP benchmark (sourced by bench/http_targets.sh): nsqd, the reference of the HTTP
# API's targets, built once from the Go module proxy into target/peers-bin/ and started on free
# loopback ports with a data directory of the caller's. The caller sources bench/peers/common.sh
# (for `free_port`).

nsq_version=1.3.0
nsq_bin=""
nsq_http=""
nsq_pid=""

# Sets nsq_bin to nsqd $nsq_version, building it if target/peers-bin/ has none yet. Debian has no
# nsqd package. `go install` cannot be used: it asks the proxy for the module's version list,
# which the proxy refuses for this module, while the release itself downloads.
nsq_build() {
    local bin_dir=$PWD/target/peers-bin go dir work log
    nsq_bin=$bin_dir/nsqd-$nsq_version
    [ -x "$nsq_bin" ] && return 0
    go=$(command -v go || echo /usr/local/go/bin/go)
    log=$bin_dir/nsqd-$nsq_version.log
    mkdir -p "$bin_dir"
    if ! [ -x "$go" ]; then
        echo "no Go toolchain ($go)" >"$log"
        return 1
    fi
    work=$(mktemp -d)
    # Outside any module, `go mod download` of an exact version fetches the release's source.
    if dir=$(cd "$work" && timeout 600 "$go" mod download -json "github.com/nsqio/nsq@v$nsq_version" 2>"$log" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') \
        && (cd "$dir" && timeout 1200 "$go" build -o "$work/nsqd" ./apps/nsqd) >>"$log" 2>&1; then
        mv "$work/nsqd" "$nsq_bin"
        rm -rf "$work"
        return 0
    fi
    rm -rf "$work"
    return 1
}

# Starts nsqd (its defaults, on loopback) and waits until it serves HTTP; sets nsq_http, nsq_pid.
nsq_start() { # dir
    local dir=$1 tcp_port http_port
    mkdir -p "$dir/data"
    tcp_port=$(free_port)
    http_port=$(free_port)
    "$nsq_bin" --tcp-address "127.0.0.1:$tcp_port" --http-address "127.0.0.1:$http_port" \
        --data-path "$dir/data" --log-level warn >"$dir/nsqd.log" 2>&1 &
    nsq_pid=$!
    nsq_http=127.0.0.1:$http_port
    for _ in $(seq 200); do
        curl -sf "http://$nsq_http/ping" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    cat "$dir/nsqd.log" >&2
    return 1
}
