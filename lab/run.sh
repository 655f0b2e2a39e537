#!/bin/bash
# Run the lab scenarios in a real Linux kernel (qemu, TCG) with Soft-RoCE devices.
#   lab/run.sh [--suite SUITE] [--scenario NAME]... [--strict]
# Scenarios: inventory allocation allocation-modes health numa smcr-prestart nri dra chart chart-webhook
# (default: all),
# and nri-smcr (run by name only: it needs SMC, --suite bookworm-backports). Each prints "PASS: name",
# "FAIL: name (why)" or "SKIP: name (why)"; the last line is "N passed, M failed" and the exit
# status is non-zero when anything failed (with --strict or ERDMA_LAB_STRICT=1, skips fail too).
# See lab/README.md for the environment variables.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
ALL_SCENARIOS="inventory allocation allocation-modes health numa smcr-prestart nri dra chart chart-webhook"
# known, run only when named (they need another kernel than the default)
BY_NAME_SCENARIOS="nri-smcr"
SCENARIOS=()
STRICT=${ERDMA_LAB_STRICT:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=${2:?--suite needs a value}; shift 2 ;;
    --scenario) SCENARIOS+=("${2:?--scenario needs a name}"); shift 2 ;;
    --strict) STRICT=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ "${#SCENARIOS[@]}" -gt 0 ] || read -r -a SCENARIOS <<<"$ALL_SCENARIOS"
for s in "${SCENARIOS[@]}"; do
  grep -qx -- "$s" < <(tr ' ' '\n' <<<"$ALL_SCENARIOS $BY_NAME_SCENARIOS") \
    || { echo "run.sh: unknown scenario '$s' (known: $ALL_SCENARIOS $BY_NAME_SCENARIOS)" >&2; exit 2; }
done

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
say "kernel $KVER ($SUITE), work dir $WORK; booting for: ${SCENARIOS[*]}"
timed vm lab_boot main.sh "${SCENARIOS[@]}"

RESULTS="$WORK/share/out/results.txt"; touch "$RESULTS"
pass=0; fail=0; lines=()
for s in "${SCENARIOS[@]}"; do
  line=$(grep -E "^(PASS|FAIL|SKIP): $s( |$)" "$RESULTS" | tail -1)
  case "$line" in
    PASS:*) pass=$((pass + 1)) ;;
    SKIP:*) if [ "$STRICT" = 1 ]; then fail=$((fail + 1)); line="FAIL: $s (skipped in strict mode: ${line#SKIP: $s })"; fi ;;
    FAIL:*) fail=$((fail + 1)) ;;
    *) fail=$((fail + 1)); line="FAIL: $s (no result: the VM crashed or timed out; see $WORK/console.log)" ;;
  esac
  lines+=("$line")
done
lab_timings_report >&2
say "logs: $WORK/share/out/ and $WORK/console.log"
printf '%s\n' "${lines[@]}"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
