#!/bin/sh
# Lab guest scenario "driver": erdma-driver's tests with its #[ignore]d ones: the real host (kmod
# through PID 1's namespaces) and the reconciler against a real kernel without erdma.
# Would fail if: modprobe/rmmod through the host's namespaces broke, the reconciler panicked or
# reported the failed install wrongly, a test stayed ignored, or no test ran.
. /mnt/host/guest/lib.sh
. /mnt/host/guest/testbin.sh
SCEN=driver
KMOD=
for m in siw dummy; do
  if modinfo "$m" >/dev/null 2>&1 && ! grep -q "^$m " /proc/modules; then KMOD=$m; break; fi
done
[ -n "$KMOD" ] || { fail driver "no unloaded test module (siw, dummy) in kernel $(uname -r)"; exit 0; }
log "test module: $KMOD"
export ERDMA_LAB_KMOD=$KMOD
test_binary erdma-driver /usr/local/bin/erdma-driver-tests
finish
