#!/bin/sh
# nri: the agent's NRI plugin on the guest's real containerd (NRI on in runtime/config.toml), and
# the same pods without it (the agent restarted with --nri off), showing the problems it solves.
# - rdma.max: pod-l is annotated network.alibabacloud.com/erdma-rdma-max "hca_handle=2". Its
#   container opens 2 device contexts and the 3rd fails with the rdma cgroup's EAGAIN, while
#   pod-n, a neighbour on the same device without the annotation, opens 3. The evidence: the OCI
#   spec containerd made (linux.resources.unified; on a cgroup v1 node none: the agent writes the
#   container's rdma cgroup at StartContainer), the container cgroup's rdma.max, and
#   rdma.current while the contexts are held. Without the plugin pod-l opens 3.
# - memlock: pod-m runs as UID 1000 (CRI run_as_user). containerd was started with an 8 MiB
#   RLIMIT_MEMLOCK (ulimit -l 8192 in runtime.sh: the kernel's default), which its containers
#   inherit. With the plugin the container's limit is unlimited and ibv_reg_mr of 64 MiB
#   succeeds; without it the limit is 8 MiB and the registration fails with ENOMEM.
# The probe is erdma-labprobe (contexts, reg-mr: libibverbs through dlopen), mounted into the
# containers read-only as a hostPath volume. The lab kubelet allocates before RunPodSandbox, as
# the kubelet does, so the plugin finds every pod's devices.
# Would fail if: the agent did not register with containerd's NRI (or registered with --nri off),
# CreateContainer adjustments did not reach the OCI spec (no unified rdma.max, no memlock
# rlimit), the limit landed on the wrong device or on the neighbour, the annotation was misparsed,
# the plugin did not find the container's devices, or the problems did not show without it
# (the limit, or the failed registration, would then not be the plugin's doing).
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --nri; need erdma-labprobe reg-mr
erdma-fake-kubelet pod run --help | grep -q -- --user || { skip "$SCEN" "erdma-fake-kubelet pod run has no --user yet"; exit 0; }
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
PROBE=$(command -v erdma-labprobe)
ANN=network.alibabacloud.com/erdma-rdma-max=hca_handle=2
MNT="--mount $PROBE:/usr/local/bin/erdma-labprobe"
ck "containerd's NRI socket exists (NRI enabled in config.toml)" test -S /var/run/nri/nri.sock
echo "  containerd's RLIMIT_MEMLOCK: $(grep 'Max locked memory' /proc/$(pidof containerd)/limits)"

# spec_of NAME: the OCI spec containerd made for the pod's container
spec_of() { ctr -n k8s.io containers info "$(jq -r .container_id "/tmp/$1.pod.json")" | jq .Spec; }
dev_of_pod() { jq -r '.allocation.device_ids[0] | split("/")[0]' "/tmp/$1.pod.json"; }

