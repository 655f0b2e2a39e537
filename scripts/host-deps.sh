#!/usr/bin/env bash
# The one place that knows what the host needs. Both README commands (lab/demo.sh and
# scripts/test.sh, and so .ci/run) call it, so they can never disagree about it.
#
#   scripts/host-deps.sh [--check] GROUP...
#
# Groups:
#   build  what `cargo build` of the workspace needs: clang, libbpf, libelf, zlib and pkg-config for
#          the SMC-R BPF policy (libbpf-sys), jq for the lab's build step
#   lab    qemu, busybox, kmod, cpio and the RDMA user-space tools the lab's guest image is made of
#   test   what the test command needs beyond build: iproute2 (netns tests), python3-venv (the
#          example training script and the SBOM validator), rustfmt, clippy and cargo-deny
#          ($CARGO_DENY_VERSION, built once with `cargo install --locked`, a few minutes)
#   image  what scripts/build-images.sh needs beyond build: jq, strip, gzip (apt-get and dpkg-deb
#          come with every Debian)
#   push   skopeo, for scripts/build-images.sh --push
#
# Installs what is missing with apt-get (Debian 12 or later), as root or through sudo. With --check
# (or ERDMA_NO_APT=1, or the older ERDMA_LAB_NO_APT=1) it installs nothing and exits 1 naming what is
# missing. Prints one line per install and nothing when everything is present.
set -euo pipefail

# The supply-chain check's cargo-deny (scripts/supply-chain.sh), pinned.
CARGO_DENY_VERSION=0.20.2

# package:probe. A probe is a command name (found on PATH or in /usr/sbin, /sbin) or an absolute path
# that the package installs.
group_packages() {
  case "$1" in
    build) echo "clang:clang libbpf-dev:/usr/include/bpf/bpf_helpers.h libelf-dev:/usr/include/libelf.h
      zlib1g-dev:/usr/include/zlib.h pkg-config:pkg-config jq:jq binutils:strip" ;;
    lab) echo "qemu-system-x86:qemu-system-x86_64 busybox-static:busybox kmod:depmod cpio:cpio
      ibverbs-utils:ibv_devinfo rdmacm-utils:rping perftest:ib_write_bw
      ibverbs-providers:/etc/libibverbs.d/rxe.driver iproute2:rdma jq:jq xz-utils:xz zstd:zstd
      strace:strace" ;;
    test) echo "iproute2:ip python3:python3 python3-venv:-" ;;
    image) echo "jq:jq binutils:strip gzip:gzip" ;;
    push) echo "skopeo:skopeo" ;;
    *) echo "host-deps: unknown group '$1' (known: build lab test image push)" >&2; return 2 ;;
  esac
}

present() {
  local probe=$1
  case "$probe" in
    /*) [ -e "$probe" ] ;;
    *) command -v "$probe" >/dev/null 2>&1 || [ -x "/usr/sbin/$probe" ] || [ -x "/sbin/$probe" ] ;;
  esac
}

check=0
groups=()
for a in "$@"; do
  case "$a" in
    --check) check=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "host-deps: unknown option '$a' (see --help)" >&2; exit 2 ;;
    *) groups+=("$a") ;;
  esac
done
[ ${#groups[@]} -gt 0 ] || { echo "host-deps: name at least one group: build lab test image push" >&2; exit 2; }
[ "${ERDMA_NO_APT:-${ERDMA_LAB_NO_APT:-0}}" = 1 ] && check=1

missing=()
want_rust_components=0
for g in "${groups[@]}"; do
  pkgs=$(group_packages "$g") || exit 2
  for pc in $pkgs; do
    pkg=${pc%%:*}; probe=${pc#*:}
    # python3-venv: the probe is "can this python make a venv with pip", not a path.
    if [ "$pkg" = python3-venv ]; then
      python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && continue
    elif present "$probe"; then
      continue
    fi
    case " ${missing[*]-} " in *" $pkg "*) ;; *) missing+=("$pkg") ;; esac
  done
  [ "$g" = test ] && want_rust_components=1
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$check" = 1 ]; then
    echo "host-deps: missing Debian packages: ${missing[*]} (install them with apt-get, or run without --check/ERDMA_NO_APT)" >&2
    exit 1
  fi
  if [ "$(id -u)" = 0 ]; then SUDO=(); elif command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "host-deps: missing Debian packages: ${missing[*]}; run as root (or install sudo) so they can be installed" >&2
    exit 1
  fi
  echo "host-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Try without refreshing the package lists first (fast when they are recent), then refresh.
  if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    "${SUDO[@]}" apt-get update -qq >/dev/null \
      && "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || { echo "host-deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
  fi
fi

if [ "$want_rust_components" = 1 ] && command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
      [ "$check" = 1 ] && { echo "host-deps: missing rustup component $c" >&2; exit 1; }
      echo "host-deps: rustup component add $c" >&2
      rustup component add "$c" >/dev/null
    fi
  done
fi
if [ "$want_rust_components" = 1 ] && command -v cargo >/dev/null 2>&1 \
    && [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  [ "$check" = 1 ] && { echo "host-deps: missing cargo-deny $CARGO_DENY_VERSION" >&2; exit 1; }
  echo "host-deps: cargo install --locked cargo-deny@$CARGO_DENY_VERSION" >&2
  cargo install --quiet --locked "cargo-deny@$CARGO_DENY_VERSION" \
    || { echo "host-deps: cargo install cargo-deny@$CARGO_DENY_VERSION failed" >&2; exit 1; }
fi
exit 0
