#!/bin/bash
# The erdma demo: build the binaries, boot a real Linux kernel with two Soft-RoCE NICs on two
# NUMA nodes, let the agent serve aliyun/erdma to the fake kubelet, start two pods (containers on
# containerd, over CRI) with one allocated RDMA device each, run RDMA traffic between them and
# print what happened.
#   lab/demo.sh [--suite SUITE] [--runtime RUNTIME]
# RUNTIME: the guest's container runtime, containerd-1.7 (default) or containerd-2.1 (lab/runtime.conf).
# Installs what it needs first (scripts/host-deps.sh build lab). Exit status 0 only with "REPORT: ok":
# distinct devices, both ends of every tool exited 0, non-zero bandwidth, packet counters that rose
# on both devices, and no RDMA device in the pod without the resource.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) SUITE=${2:?--suite needs a value}; shift 2 ;;
    --runtime) RUNTIME=${2:?--runtime needs a value}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
grep -qx -- "$RUNTIME" < <(lab_runtimes | tr ' ' '\n') \
  || { echo "demo.sh: unknown runtime '$RUNTIME' (known: $(lab_runtimes))" >&2; exit 2; }
timed host-packages lab_packages
timed cargo-build lab_build
timed kernel lab_kernel
timed runtime lab_runtime
lab_workdir
# the agent runs as the chart's DaemonSet pod, from the image operators deploy
timed images lab_images
timed initramfs lab_initramfs
say "booting kernel $KVER ($SUITE), runtime $RUNTIME; work dir $WORK"
timed vm lab_boot demo.sh
# the guest's own steps (container runtime start, image import, pod starts), on its uptime clock
[ -f "$WORK/share/out/timings.txt" ] && while read -r n v; do TIMINGS+=("guest-$n $v"); done < "$WORK/share/out/timings.txt"
echo
echo "=== erdma demo: a real kernel, real RDMA devices, the agent serving two pods ==="
if [ -s "$WORK/share/out/demo-report.txt" ]; then cat "$WORK/share/out/demo-report.txt"; else echo "(no report: see $WORK/console.log)"; fi
echo
printf 'Timings:'; for t in "${TIMINGS[@]}"; do printf ' %s %ss,' "${t% *}" "${t##* }"; done; echo " total $(elapsed "$T0")s"
echo "Logs: $WORK/share/out/"
verdict=$(grep -E '^REPORT: (ok|failed)' "$WORK/share/out/demo.log" 2>/dev/null | tail -1)
echo "${verdict:-REPORT: failed: the guest gave no verdict (see $WORK/console.log)}"
[ "$verdict" = "REPORT: ok" ]
