#!/bin/bash
# Every lab scenario that CI runs, on the kernels they need, with one summary line at the end:
#   lab/run.sh                         inventory, allocation, allocation-modes, health, numa,
#                                      smcr-prestart, nri, dra (7.3; pods on containerd in the guest)
#   lab/run.sh --scenario nri-smcr     SMC-R at sandbox creation through NRI (6.12)
#   crates/erdma-smc/lab/run-smcr.sh   SMC-R scoping between two pod namespaces (6.12)
#   same on 7.3                        the unsupported-kernel case (no SMC): clear "unsupported"
#   crates/erdma-smc/lab/run-smcr-2vm.sh  SMC-R data path between two VMs over rxe (6.12)
#   crates/erdma-smc/lab/run-pnet.sh   SMC_PNETID generic netlink against the real kernel (6.12)
#   crates/erdma-driver/lab/run-driver.sh  module load/unload through PID 1's namespaces (7.3)
# and the runtime matrix: the scenarios whose outcome depends on the container runtime
# (nri-smcr on 6.12; RUNTIME_SCENARIOS with --full) once more on each runtime of MATRIX_RUNTIMES, their
# results named NAME@RUNTIME (allocation@containerd-2.1); the runs above are on lab/run.sh's
# default runtime, containerd-1.7, and keep their plain names. A table of the matrix comes before
# the summary.
# And the node matrix (lab/nodes.conf, lab/run.sh --node): RUNTIME_SCENARIOS on each node kind
# besides default (cgroup v1, the systemd cgroup driver, runc 1.3, the 5.10 kernel, AppArmor),
# results named NAME@NODE. Plain lab/ci.sh (what CI runs) runs the cells of NODE_CI_CELLS;
# `lab/ci.sh --full` runs every cell (docs/testing.md says which run where). `--matrix-only`
# runs the node matrix alone (with --full: all of it). The table before the summary has one row
# per scenario and one column per runtime and node kind: PASS, FAIL, SKIP, "N/A [n]" (the reason
# [n] printed below it) or "not in CI (--full)".
# Prints each runner's PASS/FAIL/SKIP lines, then exactly "N passed, M failed"; a skip counts as a
# failure (ERDMA_LAB_STRICT=1), and so does a runner that exits non-zero without a FAIL line.
# Runners that run a cargo test binary in the VM (lab/guest/testbin.sh) also print its counts
# ("TESTS: ...") and the #[ignore]d tests it ran ("RAN-IGNORED: SCEN NAME"); they are passed on,
# and the line before the last says how many #[ignore]d tests ran in which VM.
set -uo pipefail
cd "$(dirname "$0")/.."
FULL=0 MATRIX_ONLY=0
for a in "$@"; do
  case "$a" in
    --full) FULL=1 ;;
    --matrix-only) MATRIX_ONLY=1 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ci.sh: unknown argument '$a' (--full, --matrix-only)" >&2; exit 2 ;;
  esac
