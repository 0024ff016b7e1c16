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

# --- a cluster of three nodes (bench/peers/cluster) -----------------------------------------------
# Three nodes on loopback sharing one epmd of their own and one Erlang cookie (one HOME), each
# with its own node name, AMQP and distribution ports, data and logs; nodes 2 and 3 join node 1
# with `rabbitmqctl join_cluster`. Sets rabbit_nodes (names), rabbit_ports (AMQP ports),
# rabbit_beams (the Erlang VMs' pids, what kill -9 hits), rabbit_envs (each node's environment,
# one string per node, split on spaces: no path here holds one).
rabbit_nodes=()
rabbit_ports=()
rabbit_beams=()
rabbit_envs=()

rabbit_ctl() { # node-index args...
    local i=$1
    shift
    # shellcheck disable=SC2086 # the environment, split on purpose
    env ${rabbit_envs[i]} timeout 120 "$rabbit_bin/rabbitmqctl" -n "${rabbit_nodes[i]}" "$@"
}

rabbit_await() { # node-index log: waits (3 minutes at most) until the node serves
    local i=$1 log=$2
    for _ in $(seq 90); do
        rabbit_ctl "$i" await_startup >/dev/null 2>&1 && return 0
        sleep 2
    done
    tail -30 "$log" >&2
    return 1
}

rabbit_cluster_start() { # dir
    local dir=$1 epmd_port i
    epmd_port=$(free_port)
    mkdir -p "$dir/home"
    epmd -port "$epmd_port" -address 127.0.0.1 &
    started+=("$!")
    rabbit_nodes=() rabbit_ports=() rabbit_beams=() rabbit_envs=()
    for i in 1 2 3; do
        local d=$dir/n$i port dist
        mkdir -p "$d/mnesia" "$d/log"
        port=$(free_port)
        dist=$(free_port)
        printf 'listeners.tcp.default = 127.0.0.1:%s\n' "$port" >"$d/rabbitmq.conf"
        echo '[].' >"$d/enabled_plugins"
        : >"$d/rabbitmq-env.conf"
        rabbit_nodes[i]="ferrymq-peers-$$-$i@localhost"
        rabbit_ports[i]=$port
        rabbit_envs[i]="HOME=$dir/home RABBITMQ_NODENAME=${rabbit_nodes[i]} RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf RABBITMQ_PID_FILE=$d/rabbitmq.pid ERL_EPMD_PORT=$epmd_port"
    done
    # Node 1 first (it writes the cookie the others read), then 2 and 3 together.
    for i in 1 2 3; do
        # shellcheck disable=SC2086
        env ${rabbit_envs[i]} RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
            "$rabbit_bin/rabbitmq-server" >"$dir/n$i/server.log" 2>&1 &
        started+=("$!")
        if [ "$i" = 1 ]; then rabbit_await 1 "$dir/n1/server.log" || return 1; fi
    done
    for i in 2 3; do
        rabbit_await "$i" "$dir/n$i/server.log" || return 1
        rabbit_ctl "$i" stop_app >/dev/null
        rabbit_ctl "$i" join_cluster "${rabbit_nodes[1]}" >/dev/null
        rabbit_ctl "$i" start_app >/dev/null
    done
    for i in 1 2 3; do
        rabbit_await "$i" "$dir/n$i/server.log" || return 1
        rabbit_beams[i]=$(rabbit_ctl "$i" eval 'os:getpid().' | tr -dc 0-9)
    done
    local running
    running=$(rabbit_ctl 1 cluster_status --formatter json |
        python3 -c 'import json, sys; print(len(json.load(sys.stdin)["running_nodes"]))')
    [ "$running" = 3 ] || { echo "RabbitMQ cluster: $running nodes running, not 3" >&2; return 1; }
}

# Stops every node still running with `rabbitmqctl stop`; the caller stops the pids in `started`.
rabbit_cluster_stop() {
    local i
    for i in "${!rabbit_nodes[@]}"; do
        if kill -0 "${rabbit_beams[i]:-0}" 2>/dev/null; then
            rabbit_ctl "$i" stop >/dev/null 2>&1 || true
        fi
    done
    rabbit_nodes=() rabbit_beams=()
}
