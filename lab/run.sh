#!/bin/bash
# Run the lab scenarios in a real Linux kernel (qemu, TCG) with Soft-RoCE devices.
#   lab/run.sh [--node NAME | [--suite SUITE] [--runtime RUNTIME]] [--scenario NAME]... [--strict]
# Scenarios: inventory allocation allocation-modes health numa smcr-prestart nri dra dra-migration chart chart-webhook faults rdma-usage doctor-usage
# (default: all),
# and nri-smcr (run by name only: it needs SMC, --suite bookworm-backports). Runtimes (the guest's
# container runtime, lab/runtime.conf): containerd-1.7 (default) and containerd-2.1. Node kinds
# (--node, lab/nodes.conf: kernel, cgroup version and driver, containerd, OCI runtime, LSM):
# default, cgroupv1, runc13, kernel510, ...; --node takes suite and runtime from its row (with
# --suite or --runtime it is a usage error). Each scenario prints "PASS: name", "FAIL: name (why)"
# or "SKIP: name (why)", the name with "@NODE" on another node kind than default
# (allocation@cgroupv1), else with "@RUNTIME" on another runtime than the default
# (allocation@containerd-2.1); the last line is "N passed, M failed" and the exit status is
# non-zero when anything failed (with --strict or ERDMA_LAB_STRICT=1, skips fail too). See
# lab/README.md for the environment variables.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
ALL_SCENARIOS="inventory allocation allocation-modes health numa smcr-prestart nri dra dra-migration chart chart-webhook faults rdma-usage doctor-usage"
# known, run only when named (they need another kernel than the default)
BY_NAME_SCENARIOS="nri-smcr"
SCENARIOS=()
STRICT=${ERDMA_LAB_STRICT:-0}
NODE_ARG="" SUITE_ARG="" RUNTIME_ARG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --node) NODE_ARG=${2:?--node needs a value}; shift 2 ;;
    --suite) SUITE_ARG=${2:?--suite needs a value}; shift 2 ;;
    --runtime) RUNTIME_ARG=${2:?--runtime needs a value}; shift 2 ;;
    --scenario) SCENARIOS+=("${2:?--scenario needs a name}"); shift 2 ;;
    --strict) STRICT=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$NODE_ARG" ]; then
  if [ -n "$SUITE_ARG$RUNTIME_ARG" ]; then
    echo "run.sh: --node $NODE_ARG takes its suite and runtime from lab/nodes.conf; drop --suite/--runtime" >&2
    exit 2
  fi
  grep -qx -- "$NODE_ARG" < <(lab_nodes | tr ' ' '\n') \
    || { echo "run.sh: unknown node kind '$NODE_ARG' (lab/nodes.conf has: $(lab_nodes))" >&2; exit 2; }
  lab_node "$NODE_ARG"
  LAB_APPEND="${LAB_APPEND:-} $(lab_node_append)"; export LAB_APPEND
else
  [ -z "$SUITE_ARG" ] || SUITE=$SUITE_ARG
  [ -z "$RUNTIME_ARG" ] || RUNTIME=$RUNTIME_ARG
fi
[ "${#SCENARIOS[@]}" -gt 0 ] || read -r -a SCENARIOS <<<"$ALL_SCENARIOS"
for s in "${SCENARIOS[@]}"; do
  grep -qx -- "$s" < <(tr ' ' '\n' <<<"$ALL_SCENARIOS $BY_NAME_SCENARIOS") \
    || { echo "run.sh: unknown scenario '$s' (known: $ALL_SCENARIOS $BY_NAME_SCENARIOS)" >&2; exit 2; }
done
grep -qx -- "$RUNTIME" < <(lab_runtimes | tr ' ' '\n') \
  || { echo "run.sh: unknown runtime '$RUNTIME' (known: $(lab_runtimes))" >&2; exit 2; }

timed host-packages lab_packages
timed cargo-build lab_build
timed kernel lab_kernel
timed runtime lab_runtime
lab_workdir
# the chart scenarios run the chart's pods from the images scripts/build-images.sh builds
if printf '%s\n' "${SCENARIOS[@]}" | grep -qE '^chart(-webhook)?$'; then timed images lab_images; fi
# the health scenario's gate: strict (fail when missed) or ci (report it; fail only past 5 s)
echo "${ERDMA_LAB_HEALTH_GATE:-strict}" > "$WORK/share/guest/health-gate"
timed initramfs lab_initramfs
say "${NODE:+node $NODE: }kernel $KVER ($SUITE), runtime $RUNTIME ($OCI), work dir $WORK; booting for: ${SCENARIOS[*]}"
timed vm lab_boot main.sh "${SCENARIOS[@]}"

RESULTS="$WORK/share/out/results.txt"; touch "$RESULTS"
# the result's name: the scenario's, with @NODE on another node kind than default, else with
# @RUNTIME on another runtime than the default
at=""; [ "$RUNTIME" = "$DEFAULT_RUNTIME" ] || at="@$RUNTIME"
[ -z "${NODE:-}" ] || { at=""; [ "$NODE" = default ] || at="@$NODE"; }
pass=0; fail=0; lines=()
for s in "${SCENARIOS[@]}"; do
  line=$(grep -E "^(PASS|FAIL|SKIP): $s( |$)" "$RESULTS" | tail -1)
  [ -n "$line" ] && line="${line%%: *}: $s$at${line#*: "$s"}"
  case "$line" in
    PASS:*) pass=$((pass + 1)) ;;
    SKIP:*) if [ "$STRICT" = 1 ]; then fail=$((fail + 1)); line="FAIL: $s$at (skipped in strict mode: ${line#SKIP: "$s$at" })"; fi ;;
    FAIL:*) fail=$((fail + 1)) ;;
    *) fail=$((fail + 1)); line="FAIL: $s$at (no result: the VM crashed or timed out; see $WORK/console.log)" ;;
  esac
  lines+=("$line")
done
lab_timings_report >&2
say "logs: $WORK/share/out/ and $WORK/console.log"
printf '%s\n' "${lines[@]}"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
