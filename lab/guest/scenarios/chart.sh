#!/bin/sh
# chart: the agent as operators deploy it. The DaemonSet the chart renders (the real Helm engine,
# deploy/helm/ci/values/lab.yaml: local ERI discovery, rxe, no driver management) runs from the
# image scripts/build-images.sh built, imported into containerd, as a pod the lab kubelet creates
# from the pod template (`pod run --manifest`): the template's image, args, env (NODE_NAME from
# spec.nodeName), hostPath volumes with their types, mounts (read-only, HostToContainer),
# capabilities, host network and PID namespaces, and its readiness probe on the metrics port.
# Two pods then get their devices from that containerized agent (the chart's 200 slots per
# device: the plugin's preferred allocation spreads them over the two devices) and move RDMA
# traffic between them. Stopping the pod (SIGTERM, the kubelet's grace period) ends the agent.
# Would fail if: the chart's default image reference is not what build-images.sh builds (the lab
# kubelet refuses a missing image: the lab has no registry); the image lacks a library the agent
# loads or its entrypoint is wrong (the container exits, never ready); the chart lost a hostPath
# mount or a path the args name (e.g. the device-plugins or pod-resources directory: the agent
# cannot register or count slots; /dev as /host/dev with --dev-root: no device nodes for the
# pods), its NODE_NAME fieldRef, its readiness probe's path or port, a capability the agent needs,
# or host networking (the probe on the node's address); or the agent in a container handed out
# device paths of its own mount namespace (/host/dev/...) instead of the node's; or the template's
# confinement (seccompProfile RuntimeDefault, readOnlyRootFilesystem, the memory limit) is missing,
# not passed to the runtime, or stops the agent (each is checked as the kernel applies it).
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet
erdma-fake-kubelet pod run --help 2>&1 | grep -q -- --manifest || { skip "$SCEN" "erdma-fake-kubelet pod run has no --manifest yet"; exit 0; }
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
WANT_IMAGE=$(jq -r '.images[] | select(.name == "erdma-agent") | .ref' "$IMAGES/images.json")
WANT_DIGEST=$(jq -r '.images[] | select(.name == "erdma-agent") | .digest' "$IMAGES/images.json")
if ! chart_agent_up; then
  chart_agent_logs
  fail "$SCEN" "the chart's agent pod did not run and register: $(tail -1 /tmp/agent.pod.err)"; exit 0
fi
P=/tmp/agent.pod.json
log "agent pod: $(jq -c '{container_id: .container_id[:12], ready, ready_after_ms, image: .image.id, image_pull: .notes.image_pull, timings_ms}' "$P")"
ck "the chart's agent image is the one build-images.sh built: $AGENT_IMAGE = $WANT_IMAGE" test "$AGENT_IMAGE" = "$WANT_IMAGE"
ck "containerd runs that image by its manifest digest $WANT_DIGEST" \
  sh -c "ctr -n k8s.io images ls | grep -F '$WANT_IMAGE' | grep -qF '$WANT_DIGEST'"
ck "the pod became ready by the chart's readiness probe ($(jq -r '[.probes[]? | select(.kind == "readiness") | .description][0] // "?"' "$P"), after $(jq -r '.ready_after_ms // "?"' "$P") ms)" \
  jq -e '.ready == true' "$P"
