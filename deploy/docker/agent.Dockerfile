# syntax=docker/dockerfile:1
# erdma-agent image: the node agent (driver modes, ERI netdevs, device plugin or DRA, SMC-R with the
# BPF socket policy, NRI), with erdmactl (`erdmactl doctor` from `kubectl exec`) and smcr_init.
# The release images come from scripts/build-images.sh (daemonless, reproducible); this file gives
# a container engine the same tree, user, environment, entrypoint and labels
# (scripts/check-dockerfiles.py keeps them in step with `build-images.sh --describe`).
# Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t ghcr.io/erdma/erdma-agent:dev \
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
COPY --from=build /out/erdma-agent/ /
# Root on purpose: the agent loads kernel modules, configures netdevs over netlink and enters the
# host's mount namespace (the chart's DaemonSet adds SYS_MODULE, SYS_ADMIN, NET_ADMIN to root).
# hadolint ignore=DL3002
USER 0:0
ENV PATH=/usr/local/bin:/usr/bin:/bin
WORKDIR /
LABEL org.opencontainers.image.source="https://github.com/erdma/erdma" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.title="erdma-agent" \
      org.opencontainers.image.description="erdma node agent: eRDMA devices for pods (device plugin aliyun/erdma or DRA), driver modes, ERI netdevs, SMC-R, NRI" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/erdma-agent"]
