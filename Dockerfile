# FerryMQ container image: one static binary in an otherwise empty image.
#
# With network access to crates.io and a Rust base image (the default):
#     docker build -t ferrymq .
# From a static binary built on the host (deploy/build-static.sh --rootfs), without a Rust image:
#     deploy/build-static.sh --rootfs
#     docker build --build-arg FERRYMQ_BINARY=host --target runtime -t ferrymq .
# (podman: add --format docker, so that the HEALTHCHECK is kept.)
#
# Inside the container the broker listens on 0.0.0.0, so it refuses to start without
# credentials: give the first admin's password in FERRYMQ_ADMIN_PASSWORD or a secret file named by
# FERRYMQ_ADMIN_PASSWORD_FILE, or set FERRYMQ_INSECURE=true to accept anyone who can reach it.

ARG FERRYMQ_BINARY=build

# The build stage: a static, stripped binary and an empty data directory.
FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS='-C target-feature=+crt-static' \
        cargo build --profile container --locked -p ferrymq --target x86_64-unknown-linux-gnu \
    && mkdir -p /rootfs/data /rootfs/etc \
    && printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf \
    && cp target/x86_64-unknown-linux-gnu/container/ferrymq /rootfs/ferrymq \
    && strip /rootfs/ferrymq

# The same files from the host: deploy/build-static.sh --rootfs lays them out here.
FROM scratch AS host
COPY target/container/rootfs/ /

FROM ${FERRYMQ_BINARY} AS rootfs

# The runtime: nothing but the binary and its data directory, owned by the unprivileged user
# (65532, "nonroot" in distroless images) so that a new named volume inherits that owner; and
# /etc/nsswitch.conf, so that host names (cluster peers, --addr) are looked up in /etc/hosts
# first, then DNS (glibc's default without it asks DNS alone unless DNS is unreachable).
FROM scratch AS runtime
COPY --from=rootfs /etc/nsswitch.conf /etc/nsswitch.conf
COPY --from=rootfs --chown=65532:65532 /ferrymq /ferrymq
COPY --from=rootfs --chown=65532:65532 /data /data
USER 65532:65532
ENV FERRYMQ_DATA_DIR=/data \
    FERRYMQ_TCP_ADDR=0.0.0.0:7070 \
    FERRYMQ_HTTP_ADDR=0.0.0.0:7080
VOLUME ["/data"]
EXPOSE 7070 7080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/ferrymq", "healthcheck"]
ENTRYPOINT ["/ferrymq"]
CMD ["serve"]