done
export ERDMA_LAB_STRICT=1
# CI runs on loaded machines: the health scenario reports its latency gate and fails only past 5 s
# per flip; the strict gate (median <= 250 ms, every flip <= 1 s) is the benchmark's.
export ERDMA_LAB_HEALTH_GATE=${ERDMA_LAB_HEALTH_GATE:-ci}
# The scenarios that run on every runtime: those whose checks go through what changed between
# containerd 1.7 and 2.x (CRI devices and device cgroup, CDI injection, verbose sandbox status,
# NRI, image import and manifest pods; rdma-usage: the container cgroups the runtime makes under
# the kubelet's pod cgroup, which the agent's usage attribution reads; doctor-usage: the CRI log
# files the runtime writes, which the API server serves as `kubectl logs`). inventory and numa run no
# container, health's pod only stays up: they run on the default runtime only.
RUNTIME_SCENARIOS="allocation allocation-modes smcr-prestart nri dra chart chart-webhook faults rdma-usage doctor-usage"
MATRIX_RUNTIMES="containerd-2.1"
# The node kinds of the matrix: every row of lab/nodes.conf but default (which the runs above are).
MATRIX_NODES=$(awk '!/^#/ && NF == 7 && $1 != "default" {print $1}' lab/nodes.conf | tr '\n' ' ')
# The cells CI runs (about 25 minutes on 2 cores, with the containerd-2.1 column's nri-smcr):
# per node kind, the scenarios whose checks go through what the kind changes. cgroupv1 (on 5.10):
# the v1 devices controller (allocation), rdma.max on the v1 rdma hierarchy (nri, dra: runc refuses
# linux.resources.unified there), the usage attribution through the v1 rdma line of
# /proc/PID/cgroup over 5.10's RDMA netlink dump (rdma-usage); kernel510 (5.10 on cgroup v2): none,
# 5.10 runs in CI as cgroupv1; runc13 (containerd 2.1 as it ships, with runc 1.3) carries CI's
# containerd 2.x coverage: CRI devices and the device cgroup, NRI adjustments, CDI from a DRA
# claim, image import and manifest pods (chart-webhook runs the agent's and the controller's
# pods); systemd: pod cgroups as slices; apparmor: containers confined by containerd's default
# profile, and the chart's agent pod with the profile the chart gives it. The rest, and the containerd-2.1 column (containerd 2.1 over Debian 12's runc 1.1, a
# pairing containerd 2.x does not ship with): lab/ci.sh --full.
declare -A NODE_CI_CELLS=(
  [cgroupv1]="allocation nri dra rdma-usage"
  [runc13]="allocation nri dra chart-webhook"
  [systemd]="allocation"
  [apparmor]="allocation chart"
)
# Cells that cannot pass on a kind for a reason outside erdma: SCENARIO@NODE -> the reason.
declare -A NODE_NA=()
# nri-smcr (SMC-R for an unmodified TCP client at sandbox creation) runs on 6.12 per runtime only:
# Debian's 7.3 has no SMC (CONFIG_DIBS unset), and Debian's 5.10 has SMC but no transparent path
# to it (neither Alibaba Cloud Linux 3's out-of-tree net.smc.tcp2smc nor 6.11's IPPROTO_SMC for
# BPF): the agent says "unsupported" there, rightly (seen 2026-12-07, --node kernel510).
declare -A NRI_SMCR_NA=(
  [trixie-backports]="Debian's 7.3 has no SMC (CONFIG_DIBS unset)"
  [bullseye-security]="Debian's 5.10 has SMC but neither Alibaba Cloud Linux 3's net.smc.tcp2smc nor IPPROTO_SMC (6.11+): the agent rightly reports SMC-R unsupported"
)
passed=0 failed=0 ignored_ran=0 ignored_where=() results=()
run() {
  local name=$1; shift
  local out rc
  printf '\n--- lab: %s\n' "$name" >&2
  out=$("$@" 2>&2); rc=$?
  # A guest kernel that oopses (seen once: an int3 at a static-branch site while text was being
  # patched, a race of the emulated CPUs under TCG) is not a verdict on erdma: run once more, and
  # say so. Any other failure counts at once.
  local console
  console=$(printf '%s\n' "$out" | sed -n 's/^FAIL: .*the VM crashed or timed out; see \(.*\))$/\1/p' | head -n 1)
  if [ -n "$console" ] && [ -f "$console" ] && grep -qE 'Oops: |Kernel panic' "$console"; then
    echo "RETRY: $name (guest kernel oops: $(grep -m1 -E 'Oops: |Kernel panic' "$console" | tr -d '\r'))"
    out=$("$@" 2>&2); rc=$?
  fi
  local lines; lines=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL|SKIP): ' || true)
  [ -n "$lines" ] && printf '%s\n' "$lines" && results+=("$lines")
  local p f s
  p=$(printf '%s\n' "$lines" | grep -c '^PASS: ' || true)
  f=$(printf '%s\n' "$lines" | grep -c '^FAIL: ' || true)
  s=$(printf '%s\n' "$lines" | grep -c '^SKIP: ' || true)
  f=$((f + s))
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then echo "FAIL: $name (runner exited $rc)"; f=1; fi
  if [ "$p" = 0 ] && [ "$f" = 0 ]; then echo "FAIL: $name (no result)"; f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  local ran n
  ran=$(printf '%s\n' "$out" | grep -E '^RAN-IGNORED: ' || true)
  printf '%s\n' "$out" | grep -E '^TESTS: ' | sed "s/^TESTS: /TESTS: $name: /" || true
  [ -n "$ran" ] && printf '%s\n' "$ran" | sed "s/^RAN-IGNORED: [^ ]* /RAN-IGNORED: $name /"
  n=$(printf '%s\n' "$ran" | grep -c '^RAN-IGNORED: ' || true)
  if [ "$n" -gt 0 ]; then ignored_ran=$((ignored_ran + n)); ignored_where+=("$name $n"); fi
}
if [ "$MATRIX_ONLY" = 0 ]; then
run scenarios bash lab/run.sh
run nri-smcr-6.12 env ERDMA_LAB_SUITE=bookworm-backports bash lab/run.sh --scenario nri-smcr
run smcr-6.12 env ERDMA_SMC_EXPECT=present bash crates/erdma-smc/lab/run-smcr.sh
run smcr-unsupported-7.3 env ERDMA_LAB_SUITE=trixie-backports ERDMA_SMC_EXPECT=absent bash crates/erdma-smc/lab/run-smcr.sh
run smcr-2vm-6.12 bash crates/erdma-smc/lab/run-smcr-2vm.sh
run pnet-6.12 bash crates/erdma-smc/lab/run-pnet.sh
run driver bash crates/erdma-driver/lab/run-driver.sh
run usage bash crates/erdma-usage/lab/run-usage.sh
for rt in $MATRIX_RUNTIMES; do
  # shellcheck disable=SC2046
  [ "$FULL" = 1 ] && run "scenarios@$rt" env ERDMA_LAB_RUNTIME="$rt" bash lab/run.sh $(printf -- '--scenario %s ' $RUNTIME_SCENARIOS)
  run "nri-smcr-6.12@$rt" env ERDMA_LAB_SUITE=bookworm-backports ERDMA_LAB_RUNTIME="$rt" bash lab/run.sh --scenario nri-smcr
