# syntax=docker/dockerfile:1
# smcr_init image: the init container the webhook injects (`/usr/local/bin/smcr_init`, reads
# SMCR_PNET, configures SMC-R in the pod's network namespace).
# Build from the repository root:
#   docker build -f deploy/docker/smcr-init.Dockerfile -t registry.example/erdma/smcr_init:dev .
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang libbpf-dev libelf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p smcr-init \
 && install -D -m 0755 target/release/smcr-init /out/smcr_init

FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libbpf1 libelf1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/smcr_init /usr/local/bin/smcr_init
ENTRYPOINT ["/usr/local/bin/smcr_init"]
