# syntax=docker/dockerfile:1
# smcr-init image: the init container the webhook injects (command `/usr/local/bin/smcr_init`, as
# the original webhook's; reads SMCR_PNET, configures SMC-R in the pod's network namespace).
# The release images come from scripts/build-images.sh (daemonless, reproducible); this file gives
# a container engine the same tree, user, environment, entrypoint and labels
# (scripts/check-dockerfiles.py keeps them in step with `build-images.sh --describe`).
# Build from the repository root:
#   docker build -f deploy/docker/smcr-init.Dockerfile -t ghcr.io/erdma/smcr-init:dev \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u -d @"$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)" .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The script installs its own Debian build packages (scripts/host-deps.sh; root here), builds the
# release binaries and writes every image's root tree to /out/<name>/.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash scripts/build-images.sh --stage /out

FROM scratch
ARG VERSION
ARG REVISION
ARG CREATED
COPY --from=build /out/smcr-init/ /
# Root by default for the configuring mode (`smcr_init`, as the original's privileged init
# container or a node tool: it writes the SMC-R sysctls and pnet table and loads the BPF socket
# policy). The webhook injects `smcr_init verify` as UID 65532 with every capability dropped: it
# only reads what the agent configured.
# hadolint ignore=DL3002
USER 0:0
ENV PATH=/usr/local/bin:/usr/bin:/bin
WORKDIR /
LABEL org.opencontainers.image.source="https://github.com/erdma/erdma" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.title="smcr-init" \
      org.opencontainers.image.description="smcr_init: the init container that moves a pod's TCP traffic to SMC-R" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/smcr_init"]
