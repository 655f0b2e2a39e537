#!/bin/sh
# dra-migration: a node moved from the device plugin to DRA serves a pod asking aliyun/erdma: 1.
# The lab kubelet (erdma-fake-kubelet run --kubeconfig) writes the Node's status as the kubelet
# does: capacity and allocatable of aliyun/erdma while the plugin is registered; when the plugin
# goes its devices turn unhealthy (allocatable 0, capacity kept) and after the stop grace period
# (the kubelet's 5 minutes, 4 s here) it writes 0 once and keeps the key. The lab allocator
# (erdma-fake-kubelet dra extended, NOT the scheduler) applies the scheduler's rule for extended
# resources backed by DRA: a node with the key in status.allocatable, even at 0, is a
# device-plugin node, so the pod gets no claim and stays Pending.
# - the agent as device plugin (2 slots per device): the node reads aliyun/erdma 4 and 4; pod-dp
#   gets a slot through Allocate;
# - the agent stopped: capacity 4, allocatable 0, then 0 and 0, the key kept;
# - before the DRA agent runs, pod-m's aliyun/erdma: 1 is refused (the node keeps the key at 0);
# - the agent as DRA driver (as dra.sh starts it, the DeviceClass of the install mapping
#   aliyun/erdma): it publishes its ResourceSlice and removes the key from the node's status; the
#   allocator then makes pod-m's extended-resource claim and pod-m runs with the claim's device
#   (its /dev/infiniband holds the uverbs device of the allocated RDMA device only).
# Would fail if: the lab kubelet did not write or keep the device plugin's resource as the kubelet
# does; the allocator served aliyun/erdma through DRA on a node still holding the key; the agent
# in DRA mode left the key in the node's status (pod-m stays Pending: FAIL naming the key); or
# pod-m's container did not get the device of its claim.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet apiserver; need erdma-agent --resource-api
# kube-rs's client (rustls) needs a root certificate even for the plain-HTTP lab API server.
export SSL_CERT_FILE=/mnt/host/guest/lab-root.pem
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
NODE=lab-node; DRV=erdma.alibabacloud.com; SLICE=$NODE-$DRV; GRACE=4
KC=/run/erdma-lab/kubeconfig; API=http://127.0.0.1:6443; ROOT=/var/lib/kubelet; CDI=/var/run/cdi
rm -rf "$CDI" "$ROOT/plugins" "$ROOT/plugins_registry" "${KC%/*}" "$KDIR" "${PODRES%/*}"
mkdir -p "$CDI" "${KC%/*}" "$KDIR" "${PODRES%/*}"
erdma-fake-kubelet apiserver --listen 127.0.0.1:6443 --kubeconfig "$KC" --node "$NODE" > "$OUT/$SCEN-apiserver.log" 2>&1 &
API_PID=$!
wait_for 20 test -s "$KC" || { fail "$SCEN" "the lab API server did not start: $(tail -3 "$OUT/$SCEN-apiserver.log")"; exit 0; }
erdma-fake-kubelet run --dir "$KDIR" --pod-resources-socket "$PODRES" --kubeconfig "$KC" --node "$NODE" \
  --plugin-stop-grace "$GRACE" > "$LOGS/$SCEN-kubelet.log" 2>&1 &
KUBELET_PID=$!
wait_for 20 test -S "$KDIR/kubelet.sock" || { fail "$SCEN" "the lab kubelet did not start: $(tail -3 "$LOGS/$SCEN-kubelet.log")"; exit 0; }
# status: "capacity allocatable" of aliyun/erdma in the node's status ("-" where absent)
status() { wget -qO- "$API/api/v1/nodes/$NODE" | jq -r --arg r "$RES" '"\(.status.capacity[$r] // "-") \(.status.allocatable[$r] // "-")"'; }
status_is() { test "$(status)" = "$1"; }
lab_alloc() { erdma-fake-kubelet dra "$@" --kubeconfig "$KC" --node "$NODE"; }

