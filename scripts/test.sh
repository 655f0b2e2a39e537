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

need_apt=()
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# The SMC-R BPF socket policy (erdma-smc feature `bpf`) is compiled with clang against libbpf.
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
[ -e /usr/include/bpf/bpf_helpers.h ] || need_apt+=(libbpf-dev)
[ -e /usr/include/libelf.h ] || need_apt+=(libelf-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
[ -e /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

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
