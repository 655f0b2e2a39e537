#!/bin/sh
# numa: the VM has two NUMA nodes; eth0 (rxe0) sits behind a PCI expander bus on node 0 and
# eth1 (rxe1) behind one on node 1. The agent advertises each slot with its device's node, and
# preferred allocation keeps each pod's slots on one device and one NUMA node.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --kubelet-dir; need erdma-labpod
ck "the VM has two NUMA nodes" test -d /sys/devices/system/node/node1
ck "eth0 is on NUMA node 0 and eth1 on node 1" sh -c "test $(numa_of_netdev eth0) = 0 && test $(numa_of_netdev eth1) = 1"
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 4 || { fail "$SCEN" "agent did not register with the fake kubelet"; exit 0; }
jq -c --arg r "$RES" '.resources[$r] | {options, devices: [.devices[] | "\(.id):\(.numa)"]}' "$STATE"
for d in rxe0 rxe1; do
  n=${d#rxe}
  got=$(jq -r --arg r "$RES" --arg p "$d/" '[.resources[$r].devices[] | select(.id | startswith($p)) | .numa | tostring] | unique | join(" ")' "$STATE")
  ck "every $d slot is advertised on NUMA node $n (got $got)" test "$got" = "[$n]"
done
ck "preferred allocation is offered" jq -e --arg r "$RES" '.resources[$r].options.get_preferred_allocation_available' "$STATE"
nodes_used=""
for p in pod-a pod-b pod-c pod-d; do
  f=$(alloc "$p" 2) || { bad "Allocate of 2 slots for $p failed: $(tail -1 /tmp/$p.alloc.err)"; continue; }
  devs=$(ibdevs "$f")
  nodes=$(for i in $(ids "$f"); do jq -r --arg r "$RES" --arg i "$i" '.resources[$r].devices[] | select(.id == $i) | .numa | map(tostring) | join(",")' "$STATE"; done | sort -u | tr '\n' ' ')
  echo "REPORT: numa: $p got $(ids "$f") -> devices $devs, NUMA node(s) $nodes" >> "$OUT/report.txt"
  ck "$p got 2 slots on one device ($devs) and one NUMA node ($nodes)" sh -c "test $(echo $devs | wc -w) = 1 && test $(echo $nodes | wc -w) = 1"
  nodes_used="$nodes_used $nodes"
  if [ "$p" = pod-a ]; then
    pod_net pod-a 10.88.0.11
    u=$(uverbs_of "$devs")
    seen=$(pod pod-a "$f" ls /dev/infiniband | grep uverbs | tr '\n' ' ')
    ck "pod-a's /dev/infiniband holds only $devs's $u: [$seen]" test "$seen" = "$u "
  fi
done
ck "the four pods fill both NUMA nodes (nodes used:$nodes_used)" sh -c "echo '$nodes_used' | grep -q 0 && echo '$nodes_used' | grep -q 1"
finish