done
fi
# the node matrix: one VM per node kind with the cells that run
for node in $MATRIX_NODES; do
  want=$RUNTIME_SCENARIOS; [ "$FULL" = 1 ] || want=${NODE_CI_CELLS[$node]:-}
  cells=()
  for s in $want; do [ -n "${NODE_NA[$s@$node]:-}" ] || cells+=("$s"); done
  [ "${#cells[@]}" -gt 0 ] || continue
  # shellcheck disable=SC2046
  run "scenarios@$node" bash lab/run.sh --node "$node" $(printf -- '--scenario %s ' "${cells[@]}")
done
# the table: one verdict per scenario and runtime or node kind
verdict_of() {
  local v
  v=$(printf '%s\n' "${results[@]}" | grep -E "^(PASS|FAIL|SKIP): $1( |\$)" | tail -n 1 | cut -d: -f1)
  echo "${v:-none}"
}
na_reasons=()
# na REASON: sets cell to "N/A [n]", REASON listed under the table as [n]
na() {
  local i
  for i in "${!na_reasons[@]}"; do [ "${na_reasons[$i]}" = "$1" ] && { cell="N/A [$((i + 1))]"; return; }; done
  na_reasons+=("$1"); cell="N/A [${#na_reasons[@]}]"
}
W=20
printf '\nlab matrix (scenario x runtime and node kind):\n  %-16s %-*s' scenario $W default
for c in $MATRIX_RUNTIMES $MATRIX_NODES; do printf ' %-*s' $W "$c"; done; echo
for s in $RUNTIME_SCENARIOS nri-smcr; do
  if [ "$MATRIX_ONLY" = 1 ]; then cell="not run"; else cell=$(verdict_of "$s"); fi
  row=$(printf '  %-16s %-*s' "$s" $W "$cell")
  for rt in $MATRIX_RUNTIMES; do
    if [ "$MATRIX_ONLY" = 1 ]; then cell="not run"
    elif [ "$FULL" = 0 ] && [ "$s" != nri-smcr ]; then cell="not in CI (--full)"
    else cell=$(verdict_of "$s@$rt"); fi
    row+=$(printf ' %-*s' $W "$cell")
  done
  for node in $MATRIX_NODES; do
    if [ "$s" = nri-smcr ]; then
      suite=$(awk -v n="$node" '!/^#/ && NF == 7 && $1 == n {print $2}' lab/nodes.conf)
      na "nri-smcr runs on 6.12 (nri-smcr-6.12 per runtime); ${NRI_SMCR_NA[$suite]:-the kernel of this kind ($suite) is not 6.12}"
    elif [ -n "${NODE_NA[$s@$node]:-}" ]; then
      na "$s@$node: ${NODE_NA[$s@$node]}"
    elif [ "$FULL" = 0 ] && ! tr ' ' '\n' <<<"${NODE_CI_CELLS[$node]:-}" | grep -qx -- "$s"; then
      cell="not in CI (--full)"
    else
      cell=$(verdict_of "$s@$node")
    fi
    row+=$(printf ' %-*s' $W "$cell")
  done
  echo "$row"
done
for i in "${!na_reasons[@]}"; do echo "  [$((i + 1))] ${na_reasons[$i]}"; done
where=$(IFS=,; echo "${ignored_where[*]:-}" | sed 's/,/, /g')
echo "ignored tests run in lab VMs: $ignored_ran (${where:-none})"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
