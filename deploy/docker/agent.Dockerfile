# syntax=docker/dockerfile:1
# erdma-agent image: driver management, ERI netdevs, device plugin, SMC-R pre-start with the BPF
# socket policy (feature `erdma-agent/bpf`). Also ships smcr_init (same binary name as the
# smcr-init image) and erdmactl (`erdmactl doctor` from `kubectl exec`).
# Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t registry.example/erdma/agent:dev .
FROM rust:1.95-bookworm AS build
# clang compiles the BPF objects (erdma-smc/build.rs, needs the libbpf-dev headers); libbpf-sys
# builds its vendored libbpf with make and links libelf and zlib found through pkg-config.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang libbpf-dev libelf-dev zlib1g-dev pkg-config make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p erdma-agent -p smcr-init -p erdmactl --features erdma-agent/bpf \
 && install -D -m 0755 target/release/erdma-agent /out/erdma-agent \
 && install -D -m 0755 target/release/smcr-init /out/smcr_init \
 && install -D -m 0755 target/release/erdmactl /out/erdmactl

# libelf1 and zlib1g: runtime libraries of the BPF loader (libbpf itself is linked statically by
# libbpf-sys). The agent runs modprobe/rmmod and the driver installer in the host's mount
# namespace (setns, no nsenter), so the host's tools are used; kmod, util-linux and iproute2 are
# here only for diagnosis with `kubectl exec`.
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libelf1 zlib1g ca-certificates kmod util-linux iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/erdma-agent"]
