#!/bin/sh
# nri-smcr (6.12, SMC): SMC-R from a pod's very first socket through the agent's NRI plugin on the
# guest's containerd. The agent runs with SMC-R on (--deviceplugin-prestart-container true) and
# --nri on: the kubelet then calls no PreStartContainer, and the plugin configures the pod's
# network namespace (pnet entry, the BPF IPPROTO_SMC policy) when containerd hands it the sandbox
# at RunPodSandbox, before any container of the pod exists. pod-s (annotated erdma-smcr: "true")
# has one container whose command is an unmodified TCP client (busybox nc) connecting to a
# plain TCP server in the node's namespace: its first and only socket must be an SMC socket
# (smc_diag through `erdmactl smc status` in its netns; here it falls back to TCP, the server
# side not speaking SMC, and the reason is decoded). Then the same pod with the agent restarted
# without the plugin and without PreStart (--nri off, no SMC-R hook): its connection is plain
# TCP (no SMC socket in its netns).
# On containerd 2.x (NRI v0.8) two more things are checked:
# - the timeout: the runtime's real default, 2 s (plugin_request_timeout as 2.x ships it), told
#   at Configure as request_timeout 2000 (milliseconds; the agent logs it in "NRI: configured by
#   the runtime" as request_timeout_ms), and pod-s is still configured at RunPodSandbox within
#   the budget that leaves (half of it);
# - a split Synchronize: containerd restarted with its debug log, SPLIT_PODS pods whose
#   annotations together pass ttRPC's 4 MiB message limit (SPLIT_ANN annotations of SPLIT_KIB KiB
#   each per pod), then the agent restarted: its plugin registers and the runtime's one
#   Synchronize message no longer fits. NRI v0.8 (pkg/adaptation, plugin.synchronize) then logs
#   "oversized message, retrying in smaller chunks" and sends the pods and containers in parts,
#   "sending sync message, P/Ptotal, C/Ctotal (more: true)" for every part but the last, and
#   closes a plugin that answers a part with more: true other than with more: true and no updates
#   ("plugin does not handle split sync requests"). Checked from containerd's log: it split, the
#   plugin "connected and synchronized" once and was not closed; from the agent's: one
#   registration and a Synchronize of every pod; and the plugin keeps serving: a new pod's
#   CreateContainer adjustment (rdma.max) is in its OCI spec, still with one registration.
#   containerd 1.7 (NRI v0.6.1) never splits and tells no timeout: neither is checked there.
# Would fail if: the NRI plugin did not configure SMC-R at RunPodSandbox (no pod-resources
# allocation yet, the netns not found from the sandbox, the annotation lost), configured it too
# late for the first socket, the kubelet still had to call PreStartContainer, or the pod got SMC
# without the plugin; on containerd 2.x, if the plugin misread the runtime's timeout (2000 taken
# for nanoseconds, or not logged), could not configure pod-s within the budget the real 2 s
# timeout leaves, did not answer a split Synchronize as the runtime requires (closed, or
# registering again and again), or stopped serving CreateContainer after it.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --nri; need erdmactl
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
modprobe smc > /tmp/modprobe.err 2>&1 && modprobe smc_diag >> /tmp/modprobe.err 2>&1 \
  || { fail "$SCEN" "kernel $(uname -r) has no SMC (run it on bookworm-backports 6.12): $(tr '\n' ' ' < /tmp/modprobe.err)"; exit 0; }
grep -q " /sys/fs/bpf " /proc/mounts || mount -t bpf bpf /sys/fs/bpf
SMCR=network.alibabacloud.com/erdma-smcr=true
SRV=10.89.0.1   # cri0, the node's side of the pods' bridge

