# Helpers shared by the benchmark scripts that start servers of their own (sourced by
# bench/peers/run, bench/peers/tail, bench/peers/sends/run, bench/peers/hops/run and
# bench/http_targets.sh).

# A free TCP port on loopback.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (10 s at most) until a server's log holds `pattern`; prints the log if it never does.
wait_log() { # file pattern
    for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    cat "$1" >&2
    return 1
}

# The machine's CPU time so far, in ticks: "steal total" (steal: the hypervisor ran something else).
cpu_ticks() {
    awk '/^cpu /{total = 0; for (i = 2; i <= NF; i++) total += $i; print $9, total}' /proc/stat
}

# The hypervisor's share of the machine's CPU time between two `cpu_ticks`, in percent (one
# decimal): a run whose vCPUs were taken away is slower for reasons of its own.
steal_pct() { # before after
    printf '%s %s\n' "$1" "$2" | awk '{ v = 0; if ($4 > $2) v = 100 * ($3 - $1) / ($4 - $2); printf "%.1f", v }'
}
