#!/bin/sh
# Lab guest scenario "driver": erdma-driver's real host (kmod through PID 1's namespaces) and the
# reconciler against a real kernel.
# Would fail if: an erdma-driver test failed against the real kernel (loading or unloading a
# module through PID 1's namespaces, or the reconciler's reported status, went wrong), or, with
# --strict/ERDMA_LAB_STRICT=1 as lab/ci.sh runs it, no unloaded test module was available.
. /mnt/host/guest/lib.sh
SCEN=driver
KMOD=
for m in siw dummy; do
  if modinfo "$m" >/dev/null 2>&1 && ! grep -q "^$m " /proc/modules; then KMOD=$m; break; fi
done
[ -n "$KMOD" ] || { skip driver "no unloaded test module (siw, dummy) in this kernel"; exit 0; }
log "test module: $KMOD"
export ERDMA_LAB_KMOD=$KMOD RUST_BACKTRACE=1
ck "erdma-driver tests on kernel $(uname -r) (module $KMOD)" /usr/local/bin/erdma-driver-tests --test-threads=1 --nocapture
cp /tmp/ck.out "$OUT/driver-tests.txt"
finish
