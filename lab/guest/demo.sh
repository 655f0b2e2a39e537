#!/bin/sh
# The demo inside the VM: the node's RDMA devices, the agent (the chart's DaemonSet pod, from the
# image scripts/build-images.sh built) serving aliyun/erdma to the fake kubelet, two pods (containers on the guest's containerd, run by the fake kubelet over CRI) each
# allocated one slot, RDMA traffic between them. Writes the human report
# to out/demo-report.txt (the host prints it) and "REPORT: ok" / "REPORT: failed: why".
#
# The verdict is the conjunction of the checks the report prints under "Verdict", each with its
# numbers: the chart's agent pod is ready and runs the built image; the pods got distinct devices; every tool exited 0 at both ends; ib_write_bw's receiving
# device counted the packets of its 1000 x 64 KiB, at a non-zero bandwidth by the wall clock; the RoCE
# packet counters rose on both devices, in both directions; the pod without aliyun/erdma has no
# /dev/infiniband and no RDMA device.
# Would fail if: the chart's agent pod could not run from the built image (a library or mount
# missing, the image reference not what the build makes), the plugin handed both pods the same device, Allocate left a device out of a pod,
# either end of ib_write_bw or ibv_rc_pingpong failed, the traffic did not cross the two rxe
# devices, or a pod without the resource could see an RDMA device or open one through a node it
# created itself (the runtime's device cgroup).
. /mnt/host/guest/lib.sh
SCEN=demo
R="$OUT/demo-report.txt"; : > "$R"
rep() { echo "$*" >> "$R"; }
die() { rep ""; rep "DEMO FAILED: $*"; echo "REPORT: failed: $*"; exit 1; }
# The verdict's checks go through lib.sh's `ck` (which collects FAILED) into the verdict file:
# vck DESCRIPTION CMD... (the description carries the numbers)
V=/tmp/verdict.txt; : > "$V"
vck() { ck "$@" >> "$V"; }
num_gt0() { awk -v x="$1" 'BEGIN { exit !(x + 0 > 0) }'; }
for b in erdmactl erdma-fake-kubelet containerd; do
  command -v $b >/dev/null || die "$b is not in the guest image (lab_build did not build it)"
done
node_up
runtime_up || die "the container runtime did not start (see out/containerd.log)"
rep "Node: Linux $(uname -r) in qemu (TCG), $(nproc) CPUs, $(ls -d /sys/devices/system/node/node* | wc -l) NUMA nodes;"
rep "      Soft-RoCE rxe0 on eth0 (NUMA 0) and rxe1 on eth1 (NUMA 1);"
rep "      container runtime $RT_NAME: containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR == 1 {print $3}')."
rep ""
rep "$ erdmactl devices"
erdmactl devices >> "$R" 2>&1 || die "erdmactl devices failed"
rep ""
start_kubelet || die "the fake kubelet did not start"
# The agent as operators deploy it: the chart's DaemonSet pod, from the image build-images.sh made.
chart_agent_up || die "the chart's agent pod did not run and register: $(tail -1 /tmp/agent.pod.err) (see out/demo-agent-container.log)"
chart_agent_logs
rep "The chart's agent DaemonSet pod ran from $AGENT_IMAGE ($(jq -r '.images[] | select(.name == "erdma-agent") | .digest' "$IMAGES/images.json" | cut -c1-19)...),"
rep "imported into containerd; the lab kubelet ran its pod template (hostNetwork, hostPID, $(jq '.spec.template.spec.volumes | length' /tmp/agent-ds.json) hostPath volumes,"
rep "NODE_NAME from spec.nodeName); ready by its readiness probe after $(jq -r '.ready_after_ms // "?"' /tmp/agent.pod.json) ms."
vck "the chart's agent pod is ready and runs the image build-images.sh built ($AGENT_IMAGE)" \
  sh -c "jq -e '.ready == true' /tmp/agent.pod.json && test '$AGENT_IMAGE' = \"\$(jq -r '.images[] | select(.name == \"erdma-agent\") | .ref' $IMAGES/images.json)\""
