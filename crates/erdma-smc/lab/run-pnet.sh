#!/bin/bash
# Runs the erdma-smc tests (pnet over SMC_PNETID generic netlink), #[ignore]d ones included,
# inside the lab VM, on a kernel with SMC (suite bookworm-backports) and Soft-RoCE devices.
# Reuses lab/lib (see lab/README.md). Prints PASS/FAIL, then the test binary's counts.
#   crates/erdma-smc/lab/run-pnet.sh      (root; needs what lab/run.sh needs)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ERDMA_LAB_SUITE=${ERDMA_LAB_SUITE:-bookworm-backports}
. "$HERE/../../../lab/lib/common.sh"
timed host-packages lab_packages
bin=$(cd "$REPO" && cargo test -q -p erdma-smc --no-run --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["lib"] and .profile.test == true) | .executable' | tail -1)
[ -x "$bin" ] || die "could not build the erdma-smc test binary"
timed kernel lab_kernel
lab_workdir
stage=$(mktemp -d /tmp/erdma-smc-lab.XXXXXX); cp "$bin" "$stage/erdma-smc-tests"
BINS=("$stage/erdma-smc-tests")
timed initramfs lab_initramfs
cp "$HERE/pnet-guest.sh" "$WORK/share/guest/scenarios/pnet.sh"
say "kernel $KVER ($SUITE), work dir $WORK"
timed vm lab_boot main.sh pnet
rm -rf "$stage"
grep -vE "^\s*$" "$WORK/share/out/pnet-"*-tests.txt 2>/dev/null | tail -60 >&2
# The test binary's counts (lab/ci.sh sums them): TESTS and RAN-IGNORED lines.
grep -E "^(TESTS|RAN-IGNORED): " "$WORK/share/out/tests.txt" 2>/dev/null
grep -E "^(PASS|FAIL|SKIP): pnet" "$WORK/share/out/results.txt" || { echo "FAIL: pnet (no result; see $WORK/console.log)"; exit 1; }
grep -q "^PASS: pnet" "$WORK/share/out/results.txt"
