#!/bin/sh
# numa: the VM has two NUMA nodes; eth0 (rxe0) sits behind a PCI expander bus on node 0 and
# eth1 (rxe1) behind one on node 1. The agent advertises each slot with its device's node, and
# its GetPreferredAllocation keeps a container on one device of one NUMA node: the node with the
# most free slots (ties: the lower node), or the node of the slots it must include (documented in
# crates/erdma-model/src/allocation.rs). The requests are ordered so that the first free slots
# (the order the slots are advertised and offered in) are on the other node or straddle both
# devices, and erdma-fake-kubelet chooses like the kubelet (the preferred IDs that are free, then
# the first free ones), so only the plugin's preference gives the expected devices.
# Would fail if: GetPreferredAllocation answered with the first available IDs, ignored the NUMA
# node's free slots or must_include, or was not offered/used (the kubelet would then take the
# first free slots; shown with a first-available plugin: pod-b lands on node 0, pod-c straddles
# rxe0 and rxe1, pod-e's init and app containers land on node 0).
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

# numa_of_ids ALLOC: the NUMA nodes of the allocated slots
numa_of_ids() {
  for i in $(ids "$1"); do
    jq -r --arg r "$RES" --arg i "$i" '.resources[$r].devices[] | select(.id == $i) | .numa | map(tostring) | join(",")' "$STATE"
  done | sort -u | tr '\n' ' '
}
# request POD CONTAINER COUNT WANT_DEVICE WHY [--reuse-from INIT]: allocate through the fake kubelet
# and check that the kubelet used the plugin's preference and that it put the container on WANT_DEVICE
request() {
  _p=$1; _c=$2; _n=$3; _want=$4; _why=$5; shift 5
  _f=/tmp/$_p-$_c.json
  if ! erdma-fake-kubelet allocate --dir "$KDIR" --resource "$RES" --count "$_n" --pod "lab/$_p" --container "$_c" "$@" \
       -o json > "$_f" 2> "/tmp/$_p.alloc.err"; then
    bad "Allocate of $_n slot(s) for $_p/$_c failed: $(tail -1 /tmp/$_p.alloc.err)"; return 1
  fi
  _devs=$(ibdevs "$_f"); _nodes=$(numa_of_ids "$_f")
  _first=$(jq -r --argjson n "$_n" '.offered[:$n] | join(" ")' "$_f")
  echo "REPORT: numa: $_p/$_c asked $_n: offered first [$_first], reused [$(jq -r '.reused | join(" ")' "$_f")], preferred [$(jq -r '.preferred | join(" ")' "$_f")], got [$(ids "$_f")] -> $_devs, NUMA node(s) $_nodes" >> "$OUT/report.txt"
  ck "$_p/$_c: the kubelet used the plugin's preferred allocation ($(jq -r '.preferred | join(" ")' "$_f"))" \
    jq -e '(.preferred | length) > 0 and (.device_ids | sort) == (.preferred | sort)' "$_f"
  ck "$_p/$_c: $_n slot(s) on $_want only ($_why; got $_devs, NUMA node(s) $_nodes; first free: $_first)" \
    sh -c "test '$_devs' = '$_want' && test $(echo $_nodes | wc -w) = 1"
  LAST=$_f
}

# 4 slots per device: rxe0/0-3 on node 0, rxe1/0-3 on node 1.
request pod-a c 1 rxe0 "4 free slots on each node: the lower node"
request pod-b c 2 rxe1 "node 1 has 4 free slots, node 0 3; the first free are rxe0/1 rxe0/2" && {
  pod_net pod-b 10.88.0.12
  u=$(uverbs_of rxe1)
  seen=$(pod pod-b "$LAST" ls /dev/infiniband | grep uverbs | tr '\n' ' ')
  ck "pod-b's /dev/infiniband holds only rxe1's $u: [$seen]" test "$seen" = "$u "
}
request pod-c c 2 rxe0 "node 0 has 3 free slots, node 1 2"
request pod-d c 2 rxe1 "node 1 has 2 free slots, node 0 1; the first free straddle rxe0 and rxe1"
ck "release pod-b" erdma-fake-kubelet release --dir "$KDIR" --pod lab/pod-b
# free now: rxe0/3 (node 0) and pod-b's two rxe1 slots (node 1)
request pod-e init 1 rxe1 "node 1 has 2 free slots, node 0 1; the first free is rxe0/3"
init_slot=$(ids /tmp/pod-e-init.json)
request pod-e app 2 rxe1 "it reuses the init container's $init_slot (must_include); the first free straddle rxe0 and rxe1" --reuse-from init
ck "pod-e's app container reused $init_slot" jq -e --arg s "$init_slot" '.reused == [$s] and (.device_ids | index($s)) != null' /tmp/pod-e-app.json
finish
