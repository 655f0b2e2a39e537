#!/bin/sh
# allocation-modes: the agent's other two ways of answering Allocate, end to end on containerd.
# - CDI mode (--cdi-spec-dir /var/run/cdi): Allocate returns CDI device names only. The lab
#   kubelet passes them to CreateContainer, for pod-a in the CRI CDI_devices field, for pod-b as a
#   cdi.k8s.io/ annotation, and nothing else: containerd injects the devices from the spec the
#   agent wrote. Each container sees exactly what the spec grants its device (not the other pod's,
#   which the device cgroup also refuses), and RDMA runs between the two CDI containers.
# - --allocate-all-devices: a container that asks for one slot gets every usable device.
# - --deviceplugin-prestart-container: the kubelet calls PreStartContainer before the container
#   is created, and the container runs with its device.
# Would fail if: CDI mode wrote no spec, answered with device nodes instead of CDI names, or its
# spec granted a pod another pod's device or a device that does not work; containerd did not
# inject CDI devices from either form (field or annotation); --allocate-all-devices gave a
# one-slot container fewer than all devices; or --deviceplugin-prestart-container did not
# register pre_start_required or its PreStartContainer failed.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --cdi-spec-dir
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
CDI=/var/run/cdi
rm -rf "$CDI"; mkdir -p "$CDI"
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 1 --cdi-spec-dir "$CDI" || { fail "$SCEN" "agent (CDI mode) did not register"; exit 0; }
SPEC=$(ls "$CDI"/*.json 2>/dev/null | head -1)
ck "the agent wrote a CDI spec into $CDI ($(ls $CDI | tr '\n' ' '))" test -n "$SPEC"
cp "$CDI"/* "$OUT/" 2>/dev/null   # kept with the logs (crates/erdma-lab/testdata has a capture)
PA=$(cpod pod-a 1 --cdi field) || { fail "$SCEN" "CDI pod-a (field) did not start: $(tail -1 /tmp/pod-a.pod.err)"; exit 0; }
PB=$(cpod pod-b 1 --cdi annotation) || { fail "$SCEN" "CDI pod-b (annotation) did not start: $(tail -1 /tmp/pod-b.pod.err)"; exit 0; }
jq .allocation "$PA" > /tmp/pod-a.json; jq .allocation "$PB" > /tmp/pod-b.json
echo " pod-a: $(jq -c '{device_ids, cdi_devices, devices}' /tmp/pod-a.json)"
cp /tmp/pod-a.json "$OUT/cdi-allocate-pod-a.json"
ck "CDI-mode Allocate names CDI devices and no device nodes" jq -e '(.cdi_devices | length > 0) and (.devices | length == 0)' /tmp/pod-a.json
DA=$(ibdevs /tmp/pod-a.json); DB=$(ibdevs /tmp/pod-b.json); UA=$(uverbs_of "$DA"); UB=$(uverbs_of "$DB")
# what the spec grants a set of CDI names: the spec-wide edits plus each named device's nodes
granted() {
  jq -r --argjson names "$(jq -c .cdi_devices "$1")" '. as $s
    | ([$s.containerEdits.deviceNodes[]?.path]
       + [$s.devices[] | select(($s.kind + "=" + .name) as $n | $names | index($n)) | .containerEdits.deviceNodes[]?.path])
    | map(select(startswith("/dev/infiniband/")) | ltrimstr("/dev/infiniband/")) | unique | .[]' "$SPEC" | sort | tr '\n' ' '
}
for p in a b; do
  f=/tmp/pod-$p.json; eval "u=\$U$(echo $p | tr ab AB)"; eval "o=\$U$(echo $p | tr ab BA)"
  form=$(jq -r .cdi_form /tmp/pod-$p.pod.json)
  want=$(granted "$f")
  seen=$(cx "pod-$p" ls /dev/infiniband | sort | tr '\n' ' ')
  ck "containerd injected from the CDI $form for pod-$p exactly what the spec grants: [$seen] = [$want], with $u and without $o" \
    sh -c "test -n '$want' && test '$seen' = '$want' && echo ' $seen' | grep -qw $u && ! echo ' $seen' | grep -qw $o"
done
CID=$(jq -r .container_id "$PB")
ck "pod-b's container was created with the CDI annotation and no DeviceSpecs (ctr: the OCI spec's devices came from containerd)" \
  sh -c "ctr -n k8s.io containers info $CID | jq -e '[.Spec.linux.devices[]?.path] | index(\"/dev/infiniband/$UB\") != null'"
set -- $(dev_of "$UA")
cx pod-b sh -c "mknod /tmp/uv c $1 $2 && echo mknod-ok; cat /tmp/uv" > /tmp/cg.out 2>&1
ck "pod-b (CDI) may not open pod-a's device $UA: the device cgroup refuses it" \
  sh -c "grep -q mknod-ok /tmp/cg.out && grep -q 'Operation not permitted' /tmp/cg.out"
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB"); IPA=$(cpod_ip pod-a)
cx pod-a timeout 120 ibv_rc_pingpong -d "$DA" -g "$GA" -n 100 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 60 cpod_listening pod-a 18515
cx pod-b timeout 120 ibv_rc_pingpong -d "$DB" -g "$GB" -n 100 "$IPA" > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
ck "ibv_rc_pingpong between the CDI containers (rc $crc/$src)" sh -c "test $crc = 0 && test $src = 0 && grep -q '100 iters' /tmp/cli.out"
runtime_clean; stop_daemons

start_kubelet || { fail "$SCEN" "fake kubelet did not restart"; exit 0; }
start_agent --slots-per-device 1 --allocate-all-devices || { fail "$SCEN" "agent (--allocate-all-devices) did not register"; exit 0; }
PC=$(cpod pod-c 1) || { fail "$SCEN" "pod-c (--allocate-all-devices) did not start: $(tail -1 /tmp/pod-c.pod.err)"; exit 0; }
echo " pod-c: $(jq -c '.allocation | {device_ids, devices: [.devices[].container_path]}' "$PC")"
ck "--allocate-all-devices: one slot ($(jq -r '.allocation.device_ids | join(" ")' "$PC")) brings both uverbs0 and uverbs1" \
  jq -e '[.allocation.devices[].container_path] | (index("/dev/infiniband/uverbs0") != null) and (index("/dev/infiniband/uverbs1") != null)' "$PC"
seen=$(cx pod-c ibv_devices | awk 'NR > 2 {print $1}' | sort | tr '\n' ' ')
ck "pod-c's ibv_devices lists both devices: [$seen]" test "$seen" = "rxe0 rxe1 "
runtime_clean; stop_daemons

start_kubelet || { fail "$SCEN" "fake kubelet did not restart"; exit 0; }
start_agent --slots-per-device 1 --deviceplugin-prestart-container true --nri off || { fail "$SCEN" "agent (pre-start) did not register"; exit 0; }
ck "with --deviceplugin-prestart-container the agent registers pre_start_required" \
  jq -e --arg r "$RES" '.resources[$r].options.pre_start_required' "$STATE"
PD=$(cpod pod-d 1) || { fail "$SCEN" "pod-d (pre-start) did not start: $(tail -1 /tmp/pod-d.pod.err)"; exit 0; }
ck "the lab kubelet called PreStartContainer for pod-d and it succeeded" jq -e '.allocation.pre_start_called' "$PD"
seen=$(cx pod-d ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
ck "pod-d runs with its device ($seen)" test "$seen" = "$(jq -r '[.allocation.device_ids[] | split("/")[0]] | unique | join(" ")' "$PD") "
finish
