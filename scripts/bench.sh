#!/usr/bin/env bash
# Regenerates every table in docs/performance.md and checks the performance gates.
#   scripts/bench.sh [--only SECTION]... [--no-lab] [--no-write] [--keep DIR]
# Sections (default: all, in this order):
#   inventory     cargo bench -p erdma-inventory --bench inventory
#   deviceplugin  cargo bench -p erdma-deviceplugin --bench deviceplugin
#   agent         cargo bench -p erdma-agent --features bpf --bench agent, on the agent binary as
#                 shipped (cargo profile `agent`: optimised for size, fat LTO)
#   nri           cargo bench -p erdma-nri --bench nri (CreateContainer with erdma's adjustment vs none)
#   dra           cargo bench -p erdma-dra --bench prepare (NodePrepareResources vs an empty call)
#   nccl          crates/erdma-nccl/bench/bench-analyze.sh (1 GiB log, against grep -c)
#   scale         cargo bench -p erdma-controller --bench scale (1 000 and 5 000 nodes at once, throttling ECS)
#   images        scripts/build-images.sh (the three images' sizes and digests, built twice)
#   lab-demo      lab/demo.sh (the demo report: ib_write_bw, ibv_rc_pingpong, timings)
#   lab-run       lab/run.sh (all scenarios; REPORT lines: health flips, kubelet restart)
#   smcr          crates/erdma-smc/lab/run-smcr-2vm.sh (two VMs, SMC-R vs TCP)
# --no-lab skips the three lab sections; --no-write prints the tables without touching the doc.
# Each section's output is kept in a run directory (printed; --keep DIR picks it); the figures
# are parsed from the `BENCH key=value unit` lines of the benches and the lab's REPORT lines and
# written between the `<!-- bench:SECTION begin/end -->` markers of docs/performance.md, each
# stamped with the commit, date, machine (nproc, load average) and the command that made it.
# Exit status: 0 when every gate of the sections run is met, 1 when a gate is missed or a section
# failed, 2 on a usage error.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
ALL="inventory deviceplugin agent nri dra nccl scale images lab-demo lab-run smcr"
LAB="lab-demo lab-run smcr"
only=(); no_lab=0; write=1; keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only+=("${2:?--only needs a section}"); shift 2 ;;
    --no-lab) no_lab=1; shift ;;
    --no-write) write=0; shift ;;
    --keep) keep=${2:?--keep needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
sections=()
for s in ${only[@]+"${only[@]}"}; do
  grep -qw -- "$s" <<<"$ALL" || { echo "bench.sh: unknown section '$s' (known: $ALL)" >&2; exit 2; }
done
for s in $ALL; do
  if [ "${#only[@]}" -gt 0 ] && ! printf '%s\n' "${only[@]}" | grep -qx -- "$s"; then continue; fi
  if [ "$no_lab" = 1 ] && grep -qw -- "$s" <<<"$LAB"; then continue; fi
  sections+=("$s")
done
[ "${#sections[@]}" -gt 0 ] || { echo "bench.sh: no section left to run" >&2; exit 2; }

# The benches build the workspace (the agent with its BPF policy): the same host packages as the
# test command (the lab sections install their own on top).
"$REPO/scripts/host-deps.sh" build || { echo "bench.sh: host packages missing (see above)" >&2; exit 1; }

RUN=${keep:-$(mktemp -d /tmp/erdma-bench.XXXXXX)}
mkdir -p "$RUN"
commit=$(git rev-parse --short HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then commit="$commit dirty"; fi
{
  echo "commit=$commit"
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
} > "$RUN/run.meta"
echo "bench.sh: sections ${sections[*]}; commit $commit; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); output in $RUN" >&2

# Where cargo puts what it builds (CARGO_TARGET_DIR or the workspace's target/): the agent section
# runs the binary of the `agent` profile from there.
ERDMA_TARGET_DIR=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') \
  || { echo "bench.sh: cargo metadata failed" >&2; exit 1; }
export ERDMA_TARGET_DIR

# The command of each section (run from the repository root).
command_of() {
  case "$1" in
    inventory) echo "cargo bench -p erdma-inventory --bench inventory" ;;
    deviceplugin) echo "cargo bench -p erdma-deviceplugin --bench deviceplugin" ;;
    agent) echo "cargo build --locked -q --profile agent -p erdma-agent --features bpf --bin erdma-agent && ERDMA_AGENT_BIN=\$ERDMA_TARGET_DIR/agent/erdma-agent cargo bench -p erdma-agent --features bpf --bench agent" ;;
    nri) echo "cargo bench -p erdma-nri --bench nri" ;;
    dra) echo "cargo bench -p erdma-dra --bench prepare" ;;
    nccl) echo "crates/erdma-nccl/bench/bench-analyze.sh" ;;
    scale) echo "cargo bench -p erdma-controller --bench scale" ;;
    images) echo "scripts/build-images.sh --out $RUN/images.out" ;;
    lab-demo) echo "ERDMA_LAB_WORK=$RUN/lab-demo.work lab/demo.sh" ;;
    lab-run) echo "ERDMA_LAB_PROFILE=release ERDMA_LAB_WORK=$RUN/lab-run.work lab/run.sh" ;;
    smcr) echo "ERDMA_LAB_WORK=$RUN/smcr.work crates/erdma-smc/lab/run-smcr-2vm.sh" ;;
  esac
}

for s in "${sections[@]}"; do
  cmd=$(command_of "$s")
  echo "bench.sh: [$s] $cmd" >&2
  load0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%s.%N); started=$(date -u '+%Y-%m-%d %H:%M UTC')
  case "$s" in
    lab-*|smcr) rm -rf "$RUN/$s.work" ;;
  esac
  bash -c "$cmd" > "$RUN/$s.log" 2>&1; rc=$?
  # The lab writes its REPORT lines to files in the work directory: keep them with the log.
  for f in report.txt timings.txt results.txt smcr2vm-smc.json smcr2vm-tcp.json demo-report.txt; do
    [ -f "$RUN/$s.work/share/out/$f" ] && cp "$RUN/$s.work/share/out/$f" "$RUN/$s.$f"
  done
  for f in "$RUN/$s.work"/console*.log; do [ -f "$f" ] && cp "$f" "$RUN/$s.$(basename "$f")"; done
  {
    echo "command=$cmd"
    echo "started=$started"
    echo "rc=$rc"
    echo "wall_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')"
    echo "load_before=$load0"
    echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$RUN/$s.meta"
  echo "bench.sh: [$s] exit $rc, $(sed -n 's/^wall_s=//p' "$RUN/$s.meta") s" >&2
  # The lab's qemu work directories are large: keep only what the renderer reads.
  case "$s" in
    lab-*|smcr) rm -rf "$RUN/$s.work" ;;
  esac
done

args=("$RUN" "$REPO/docs/performance.md")
[ "$write" = 1 ] || args+=(--no-write)
python3 "$REPO/scripts/bench-render.py" "${args[@]}" "${sections[@]/#/--section=}"
