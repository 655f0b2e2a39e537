#!/bin/sh
# doctor-usage: `erdmactl doctor --pod` names a pod that holds aliyun/erdma but runs NCCL over
# sockets, with the cause it can see (issue 32), from what a cluster really gives it: the Pod
# object (the lab API server), the agent's /usage through the API server's pod proxy (the agent
# reads the kernel's RDMA objects), and the container's log as `kubectl logs` serves it (the lab
# API server reads the CRI log files containerd wrote under /var/log/pods, as the kubelet does).
# Three pods, each holding one slot of aliyun/erdma through the agent's device plugin:
# - nccl-hca: NCCL_IB_HCA=mlx5 in its spec (carried over from a Mellanox cluster); prints the
#   log of a real NCCL 2.28.9 run that found no IB device and fell back to sockets. Doctor must
#   FAIL pod.rdma_usage naming NCCL_IB_HCA=mlx5 and the device the pod was allocated.
# - nccl-noprov: its image has no libibverbs provider (an emptyDir over /etc/libibverbs.d, as an
#   image without ibverbs-providers' driver files); runs ibv_devinfo with IBV_SHOW_WARNINGS=1,
#   so rdma-core itself writes "no userspace device-specific driver found", then the same NCCL
#   log. Doctor must FAIL naming the missing provider.
# - rdma-ok (control): runs ibv_rc_pingpong's server on its device (one RC QP, waiting for a
#   peer). Doctor must PASS pod.rdma_usage with the QP the kernel lists for that process.
# NCCL needs a GPU, which the lab's VM has not: the pods print the log a real NCCL wrote on two
# H200s without an RDMA device (testdata/nccl/real/h200x2-nccl2.28.9/nccl-socket.log, unchanged);
# everything else (allocation, device nodes, rdma-core's own warning, the kernel's QPs, the log
# path) is real. The agent runs as a host process; its Pod object (owned by the chart's DaemonSet,
# host network) says where it listens, as the chart's pod would.
# Would fail if: doctor did not find the node's agent pod or could not reach its /usage through
# the pod proxy, did not map the agent's answer to the pod, read the wrong container's log or
# none, missed NCCL's socket fallback, did not read NCCL_IB_HCA from the spec or matched it
# against the wrong devices, did not recognise rdma-core's missing-provider warning, or failed a
# pod that does use RDMA.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --rdma-usage; need erdmactl
# kube-rs's client (rustls) does not start without a root certificate and the guest has no CA
# store; the lab's API server is plain HTTP, so a placeholder root (its key was discarded) does.
export SSL_CERT_FILE=/mnt/host/guest/lab-root.pem
erdma-fake-kubelet apiserver --help 2>&1 | grep -q -- --pod-log-dir || { skip "$SCEN" "erdma-fake-kubelet apiserver has no --pod-log-dir yet"; exit 0; }
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
NODE=$NODE_NAME_LAB
KC=/run/erdma-lab/kubeconfig-doctor
NCCL_LOG=/mnt/host/nccl/nccl-socket.log
[ -s "$NCCL_LOG" ] || { fail "$SCEN" "the NCCL log is not in the share ($NCCL_LOG)"; exit 0; }
F="$OUT/doctor-usage.txt"; : > "$F"
fig() { echo "$*" >> "$F"; echo "  $*"; }

# --- the objects: the agent's pod, and the three pods as a user would apply them -----------------
pod_yaml() {  # pod_yaml NAME ENV_YAML VOLUME_MOUNTS_YAML VOLUMES_YAML SCRIPT: a Pod asking aliyun/erdma: 1
  cat << EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: lab}
spec:
  nodeName: $NODE
  restartPolicy: Never
  containers:
  - name: trainer
    image: lab.local/rdma-tools:1
    command: ["/bin/sh", "-c", "$5"]
    env: [{name: NCCL_DEBUG, value: INFO}$2]
    resources: {limits: {aliyun/erdma: "1"}}
    volumeMounts: [{name: nccl, mountPath: /nccl, readOnly: true}$3]
  volumes: [{name: nccl, hostPath: {path: /mnt/host/nccl, type: Directory}}$4]
