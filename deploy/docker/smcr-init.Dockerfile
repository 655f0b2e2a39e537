# syntax=docker/dockerfile:1
# smcr_init image: the init container the webhook injects (command `/usr/local/bin/smcr_init`, as
# the original webhook; reads SMCR_PNET, configures SMC-R in the pod's network namespace). The
# BPF socket policy is in smcr-init's default features.
# Build from the repository root:
#   docker build -f deploy/docker/smcr-init.Dockerfile -t registry.example/erdma/smcr_init:dev .
FROM rust:1.95-bookworm AS build
# clang compiles the BPF objects (needs the libbpf-dev headers); libbpf-sys builds its vendored
# libbpf with make and links libelf and zlib found through pkg-config.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang libbpf-dev libelf-dev zlib1g-dev pkg-config make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p smcr-init \
 && install -D -m 0755 target/release/smcr-init /out/smcr_init

# libelf1 and zlib1g: runtime libraries of the BPF loader (libbpf is linked statically).
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libelf1 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/smcr_init /usr/local/bin/smcr_init
ENTRYPOINT ["/usr/local/bin/smcr_init"]
