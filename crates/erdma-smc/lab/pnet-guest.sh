#!/bin/sh
# Lab guest scenario "pnet": the erdma-smc tests (built without `bpf`) against a real kernel with
# SMC and rxe devices, #[ignore]d ones included (the pnet client on the real SMC_PNETID family,
# the ib port entry in the initial namespace). A missing smc module or RDMA device is a FAIL.
# Would fail if: a pnet request were mis-encoded or mis-decoded (the kernel refuses or lists
# something else), a test failed or stayed ignored, or no test ran.
. /mnt/host/guest/lib.sh
. /mnt/host/guest/testbin.sh
SCEN=pnet
if ! modprobe smc 2>/dev/null; then fail pnet "kernel $(uname -r) has no smc module (this scenario needs the 6.12 suite)"; exit 0; fi
log "smc loaded; ib devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
IB=$(ls /sys/class/infiniband | head -n 1)
[ -n "$IB" ] || { fail pnet "no RDMA device in the VM"; exit 0; }
export ERDMA_LAB_IBDEV=$IB
# This kernel has SMC: the tests of the "SMC unsupported" path run on the CI host and the 7.3 VM.
test_binary erdma-smc /usr/local/bin/erdma-smc-tests --skip without_smc
finish