rep ""
rep "Agent registered aliyun/erdma with the fake kubelet:"
jq -r --arg r "$RES" '.resources[$r].devices | group_by(.id | split("/")[0])[]
  | "  \(.[0].id | split("/")[0]): \(length) slots, \(map(select(.health == "Healthy")) | length) healthy, NUMA \(.[0].numa | map(tostring) | join(","))"' "$STATE" >> "$R"
cpod pod-a 1 > /dev/null || die "pod-a did not start: $(tail -1 /tmp/pod-a.pod.err)"
cpod pod-b 1 > /dev/null || die "pod-b did not start: $(tail -1 /tmp/pod-b.pod.err)"
cpod pod-c 0 > /dev/null || die "pod-c did not start: $(tail -1 /tmp/pod-c.pod.err)"
A=/tmp/pod-a.json; B=/tmp/pod-b.json
for p in a b c; do echo "pod-run-pod-$p $(jq -r '.timings_ms.total / 1000' /tmp/pod-$p.pod.json)" >> "$OUT/timings.txt"; done
jq .allocation /tmp/pod-a.pod.json > "$A"; jq .allocation /tmp/pod-b.pod.json > "$B"
IPA=$(cpod_ip pod-a)
DA=$(ibdevs "$A"); DB=$(ibdevs "$B")
rep ""
for p in a b; do
  f=/tmp/pod-$p.json
  rep "Pod lab/pod-$p (container $(jq -r '.container_id[:12]' /tmp/pod-$p.pod.json), $(cpod_ip pod-$p), started in $(jq -r .timings_ms.total /tmp/pod-$p.pod.json) ms) was allocated $(ids "$f"):"
  rep "  devices: $(jq -r '[.devices[] | "\(.container_path) (\(.permissions))"] | join(", ")' "$f")"
  rep "  env:     $(jq -r '.envs | to_entries | map("\(.key)=\(.value)") | join(" ")' "$f")"
  rep "  inside the pod, /dev/infiniband: $(cx pod-$p ls /dev/infiniband | tr '\n' ' ')"
  rep "  inside the pod, ibv_devices:     $(cx pod-$p ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')"
done
vck "the pods got one device each, and distinct ones: pod-a $DA, pod-b $DB" \
  sh -c "test -n '$DA' && test -n '$DB' && test '$DA' != '$DB' && test \$(echo $DA | wc -w) = 1 && test \$(echo $DB | wc -w) = 1"
