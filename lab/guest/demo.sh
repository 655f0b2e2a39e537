#!/bin/sh
# The demo inside the VM: the node's RDMA devices, the agent serving aliyun/erdma to the fake
# kubelet, two pods each allocated one slot, RDMA traffic between them. Writes the human report
# to out/demo-report.txt (the host prints it) and "REPORT: ok" / "REPORT: failed: why".
. /mnt/host/guest/lib.sh
SCEN=demo
R="$OUT/demo-report.txt"; : > "$R"
rep() { echo "$*" >> "$R"; }
die() { rep ""; rep "DEMO FAILED: $*"; echo "REPORT: failed: $*"; exit 1; }
for b in erdmactl erdma-fake-kubelet erdma-agent erdma-labpod; do
  command -v $b >/dev/null || die "$b is not built yet"
done
node_up
rep "Node: Linux $(uname -r) in qemu (TCG), $(nproc) CPUs, $(ls -d /sys/devices/system/node/node* | wc -l) NUMA nodes;"
rep "      Soft-RoCE rxe0 on eth0 (NUMA 0) and rxe1 on eth1 (NUMA 1)."
rep ""
rep "$ erdmactl devices"
erdmactl devices >> "$R" 2>&1 || die "erdmactl devices failed"
rep ""
start_kubelet || die "the fake kubelet did not start"
start_agent || die "the agent did not register (see out/demo-agent.log)"
rep "Agent registered aliyun/erdma with the fake kubelet:"
jq -r --arg r "$RES" '.resources[$r].devices | group_by(.id | split("/")[0])[]
  | "  \(.[0].id | split("/")[0]): \(length) slots, \(map(select(.health == "Healthy")) | length) healthy, NUMA \(.[0].numa | map(tostring) | join(","))"' "$STATE" >> "$R"
pod_net pod-a 10.88.0.11; pod_net pod-b 10.88.0.12
A=$(alloc pod-a 1) || die "Allocate for pod-a failed: $(tail -1 /tmp/pod-a.alloc.err)"
B=$(alloc pod-b 1) || die "Allocate for pod-b failed: $(tail -1 /tmp/pod-b.alloc.err)"
DA=$(ibdevs "$A"); DB=$(ibdevs "$B")
rep ""
for p in a b; do
  f=/tmp/pod-$p.json
  rep "Pod lab/pod-$p (10.88.0.1$(echo $p | tr ab 12)) was allocated $(ids "$f"):"
  rep "  devices: $(jq -r '[.devices[] | "\(.container_path) (\(.permissions))"] | join(", ")' "$f")"
  rep "  env:     $(jq -r '.envs | to_entries | map("\(.key)=\(.value)") | join(" ")' "$f")"
  rep "  inside the pod, /dev/infiniband: $(pod pod-$p "$f" ls /dev/infiniband | tr '\n' ' ')"
  rep "  inside the pod, ibv_devices:     $(pod pod-$p "$f" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')"
done
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB")
listening() { ip netns exec pod-a ss -Hltn | grep -q ":18515 "; }
pod pod-a "$A" timeout 60 ib_write_bw -d "$DA" -x "$GA" -F -n 1000 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 20 listening
pod pod-b "$B" timeout 60 ib_write_bw -d "$DB" -x "$GB" -F -n 1000 10.88.0.11 > /tmp/cli.out 2>&1 || die "ib_write_bw from pod-b to pod-a failed: $(tail -3 /tmp/cli.out | tr '\n' ' ')"
wait $srv
bw=$(awk '/^ *65536 / {print $4}' /tmp/cli.out | tail -1)
pod pod-a "$A" timeout 60 ibv_rc_pingpong -d "$DA" -g "$GA" -n 500 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 20 listening
pod pod-b "$B" timeout 60 ibv_rc_pingpong -d "$DB" -g "$GB" -n 500 10.88.0.11 > /tmp/cli.out 2>&1 || die "ibv_rc_pingpong from pod-b to pod-a failed"
wait $srv
lat=$(awk '/iters in/ {print $7}' /tmp/cli.out)
rep ""
rep "RDMA between the pods (RoCEv2 over Soft-RoCE, $DB in pod-b -> $DA in pod-a):"
rep "  ib_write_bw (RDMA WRITE, 1000 x 64 KiB):  ${bw} MB/s"
rep "  ibv_rc_pingpong (RC send/recv, 500 x 4 KiB): $lat us/iteration"
rep "  rdma statistic: $DA rcvd $(rdma -j statistic show link "$DA/1" | jq -r '.[0].rcvd_bytes') bytes, $DB sent $(rdma -j statistic show link "$DB/1" | jq -r '.[0].sent_bytes') bytes"
rep "  (software emulation on a shared CPU: the numbers show function, not speed)"
rep ""
rep "A pod without aliyun/erdma: /dev/infiniband $(pod_net pod-c 10.88.0.13; pod pod-c - sh -c 'test -e /dev/infiniband && echo present || echo absent'), ibv_devinfo says: $(pod pod-c - ibv_devinfo 2>&1 | tail -1)"
echo "REPORT: ok"
