#!/bin/bash
# Run the lab scenarios in a real Linux kernel (qemu, TCG) with Soft-RoCE devices.
#   lab/run.sh [--suite SUITE] [--runtime RUNTIME] [--scenario NAME]... [--strict]
# Scenarios: inventory allocation allocation-modes health numa smcr-prestart nri dra chart chart-webhook faults rdma-usage doctor-usage
# (default: all),
# and nri-smcr (run by name only: it needs SMC, --suite bookworm-backports). Runtimes (the guest's
# container runtime, lab/runtime.conf): containerd-1.7 (default) and containerd-2.1. Each scenario
# prints "PASS: name", "FAIL: name (why)" or "SKIP: name (why)", the name with "@RUNTIME" on
# another runtime than the default (allocation@containerd-2.1); the last line is "N passed, M
# failed" and the exit status is non-zero when anything failed (with --strict or
# ERDMA_LAB_STRICT=1, skips fail too). See lab/README.md for the environment variables.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
ALL_SCENARIOS="inventory allocation allocation-modes health numa smcr-prestart nri dra chart chart-webhook faults rdma-usage doctor-usage"
# known, run only when named (they need another kernel than the default)
BY_NAME_SCENARIOS="nri-smcr"
SCENARIOS=()
STRICT=${ERDMA_LAB_STRICT:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=${2:?--suite needs a value}; shift 2 ;;
    --runtime) RUNTIME=${2:?--runtime needs a value}; shift 2 ;;
    --scenario) SCENARIOS+=("${2:?--scenario needs a name}"); shift 2 ;;
    --strict) STRICT=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
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
say "kernel $KVER ($SUITE), runtime $RUNTIME, work dir $WORK; booting for: ${SCENARIOS[*]}"
timed vm lab_boot main.sh "${SCENARIOS[@]}"

RESULTS="$WORK/share/out/results.txt"; touch "$RESULTS"
# the result's name: the scenario's, with @RUNTIME on another runtime than the default
at=""; [ "$RUNTIME" = "$DEFAULT_RUNTIME" ] || at="@$RUNTIME"
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