SEEN_A=$(cx pod-a ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
SEEN_B=$(cx pod-b ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
vck "each pod sees exactly its device: pod-a [$SEEN_A], pod-b [$SEEN_B]" \
  sh -c "test '$SEEN_A' = '$DA ' && test '$SEEN_B' = '$DB '"

GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB")
# stat IBDEV COUNTER: one RoCE counter of port 1 (rxe's hardware counters)
rstat() { rdma -j statistic show link "$1/1" | jq -r --arg c "$2" '.[0][$c] // empty'; }
snap() { for d in "$DA" "$DB"; do for c in sent_pkts rcvd_pkts; do echo "$d.$c=$(rstat "$d" $c)"; done; done; }
delta() { # delta BEFORE AFTER KEY
  _b=$(echo "$1" | sed -n "s/^$3=//p"); _a=$(echo "$2" | sed -n "s/^$3=//p")
  if [ -n "$_a" ] && [ -n "$_b" ]; then echo $((_a - _b)); else echo "?"; fi
}
listening() { cpod_listening pod-a 18515; }
S0=$(snap)
cwrite_bw pod-a "$DA" pod-b "$DB" /tmp/bw
bw=$WB_MBPS
cx pod-a timeout 300 ibv_rc_pingpong -d "$DA" -g "$GA" -n 500 > /tmp/pp-srv.out 2>&1 &
srv=$!; wait_for 60 listening
cx pod-b timeout 300 ibv_rc_pingpong -d "$DB" -g "$GB" -n 500 "$IPA" > /tmp/pp-cli.out 2>&1; pp_crc=$?
wait $srv; pp_src=$?
lat=$(awk '/iters in/ {print $7}' /tmp/pp-cli.out | tail -1)
S1=$(snap)
a_tx=$(delta "$S0" "$S1" "$DA.sent_pkts"); a_rx=$(delta "$S0" "$S1" "$DA.rcvd_pkts")
b_tx=$(delta "$S0" "$S1" "$DB.sent_pkts"); b_rx=$(delta "$S0" "$S1" "$DB.rcvd_pkts")
vck "ib_write_bw exited 0 at both ends (client in pod-b rc $WB_CRC, server in pod-a rc $WB_SRC) and moved its 1000 x 64 KiB: $DA received $WB_RX packets (at least $WB_NEED at its active MTU)" \
  cwrite_bw_moved
vck "ib_write_bw measured a non-zero bandwidth: $bw MB/s by the wall clock over $WB_SECS s (perftest's own figure: ${WB_PERF:-none})" \
  num_gt0 "$bw"
vck "ibv_rc_pingpong exited 0 at both ends (client rc $pp_crc, server rc $pp_src), ${lat:-?} us/iteration" \
  sh -c "test $pp_crc = 0 && test $pp_src = 0 && test -n '$lat'"
vck "RoCE packet counters rose on both devices: $DA sent +$a_tx rcvd +$a_rx, $DB sent +$b_tx rcvd +$b_rx" \
  sh -c "num() { case \$1 in ''|*[!0-9]*) return 1;; esac; test \$1 -gt 0; }; num '$a_tx' && num '$a_rx' && num '$b_tx' && num '$b_rx'"

C_DEV=$(cx pod-c sh -c 'test -e /dev/infiniband && ls /dev/infiniband | tr "\n" " " || echo absent')
C_LIST=$(cx pod-c ibv_devices 2>/dev/null | awk 'NR > 2 {print $1}' | tr '\n' ' ')
C_MSG=$(cx pod-c ibv_devinfo 2>&1 | tail -1)
vck "the pod without aliyun/erdma has no RDMA device: /dev/infiniband $C_DEV, ibv_devices [${C_LIST}], ibv_devinfo: $C_MSG" \
  sh -c "test '$C_DEV' = absent && test -z '$C_LIST'"
set -- $(dev_of "$(uverbs_of "$DA")")
C_CG=$(cx pod-c sh -c "mknod /tmp/uv c $1 $2 && echo mknod-ok; cat /tmp/uv" 2>&1 | tr '\n' ' ')
vck "the runtime's device cgroup refuses $DA's node it creates itself: $C_CG" \
  sh -c "echo '$C_CG' | grep -q mknod-ok && echo '$C_CG' | grep -q 'Operation not permitted'"

rep ""
rep "RDMA between the pods (RoCEv2 over Soft-RoCE, $DB in pod-b -> $DA in pod-a):"
rep "  ib_write_bw (RDMA WRITE, 1000 x 64 KiB):      ${bw:-?} MB/s by the wall clock, connection set-up included (perftest's own TSC-based figure: ${WB_PERF:-none} MB/s)"
rep "  ibv_rc_pingpong (RC send/recv, 500 x 4 KiB): ${lat:-?} us/iteration"
rep "  RoCE packets during both runs:  $DA sent $a_tx, received $a_rx;  $DB sent $b_tx, received $b_rx"
rep "  (software emulation on a shared CPU: the numbers show function, not speed)"
rep ""
rep "A pod without aliyun/erdma: /dev/infiniband $C_DEV; ibv_devinfo: $C_MSG"
rep "  and when it creates $DA's node itself (mknod): $C_CG"
rep ""
rep "Verdict:"
cat "$V" >> "$R"
for f in /tmp/bw-cli.out /tmp/bw-srv.out /tmp/pp-cli.out /tmp/pp-srv.out; do cp "$f" "$OUT/demo-$(basename "$f")"; done
# machine-readable figures for scripts/bench.sh
{
  echo "REPORT: demo ib_write_bw_MBps=${bw:-} pingpong_us=${lat:-}"
  echo "REPORT: demo pkts $DA.sent=$a_tx $DA.rcvd=$a_rx $DB.sent=$b_tx $DB.rcvd=$b_rx"
} >> "$OUT/report.txt"
if [ -z "$FAILED" ]; then echo "REPORT: ok"; else echo "REPORT: failed: $FAILED"; exit 1; fi
