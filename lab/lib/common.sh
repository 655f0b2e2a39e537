# Host-side helpers shared by lab/run.sh and lab/demo.sh (sourced, bash).
# Env: ERDMA_LAB_CACHE   downloads, unpacked kernels, base initramfs (default ~/.cache/erdma-lab)
#      ERDMA_LAB_WORK    work dir of this run: share, logs, initrd (default: a new /tmp/erdma-lab.*)
#      ERDMA_LAB_SUITE   kernel suite (default trixie-backports; see lab/kernels.conf)
#      ERDMA_LAB_RUNTIME the guest's container runtime (default containerd-1.7; the sections of
#                        lab/runtime.conf: containerd-1.7, containerd-2.1)
#      ERDMA_NO_APT=1    never run apt-get install (fail naming what is missing); ERDMA_LAB_NO_APT=1 too
#      ERDMA_LAB_PROFILE debug (default, the test build cache) or release (as shipped; the benchmark)
#      ERDMA_LAB_NO_BUILD=1 no cargo build: the lab binaries as cargo last built them
#      ERDMA_LAB_SCENARIO_LIMIT seconds each scenario may run in the guest (default 480)
#      ERDMA_LAB_IMAGES  the chart scenarios' images from this build-images.sh --out directory
#                        (default: built for the run)
#      CARGO_TARGET_DIR  honoured when locating the built binaries
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=$(cd "$LAB/.." && pwd)
CACHE=${ERDMA_LAB_CACHE:-${HOME:-/root}/.cache/erdma-lab}
SUITE=${ERDMA_LAB_SUITE:-trixie-backports}
DEFAULT_RUNTIME=containerd-1.7
RUNTIME=${ERDMA_LAB_RUNTIME:-$DEFAULT_RUNTIME}
# the OCI runtime in the runtime layer (lab/run.sh --node sets it from lab/nodes.conf)
OCI=runc-1.1
T0=$(date +%s.%N)
TIMINGS=()

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
say() { printf '[%6ss] %s\n' "$(elapsed "$T0")" "$*" >&2; }
die() { say "ERROR: $*"; exit 2; }
# timed NAME CMD...: run CMD, record "NAME SECONDS" in TIMINGS
timed() {
  local name=$1 t rc=0; shift; t=$(date +%s.%N)
  "$@" || rc=$?
  TIMINGS+=("$name $(elapsed "$t")")
  return $rc
}

# What the host needs to build the binaries and the guest image: one installer shared with
# scripts/test.sh (scripts/host-deps.sh), so the README's two commands can never disagree.
lab_packages() {
  "$REPO/scripts/host-deps.sh" build lab || die "host packages missing (see the line above)"
}

# The directory cargo builds into (it knows best: CARGO_TARGET_DIR, its config, or the default).
cargo_target_dir() {
  (cd "$REPO" && cargo metadata --no-deps --format-version 1 2>/dev/null | jq -r .target_directory)
}

# Builds the lab's binaries with cargo; sets BINS to the paths of those that exist.
# A binary the workspace does not have yet is reported and left out (scenarios that need it SKIP).
LAB_BINARIES="erdma-agent erdmactl erdma-fake-kubelet erdma-labpod erdma-labprobe"
lab_build() {
  local have args=() b dir
  command -v cargo >/dev/null || die "cargo not found; install the Rust toolchain (rustup) first"
  have=$(cd "$REPO" && cargo metadata --no-deps --format-version 1 2>/dev/null \
    | jq -r '.packages[].targets[] | select(.kind | index("bin")) | .name')
  for b in $LAB_BINARIES; do
    if grep -qx "$b" <<<"$have"; then args+=(--bin "$b"); else say "note: the workspace has no binary $b yet"; fi
  done
  # the agent as shipped: with the SMC-R BPF socket policy (clang + libbpf from the build group)
  grep -qx erdma-agent <<<"$have" && args+=(--features erdma-agent/bpf)
  # ERDMA_LAB_PROFILE=release builds them as shipped (the benchmark's lab sections); the default
  # debug build shares the test command's build cache.
  case "${ERDMA_LAB_PROFILE:-debug}" in
    debug) dir=debug ;;
    release) dir=release; args+=(--release) ;;
    *) die "ERDMA_LAB_PROFILE is '${ERDMA_LAB_PROFILE}' (debug or release)" ;;
  esac
  # ERDMA_LAB_NO_BUILD=1: the binaries cargo built last, as they are (a lab change tried while
  # the workspace does not build)
  if [ "${ERDMA_LAB_NO_BUILD:-0}" = 1 ]; then
    say "ERDMA_LAB_NO_BUILD=1: no cargo build; the binaries as last built"
  else
    say "cargo build ${args[*]}"
    (cd "$REPO" && cargo build -q "${args[@]}") || die "cargo build failed"
  fi
  # As shipped, the agent is built with its own cargo profile (optimised for size, as
  # scripts/build-images.sh builds it).
  local agent_dir
  agent_dir=$(cargo_target_dir)/$dir
  if [ "$dir" = release ] && grep -qx erdma-agent <<<"$have"; then
    say "cargo build --profile agent --bin erdma-agent --features erdma-agent/bpf"
    (cd "$REPO" && cargo build -q --profile agent --bin erdma-agent --features erdma-agent/bpf) \
      || die "cargo build failed"
    agent_dir=$(cargo_target_dir)/agent
  fi
  dir=$(cargo_target_dir)/$dir
  BINS=()
  for b in $LAB_BINARIES; do
    if [ "$b" = erdma-agent ]; then
      [ -x "$agent_dir/$b" ] && grep -qx "$b" <<<"$have" && BINS+=("$agent_dir/$b")
    else
      [ -x "$dir/$b" ] && grep -qx "$b" <<<"$have" && BINS+=("$dir/$b")
    fi
  done
  return 0
}

