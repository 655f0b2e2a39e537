#!/bin/sh
# dra: the agent as the DRA driver erdma.alibabacloud.com (--resource-api dra) on containerd.
# The lab's API server (erdma-fake-kubelet apiserver: the in-memory fake over HTTP, started with
# the Node and the DeviceClass the install renders) takes the agent's ResourceSlice. A minimal,
# labelled lab allocator (erdma-fake-kubelet dra ..., NOT the scheduler) writes what the scheduler
# would into the ResourceClaims: device, shareID, consumedCapacity from the published slice. The
# lab kubelet (pod run --kubeconfig) reads each Pod object, registers the driver through
# plugins_registry, calls NodePrepareResources for the container's claims and creates the
# container with the CDI device IDs the driver returned; pod delete calls NodeUnprepareResources.
# - pod-a (claim-a, shares=120) and pod-b (claim-b, shares=80) share ONE device, rxe0, by
#   capacity (200 shares); each container holds exactly its own claim's CDI devices (containerd
#   injects them: /dev/infiniband, the OCI spec, the claim's env), and ibv_rc_pingpong runs
#   between the two containers, both on rxe0.
# - claim-c (shares=1 more on rxe0): the allocator refuses it (rxe0 is full); written anyway
#   (--overcommit, as a scheduler with another view would), NodePrepareResources refuses it with
#   an error naming the capacity, and pod-c gets no container and no CDI spec.
# - eth0 down: rxe0 gets the taint erdma.alibabacloud.com/unhealthy=link-down:NoSchedule in the
#   ResourceSlice (rxe1 none, pod-a keeps running); eth0 up: the taint goes.
# - pod-e asks aliyun/erdma: 1: the allocator makes the claim the scheduler makes for an extended
#   resource through the DeviceClass's extendedResourceName (KEP-5004), the lab kubelet finds it
#   in the pod's status.extendedResourceClaimStatus and the container gets rxe1 (rxe0 is full) and
#   runs RDMA with pod-a.
# - pod-f's claim-f asks through a prioritized list (firstAvailable, allocated as rdma/erdma): its
#   container, which names the request rdma, gets rxe1's uverbs device.
# - each claim's consumed rdma capacity (ERDMA_RDMA_MAX in its CDI spec) becomes its container's
#   rdma.max through the agent's NRI plugin (OCI spec and cgroup).
# - the device plugin is not registered; deleting pod-a unprepares claim-a (spec gone).
# Would fail if: the agent in DRA mode published no slice, wrong attributes or capacity, or also
# served aliyun/erdma through the device plugin; the driver did not register or prepare; a
# claim's CDI spec granted another device or was not injected by containerd; two claims could not
# share one device by capacity, or their containers could not run RDMA; prepare accepted a claim
# beyond the device's capacity; a link-down device was not tainted (or stayed tainted after up);
# an aliyun/erdma pod was not served through the DeviceClass mapping; a firstAvailable claim's
# container got no device (request names answered as rdma/erdma); unprepare left the spec; or
# a claim's consumed rdma capacity did not become its container's rdma.max (the NRI hand-off).
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet apiserver; need erdma-agent --resource-api
# kube-rs's client (rustls) does not start without a root certificate and the guest has no CA
# store; the lab's API server is plain HTTP, so a placeholder root (its key was discarded) does.
export SSL_CERT_FILE=/mnt/host/guest/lab-root.pem
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
NODE=lab-node; DRV=erdma.alibabacloud.com; SLICE=$NODE-$DRV
KC=/run/erdma-lab/kubeconfig; API=http://127.0.0.1:6443; ROOT=/var/lib/kubelet; CDI=/var/run/cdi
CK=$ROOT/plugins/$DRV/checkpoint.json
# The checkpoint's prepared claims: its snapshot line with the appended records replayed.
# (written to $CKC, which the checks read).
CKC=/tmp/dra-checkpoint-claims.json
ck_claims() { jq -s 'reduce .[1:][] as $r (.[0].claims; if $r.prepared then .[$r.prepared.uid] = $r.prepared.claim else del(.[$r.unprepared.uid]) end)' "$CK" > "$CKC"; }
rm -rf "$CDI" "$ROOT/plugins" "$ROOT/plugins_registry" "${KC%/*}"; mkdir -p "$CDI" "${KC%/*}"
erdma-fake-kubelet apiserver --listen 127.0.0.1:6443 --kubeconfig "$KC" --node "$NODE" > "$OUT/$SCEN-apiserver.log" 2>&1 &
API_PID=$!
wait_for 20 test -s "$KC" || { fail "$SCEN" "the lab API server did not start: $(tail -3 "$OUT/$SCEN-apiserver.log")"; exit 0; }
# the fake kubelet runs too: in DRA mode the agent must not register aliyun/erdma with it
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
erdma-agent --resource-api dra --node-name "$NODE" --kubeconfig "$KC" --kubelet-root-dir "$ROOT" --cdi-spec-dir "$CDI" \
  --kubelet-dir "$KDIR" --pod-resources-socket "$PODRES" --rdma-driver rxe --prefer-driver none --local-eri-discovery \
  --instance-id i-lab --metrics-addr 127.0.0.1:9464 --nri on --nri-budget-ms 8000 > "$OUT/$SCEN-agent.log" 2>&1 &