# plain FILE: the file without the ANSI colours of the agent's log
plain() { sed "s/$(printf '\033')\[[0-9;]*m//g" "$1"; }
estab_on() { nsenter --net="$1" ss -tan | grep -q "ESTAB.*$SRV:$2"; }
decision() { jq -r '[(.smcr // [])[] | select(.pod == "lab/pod-s")] | last | .outcome // "none"' /tmp/healthz.json; }
# phase NAME PORT AGENT-FLAGS...: the server, the agent, pod-s; results in /tmp/NAME-*
phase() {
  _p=$1; _port=$2; shift 2
  (sleep 90 | busybox nc -l -p "$_port" > /dev/null 2>&1) &
  wait_for 10 sh -c "ss -Hltn | grep -q ':$_port '" || log "the server on port $_port is not listening"
  start_kubelet || { bad "fake kubelet did not start ($_p)"; return 1; }
  start_agent --slots-per-device 2 "$@" || { bad "agent ($*) did not register"; return 1; }
  case " $* " in *" --nri on "*)
    wait_for 30 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.nri.connected'" \
      || { bad "the NRI plugin did not connect: $(wget -qO- http://127.0.0.1:9464/healthz | jq -c .nri)"; return 1; } ;;
  esac
  cpod pod-s 1 --annotation "$SMCR" -- sh -c "sleep 60 | nc $SRV $_port" > /dev/null \
    || { bad "pod-s did not start ($_p): $(tail -1 /tmp/pod-s.pod.err)"; return 1; }
  NS=$(cpod_netns pod-s)
  wait_for 30 estab_on "$NS" "$_port" || bad "pod-s did not connect to $SRV:$_port ($_p)"
  nsenter --net="$NS" ss -tan | sed "s/^/    pod-s ss ($_p): /"
  erdmactl smc status --netns "$NS" -o json > "/tmp/$_p-smc.json" 2> "/tmp/$_p-smc.err" || bad "erdmactl smc status ($_p): $(cat /tmp/$_p-smc.err)"
  erdmactl smc status --netns "$NS" | sed "s/^/    smc ($_p): /"
  wget -qO /tmp/healthz.json http://127.0.0.1:9464/healthz
  wget -qO "/tmp/$_p-metrics.txt" http://127.0.0.1:9464/metrics
  cp /tmp/healthz.json "$OUT/$SCEN-$_p-healthz.json"; cp "/tmp/$_p-smc.json" /tmp/pod-s.pod.json "$OUT/$SCEN-$_p-pod.json" 2>/dev/null
  cp /tmp/pod-s.pod.json "/tmp/$_p-pod.json"
  echo "  $_p: nri $(jq -c .nri /tmp/healthz.json), pod-s decision '$(decision)', pre_start_called $(jq .allocation.pre_start_called /tmp/pod-s.pod.json)"
  decision > "/tmp/$_p-decision"
  runtime_clean; stop_daemons
  cp "$OUT/$SCEN-agent.log" "$OUT/$SCEN-$_p-agent.log"
}

echo " with the NRI plugin (--nri on, SMC-R on):"
phase on 5000 --deviceplugin-prestart-container true --nri on --nri-budget-ms 8000 --cri-socket "$CTRD_SOCK"
ck "the agent asked for no PreStartContainer (NRI path), and the lab kubelet called none" \
  jq -e '.allocation.pre_start_called == false' /tmp/on-pod.json
ck "pod-s: the NRI plugin configured SMC-R at RunPodSandbox (decision '$(cat /tmp/on-decision)')" grep -qx configured /tmp/on-decision
n=$(jq '[.sockets[]? | select(.state != "LISTEN")] | length' /tmp/on-smc.json 2>/dev/null)
ck "pod-s's first socket (its container's TCP client) is an SMC socket ($n in smc_diag)" test "${n:-0}" -ge 1
ck "its mode and reason: $(jq -c '[.sockets[]? | {mode, fallback: .fallback.reason.name}] | unique' /tmp/on-smc.json 2>/dev/null)" \
  jq -e '.sockets[] | select(.mode == "SMCR" or (.fallback.reason.code // 0) != 0)' /tmp/on-smc.json

