# syntax=docker/dockerfile:1
# erdma-controller image: ERI provisioning, ERdmaDevice objects, SMC-R webhook.
# Build from the repository root:
#   docker build -f deploy/docker/controller.Dockerfile -t registry.example/erdma/controller:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p erdma-controller \
 && install -D -m 0755 target/release/erdma-controller /out/erdma-controller

# glibc + libgcc only, no shell, non-root (UID 65532, as the manifests expect).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/erdma-controller /usr/local/bin/erdma-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/erdma-controller"]
