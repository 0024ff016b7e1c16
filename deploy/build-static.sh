#!/usr/bin/env bash
# Builds a fully static, stripped `ferrymq` for x86_64 Linux and reports its size.
#
#     deploy/build-static.sh            # -> target/x86_64-unknown-linux-gnu/container/ferrymq-static
#     deploy/build-static.sh --rootfs   # also lays out target/container/rootfs for the image
#
# glibc's static build: host names (cluster peers, --addr of client commands) are looked up by
# glibc's built-in files and dns services (glibc 2.34 and later need no NSS library for them);
# the image's /etc/nsswitch.conf (laid out by --rootfs) asks /etc/hosts first. Where the
# musl target is installed (rustup target add x86_64-unknown-linux-musl), set
# FERRYMQ_STATIC_TARGET=x86_64-unknown-linux-musl to use it instead.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${FERRYMQ_STATIC_TARGET:-x86_64-unknown-linux-gnu}
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --profile container --locked -p ferrymq --target "$target"

out=target/$target/container/ferrymq
stripped=target/$target/container/ferrymq-static
cp "$out" "$stripped"
strip "$stripped"

# A static executable has no program interpreter and needs no shared library.
if readelf -l "$stripped" | grep -q INTERP || readelf -d "$stripped" | grep -q NEEDED; then
    echo "error: $stripped is dynamically linked" >&2
    readelf -d "$stripped" | grep NEEDED >&2 || true
    exit 1
fi
bytes=$(stat -c %s "$stripped")
echo "static binary: $stripped ($bytes bytes, $(( (bytes + 524288) / 1048576 )) MiB)"

if [[ "${1:-}" == "--rootfs" ]]; then
    rootfs=target/container/rootfs
    rm -rf "$rootfs"
    mkdir -p "$rootfs/data" "$rootfs/etc"
    printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
    cp "$stripped" "$rootfs/ferrymq"
    echo "image root: $rootfs"
fi