EOF
}
NCCL_RUN='cat /nccl/nccl-socket.log; exec sleep 2147483647'
PINGPONG='u=$(ls /dev/infiniband | grep -m1 uverbs); d=$(cat /sys/class/infiniband_verbs/$u/ibdev); echo device $d; exec ibv_rc_pingpong -d $d -g 0'
{
  cat << EOF
apiVersion: v1
kind: Pod
metadata:
  name: alibabacloud-erdma-agent-lab
  namespace: kube-system
  labels: {app: alibabacloud-erdma-agent}
  ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: alibabacloud-erdma-agent, uid: 5d0c7c1e-0000-4000-8000-0000000000d5, controller: true}]
spec:
  nodeName: $NODE
  hostNetwork: true
  containers:
  - name: alibabacloud-erdma-controller
    image: lab.local/erdma-agent:lab
    ports: [{name: metrics, containerPort: 9464}]
status: {phase: Running, hostIP: 127.0.0.1, podIP: 127.0.0.1, podIPs: [{ip: 127.0.0.1}]}
EOF
  pod_yaml nccl-hca ", {name: NCCL_IB_HCA, value: mlx5}" "" "" "$NCCL_RUN"
  pod_yaml nccl-noprov ", {name: IBV_SHOW_WARNINGS, value: \"1\"}" ", {name: providers, mountPath: /etc/libibverbs.d}" \
    ", {name: providers, emptyDir: {}}" "ibv_devinfo; $NCCL_RUN"
  pod_yaml rdma-ok "" "" "" "$PINGPONG"
} > /tmp/du-objects.yaml
cp /tmp/du-objects.yaml "$OUT/doctor-usage-objects.yaml"

mkdir -p "${KC%/*}"; rm -f "$KC"
erdma-fake-kubelet apiserver --listen 127.0.0.1:6443 --kubeconfig "$KC" --node "$NODE" \
  --objects /tmp/du-objects.yaml --pod-log-dir /var/log/pods > "$OUT/$SCEN-apiserver.log" 2>&1 &