# --- the device plugin ------------------------------------------------------------------------
start_agent --slots-per-device 2 || { fail "$SCEN" "the agent did not register as device plugin"; exit 0; }
wait_for 20 status_is "4 4"
ck "the device plugin's 4 slots are in the node's status: capacity and allocatable [$(status)]" status_is "4 4"
ck "pod-dp gets a slot through the device plugin" alloc pod-dp 1
erdma-fake-kubelet release --dir "$KDIR" --pod lab/pod-dp > /dev/null
t=$(now)
kill "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null; AGENT_PID=
wait_for 20 status_is "4 0"
ck "the plugin gone: allocatable 0, capacity kept for the grace period [$(status)]" status_is "4 0"
wait_for 30 status_is "0 0"
ck "after the grace period the key stays at 0 [$(status)] ($(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s after the stop)" status_is "0 0"

# --- before the DRA driver: the scheduler's rule keeps the pod Pending ----------------------------
if lab_alloc extended --pod lab/pod-m --resource "$RES" --count 1 > /tmp/pod-m.pending.json 2> /tmp/pod-m.pending.err; then
  bad "pod-m got a DRA claim although the node still holds $RES at 0: $(jq -c '.status.allocation.devices.results' /tmp/pod-m.pending.json)"
fi
ck "pod-m (aliyun/erdma: 1) is refused on the node with the key at 0: $(tail -1 /tmp/pod-m.pending.err | cut -c1-180)" \
  grep -qF "has $RES in status.allocatable" /tmp/pod-m.pending.err

# --- the DRA driver ---------------------------------------------------------------------------------
t=$(now)
erdma-agent --resource-api dra --node-name "$NODE" --kubeconfig "$KC" --kubelet-root-dir "$ROOT" --cdi-spec-dir "$CDI" \
  --kubelet-dir "$KDIR" --pod-resources-socket "$PODRES" --rdma-driver rxe --prefer-driver none --local-eri-discovery \
  --instance-id i-lab --metrics-addr 127.0.0.1:9464 --nri off > "$OUT/$SCEN-agent.log" 2>&1 &
AGENT_PID=$!
has_slice() { wget -qO- "$API/apis/resource.k8s.io/v1/resourceslices/$SLICE" | jq -se '.[0].spec.devices | length == 2'; }
wait_for 60 has_slice || { fail "$SCEN" "no ResourceSlice $SLICE in 60 s: $(tail -3 "$OUT/$SCEN-agent.log")"; exit 0; }
wait_for 30 status_is "- -"
ck "the DRA agent removed $RES from the node's status [$(status)] ($(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s after its start)" status_is "- -"
ck "the agent logged the removal" grep -q "removed $RES from the status of node $NODE" "$OUT/$SCEN-agent.log"
lab_alloc extended --pod lab/pod-m --resource "$RES" --count 1 > /tmp/pod-m.claim.json 2> /tmp/pod-m.claim.err \
  || { fail "$SCEN" "pod-m stays Pending on the DRA node: $(tail -1 /tmp/pod-m.claim.err)"; exit 0; }
DEV=$(jq -r '.status.allocation.devices.results[0].device' /tmp/pod-m.claim.json)
EU=$(jq -r .metadata.uid /tmp/pod-m.claim.json)
echo " $(jq -r .metadata.name /tmp/pod-m.claim.json): $(jq -c '.status.allocation.devices.results[0]' /tmp/pod-m.claim.json)"
PM=$(cpod pod-m 0 --kubeconfig "$KC" --kubelet-root-dir "$ROOT") || { fail "$SCEN" "pod-m did not start: $(tail -1 /tmp/pod-m.pod.err)"; exit 0; }
ck "pod-m was prepared through its extended-resource claim with one CDI device on $DEV" \
  jq -e --arg id "$DRV/claim=$EU-$DEV" '.dra_claims | length == 1 and .[0].cdi_devices == [$id]' "$PM"
case $DEV in rxe0) OTHER=rxe1 ;; *) OTHER=rxe0 ;; esac
U=$(uverbs_of "$DEV"); UO=$(uverbs_of "$OTHER")
seen=$(cx pod-m ls /dev/infiniband | tr '\n' ' ')
ck "pod-m sees /dev/infiniband/$U ($DEV) and not $UO: [$seen]" sh -c "echo ' $seen' | grep -qw $U && ! echo ' $seen' | grep -qw $UO"
echo "dra-migration-agent-to-served $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
runtime_clean
kill "$AGENT_PID" "$API_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null; wait "$API_PID" 2>/dev/null; AGENT_PID=
stop_daemons
rm -rf "$CDI"/*
finish
