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
# Would fail if: the NRI plugin did not configure SMC-R at RunPodSandbox (no pod-resources
# allocation yet, the netns not found from the sandbox, the annotation lost), configured it too
# late for the first socket, the kubelet still had to call PreStartContainer, or the pod got SMC
# without the plugin.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --nri; need erdmactl
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
modprobe smc > /tmp/modprobe.err 2>&1 && modprobe smc_diag >> /tmp/modprobe.err 2>&1 \
  || { fail "$SCEN" "kernel $(uname -r) has no SMC (run it on bookworm-backports 6.12): $(tr '\n' ' ' < /tmp/modprobe.err)"; exit 0; }
grep -q " /sys/fs/bpf " /proc/mounts || mount -t bpf bpf /sys/fs/bpf
SMCR=network.alibabacloud.com/erdma-smcr=true
SRV=10.89.0.1   # cri0, the node's side of the pods' bridge

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
finish