# The images operators deploy, built by scripts/build-images.sh (release binaries, as shipped) into
# the share, beside the chart as the real Helm engine rendered it for the lab's values
# (deploy/helm/ci/rendered/lab.json and lab-webhook.json from deploy/helm/ci/values/; the chart's CI
# keeps them current): the guest imports an image and runs the chart's pod templates from it
# (guest/runtime.sh, chart_agent_up). Call after lab_workdir.
lab_images() {
  local case rendered
  mkdir -p "$WORK/share/chart"
  for case in lab lab-webhook; do
    rendered="$REPO/deploy/helm/ci/rendered/$case.json"
    [ -f "$rendered" ] || die "$rendered is missing (bash deploy/helm/ci/check.sh --update renders it)"
    cp "$rendered" "$WORK/share/chart/$case.json"
  done
  # ERDMA_LAB_IMAGES=DIR: the images an earlier build-images.sh run wrote to DIR (its --out),
  # used as they are: one build for several runs (it is minutes on a 2-core host)
  if [ -n "${ERDMA_LAB_IMAGES:-}" ]; then
    [ -f "$ERDMA_LAB_IMAGES/images.json" ] \
      || die "ERDMA_LAB_IMAGES=$ERDMA_LAB_IMAGES has no images.json (give the --out directory of scripts/build-images.sh)"
    say "ERDMA_LAB_IMAGES: the images in $ERDMA_LAB_IMAGES, not rebuilt"
    mkdir -p "$WORK/share/images"
    cp -r "$ERDMA_LAB_IMAGES"/. "$WORK/share/images/" || die "copying $ERDMA_LAB_IMAGES failed"
    return 0
  fi
  bash "$REPO/scripts/build-images.sh" --out "$WORK/share/images" >&2 || die "scripts/build-images.sh failed"
}

# Sets KROOT (unpacked pinned kernel of $SUITE).
lab_kernel() {
  KROOT=$("$LAB/lib/kernel.sh" "$SUITE" | tail -1) || die "kernel download failed for suite $SUITE"
  KVER=$(basename "$(ls -d "$KROOT"/lib/modules/* "$KROOT"/usr/lib/modules/* 2>/dev/null | head -1)")
}

# The runtimes lab/runtime.conf pins (its containerd sections), space separated.
lab_runtimes() { sed -n 's/^\[\(containerd-[^]]*\)\].*/\1/p' "$LAB/runtime.conf" | tr '\n' ' ' | sed 's/ $//'; }
# The OCI runtimes: runc-1.1 (in every containerd section) and lab/runtime.conf's other sections.
lab_ocis() { { echo runc-1.1; sed -n 's/^\[\([^]]*\)\].*/\1/p' "$LAB/runtime.conf" | grep -v '^containerd-'; } | tr '\n' ' ' | sed 's/ $//'; }

