#!/bin/sh
# Lab guest scenario "pnet": the SMC_PNETID client against a real kernel with SMC and rxe devices.
# Would fail if: an erdma-smc test failed against the real kernel (the SMC_PNETID generic
# netlink client could not add, list or remove pnet entries for the rxe device), or, with
# --strict/ERDMA_LAB_STRICT=1 as lab/ci.sh runs it, the kernel had no SMC or no RDMA device.
. /mnt/host/guest/lib.sh
SCEN=pnet
if ! modprobe smc 2>/dev/null; then skip pnet "kernel $(uname -r) has no smc module"; exit 0; fi
log "smc loaded; ib devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
IB=$(ls /sys/class/infiniband | head -n 1)
[ -n "$IB" ] || { skip pnet "no RDMA device in the VM"; exit 0; }
export ERDMA_LAB_IBDEV=$IB RUST_BACKTRACE=1
ck "erdma-smc tests on kernel $(uname -r) (ib $IB)" /usr/local/bin/erdma-smc-tests --test-threads=1 --nocapture
cp /tmp/ck.out "$OUT/pnet-tests.txt"
grep -E "^test |SKIP|test result" "$OUT/pnet-tests.txt" | sed "s/^/    /" || true
finish
