#!/bin/bash
# Two lab VMs (Debian 6.12, TCG, 1 vCPU each) joined by a qemu stream netdev over a host Unix
# socket; rxe0 on each NIC, a shared UEID, the BPF policy applied to each VM's main namespace.
# An unmodified TCP client/server (crates/erdma-smc/examples/tcpbench.rs) must run in mode SMCR
# from the first connection, and in TCP once the policy is released. Prints REPORT lines with
# connect times and throughput (under TCG they show function, not speed).
#   crates/erdma-smc/lab/run-smcr-2vm.sh   (root; what lab/run.sh needs, plus clang, libbpf-dev, libelf-dev)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export ERDMA_LAB_SUITE=${ERDMA_LAB_SUITE:-bookworm-backports}
. "$HERE/../../../lab/lib/common.sh"
timed host-packages lab_packages
cd "$REPO" || exit 2
cargo build -q -p smcr-init && cargo build -q -p erdma-smc --example tcpbench || die "cargo build failed"
dir=${CARGO_TARGET_DIR:-$REPO/target}/debug
timed kernel lab_kernel
lab_workdir
BINS=("$dir/smcr-init" "$dir/examples/tcpbench")
timed initramfs lab_initramfs
for r in server client; do cp "$HERE/smcr2vm-guest.sh" "$WORK/share/guest/scenarios/smcr2vm-$r.sh"; done
VMLINUZ=$( (ls "$KROOT"/boot/vmlinuz-* "$KROOT"/usr/lib/modules/*/vmlinuz 2>/dev/null || true) | head -1)
SOCK=$(mktemp -u /tmp/erdma-smcr2vm.XXXXXX.sock)
APPEND="console=ttyS0 quiet panic=-1 loglevel=4 cryptomgr.notests mitigations=off tsc=reliable no_timer_check rcupdate.rcu_expedited=1"
vm() { # vm ROLE server=on|off MAC
  timeout --foreground "${LAB_TIMEOUT:-600}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
    -m 1024 -smp 1 -nographic -no-reboot -nic none \
    -netdev stream,id=n0,server=$2,addr.type=unix,addr.path="$SOCK" -device virtio-net-pci,netdev=n0,mac=$3 \
    -kernel "$VMLINUZ" -initrd "$INITRD" \
    -fsdev local,id=hostshare,path="$WORK/share",security_model=none \
    -device virtio-9p-pci,fsdev=hostshare,mount_tag=hostshare \
    -append "$APPEND lab.script=guest/scenarios/smcr2vm-$1.sh lab.args=$1" < /dev/null > "$WORK/console-$1.log" 2>&1
}
say "kernel $KVER ($SUITE), work dir $WORK: booting server and client"
t=$(date +%s.%N)
vm server on 52:54:00:4b:00:01 & srv=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
vm client off 52:54:00:4b:00:02
wait $srv
TIMINGS+=("two-vms $(elapsed "$t")"); rm -f "$SOCK"
grep -hE "^(  ok|  FAIL|REPORT)" "$WORK/console-server.log" "$WORK/console-client.log" >&2
lab_timings_report >&2
res="$WORK/share/out/results.txt"
grep -E "^(PASS|FAIL|SKIP): smcr2vm" "$res" || { echo "FAIL: smcr2vm (no result; see $WORK/console-*.log)"; exit 1; }
[ "$(grep -c '^PASS: smcr2vm' "$res")" = 2 ]
