#!/bin/sh
# Lab guest scenario "usage": erdma-usage's tests with its #[ignore]d ones: the RDMA netlink reader
# (QPs, MRs, CQs, PDs, port counters) against the real kernel with rxe0 and rxe1 and a running
# ibv_rc_pingpong, compared with iproute2's `rdma -j resource show` and `rdma -j statistic`.
# Would fail if: a request were mis-encoded (the kernel refuses it) or an answer mis-decoded (the
# reader and `rdma` disagree on a QP's number, type, state or owner, an MR's length, the CQ or PD
# counts, or the counter names), a test failed or stayed ignored, or no test ran.
. /mnt/host/guest/lib.sh
. /mnt/host/guest/testbin.sh
SCEN=usage
for d in rxe0 rxe1; do
  port_active "$d" || { fail usage "$d is not ACTIVE in kernel $(uname -r)"; exit 0; }
done
log "ib devices: $(ls /sys/class/infiniband | tr '\n' ' ')"
test_binary erdma-usage /usr/local/bin/erdma-usage-tests
finish
