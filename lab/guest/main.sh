#!/bin/sh
# Guest entry point: set up the node once, then run each scenario given as an argument in its
# own session (killed after LIMIT seconds), cleaning up pods and daemons in between.
# Results: out/results.txt (PASS/FAIL/SKIP lines); timings: out/timings.txt.
. /mnt/host/guest/lib.sh
# the host's ERDMA_LAB_SCENARIO_LIMIT (lab/lib/common.sh, lab_workdir), else 480 s
LIMIT=${LIMIT:-$(cat /mnt/host/guest/scenario-limit 2>/dev/null || echo 480)}
: > "$OUT/results.txt"; : > "$OUT/timings.txt"
t=$(now); echo "boot-to-script $t" >> "$OUT/timings.txt"
log "kernel $(uname -r), $(nproc) CPUs, NUMA nodes: $(ls -d /sys/devices/system/node/node* | wc -l)"
node_up
# the container runtime, when the image has it (lab/run.sh and demo.sh build it in)
command -v containerd > /dev/null && { runtime_up || log "the container runtime did not start"; }
echo "node-setup $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"

cleanup() {
  runtime_clean
  # a scenario that turned containerd's debug log on (nri-smcr): back to info, the log kept
  if [ "$(cat "$CTRD_LEVEL_FILE" 2>/dev/null)" = debug ]; then runtime_restart info; fi
  for ns in $(ip netns list | awk '{print $1}'); do ip netns del "$ns"; done
  ip link set eth0 up 2>/dev/null; ip link set eth1 up 2>/dev/null
  rm -rf "$KDIR" /tmp/*.json
}

for s in "$@"; do
  if [ ! -f "/mnt/host/guest/scenarios/$s.sh" ]; then fail "$s" "no such scenario"; continue; fi
  log "=== scenario $s"
  t=$(now)
  # setsid is a busybox applet that would run busybox's own sh: name dash explicitly
  SCEN=$s setsid /usr/bin/dash "/mnt/host/guest/scenarios/$s.sh" &
  pid=$!
  # the watchdog's sleep must not hold the console pipe open after the scenario ends
  ( sleep "$LIMIT" > /dev/null 2>&1; echo "scenario $s: no result after ${LIMIT}s, killing it"; kill -9 "-$pid" ) &
  wd=$!
  wait $pid
  kill $wd 2>/dev/null
  kill -9 "-$pid" 2>/dev/null
  grep -qE "^(PASS|FAIL|SKIP): $s( |\$)" "$OUT/results.txt" || fail "$s" "scenario ended without a result"
  echo "scenario-$s $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
  cleanup
done
log "done"