# The node kinds of lab/nodes.conf, space separated.
lab_nodes() { awk '!/^#/ && NF == 7 {print $1}' "$LAB/nodes.conf" | tr '\n' ' ' | sed 's/ $//'; }
# lab_node NAME: takes the kind's row of lab/nodes.conf: sets NODE, SUITE, RUNTIME, NODE_CGROUP,
# NODE_DRIVER, OCI and NODE_LSM; a name not there, or a row with a value out of its column's
# set, is an error naming the row and the values it may have.
lab_node() {
  local row
  row=$(awk -v n="$1" '!/^#/ && NF == 7 && $1 == n' "$LAB/nodes.conf")
  [ -n "$row" ] || die "unknown node kind '$1' (lab/nodes.conf has: $(lab_nodes))"
  read -r NODE SUITE NODE_CGROUP NODE_DRIVER RUNTIME OCI NODE_LSM <<<"$row"
  awk -v s="$SUITE" '!/^#/ && $1 == s {found = 1} END {exit !found}' "$LAB/kernels.conf" \
    || die "node $NODE: suite '$SUITE' is not in lab/kernels.conf"
  case "$NODE_CGROUP" in v1|v2) ;; *) die "node $NODE: cgroup '$NODE_CGROUP' (v1 or v2)" ;; esac
  case "$NODE_DRIVER" in cgroupfs|systemd) ;; *) die "node $NODE: cgroup driver '$NODE_DRIVER' (cgroupfs or systemd)" ;; esac
  case "$NODE_LSM" in none|apparmor) ;; *) die "node $NODE: LSM '$NODE_LSM' (none or apparmor)" ;; esac
  grep -qx -- "$RUNTIME" < <(lab_runtimes | tr ' ' '\n') \
    || die "node $NODE: runtime '$RUNTIME' is not a section of lab/runtime.conf ($(lab_runtimes))"
  grep -qx -- "$OCI" < <(lab_ocis | tr ' ' '\n') \
    || die "node $NODE: OCI runtime '$OCI' (known: $(lab_ocis))"
}
# lab_node_append: the kernel command line that tells the guest its node kind (lab/guest/init and
# lab/guest/runtime.sh read it), plus the kernel parameters the kind needs.
lab_node_append() {
  local a="lab.node=$NODE lab.cgroup=$NODE_CGROUP lab.cgroup_driver=$NODE_DRIVER lab.oci=$OCI lab.lsm=$NODE_LSM"
  # AppArmor is built into Debian's kernels but not in their default LSM list everywhere
  [ "$NODE_LSM" = apparmor ] && a="$a apparmor=1 security=apparmor"
  echo "$a"
}
# Sets RUNTIME_LAYER: the guest's container runtime $RUNTIME (containerd, runc, CNI plugins, the
# offline OCI image) as an initramfs layer, cached by content (lab/lib/runtime.sh, pins in
# lab/runtime.conf). lab_initramfs adds it when it is set; lab_workdir then tells the guest
# which runtime it is meant to find (share/guest/runtime-name).
RUNTIME_LAYER=""
lab_runtime() {
  grep -qx -- "$RUNTIME" < <(lab_runtimes | tr ' ' '\n') \
    || die "unknown runtime '$RUNTIME' (lab/runtime.conf has: $(lab_runtimes))"
  RUNTIME_LAYER=$("$LAB/lib/runtime.sh" "$CACHE/runtime" "$RUNTIME" "$OCI" | tail -1) && [ -f "$RUNTIME_LAYER" ] \
    || die "the container runtime layer could not be built (lab/lib/runtime.sh $RUNTIME $OCI)"
}