echo " without the plugin and without PreStart (--nri off, no SMC-R hook):"
phase off 5001 --nri off
ck "pod-s's connection is plain TCP: no SMC socket in its netns" jq -e '.summary.total == 0' /tmp/off-smc.json

case "$RT_NAME" in containerd-1.*)
  echo " $RT_NAME (NRI v0.6.1) tells no request timeout and never splits a Synchronize: the timeout and split checks run on containerd 2.x"
  finish; exit 0 ;;
esac

# --- containerd 2.x: the runtime's 2 s timeout, told in milliseconds ----------------------
plain "$OUT/$SCEN-on-agent.log" | grep -m1 'NRI: configured by the runtime' > /tmp/on-configured.txt
echo "  agent (--nri on): $(cat /tmp/on-configured.txt | grep . || echo "no 'NRI: configured by the runtime' line")"
ck "the runtime told its 2 s request timeout in ms and the agent read it so: request_timeout_ms 2000 in 'NRI: configured by the runtime'" \
  grep -qE 'request_timeout_ms=(Some\()?2000([^0-9]|$)' /tmp/on-configured.txt
grep -h 'erdma_nri_hook_duration_seconds_\(count\|sum\){hook="RunPodSandbox"' /tmp/on-metrics.txt 2>/dev/null | sed 's/^/    metrics (on): /'

# --- containerd 2.x: a Synchronize over ttRPC's 4 MiB, split ------------------------------
SPLIT_PODS=10 SPLIT_ANN=4 SPLIT_KIB=115
echo " a split Synchronize: $SPLIT_PODS pods with $SPLIT_ANN annotations of $SPLIT_KIB KiB each ($((SPLIT_PODS * SPLIT_ANN * SPLIT_KIB)) KiB; ttRPC's limit is 4096 KiB), then the agent restarted"
t=$(now)
runtime_restart debug || { bad "containerd did not restart with its debug log"; finish; exit 0; }
start_kubelet || { bad "fake kubelet did not start (split)"; finish; exit 0; }
AGENT_FLAGS="--slots-per-device 2 --deviceplugin-prestart-container true --nri on --nri-budget-ms 8000 --cri-socket $CTRD_SOCK"
start_agent $AGENT_FLAGS || { bad "agent did not register (split)"; finish; exit 0; }
wait_for 30 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.nri.connected'" || bad "the NRI plugin did not connect before the pods (split)"
V=$(head -c $((SPLIT_KIB * 1024)) /dev/zero | tr '\0' x)
i=0
while [ $i -lt $SPLIT_PODS ]; do
  set --; j=0
  while [ $j -lt $SPLIT_ANN ]; do set -- "$@" --annotation "lab.erdma.io/filler-$j=$V"; j=$((j + 1)); done
  cpod "big-$i" 0 "$@" > /dev/null || { bad "big-$i did not start: $(tail -1 /tmp/big-$i.pod.err | cut -c1-200)"; break; }
  i=$((i + 1))
done
echo "split-pods-up $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
echo "  $i pods up; containerd holds $(ctr -n k8s.io containers ls -q | wc -l) containers (sandboxes and theirs)"
cp "$OUT/$SCEN-agent.log" "$OUT/$SCEN-split-before-agent.log"
mark=$(wc -l < "$CTRD_DEBUG_LOG")
# the agent's restart: its NRI plugin registers again and is synchronized with every pod
kill "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null; AGENT_PID=
t=$(now)
start_agent $AGENT_FLAGS || bad "agent did not register again (split)"
wait_for 30 sh -c "wget -qO- http://127.0.0.1:9464/healthz | jq -e '.nri.connected'"
echo "split-agent-restart-to-connected $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
sleep 5   # a plugin the runtime closed would reconnect and register again meanwhile
tail -n +$((mark + 1)) "$CTRD_DEBUG_LOG" | grep -E 'sync message|oversized message|synchroniz|split sync|NRI plugin|10-erdma' > /tmp/split-ctrd.log
sed 's/^/    containerd: /' /tmp/split-ctrd.log | cut -c1-240
plain "$OUT/$SCEN-agent.log" | grep -E 'NRI' > /tmp/split-agent.log
sed 's/^/    agent: /' /tmp/split-agent.log | cut -c1-240
parts=$(grep -c 'sending sync message.*(more: true)' /tmp/split-ctrd.log)
if grep -q 'plugin does not handle split sync requests' /tmp/split-ctrd.log; then
  bad "the runtime split the Synchronize ($parts parts with more: true) and closed the plugin: 'plugin does not handle split sync requests' (the agent did not answer a part with more: true and no updates)"