# phase MODE: the agent with --nri MODE, the pods, their probes (results in /tmp/MODE-*). The
# neighbour pod-n runs only with the plugin (without it nothing is limited anyway).
phase() {
  start_kubelet || { bad "fake kubelet did not start ($1)"; return 1; }
  start_agent --slots-per-device 2 --nri "$1" --nri-budget-ms 8000 || { bad "agent (--nri $1) did not register"; return 1; }
  if [ "$1" = on ]; then
    wait_for 30 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.nri.connected'" \
      || { bad "the agent's NRI plugin did not connect to containerd: $(wget -qO- http://127.0.0.1:9464/healthz | jq -c .nri)"; return 1; }
  fi
  wget -qO /tmp/healthz.json http://127.0.0.1:9464/healthz
  echo "  agent --nri $1: /healthz nri $(jq -c .nri /tmp/healthz.json)"
  cp /tmp/healthz.json "$OUT/$SCEN-$1-healthz.json"
  pods="pod-l pod-m"
  cpod pod-l 1 --annotation "$ANN" $MNT > /dev/null || { bad "pod-l did not start ($1): $(tail -1 /tmp/pod-l.pod.err)"; return 1; }
  DL=$(dev_of_pod pod-l)
  if [ "$1" = on ]; then
    # a plain allocation takes the other device's first slot, so that pod-n (then a NUMA tie:
    # the lower node) lands next to pod-l
    alloc filler 1 > /dev/null || { bad "filler allocation failed"; return 1; }
    cpod pod-n 1 $MNT > /dev/null || { bad "pod-n did not start: $(tail -1 /tmp/pod-n.pod.err)"; return 1; }
    pods="pod-l pod-n pod-m"
    DN=$(dev_of_pod pod-n)
    [ "$DL" = "$DN" ] || { bad "pod-l ($DL) and its neighbour pod-n ($DN) are not on the same device"; return 1; }
  fi
  cpod pod-m 1 --user 1000 $MNT > /dev/null || { bad "pod-m (UID 1000) did not start ($1): $(tail -1 /tmp/pod-m.pod.err)"; return 1; }
  echo "  pods on: $(for p in $pods; do printf '%s %s; ' $p "$(dev_of_pod $p)"; done)"
  for p in $pods; do
    spec_of $p > "/tmp/$1-$p.spec.json"
    cg=$(cgroup_dir rdma "$(jq -r .linux.cgroupsPath "/tmp/$1-$p.spec.json")")
    grep "^$DL " "$cg/rdma.max" > "/tmp/$1-$p.rdma.max"
    [ $p = pod-l ] && CG=$cg
  done
  for p in pod-l ${DN:+pod-n}; do
    echo "  $p: OCI spec unified $(jq -c '.linux.resources.unified // {}' "/tmp/$1-$p.spec.json"), cgroup rdma.max: $(cat "/tmp/$1-$p.rdma.max")"
  done
  # pod-l opens 3 contexts and holds what it got for a while: the cgroup counts them (ExecSync
  # answers only when the probe ends, so the count is read from the cgroup while it runs)
  cx pod-l erdma-labprobe contexts --device "$DL" --count 3 --hold-ms 6000 > "/tmp/$1-pod-l.ctx" 2>&1 &
  h=$!
  wait_for 30 grep -q "^$DL hca_handle=[1-9]" "$CG/rdma.current"
  sleep 1   # the probe opens its contexts one after the other
  grep "^$DL " "$CG/rdma.current" > "/tmp/$1-pod-l.rdma.current"
  [ -n "${DN:-}" ] && cx pod-n erdma-labprobe contexts --device "$DN" --count 3 > "/tmp/$1-pod-n.ctx" 2>&1
  wait $h
  echo "  pod-l holding its contexts: rdma.current $(cat "/tmp/$1-pod-l.rdma.current")"
  for p in pod-l ${DN:+pod-n}; do echo "  $p opens 3 contexts on $DL: $(tr '\n' ' ' < "/tmp/$1-$p.ctx")"; done
  cx pod-m sh -c "id -u; grep 'Max locked memory' /proc/self/limits; erdma-labprobe reg-mr --device $(dev_of_pod pod-m) --size 64M" > "/tmp/$1-pod-m.out" 2>&1
  echo "  pod-m: $(tr -s ' ' < "/tmp/$1-pod-m.out" | tr '\n' ' ')"
  cp "/tmp/$1-"* "$OUT/" 2>/dev/null
  DN=
  runtime_clean; stop_daemons
  cp "$OUT/$SCEN-agent.log" "$OUT/$SCEN-$1-agent.log"
}

echo " with the NRI plugin (--nri on):"
t=$(now)
phase on
echo "nri-phase-on $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
if [ "$LAB_CGROUP" = v1 ]; then
  # runc refuses linux.resources.unified on cgroup v1: the agent writes the container's rdma
  # cgroup at StartContainer instead
  ck "cgroup v1: /healthz nri shows cgroup v1 and the rdma-cgroup route" \
    jq -e '.nri.cgroup_version == "v1" and .nri.rdma_max_route == "rdma-cgroup"' "$OUT/$SCEN-on-healthz.json"
  ck "cgroup v1: pod-l's OCI spec carries no unified (runc refuses it on v1)" \
    jq -e '(.linux.resources.unified // {}) | length == 0' /tmp/on-pod-l.spec.json
else
  ck "pod-l's OCI spec carries rdma.max '$DL hca_handle=2' (the plugin's CreateContainer adjustment)" \
    jq -e --arg l "$DL hca_handle=2" '.linux.resources.unified["rdma.max"] == $l' /tmp/on-pod-l.spec.json
fi
ck "pod-l's cgroup rdma.max: $(cat /tmp/on-pod-l.rdma.max)" grep -q "^$DL hca_handle=2 " /tmp/on-pod-l.rdma.max
ck "pod-l holding its contexts: rdma.current $(cat /tmp/on-pod-l.rdma.current)" grep -q "^$DL hca_handle=2 " /tmp/on-pod-l.rdma.current
ck "pod-l (hca_handle=2) opens 2 contexts, the 3rd fails with EAGAIN (errno 11, the rdma cgroup)" \
  sh -c "grep -qx 'opened=2 requested=3' /tmp/on-pod-l.ctx && grep -qx 'failed_at=3 errno=11' /tmp/on-pod-l.ctx"
ck "neighbour pod-n on the same device: no limit (rdma.max $(cat /tmp/on-pod-n.rdma.max)), opens 3" \
  sh -c "grep -q '^$DL hca_handle=max ' /tmp/on-pod-n.rdma.max && grep -qx 'opened=3 requested=3' /tmp/on-pod-n.ctx"
ck "pod-m runs as UID 1000" sh -c "head -1 /tmp/on-pod-m.out | grep -qx 1000"
ck "pod-m's OCI spec has RLIMIT_MEMLOCK unlimited (the plugin's adjustment)" \
  jq -e '[.process.rlimits[]? | select(.type == "RLIMIT_MEMLOCK" and .soft == 18446744073709551615)] | length == 1' /tmp/on-pod-m.spec.json
ck "pod-m's Max locked memory is unlimited" grep -q 'Max locked memory *unlimited *unlimited' /tmp/on-pod-m.out
ck "non-root pod-m registers 64 MiB (ibv_reg_mr)" grep -qx "registered=$((64 << 20))" /tmp/on-pod-m.out

echo " without the plugin (--nri off), the same pods:"
t=$(now)
phase off
echo "nri-phase-off $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
ck "agent --nri off: the plugin is not used" jq -e '.nri.used == false' "$OUT/$SCEN-off-healthz.json"
ck "pod-l's OCI spec has no rdma.max" jq -e '(.linux.resources.unified // {}) | has("rdma.max") | not' /tmp/off-pod-l.spec.json
ck "pod-l's cgroup rdma.max: $(cat /tmp/off-pod-l.rdma.max) (no limit)" grep -q "^$DL hca_handle=max " /tmp/off-pod-l.rdma.max
ck "pod-l opens 3 contexts (the annotation's limit is not applied)" grep -qx 'opened=3 requested=3' /tmp/off-pod-l.ctx
ck "pod-m still runs as UID 1000" sh -c "head -1 /tmp/off-pod-m.out | grep -qx 1000"
ck "pod-m's Max locked memory is containerd's 8 MiB" grep -q 'Max locked memory *8388608 *8388608' /tmp/off-pod-m.out
ck "non-root pod-m cannot register 64 MiB: ENOMEM (errno 12, RLIMIT_MEMLOCK)" grep -qx 'errno=12' /tmp/off-pod-m.out
finish