PID=$(chart_agent_pid)
ck "the agent runs as the container's process (host PID ${PID:-none})" sh -c "test -n '$PID' && test -d /proc/$PID"
if [ -n "$PID" ]; then
  ARGS=$(tr '\0' ' ' < "/proc/$PID/cmdline")
  WANT_ARGS="/usr/local/bin/erdma-agent $(jq -r '.spec.template.spec.containers[0].args | join(" ")' /tmp/agent-ds.json) "
  ck "its command line is the image's entrypoint with the template's args: $ARGS" test "$ARGS" = "$WANT_ARGS"
  ck "NODE_NAME came from the template's fieldRef spec.nodeName ($NODE_NAME_LAB)" \
    sh -c "tr '\0' '\n' < /proc/$PID/environ | grep -qx 'NODE_NAME=$NODE_NAME_LAB'"
  ck "it has its own mount namespace (the image's root), the node's network and PID namespaces (hostNetwork, hostPID)" \
    sh -c "test \"\$(readlink /proc/$PID/ns/mnt)\" != \"\$(readlink /proc/1/ns/mnt)\" && test \"\$(readlink /proc/$PID/ns/net)\" = \"\$(readlink /proc/1/ns/net)\" && test \"\$(readlink /proc/$PID/ns/pid)\" = \"\$(readlink /proc/1/ns/pid)\""
  # CapEff bits: NET_ADMIN 12, NET_RAW 13, SYS_MODULE 16, SYS_CHROOT 18, SYS_PTRACE 19, SYS_ADMIN 21
  CAPS=$(awk '/^CapEff:/ {print $2}' "/proc/$PID/status")
  ck "its effective capabilities hold the template's adds (SYS_MODULE SYS_ADMIN SYS_CHROOT SYS_PTRACE NET_ADMIN) and not the dropped NET_RAW: CapEff $CAPS" \
    sh -c "c=\$((0x$CAPS)); for b in 12 16 18 19 21; do test \$(( (c >> b) & 1 )) = 1 || exit 1; done; test \$(( (c >> 13) & 1 )) = 0"
  # the template's confinement, as the kernel applies it to the agent's process
  SC=/tmp/agent-ds.json
  WANT_SECCOMP=$(jq -r '.spec.template.spec.containers[0].securityContext.seccompProfile.type // "none"' "$SC")
  SECCOMP=$(awk '/^Seccomp:/ {print $2}' "/proc/$PID/status")
  ck "the template's seccompProfile ($WANT_SECCOMP) is in force: Seccomp mode $SECCOMP (2: a filter)" \
    sh -c "test '$WANT_SECCOMP' = RuntimeDefault && test '$SECCOMP' = 2"
  ROOT_OPTS=$(awk '$5 == "/" {print $6}' "/proc/$PID/mountinfo" | tail -n 1)
  ck "the template's readOnlyRootFilesystem ($(jq -r '.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem' "$SC")) is in force: the agent's / is mounted $ROOT_OPTS" \
    sh -c "jq -e '.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem == true' $SC > /dev/null && echo '$ROOT_OPTS' | tr ',' '\n' | grep -qx ro"
  WANT_MEM=$(jq -r '.spec.template.spec.containers[0].resources.limits.memory // ""' "$SC")
  case "$WANT_MEM" in *Mi) WANT_BYTES=$(( ${WANT_MEM%Mi} * 1048576 )) ;; *Gi) WANT_BYTES=$(( ${WANT_MEM%Gi} * 1073741824 )) ;; *) WANT_BYTES="" ;; esac
  CG2=$(sed -n 's/^0:://p' "/proc/$PID/cgroup"); CG1=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}://p' "/proc/$PID/cgroup")
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then MEM=$(cat "/sys/fs/cgroup$CG2/memory.max" 2>/dev/null); else MEM=$(cat "/sys/fs/cgroup/memory$CG1/memory.limit_in_bytes" 2>/dev/null); fi
  ck "the template's memory limit ($WANT_MEM = ${WANT_BYTES:-?} bytes) is the agent's cgroup limit: $MEM" \
    sh -c "test -n '$WANT_BYTES' && test '$MEM' = '$WANT_BYTES'"
  ck "the kubelet's directories are the node's, through the template's hostPath mounts" \
    sh -c "test -S /proc/$PID/root/var/lib/kubelet/device-plugins/kubelet.sock && test -S /proc/$PID/root/var/lib/kubelet/pod-resources/kubelet.sock && test -e /proc/$PID/root/host/dev/infiniband"
