#!/bin/bash
# Runs the erdma-driver tests, #[ignore]d ones included, inside the lab VM (real modprobe/rmmod
# through PID 1's namespaces, the reconciler against a kernel without erdma). Reuses lab/lib (see
# lab/README.md). Prints PASS/FAIL, then the test binary's counts.
#   crates/erdma-driver/lab/run-driver.sh      (root; needs what lab/run.sh needs)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../../lab/lib/common.sh"
timed host-packages lab_packages
bin=$(cd "$REPO" && cargo test -q -p erdma-driver --no-run --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["lib"] and .profile.test == true) | .executable' | tail -1)
[ -x "$bin" ] || die "could not build the erdma-driver test binary"
timed kernel lab_kernel
lab_workdir
stage=$(mktemp -d /tmp/erdma-driver-lab.XXXXXX); cp "$bin" "$stage/erdma-driver-tests"
BINS=("$stage/erdma-driver-tests")
timed initramfs lab_initramfs
cp "$HERE/driver-guest.sh" "$WORK/share/guest/scenarios/driver.sh"
say "kernel $KVER ($SUITE), work dir $WORK"
timed vm lab_boot main.sh driver
rm -rf "$stage"
grep -vE "^\s*$" "$WORK/share/out/driver-"*-tests.txt 2>/dev/null | tail -60 >&2
# The test binary's counts (lab/ci.sh sums them): TESTS and RAN-IGNORED lines.
grep -E "^(TESTS|RAN-IGNORED): " "$WORK/share/out/tests.txt" 2>/dev/null
grep -E "^(PASS|FAIL|SKIP): driver" "$WORK/share/out/results.txt" || { echo "FAIL: driver (no result; see $WORK/console.log)"; exit 1; }
grep -q "^PASS: driver" "$WORK/share/out/results.txt"
