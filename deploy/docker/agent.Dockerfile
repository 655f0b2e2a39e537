# syntax=docker/dockerfile:1
# erdma-agent image: driver management, ERI netdevs, device plugin, SMC-R (also ships smcr_init
# and erdmactl, as the original agent image shipped smc-tools).
# Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t registry.example/erdma/agent:dev .
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang libbpf-dev libelf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p erdma-agent -p smcr-init -p erdmactl \
 && install -D -m 0755 target/release/erdma-agent /out/erdma-agent \
 && install -D -m 0755 target/release/smcr-init /out/smcr_init \
 && install -D -m 0755 target/release/erdmactl /out/erdmactl

# kmod: modprobe/modinfo fallback inside the container; util-linux: nsenter into the host for the
# driver installer; libbpf/libelf: the SMC-R BPF socket policy.
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      kmod util-linux iproute2 ca-certificates libbpf1 libelf1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/erdma-agent"]