fi
HEALTH=$(wget -qO- "http://$NODE_IP_LAB:9101/healthz" 2>/dev/null)
ck "/healthz on the node's address (hostNetwork, the chart's metrics port 9101) answers: $(echo "$HEALTH" | head -c 160)" test -n "$HEALTH"
NDEV=$(jq -r --arg r "$RES" '.resources[$r].devices | length' "$STATE")
ck "the agent registered aliyun/erdma with the chart's 200 slots per device: $NDEV slots" test "$NDEV" = 400
ck "every advertised device path is the node's /dev, not the container's /host/dev" \
  sh -c "! grep -q '/host/dev' $STATE"

PA=$(cpod pod-a 1) || { chart_agent_logs; fail "$SCEN" "pod-a did not start: $(tail -1 /tmp/pod-a.pod.err)"; exit 0; }
PB=$(cpod pod-b 1) || { chart_agent_logs; fail "$SCEN" "pod-b did not start: $(tail -1 /tmp/pod-b.pod.err)"; exit 0; }
jq .allocation "$PA" > /tmp/pod-a.json; jq .allocation "$PB" > /tmp/pod-b.json
A=/tmp/pod-a.json; B=/tmp/pod-b.json
DA=$(ibdevs "$A"); DB=$(ibdevs "$B")
ck "pod-a got one device ($DA), pod-b another ($DB), from the containerized agent" \
  sh -c "test -n '$DA' && test -n '$DB' && test '$DA' != '$DB' && test \$(echo $DA | wc -w) = 1 && test \$(echo $DB | wc -w) = 1"
for p in a b; do
  eval "d=\$D$(echo $p | tr ab AB)"
  seen=$(cx "pod-$p" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  ck "pod-$p's ibv_devices lists only $d: [$seen]" test "$seen" = "$d "
done
cwrite_bw pod-a "$DA" pod-b "$DB" /tmp/chart-bw
ck "ib_write_bw pod-b ($DB) -> pod-a ($DA) exited 0 at both ends (rc $WB_CRC/$WB_SRC) and $DA received $WB_RX packets (at least $WB_NEED); $WB_MBPS MB/s by the wall clock" \
  cwrite_bw_moved
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB"); IPA=$(cpod_ip pod-a)
cx pod-a timeout 300 ibv_rc_pingpong -d "$DA" -g "$GA" -n 200 > /tmp/chart-pp-srv.out 2>&1 &
srv=$!; wait_for 60 cpod_listening pod-a 18515
cx pod-b timeout 300 ibv_rc_pingpong -d "$DB" -g "$GB" -n 200 "$IPA" > /tmp/chart-pp-cli.out 2>&1; crc=$?
wait $srv; src=$?
ck "ibv_rc_pingpong pod-b -> pod-a exited 0 at both ends (rc $crc/$src): $(grep 'iters in' /tmp/chart-pp-cli.out | tail -1)" \
  sh -c "test $crc = 0 && test $src = 0"
echo "REPORT: chart ib_write_bw_MBps=$WB_MBPS agent_ready_ms=$(jq -r '.ready_after_ms // ""' "$P")" >> "$OUT/report.txt"

erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-a > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-b > /dev/null 2>&1
T=$(now)
erdma-fake-kubelet pod delete --dir "$KDIR" --pod "$AGENT_POD" --grace 30 > /tmp/agent-delete.out 2>&1; drc=$?
took=$(awk -v a="$T" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
# the container's log stays in the pod's log directory after the container is removed
chart_agent_logs
ck "deleting the agent pod stopped it within the grace period (rc $drc, $took s), its process is gone" \
  sh -c "test $drc = 0 && ! test -d /proc/${PID:-0}"
ck "the agent stopped cleanly on the kubelet's SIGTERM: its log ends with 'SIGTERM: shutting down' and 'erdma-agent stopped'" \
  sh -c "grep -q 'SIGTERM: shutting down' '$OUT/${SCEN}-agent-container.log' && grep -q 'erdma-agent stopped' '$OUT/${SCEN}-agent-container.log'"
finish