wait_for 20 test -s "$KC" || { fail "$SCEN" "the lab API server did not start: $(tail -3 "$OUT/$SCEN-apiserver.log")"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
# doctor reaches /usage through the API server's pod proxy, not from the node's loopback: the
# agent serves it there only with --usage-remote (docs/operations.md, the flag table).
start_agent --slots-per-device 2 --usage-remote || { fail "$SCEN" "the agent did not register"; exit 0; }

for p in nccl-hca nccl-noprov rdma-ok; do
  erdma-fake-kubelet pod run --dir "$KDIR" --manifest /tmp/du-objects.yaml --object "Pod/$p" \
    --node-name "$NODE" --node-ip "$NODE_IP_LAB" > "/tmp/$p.pod.json" 2> "/tmp/$p.pod.err" \
    || { fail "$SCEN" "$p did not start: $(tail -2 "/tmp/$p.pod.err" | tr '\n' ' ')"; exit 0; }
  fig "lab/$p: allocated $(jq -r '.allocation.device_ids | join(" ")' "/tmp/$p.pod.json")"
done
dev_of_pod() { jq -r '.allocation.device_ids[0] | split("/")[0]' "/tmp/$1.pod.json"; }
# the logs as kubectl reads them (through the API server), once each pod has written its own
kubectl_log() { timeout 10 wget -qO- "http://127.0.0.1:6443/api/v1/namespaces/lab/pods/$1/log?container=trainer"; }
log_has() { kubectl_log "$1" | grep -qF "$2"; }
for p in nccl-hca nccl-noprov; do
  wait_for 60 log_has $p "Using network Socket" \
    || bad "lab/$p's log, as the API server serves it, never showed NCCL's 'Using network Socket' (log: $(kubectl_log $p | tail -2 | tr '\n' ' '))"
done
kubectl_log nccl-noprov > "$OUT/doctor-usage-nccl-noprov.log" 2> /dev/null
ck "rdma-core in lab/nccl-noprov itself warned that it has no provider: $(grep -m1 'no userspace device-specific driver' "$OUT/doctor-usage-nccl-noprov.log")" \
  grep -q "libibverbs: Warning: no userspace device-specific driver found for" "$OUT/doctor-usage-nccl-noprov.log"
# the control's QP, as the kernel lists it (the pingpong server waits for its peer)
OKDEV=$(dev_of_pod rdma-ok)
qps() { rdma -j resource show qp | jq -s -c 'flatten(1) | [.[] | select(.comm == "ibv_rc_pingpong") | {ifname, lqpn, type, state, pid}]'; }
okqp() { qps | jq -e --arg d "$OKDEV" '[.[] | select(.ifname == $d)] | length >= 1'; }
wait_for 60 okqp || bad "the kernel lists no QP of ibv_rc_pingpong on $OKDEV (lab/rdma-ok's log: $(kubectl_log rdma-ok | tail -2 | tr '\n' ' '))"
fig "kernel QPs of ibv_rc_pingpong: $(qps)"

# --- doctor --pod ------------------------------------------------------------------------------
doctor() { erdmactl doctor --kubeconfig "$KC" -n lab --pod "$1" -o json > "/tmp/du-doctor-$1.json" 2> "/tmp/du-doctor-$1.err"; }
usage_check() { jq -c '[.checks[] | select(.id == "pod.rdma_usage")][0] // {} | {status, message, hint}' "/tmp/du-doctor-$1.json" 2> /dev/null; }
for p in nccl-hca nccl-noprov rdma-ok; do
  doctor $p; echo "$?" > "/tmp/du-doctor-$p.rc"
  cp "/tmp/du-doctor-$p.json" "$OUT/doctor-usage-$p.json" 2> /dev/null
  cp "/tmp/du-doctor-$p.err" "$OUT/doctor-usage-$p.err" 2> /dev/null
  fig "doctor --pod lab/$p (exit $(cat /tmp/du-doctor-$p.rc)): $(usage_check $p)$(test -s /tmp/du-doctor-$p.err && echo "; stderr: $(tail -2 /tmp/du-doctor-$p.err | tr '\n' ' ')")"
done
HCADEV=$(dev_of_pod nccl-hca)
ck "doctor fails lab/nccl-hca naming NCCL_IB_HCA=mlx5 and its device $HCADEV, and exits 1: $(usage_check nccl-hca)" \
  sh -c "test \"\$(cat /tmp/du-doctor-nccl-hca.rc)\" = 1 && jq -e --arg d '$HCADEV' '[.checks[] | select(.id == \"pod.rdma_usage\")][0]
    | .status == \"FAIL\" and (.message | contains(\"NCCL fell back to sockets\")) and (.message | contains(\"NCCL_IB_HCA=mlx5 matches none of the devices allocated to the pod (\" + \$d + \")\"))' /tmp/du-doctor-nccl-hca.json"
ck "doctor fails lab/nccl-noprov naming the missing libibverbs provider, and exits 1: $(usage_check nccl-noprov)" \
  sh -c "test \"\$(cat /tmp/du-doctor-nccl-noprov.rc)\" = 1 && jq -e '[.checks[] | select(.id == \"pod.rdma_usage\")][0]
    | .status == \"FAIL\" and (.message | contains(\"NCCL fell back to sockets\")) and (.message | contains(\"has no provider\"))' /tmp/du-doctor-nccl-noprov.json"
rdma_ok_passes() {
  test -s /tmp/du-doctor-rdma-ok.json && jq -e --arg d "$OKDEV" '[.checks[] | select(.id == "pod.rdma_usage")][0]
    | .status == "PASS" and (.message | test("hold [1-9][0-9]* QPs")) and (.message | contains($d))' /tmp/du-doctor-rdma-ok.json
}
ck "doctor passes lab/rdma-ok, which holds a QP on $OKDEV: $(usage_check rdma-ok)" rdma_ok_passes

for p in nccl-hca nccl-noprov rdma-ok; do erdma-fake-kubelet pod delete --dir "$KDIR" --pod "lab/$p" > /dev/null 2>&1; done
finish
