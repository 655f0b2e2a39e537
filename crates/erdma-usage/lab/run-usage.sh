#!/bin/bash
# Runs the erdma-usage tests, #[ignore]d ones included, inside the lab VM: the RDMA netlink reader
# against the real kernel's resource tracking on rxe0/rxe1 with a running ibv_rc_pingpong, and
# iproute2's `rdma resource show` / `rdma statistic` as the oracle. Reuses lab/lib (see
# lab/README.md). Prints PASS/FAIL, then the test binary's counts.
#   crates/erdma-usage/lab/run-usage.sh      (root; needs what lab/run.sh needs)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../../lab/lib/common.sh"
timed host-packages lab_packages
bin=$(cd "$REPO" && cargo test -q -p erdma-usage --no-run --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["lib"] and .profile.test == true) | .executable' | tail -1)
[ -x "$bin" ] || die "could not build the erdma-usage test binary"
timed kernel lab_kernel
lab_workdir
stage=$(mktemp -d /tmp/erdma-usage-lab.XXXXXX); cp "$bin" "$stage/erdma-usage-tests"
BINS=("$stage/erdma-usage-tests")
timed initramfs lab_initramfs
cp "$HERE/usage-guest.sh" "$WORK/share/guest/scenarios/usage.sh"
say "kernel $KVER ($SUITE), work dir $WORK"
timed vm lab_boot main.sh usage
rm -rf "$stage"
grep -vE "^\s*$" "$WORK/share/out/usage-"*-tests.txt 2>/dev/null | tail -80 >&2
# The test binary's counts (lab/ci.sh sums them): TESTS and RAN-IGNORED lines.
grep -E "^(TESTS|RAN-IGNORED): " "$WORK/share/out/tests.txt" 2>/dev/null
grep -E "^(PASS|FAIL|SKIP): usage" "$WORK/share/out/results.txt" || { echo "FAIL: usage (no result; see $WORK/console.log)"; exit 1; }
grep -q "^PASS: usage" "$WORK/share/out/results.txt"
