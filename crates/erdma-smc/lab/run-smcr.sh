#!/bin/bash
# Runs the SMC-R scenario (crates/erdma-smc/lab/smcr-guest.sh) in the lab VM on a kernel with SMC
# and IPPROTO_SMC (suite bookworm-backports, Debian 6.12). Reuses lab/lib (see lab/README.md).
#   crates/erdma-smc/lab/run-smcr.sh      (root; needs what lab/run.sh needs, plus clang,
#                                          libbpf-dev and libelf-dev for the BPF policy)
# ERDMA_SMC_EXPECT=present|absent says whether the kernel must have SMC: present for
# bookworm-backports (6.12, where a failing `modprobe smc` is a FAIL), absent for any other suite
# (the unsupported-kernel run on trixie-backports 7.3, which checks the clear "unsupported" path).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ERDMA_LAB_SUITE=${ERDMA_LAB_SUITE:-bookworm-backports}
. "$HERE/../../../lab/lib/common.sh"
if [ "$SUITE" = bookworm-backports ]; then SMC_EXPECT=${ERDMA_SMC_EXPECT:-present}; else SMC_EXPECT=${ERDMA_SMC_EXPECT:-absent}; fi
case "$SMC_EXPECT" in present|absent) ;; *) die "ERDMA_SMC_EXPECT must be present or absent, not '$SMC_EXPECT'" ;; esac
timed host-packages lab_packages
cd "$REPO" || exit 2
bin=$(cargo test -q -p erdma-smc --features bpf --no-run --message-format=json 2>/dev/null \
  | jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["lib"] and .profile.test == true) | .executable' | tail -1)
[ -x "$bin" ] || die "could not build the erdma-smc test binary"
cargo build -q -p smcr-init -p erdmactl || die "cargo build failed"
dir=$(cargo_target_dir)/debug
timed kernel lab_kernel
lab_workdir
stage=$(mktemp -d /tmp/erdma-smcr-lab.XXXXXX); cp "$bin" "$stage/erdma-smc-tests"
BINS=("$stage/erdma-smc-tests" "$dir/smcr-init" "$dir/erdmactl")
timed initramfs lab_initramfs
cp "$HERE/smcr-guest.sh" "$WORK/share/guest/scenarios/smcr.sh"
echo "$SMC_EXPECT" > "$WORK/share/guest/smc-expected"
say "kernel $KVER ($SUITE), work dir $WORK, SMC expected $SMC_EXPECT"
timed vm lab_boot main.sh smcr
rm -rf "$stage"
grep -vE "^\s*$" "$WORK/share/out/smcr-"*-tests.txt 2>/dev/null | grep -E "^test |SKIP|test result|panicked" | tail -60 >&2
lab_timings_report >&2
# The test binary's counts (lab/ci.sh sums them): TESTS and RAN-IGNORED lines.
grep -E "^(TESTS|RAN-IGNORED): " "$WORK/share/out/tests.txt" 2>/dev/null
grep -E "^(PASS|FAIL|SKIP): smcr" "$WORK/share/out/results.txt" || { echo "FAIL: smcr (no result; see $WORK/console.log)"; exit 1; }
grep -q "^PASS: smcr" "$WORK/share/out/results.txt"
