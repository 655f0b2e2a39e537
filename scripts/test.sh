#!/usr/bin/env bash
# The project's test command (README, second set-up command; `.ci/run` calls it).
# Installs what the tests need on a fresh Debian 12 machine, then runs, in order:
#   rustfmt check, clippy -D warnings, every workspace test, and the lab scenarios on a real kernel.
# Set ERDMA_SKIP_LAB=1 to skip the lab (it needs ~1 GB of downloads on first run and qemu).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# Keep build output outside the clone so repeated runs (and CI on a machine that built before)
# reuse it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/erdma/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# One installer for the host's needs, shared with lab/demo.sh (the lab installs its own group
# when it runs: lab/run.sh and lab/demo.sh call the same script).
groups=(build test)
[ "${ERDMA_SKIP_LAB:-0}" = 1 ] || groups+=(lab)
bash scripts/host-deps.sh "${groups[@]}"

log "rustfmt"
cargo fmt --all --check

log "clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

log "cargo test"
cargo test --workspace --all-features --locked --no-fail-fast

log "example training script on CPU (2 processes, gloo)"
bash examples/pytorch-mnist/ci-test.sh

if [ "${ERDMA_SKIP_LAB:-0}" != 1 ]; then
  log "lab scenarios (real kernel under qemu)"
  bash lab/ci.sh
fi
