#!/bin/bash
# Boot the lab VM: a "node" with two NUMA nodes and two virtio NICs, eth0 behind a PCI expander
# bus on NUMA node 0 and eth1 behind one on NUMA node 1. Both NICs sit on one qemu hub (a
# switch with no uplink): they reach each other and nothing else.
#   vm.sh KROOT INITRD SHARE [SCRIPT [ARG...]]
# SCRIPT is a path relative to SHARE that the guest's /init runs; its output goes to the console
# (this script's stdout) and to SHARE/out/<script>.log.
# Env: LAB_ACCEL (tcg; "kvm" only where /dev/kvm runs stock kernels), LAB_MEM (MiB per NUMA node,
#      default 768), LAB_TIMEOUT (seconds, default 600), LAB_APPEND (extra kernel arguments),
#      LAB_SHELL=1 (interactive shell after the script).
set -euo pipefail
KROOT=$1; INITRD=$2; SHARE=$(readlink -f "$3"); shift 3
SCRIPT=${1:-}; [ $# -gt 0 ] && shift
ARGS=$(IFS=,; echo "$*")
VMLINUZ=$( (ls "$KROOT"/boot/vmlinuz-* "$KROOT"/usr/lib/modules/*/vmlinuz 2>/dev/null || true) | head -1)
[ -n "$VMLINUZ" ] || { echo "vm.sh: no vmlinuz under $KROOT" >&2; exit 2; }
if [ "${LAB_ACCEL:-tcg}" = kvm ]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max); fi
MEM=${LAB_MEM:-768}
# boot-time savers under TCG (about 2 s): no crypto self-tests, no mitigations, no timer checks
APPEND="console=ttyS0 quiet panic=-1 loglevel=4 cryptomgr.notests mitigations=off tsc=reliable"
APPEND="$APPEND no_timer_check rcupdate.rcu_expedited=1 ${LAB_APPEND:-}"
[ -n "$SCRIPT" ] && APPEND="$APPEND lab.script=$SCRIPT"
[ -n "$ARGS" ] && APPEND="$APPEND lab.args=$ARGS"
[ "${LAB_SHELL:-0}" = 1 ] && APPEND="$APPEND lab.shell=1"
exec timeout --foreground "${LAB_TIMEOUT:-600}" qemu-system-x86_64 "${ACC[@]}" \
  -m $((2 * MEM)) -smp 2 -nographic -no-reboot -nic none \
  -object memory-backend-ram,id=m0,size=${MEM}M -object memory-backend-ram,id=m1,size=${MEM}M \
  -numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1 \
  -device pxb,id=pxb0,bus_nr=16,numa_node=0,bus=pci.0 \
  -device pxb,id=pxb1,bus_nr=32,numa_node=1,bus=pci.0 \
  -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,bus=pxb0,mac=52:54:00:e7:00:01 \
  -netdev hubport,id=n1,hubid=0 -device virtio-net-pci,netdev=n1,bus=pxb1,mac=52:54:00:e7:00:02 \
  -kernel "$VMLINUZ" -initrd "$INITRD" \
  -fsdev local,id=hostshare,path="$SHARE",security_model=none \
  -device virtio-9p-pci,fsdev=hostshare,mount_tag=hostshare,bus=pci.0 \
  -append "$APPEND"