AGENT_PID=$!
get() { wget -qO- "$API$1"; }
slice() { get "/apis/resource.k8s.io/v1/resourceslices/$SLICE"; }
# -s: jq -e on no input at all (the slice not there yet) would succeed
has_slice() { slice | jq -se '.[0].spec.devices | length == 2'; }
registered_dra() { test -S "$ROOT/plugins_registry/$DRV-reg.sock"; }
t=$(now)
wait_for 60 has_slice || { fail "$SCEN" "no ResourceSlice $SLICE with two devices in 60 s: $(tail -3 "$OUT/$SCEN-agent.log")"; exit 0; }
wait_for 20 registered_dra || { fail "$SCEN" "the DRA registration socket did not appear"; exit 0; }
echo "dra-agent-to-slice $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
wait_for 30 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.nri.connected'" \
  || { fail "$SCEN" "the agent's NRI plugin did not connect to containerd: $(wget -qO- http://127.0.0.1:9464/healthz | jq -c .nri)"; exit 0; }
slice > "$OUT/$SCEN-slice.json"
echo " slice: $(jq -c '[.spec.devices[] | {name, ibdev: .attributes.ibdev.string, netdev: .attributes.netdev.string, numa: .attributes.numaNode.int, shares: .capacity.shares.value, multi: .allowMultipleAllocations}]' "$OUT/$SCEN-slice.json")"
ck "the slice has rxe0 (eth0, NUMA 0) and rxe1 (eth1, NUMA 1), 200 shares each, shareable, untainted" jq -e '
  [.spec.devices[] | [.name, .attributes.ibdev.string, .attributes.netdev.string, .attributes.numaNode.int, .capacity.shares.value, .allowMultipleAllocations, (.taints // [] | length)]]
  == [["rxe0", "rxe0", "eth0", 0, "200", true, 0], ["rxe1", "rxe1", "eth1", 1, "200", true, 0]]
  and .spec.nodeName == "lab-node" and .spec.pool.name == "lab-node"' "$OUT/$SCEN-slice.json"
ck "the node condition ERdmaResourceAPI says DRA" sh -c "wget -qO- $API/api/v1/nodes/$NODE | jq -e '.status.conditions[] | select(.type == \"ERdmaResourceAPI\") | .reason == \"DRA\"'"
ck "the device plugin is off: the fake kubelet has no $RES registration" jq -e --arg r "$RES" '.resources[$r] == null' "$STATE"
ck "the DeviceClass $DRV (from the install) maps aliyun/erdma" sh -c "wget -qO- $API/apis/resource.k8s.io/v1/deviceclasses/$DRV | jq -e '.spec.extendedResourceName == \"aliyun/erdma\"'"

# --- two claims share rxe0 by capacity ---------------------------------------------------
lab_alloc() { erdma-fake-kubelet dra "$@" --kubeconfig "$KC" --node "$NODE"; }
claim() {  # claim POD CLAIM SHARES [flags]: the lab allocator; JSON in /tmp/CLAIM.claim.json
  _p=$1; _c=$2; _s=$3; shift 3
  lab_alloc claim --pod "lab/$_p" --claim "$_c" --capacity "shares=$_s" "$@" > "/tmp/$_c.claim.json" 2> "/tmp/$_c.claim.err"
}
dpod() { cpod "$@" --kubeconfig "$KC" --kubelet-root-dir "$ROOT"; }
claim pod-a claim-a 120 || { fail "$SCEN" "allocating claim-a failed: $(tail -1 /tmp/claim-a.claim.err)"; exit 0; }
claim pod-b claim-b 80 || { fail "$SCEN" "allocating claim-b failed: $(tail -1 /tmp/claim-b.claim.err)"; exit 0; }
res() { jq -c '.status.allocation.devices.results[0] | {device, shareID, consumedCapacity}' "/tmp/$1.claim.json"; }
echo " claim-a: $(res claim-a)"; echo " claim-b: $(res claim-b)"
ck "the allocator put claim-a (120 shares) and claim-b (80 shares) on one device, rxe0, with two shareIDs" sh -c "
  jq -e '.status.allocation.devices.results[0] | .device == \"rxe0\" and .consumedCapacity.shares == \"120\" and (.shareID | length > 0)' /tmp/claim-a.claim.json &&
  jq -e '.status.allocation.devices.results[0] | .device == \"rxe0\" and .consumedCapacity.shares == \"80\" and (.shareID | length > 0)' /tmp/claim-b.claim.json &&
  test \"\$(jq -r '.status.allocation.devices.results[0].shareID' /tmp/claim-a.claim.json)\" != \"\$(jq -r '.status.allocation.devices.results[0].shareID' /tmp/claim-b.claim.json)\""
PA=$(dpod pod-a 0) || { fail "$SCEN" "pod-a (claim-a) did not start: $(tail -1 /tmp/pod-a.pod.err)"; exit 0; }
PB=$(dpod pod-b 0) || { fail "$SCEN" "pod-b (claim-b) did not start: $(tail -1 /tmp/pod-b.pod.err)"; exit 0; }
# /readyz means "serving through the node's resource API": here the DRA driver's registration,
# which the lab kubelet made when it ran pod-a
# (it used to wait for the device plugin, which never registers on a DRA node).
wait_for 20 sh -c "wget -qO- http://127.0.0.1:9464/readyz" > /dev/null
ck "/readyz answers 200 on the DRA node (no device plugin registered): $(wget -qO- http://127.0.0.1:9464/readyz 2>&1 | head -1)" \
  sh -c "wget -qO- http://127.0.0.1:9464/readyz | grep -qx ready && wget -qO- http://127.0.0.1:9464/healthz | jq -e '.registered == true and .resource_api == \"dra\"'"
for p in a b; do
  echo "pod-run-dra-pod-$p $(jq -r '.timings_ms.total / 1000' /tmp/pod-$p.pod.json)" >> "$OUT/timings.txt"
  log "pod-$p: claims $(jq -c '.dra_claims' /tmp/pod-$p.pod.json), ms $(jq -c .timings_ms /tmp/pod-$p.pod.json)"
done
U0=$(uverbs_of rxe0); U1=$(uverbs_of rxe1)
for p in a b; do
  uid=$(jq -r .metadata.uid /tmp/claim-$p.claim.json)
  spec="$CDI/$DRV-claim_$uid.json"; cp "$spec" "$OUT/$SCEN-claim-$p-cdi.json" 2>/dev/null
  ck "pod-$p was prepared with claim-$p's one CDI device $DRV/claim=$uid-rxe0" \
    jq -e --arg id "$DRV/claim=$uid-rxe0" '.dra_claims | length == 1 and .[0].name == "claim-'$p'" and .[0].cdi_devices == [$id]' "/tmp/pod-$p.pod.json"
  want=$(jq -r '[.containerEdits.deviceNodes[]?.path, .devices[].containerEdits.deviceNodes[]?.path] | map(select(startswith("/dev/infiniband/")) | ltrimstr("/dev/infiniband/")) | unique | .[]' "$spec" | sort | tr '\n' ' ')
  seen=$(cx "pod-$p" ls /dev/infiniband | sort | tr '\n' ' ')
  ck "containerd injected claim-$p's spec into pod-$p: /dev/infiniband [$seen] = spec [$want], with $U0 and without $U1" \
    sh -c "test -n '$want' && test '$seen' = '$want' && echo ' $seen' | grep -qw $U0 && ! echo ' $seen' | grep -qw $U1"
  # each claim's variables are under its own names (ERDMA_DEVICES_<UID>...): two claims in one
  # container cannot overwrite each other's
  S=$(echo "$uid" | tr 'a-z-' 'A-Z_')
  seen=$(cx "pod-$p" env | grep -E '^ERDMA_(DRA_CLAIM_UID|RDMA_MAX|DEVICES)' | sort | tr '\n' ' ')
  ck "pod-$p's env is its own claim's: [$seen]" test "$seen" = "ERDMA_DEVICES_$S=rxe0 ERDMA_DRA_CLAIM_UID_$S=$uid ERDMA_RDMA_MAX_$S=rxe0 hca_handle=4 hca_object=8000 "
  CID=$(jq -r .container_id "/tmp/pod-$p.pod.json")
  ctr -n k8s.io containers info "$CID" > "/tmp/pod-$p.ctr.json"
  ck "pod-$p's OCI spec (ctr) holds /dev/infiniband/$U0 and claim-$p's UID, from CDI (no DeviceSpecs were sent)" \
    sh -c "jq -e --arg e 'ERDMA_DRA_CLAIM_UID_$S=$uid' '([.Spec.linux.devices[]?.path] | index(\"/dev/infiniband/$U0\") != null) and ([.Spec.linux.devices[]?.path] | index(\"/dev/infiniband/$U1\") == null) and (.Spec.process.env | index(\$e) != null)' /tmp/pod-$p.ctr.json"
  seen=$(cx "pod-$p" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  ck "pod-$p's ibv_devices lists only rxe0: [$seen]" test "$seen" = "rxe0 "
  # The claim's consumed capacity reaches the kernel: the agent's NRI plugin turns the spec's
  # ERDMA_RDMA_MAX hand-off into the container's rdma.max (cgroup v2: the OCI spec's unified,
  # which runc writes; cgroup v1: runc refuses unified there, so the spec carries none and the
  # agent writes the container's rdma cgroup at StartContainer).
  CGP=$(cgroup_dir rdma "$(jq -r .Spec.linux.cgroupsPath "/tmp/pod-$p.ctr.json")")
  if [ "$LAB_CGROUP" = v1 ]; then
    spec_rdma_max="(.Spec.linux.resources.unified // {}) | length == 0"
  else
    spec_rdma_max='.Spec.linux.resources.unified["rdma.max"] == "rxe0 hca_handle=4 hca_object=8000"'
  fi
  ck "pod-$p's rdma.max is claim-$p's consumed capacity (NRI from the CDI hand-off, cgroup $LAB_CGROUP): OCI spec $(jq -c '.Spec.linux.resources.unified // {}' "/tmp/pod-$p.ctr.json"), cgroup [$(grep '^rxe0 ' "$CGP/rdma.max" 2>&1)]" \
    sh -c "jq -e '$spec_rdma_max' /tmp/pod-$p.ctr.json && grep -q '^rxe0 hca_handle=4 hca_object=8000 *\$' '$CGP/rdma.max'"
done
G0=$(gid_v4 rxe0); G1=$(gid_v4 rxe1); IPA=$(cpod_ip pod-a)
pkts() { rdma -j statistic show link "$1/1" | jq -r '.[0].rcvd_pkts'; }
pingpong() {  # pingpong SERVER-POD SERVER-DEV CLIENT-POD CLIENT-DEV N: ibv_rc_pingpong over CRI exec
  cx "$1" timeout 200 ibv_rc_pingpong -d "$2" -g "$(gid_v4 "$2")" -n "$5" > /tmp/srv.out 2>&1 &
  _srv=$!; wait_for 60 cpod_listening "$1" 18515
  cx "$3" timeout 200 ibv_rc_pingpong -d "$4" -g "$(gid_v4 "$4")" -n "$5" "$(cpod_ip "$1")" > /tmp/cli.out 2>&1; PC=$?
  wait $_srv; PS=$?
  sed 's/^/        client| /' /tmp/cli.out | tail -3; sed 's/^/        server| /' /tmp/srv.out | tail -2
  test $PC = 0 && test $PS = 0 && grep -q "$5 iters" /tmp/cli.out
}
r0=$(pkts rxe0)
ck "ibv_rc_pingpong pod-b -> pod-a, both on the shared rxe0 (200 iterations)" pingpong pod-a rxe0 pod-b rxe0 200
r1=$(pkts rxe0)
ck "RoCE packets went through rxe0 (+$((r1 - r0)))" test $((r1 - r0)) -ge 200

# --- a third claim beyond rxe0's capacity ---------------------------------------------------
claim pod-c claim-c 1 --device rxe0
ck "the allocator refuses claim-c on rxe0: $(tail -1 /tmp/claim-c.claim.err | cut -c1-160)" grep -qF 'rxe0: shares=200, allocated 200, asked 1' /tmp/claim-c.claim.err
claim pod-c claim-c 1 --device rxe0 --overcommit || { fail "$SCEN" "writing claim-c's allocation failed: $(tail -1 /tmp/claim-c.claim.err)"; exit 0; }
UC=$(jq -r .metadata.uid /tmp/claim-c.claim.json)
n0=$(ctr -n k8s.io containers ls -q | wc -l)
if dpod pod-c 0 > /dev/null; then bad "pod-c started although claim-c exceeds rxe0's shares"; fi
sed 's/^/        pod-c| /' /tmp/pod-c.pod.err | tail -2
ck "NodePrepareResources refused claim-c naming the capacity (shares=200; 2 claims hold 200, it asks 1)" \
  grep -qF 'device rxe0 has shares=200; 2 prepared claim(s) hold 200 and this claim asks 1, which exceeds the capacity' /tmp/pod-c.pod.err
ck_claims
ck "claim-c has no CDI spec and is not in the driver's checkpoint" sh -c "! test -e $CDI/$DRV-claim_$UC.json && ! jq -e --arg u $UC '.[\$u]' $CKC"
n1=$(ctr -n k8s.io containers ls -q | wc -l)
ck "pod-c left nothing in the runtime ($n0 -> $n1 containers; the lab kubelet prepares before RunPodSandbox, as the kubelet does)" sh -c "! erdma-fake-kubelet pod status --dir $KDIR --pod lab/pod-c && test $n0 = $n1"

# --- a device taint on link down --------------------------------------------------------------
taint() { slice | jq -r --arg d "$1" '[.spec.devices[] | select(.name == $d) | (.taints // [])[] | "\(.key)=\(.value):\(.effect)"] | join(",")'; }
tainted() { test "$(taint rxe0)" = "$DRV/unhealthy=link-down:NoSchedule"; }
untainted() { test -z "$(taint rxe0)"; }
t=$(now); ip link set eth0 down
if wait_for 15 tainted; then good "eth0 down: rxe0 tainted $(taint rxe0) in the slice after $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s"
else bad "eth0 down: rxe0 not tainted in 15 s (taints: '$(taint rxe0)')"; fi
ck "rxe1 stays untainted while eth0 is down" test -z "$(taint rxe1)"
ck "pod-a keeps running on the tainted device (NoSchedule, not NoExecute)" test "$(cpod_state pod-a)" = CONTAINER_RUNNING
t=$(now); ip link set eth0 up
if wait_for 15 untainted; then good "eth0 up: rxe0's taint gone after $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s"
else bad "eth0 up: rxe0 still tainted after 15 s ($(taint rxe0))"; fi
wait_for 10 port_active rxe0

# --- aliyun/erdma: 1 through the DeviceClass mapping (KEP-5004) -------------------------------------
lab_alloc extended --pod lab/pod-e --resource aliyun/erdma --count 1 > /tmp/ext.claim.json 2> /tmp/ext.claim.err \
  || { fail "$SCEN" "the extended-resource claim for pod-e failed: $(tail -1 /tmp/ext.claim.err)"; exit 0; }
EC=$(jq -r .metadata.name /tmp/ext.claim.json); EU=$(jq -r .metadata.uid /tmp/ext.claim.json)
echo " $EC: $(jq -c '{annotations: .metadata.annotations, request: .spec.devices.requests[0], result: .status.allocation.devices.results[0]}' /tmp/ext.claim.json)"
ck "the claim for aliyun/erdma: 1 is the scheduler's form: $EC, annotated, request container-0-request-0 of class $DRV, on rxe1 (rxe0 is full)" jq -e '
  (.metadata.name | startswith("pod-e-extended-resources-")) and .metadata.annotations["resource.kubernetes.io/extended-resource-claim"] == "true"
  and .metadata.ownerReferences[0].name == "pod-e" and .spec.devices.requests[0].name == "container-0-request-0"
  and .spec.devices.requests[0].exactly.deviceClassName == "erdma.alibabacloud.com" and .spec.devices.requests[0].exactly.count == 1
  and .status.allocation.devices.results[0].device == "rxe1"' /tmp/ext.claim.json
ck "pod-e asks aliyun/erdma: 1 and its status maps container c to the claim's request" sh -c "wget -qO- $API/api/v1/namespaces/lab/pods/pod-e | jq -e '.spec.containers[0].resources.requests[\"aliyun/erdma\"] == \"1\" and .status.extendedResourceClaimStatus == {requestMappings: [{containerName: \"c\", requestName: \"container-0-request-0\", resourceName: \"aliyun/erdma\"}], resourceClaimName: \"$EC\"}'"
PE=$(dpod pod-e 0) || { fail "$SCEN" "pod-e (aliyun/erdma through DRA) did not start: $(tail -1 /tmp/pod-e.pod.err)"; exit 0; }
ck "pod-e was prepared through $EC with one CDI device on rxe1" \
  jq -e --arg id "$DRV/claim=$EU-rxe1" --arg c "$EC" '.dra_claims | length == 1 and .[0].name == $c and .[0].cdi_devices == [$id]' "$PE"
seen=$(cx pod-e ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
ck "pod-e's ibv_devices lists only rxe1: [$seen]" test "$seen" = "rxe1 "
ck "ibv_rc_pingpong pod-e (rxe1, aliyun/erdma via DRA) -> pod-a (rxe0, claim-a) (100 iterations)" pingpong pod-a rxe0 pod-e rxe1 100
prepared() { wget -qO- http://127.0.0.1:9464/healthz | jq -c '.dra.prepared_claims'; }
wait_for 10 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.dra.prepared_claims == {\"rxe0\": 2, \"rxe1\": 1}'"
ck "/healthz counts the prepared claims per device: $(prepared)" test "$(prepared)" = '{"rxe0":2,"rxe1":1}'
# The driver reads each claim it prepares by a GET (no watch of the cluster's claims).
reads_ok=".dra.claim_reads.gets >= 4 and .dra.claim_reads.failed == 0"
ck "/healthz: the driver read the claims it prepared by GET: $(wget -qO- http://127.0.0.1:9464/healthz | jq -c '.dra.claim_reads')" sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '$reads_ok'"

# --- a prioritized list (firstAvailable) ------------------------------------------------------------
# claim-f's request rdma is a firstAvailable list of one subrequest, erdma: allocated as
# rdma/erdma; pod-f's container names the request rdma, and the kubelet matches that name exactly
# against the request names NodePrepareResources answers (the driver strips /erdma, as the
# upstream helper does), so the container gets the device.
claim pod-f claim-f 10 --device rxe1 --first-available erdma || { fail "$SCEN" "allocating claim-f failed: $(tail -1 /tmp/claim-f.claim.err)"; exit 0; }
UF=$(jq -r .metadata.uid /tmp/claim-f.claim.json)
ck "claim-f is a firstAvailable claim allocated as rdma/erdma on rxe1" jq -e '
  .spec.devices.requests[0].name == "rdma" and .spec.devices.requests[0].firstAvailable[0].name == "erdma"
  and .status.allocation.devices.results[0].request == "rdma/erdma" and .status.allocation.devices.results[0].device == "rxe1"' /tmp/claim-f.claim.json
PF=$(dpod pod-f 0) || { fail "$SCEN" "pod-f (firstAvailable claim-f) did not start: $(tail -1 /tmp/pod-f.pod.err)"; exit 0; }
ck "pod-f's container (request rdma) got claim-f's CDI device $DRV/claim=$UF-rxe1" \
  jq -e --arg id "$DRV/claim=$UF-rxe1" '.dra_claims | length == 1 and .[0].cdi_devices == [$id]' "$PF"
seen=$(cx pod-f ls /dev/infiniband | tr '\n' ' ')
ck "pod-f sees /dev/infiniband/$U1 (rxe1) and not $U0: [$seen]" sh -c "echo ' $seen' | grep -qw $U1 && ! echo ' $seen' | grep -qw $U0"

# --- deletion unprepares --------------------------------------------------------------------------
UA=$(jq -r .metadata.uid /tmp/claim-a.claim.json)
ck "pod-a deleted (containers, sandbox, NodeUnprepareResources)" erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-a
ck_claims
ck "claim-a's CDI spec and checkpoint entry are gone; claim-b's stay" sh -c "! test -e $CDI/$DRV-claim_$UA.json && ! jq -e --arg u $UA '.[\$u]' $CKC && jq -e --arg u $(jq -r .metadata.uid /tmp/claim-b.claim.json) '.[\$u]' $CKC"
runtime_clean
ck_claims
ck "after every pod is deleted no claim is prepared: $(jq -c 'keys' $CKC)" jq -e 'length == 0' "$CKC"
kill "$AGENT_PID" "$API_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null; wait "$API_PID" 2>/dev/null; AGENT_PID=
stop_daemons
rm -rf "$CDI"/*
finish
