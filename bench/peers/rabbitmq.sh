# RabbitMQ for the peer scripts (sourced by bench/peers/run and bench/peers/tail): a node of its
# own on free loopback ports, with its data, logs and Erlang cookie under a directory of the
# caller, and an epmd of its own on its own port, so that stopping them touches nothing else.
# The caller sources bench/peers/common.sh (for `free_port`) and defines the array `started` (pids it stops on exit); the epmd and
# the node's pid are added to it.

rabbit_bin=/usr/lib/rabbitmq/bin
rabbit_node=""
rabbit_env=()
rabbit_port=""
rabbit_pid=""

# Starts the node and waits until it serves (2 minutes at most); sets rabbit_port, rabbit_pid.
rabbit_start() { # dir
    local dir=$1 dist_port epmd_port up
    mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
    rabbit_port=$(free_port)
    dist_port=$(free_port)
    epmd_port=$(free_port)
    local name="ferrymq-peers-$$@localhost"
    printf 'listeners.tcp.default = 127.0.0.1:%s\n' "$rabbit_port" >"$dir/rabbitmq.conf"
    echo '[].' >"$dir/enabled_plugins"
    : >"$dir/rabbitmq-env.conf"
    rabbit_env=(
        HOME="$dir/home"
        RABBITMQ_NODENAME="$name"
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
        RABBITMQ_NODE_PORT="$rabbit_port"
        RABBITMQ_DIST_PORT="$dist_port"
        RABBITMQ_MNESIA_BASE="$dir/mnesia"
        RABBITMQ_LOG_BASE="$dir/log"
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
        RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
        RABBITMQ_PID_FILE="$dir/rabbitmq.pid"
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
        ERL_EPMD_PORT="$epmd_port"
    )
    epmd -port "$epmd_port" -address 127.0.0.1 &
    started+=("$!")
    env "${rabbit_env[@]}" "$rabbit_bin/rabbitmq-server" >"$dir/server.log" 2>&1 &
    rabbit_pid=$!
    started+=("$rabbit_pid")
    rabbit_node=$name
    # await_startup gives up at once while the node is not reachable yet: ask again.
    up=no
    for _ in $(seq 60); do
        if env "${rabbit_env[@]}" timeout 60 "$rabbit_bin/rabbitmqctl" -n "$name" \
            await_startup >/dev/null 2>&1; then
            up=yes
            break
        fi
        kill -0 "$rabbit_pid" 2>/dev/null || break
        sleep 2
    done
    if [ "$up" != yes ]; then
        tail -30 "$dir/server.log" >&2
        return 1
    fi
}

# The running node's version and its Erlang/OTP release, for the notes.
rabbit_version() {
    local version
    version=$(env "${rabbit_env[@]}" "$rabbit_bin/rabbitmqctl" -n "$rabbit_node" version 2>/dev/null \
        || dpkg-query -W -f '${Version}' rabbitmq-server)
    echo "$version (Erlang/OTP $(erl -noshell -eval 'io:put_chars(erlang:system_info(otp_release)), halt().' 2>/dev/null || echo '?'))"
}

# Stops the node with `rabbitmqctl stop`, which lets it shut down in order; the caller then stops
# the pids in `started` (the epmd, and the node's start script if it is still there).
rabbit_stop() {
    if [ -n "$rabbit_node" ]; then
        env "${rabbit_env[@]}" timeout 60 "$rabbit_bin/rabbitmqctl" -n "$rabbit_node" stop \
            >/dev/null 2>&1 || true
        rabbit_node=""
    fi
}
