#!/bin/sh
# inventory: `erdmactl devices` inside the VM lists rxe0 and rxe1 with the state, GIDs, NUMA
# node, netdev, MAC and uverbs device that the kernel reports (ibv_devinfo, rdma, sysfs, /dev).
# Would fail if: the inventory misread or left out any of these (port state, node GUID, a GID or
# its type, the netdev pairing, MAC, NUMA node, uverbs path or major:minor), called a healthy
# device unhealthy, or `erdmactl devices` dropped a device from its table or JSON.
. /mnt/host/guest/lib.sh
need erdmactl
if ! erdmactl devices > /tmp/table.txt 2>&1; then fail "$SCEN" "erdmactl devices exited non-zero: $(tail -1 /tmp/table.txt)"; exit 0; fi
cat /tmp/table.txt
erdmactl devices -o json > /tmp/inv.json 2>/tmp/inv.err || { fail "$SCEN" "erdmactl devices -o json failed: $(tail -1 /tmp/inv.err)"; exit 0; }
rdma -j link show > /tmp/links.json
for d in rxe0 rxe1; do
  echo " $d:"
  j() { jq -r --arg d "$d" ".devices[] | select(.name == \$d) | $1" /tmp/inv.json; }
  ck "$d is listed" test "$(j .name)" = "$d"
  ck "$d appears in the table" grep -q "^$d " /tmp/table.txt
  ibv_devinfo -v -d "$d" > /tmp/devinfo.txt
  # port state: ibv_devinfo "PORT_ACTIVE (4)" <-> "active"
  want=$(awk '/^[[:space:]]*state:/ {print $2; exit}' /tmp/devinfo.txt | sed 's/^PORT_//' | tr 'A-Z' 'a-z')
  ck "$d port state $(j '.ports[0].state') = ibv_devinfo $want" test "$(j '.ports[0].state')" = "$want"
  want=$(awk '/node_guid:/ {print $2; exit}' /tmp/devinfo.txt)
  ck "$d node GUID $(j .node_guid) = ibv_devinfo $want" test "$(j .node_guid)" = "$want"
  # GIDs: "GID[  1]:  ::ffff:10.77.0.1, RoCE v2" <-> {index, gid, gid_type: roce_v2}
  sed -n 's/^[[:space:]]*GID\[ *\([0-9]*\)\]:[[:space:]]*\([^,]*\), RoCE v2$/\1 \2 roce_v2/p; s/^[[:space:]]*GID\[ *\([0-9]*\)\]:[[:space:]]*\([^,]*\), IB\/RoCE v1$/\1 \2 roce_v1/p' \
    /tmp/devinfo.txt | sort > /tmp/gids.want
  j '.ports[0].gids[] | "\(.index) \(.gid) \(.gid_type)"' | sort > /tmp/gids.got
  ck "$d GIDs ($(wc -l < /tmp/gids.got)) = ibv_devinfo GIDs ($(wc -l < /tmp/gids.want))" \
    sh -c 'test -s /tmp/gids.want && diff /tmp/gids.want /tmp/gids.got'
  nd=$(jq -r --arg d "$d" '.[] | select(.ifname == $d) | .netdev' /tmp/links.json)
  ck "$d netdev $(j .netdev.name) = rdma link $nd" test "$(j .netdev.name)" = "$nd"
  ck "$d MAC $(j .netdev.mac) = $nd's address" test "$(j .netdev.mac)" = "$(cat /sys/class/net/$nd/address)"
  want=$(numa_of_netdev "$nd")
  placed=${d#rxe}   # the VM puts the NIC of rxe0 on NUMA node 0 and that of rxe1 on node 1
  ck "$d NUMA $(j .numa_node) = PCI numa_node of $nd ($want) = qemu placement ($placed)" \
    sh -c "test '$(j .numa_node)' = '$want' && test '$want' = '$placed'"
  uv=$(uverbs_of "$d")
  ck "$d uverbs $(j .char_devices.uverbs.path) = /dev/infiniband/$uv" test "$(j .char_devices.uverbs.path)" = "/dev/infiniband/$uv"
  want=$(stat -c '%t %T' "/dev/infiniband/$uv" | (read -r a b; echo "$((0x$a)):$((0x$b))"))
  ck "$d uverbs major:minor $(j '"\(.char_devices.uverbs.major):\(.char_devices.uverbs.minor)"') = /dev node $want" \
    test "$(j '"\(.char_devices.uverbs.major):\(.char_devices.uverbs.minor)"')" = "$want"
  ck "$d health is healthy" test "$(j .health.status)" = healthy
done
finish
