#!/bin/sh
# allocation-modes: the agent's other two ways of answering Allocate, end to end.
# - CDI mode (--cdi-spec-dir): Allocate returns CDI device names; erdma-labpod resolves them from
#   the spec the agent wrote, each pod still sees only its own device, and RDMA runs between them.
# - --allocate-all-devices: a container that asks for one slot gets every usable device.
# - --deviceplugin-prestart-container: the kubelet calls PreStartContainer before the pod starts.
# Would fail if: CDI mode wrote no spec, answered with device nodes instead of CDI names, or its
# spec granted a pod another pod's device or a device that does not work; --allocate-all-devices
# gave a one-slot container fewer than all devices; or --deviceplugin-prestart-container did not
# register pre_start_required or its PreStartContainer failed.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --cdi-spec-dir; need erdma-labpod
CDI=/var/run/cdi
rm -rf "$CDI"; mkdir -p "$CDI"
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 1 --cdi-spec-dir "$CDI" || { fail "$SCEN" "agent (CDI mode) did not register"; exit 0; }
ck "the agent wrote a CDI spec into $CDI ($(ls $CDI | tr '\n' ' '))" sh -c "ls $CDI | grep -qE '\\.(json|yaml|yml)\$'"
cp "$CDI"/* "$OUT/" 2>/dev/null   # kept with the logs (crates/erdma-lab/testdata has a capture)
pod_net pod-a 10.88.0.11; pod_net pod-b 10.88.0.12
A=$(alloc pod-a 1) || { fail "$SCEN" "CDI-mode Allocate for pod-a failed: $(tail -1 /tmp/pod-a.alloc.err)"; exit 0; }
B=$(alloc pod-b 1) || { fail "$SCEN" "CDI-mode Allocate for pod-b failed: $(tail -1 /tmp/pod-b.alloc.err)"; exit 0; }
echo " pod-a: $(jq -c '{device_ids, cdi_devices, devices}' "$A")"
cp "$A" "$OUT/cdi-allocate-pod-a.json"
ck "CDI-mode Allocate names CDI devices" jq -e '.cdi_devices | length > 0' "$A"
DA=$(ibdevs "$A"); DB=$(ibdevs "$B"); UA=$(uverbs_of "$DA"); UB=$(uverbs_of "$DB")
for p in a b; do
  f=/tmp/pod-$p.json; eval "u=\$U$(echo $p | tr ab AB)"; eval "o=\$U$(echo $p | tr ab BA)"
  want=$(erdma-labpod plan --name "pod-$p" --alloc "$f" -- true \
    | jq -r '.devices[].container_path | select(startswith("/dev/infiniband/")) | ltrimstr("/dev/infiniband/")' | sort | tr '\n' ' ')
  seen=$(pod "pod-$p" "$f" ls /dev/infiniband | sort | tr '\n' ' ')
  ck "pod-$p (CDI) sees exactly what the CDI spec grants: [$seen] = [$want], with $u and without $o" \
    sh -c "test '$seen' = '$want' && echo ' $seen' | grep -qw $u && ! echo ' $seen' | grep -qw $o"
done
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB")
listening() { ip netns exec pod-a ss -Hltn | grep -q ":18515 "; }
pod pod-a "$A" timeout 60 ibv_rc_pingpong -d "$DA" -g "$GA" -n 100 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 20 listening
pod pod-b "$B" timeout 60 ibv_rc_pingpong -d "$DB" -g "$GB" -n 100 10.88.0.11 > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
ck "ibv_rc_pingpong between the CDI pods (rc $crc/$src)" sh -c "test $crc = 0 && test $src = 0 && grep -q '100 iters' /tmp/cli.out"
stop_daemons

start_kubelet || { fail "$SCEN" "fake kubelet did not restart"; exit 0; }
start_agent --slots-per-device 1 --allocate-all-devices || { fail "$SCEN" "agent (--allocate-all-devices) did not register"; exit 0; }
pod_net pod-c 10.88.0.13
C=$(alloc pod-c 1) || { fail "$SCEN" "Allocate with --allocate-all-devices failed: $(tail -1 /tmp/pod-c.alloc.err)"; exit 0; }
echo " pod-c: $(jq -c '{device_ids, devices: [.devices[].container_path]}' "$C")"
ck "--allocate-all-devices: one slot ($(ids "$C")) brings both uverbs0 and uverbs1" \
  jq -e '[.devices[].container_path] | (index("/dev/infiniband/uverbs0") != null) and (index("/dev/infiniband/uverbs1") != null)' "$C"
seen=$(pod pod-c "$C" ibv_devices | awk 'NR > 2 {print $1}' | sort | tr '\n' ' ')
ck "pod-c's ibv_devices lists both devices: [$seen]" test "$seen" = "rxe0 rxe1 "
stop_daemons

start_kubelet || { fail "$SCEN" "fake kubelet did not restart"; exit 0; }
start_agent --slots-per-device 1 --deviceplugin-prestart-container true || { fail "$SCEN" "agent (pre-start) did not register"; exit 0; }
ck "with --deviceplugin-prestart-container the agent registers pre_start_required" \
  jq -e --arg r "$RES" '.resources[$r].options.pre_start_required' "$STATE"
D=$(alloc pod-d 1) || { fail "$SCEN" "Allocate with pre-start failed: $(tail -1 /tmp/pod-d.alloc.err)"; exit 0; }
ck "the fake kubelet called PreStartContainer for pod-d and it succeeded" jq -e '.pre_start_called' "$D"
pod_net pod-d 10.88.0.14
seen=$(pod pod-d "$D" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
ck "pod-d runs with its device ($seen)" test "$seen" = "$(ibdevs "$D") "
finish