# Sets NODE_LAYERS: the extra guest layers the node kind needs (lab/lib/node-layer.sh, pins in
# lab/node-layers.conf): systemd for the systemd cgroup driver, apparmor for the AppArmor LSM.
NODE_LAYERS=""
lab_node_layers() {
  local l f want=""
  [ "${NODE_DRIVER:-cgroupfs}" = systemd ] && want="$want systemd"
  [ "${NODE_LSM:-none}" = apparmor ] && want="$want apparmor"
  NODE_LAYERS=""
  for l in $want; do
    f=$("$LAB/lib/node-layer.sh" "$CACHE/node" "$l" | tail -1) && [ -f "$f" ] \
      || die "the node kind's $l layer could not be built (lab/lib/node-layer.sh $l)"
    NODE_LAYERS="$NODE_LAYERS $f"
  done
}
# Sets INITRD: the cached base image (rebuilt when the kernel, the builder, /init or the host
# tools change), the container runtime layer when lab_runtime ran, and an overlay with the
# freshly built erdma binaries.
lab_initramfs() {
  local key base stage
  key=$( { echo "$KROOT"; cat "$LAB/lib/initramfs.sh" "$LAB/guest/init";
           dpkg-query -W -f='${Package} ${Version}\n' busybox-static ibverbs-utils rdmacm-utils perftest \
             ibverbs-providers iproute2 jq 2>/dev/null; } | sha256sum | cut -c1-16)
  base="$CACHE/initramfs/base-$key.cpio.gz"
  if [ ! -f "$base" ]; then
    mkdir -p "$CACHE/initramfs"
    "$LAB/lib/initramfs.sh" base "$KROOT" "$base.tmp.$$" && mv "$base.tmp.$$" "$base" || die "initramfs build failed"
  fi
  lab_node_layers
  stage="$WORK/bin"; rm -rf "$stage"; mkdir -p "$stage"
  for b in "${BINS[@]}"; do strip -o "$stage/$(basename "$b")" "$b" 2>/dev/null || cp "$b" "$stage/"; done
  if [ "${#BINS[@]}" -gt 0 ]; then
    "$LAB/lib/initramfs.sh" overlay "$stage"/* "$WORK/overlay.cpio.gz" || die "overlay build failed"
    cat "$base" $RUNTIME_LAYER $NODE_LAYERS "$WORK/overlay.cpio.gz" > "$WORK/initrd.cpio.gz"
  else
    cat "$base" $RUNTIME_LAYER $NODE_LAYERS > "$WORK/initrd.cpio.gz"
  fi
  INITRD="$WORK/initrd.cpio.gz"
}

# Prepares WORK and the 9p share (guest scripts, out/).
lab_workdir() {
  WORK=${ERDMA_LAB_WORK:-$(mktemp -d /tmp/erdma-lab.XXXXXX)}
  mkdir -p "$WORK/share/out"; rm -rf "$WORK/share/guest" "$WORK/share/out"/*
  cp -r "$LAB/guest" "$WORK/share/guest"
  # A real NCCL log of a run on sockets, which the doctor-usage scenario's pods print (the lab
  # has no GPU to run NCCL).
  mkdir -p "$WORK/share/nccl"; cp "$REPO/testdata/nccl/real/h200x2-nccl2.28.9/nccl-socket.log" "$WORK/share/nccl/"
  if [ -n "$RUNTIME_LAYER" ]; then echo "$RUNTIME" > "$WORK/share/guest/runtime-name"; fi
  # each scenario's limit in the guest (guest/main.sh), for a host too loaded for the default
  if [ -n "${ERDMA_LAB_SCENARIO_LIMIT:-}" ]; then
    case "$ERDMA_LAB_SCENARIO_LIMIT" in
      *[!0-9]*|0) die "ERDMA_LAB_SCENARIO_LIMIT is '$ERDMA_LAB_SCENARIO_LIMIT' (seconds, a positive whole number)" ;;
    esac
    echo "$ERDMA_LAB_SCENARIO_LIMIT" > "$WORK/share/guest/scenario-limit"
  fi
}

# Boots the VM running guest/main.sh with ARGS; console to $WORK/console.log; PASS/FAIL/SKIP/
# TIME lines are echoed as they appear.
lab_boot() {
  local script=$1; shift
  local try
  for try in 1 2 3; do
    LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/lib/vm.sh" "$KROOT" "$INITRD" "$WORK/share" "guest/$script" "$@" \
      < /dev/null 2>&1 | tee "$WORK/console.log" | grep --line-buffered -E '^(PASS|FAIL|SKIP|REPORT)' >&2 || true
    # Multi-threaded TCG occasionally oopses while the kernel patches its own code during early
    # boot (int3 from text_poke), before /init runs. That is the emulator, not the code under test:
    # boot again (at most twice), and say so. A panic after the guest started is never retried.
    if [ "$try" -lt 3 ] && grep -q 'Kernel panic' "$WORK/console.log" \
       && [ -z "$(find "$WORK/share/out" -type f 2>/dev/null | head -1)" ]; then
      cp "$WORK/console.log" "$WORK/console-boot-panic.log"
      say "the kernel panicked before /init (TCG code-patching flake, see console-boot-panic.log); booting again"
      continue
    fi
    break
  done
}

lab_timings_report() {
  local t
  echo "timings (s):"
  for t in "${TIMINGS[@]}"; do echo "  $t"; done
  [ -f "$WORK/share/out/timings.txt" ] && sed 's/^/  guest /' "$WORK/share/out/timings.txt"
  echo "  total $(elapsed "$T0")"
}