elif grep -q 'failed to synchronize plugin' /tmp/split-ctrd.log; then
  bad "the runtime could not synchronize the plugin: $(grep -m1 'failed to synchronize plugin' /tmp/split-ctrd.log | sed 's/.*msg=//' | cut -c1-200)"
fi
ck "containerd split the Synchronize: oversized for one ttRPC message, sent in $((parts + 1)) parts ($parts with more: true)" \
  sh -c "grep -q 'oversized message, retrying in smaller chunks' /tmp/split-ctrd.log && test $parts -ge 1 && grep -q 'sending sync message.*(more: false)' /tmp/split-ctrd.log"
ck "containerd: the plugin 10-erdma connected and synchronized once, and was not closed" \
  sh -c "test \$(grep -c '10-erdma.* connected and synchronized' /tmp/split-ctrd.log) = 1 && ! grep -qE 'failed to synchronize|does not handle split' /tmp/split-ctrd.log"
synced=$(grep -m1 'NRI: synchronized with the runtime' /tmp/split-agent.log | sed -n 's/.* pods=\([0-9]*\).*/\1/p')
ck "the agent was synchronized with every pod at once (pods=${synced:-none}, $i big pods)" test "${synced:-0}" -ge "$i"
ck "the agent registered once after its restart (no re-registration loop): $(grep -c 'NRI: registered' /tmp/split-agent.log) registration(s), $(grep -c 'NRI session ended' /tmp/split-agent.log) session end(s)" \
  sh -c "test \$(grep -c 'NRI: registered' /tmp/split-agent.log) = 1 && ! grep -q 'NRI session ended' /tmp/split-agent.log"
# the plugin keeps serving: a new pod's CreateContainer is adjusted
if cpod pod-l 1 --annotation network.alibabacloud.com/erdma-rdma-max=hca_handle=2 > /dev/null; then
  DL=$(jq -r '.allocation.device_ids[0] | split("/")[0]' /tmp/pod-l.pod.json)
  ctr -n k8s.io containers info "$(jq -r .container_id /tmp/pod-l.pod.json)" | jq .Spec > /tmp/split-pod-l.spec.json
  ck "after the split Synchronize the plugin still adjusts CreateContainer: pod-l's OCI spec rdma.max $(jq -c '.linux.resources.unified["rdma.max"]' /tmp/split-pod-l.spec.json) ('$DL hca_handle=2')" \
    jq -e --arg l "$DL hca_handle=2" '.linux.resources.unified["rdma.max"] == $l' /tmp/split-pod-l.spec.json
else
  bad "pod-l did not start after the split Synchronize: $(tail -1 /tmp/pod-l.pod.err | cut -c1-200)"
fi
nreg=$(plain "$OUT/$SCEN-agent.log" | grep -c 'NRI: registered')
ck "still one registration after pod-l ($nreg)" test "$nreg" = 1
t=$(now)
runtime_clean; stop_daemons
echo "split-pods-deleted $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
cp "$OUT/$SCEN-agent.log" "$OUT/$SCEN-split-agent.log"; cp /tmp/split-ctrd.log "$OUT/$SCEN-split-containerd.log"
runtime_restart info
finish
