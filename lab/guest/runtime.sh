# The guest's container runtime and the lab kubelet's pods on it (sourced by dash, after lib.sh).
#
# runtime_up starts containerd (1.7 or 2.1, whichever the initramfs's runtime layer holds:
# lab/runtime.conf, lab/run.sh --runtime) with the configuration for its version
# (runtime/containerd-1.7.toml, config version 2, or runtime/containerd-2.1.toml, version 3: the
# same set-up in each version's plugin names: CRI with CDI, NRI on, runc with NoPivotRoot, CNI),
# runc and the CNI bridge network "lab" (bridge cri0, 10.89.0.0/24: each pod gets its own network
# namespace /var/run/netns/cni-... and an address), and imports the offline image
# lab.local/rdma-tools:1 (busybox, rdma-core tools, the rxe provider). Its binaries come in the
# initramfs's runtime layer (lab/lib/runtime.sh); its configuration from the share, so a changed
# config needs no image rebuild. RT_NAME says which runtime runs (containerd-1.7, containerd-2.1),
# for the scenarios whose checks differ (nri-smcr: NRI v0.8's timeout and split Synchronize).
#
# Pods are run by the lab's kubelet, `erdma-fake-kubelet pod run`, over the real CRI socket:
# Allocate (admission), RunPodSandbox, PreStartContainer, CreateContainer with the Allocate response's
# devices/mounts/envs/CDI names, StartContainer. The helpers below wrap it.
CTRD_SOCK=/run/containerd/containerd.sock
IMAGE=lab.local/rdma-tools:1
RUNTIME_CFG=/mnt/host/guest/runtime
# containerd's log level and log file (runtime_restart changes them): info into the share; debug
# (NRI's split-Synchronize lines) into guest memory, copied to the share when the level goes back
CTRD_LEVEL_FILE=/run/erdma-lab-containerd-level
CTRD_DEBUG_LOG=/var/log/containerd-debug.log

# runtime_name: containerd-MAJOR.MINOR of the containerd in the image ("containerd
# github.com/containerd/containerd/v2 2.1.9+unknown ..." -> containerd-2.1)
runtime_name() { containerd --version | awk '{v = $3; sub(/^v/, "", v); split(v, p, "."); print "containerd-" p[1] "." p[2]}'; }
RT_NAME=$(command -v containerd > /dev/null && runtime_name)
# the systemd cgroup driver and AppArmor node kinds: node_kind_config, the lab kubelet's driver
. /mnt/host/guest/node-kind.sh

# The node kind's cgroup version (lab.cgroup on the kernel command line, lab/nodes.conf; v2
# unless it says v1) and OCI runtime (lab.oci; runc-1.1 unless it says otherwise).
LAB_CGROUP=$(sed -n 's/.*[[:space:]]lab.cgroup=\([^[:space:]]*\).*/\1/p' /proc/cmdline)
[ "$LAB_CGROUP" = v1 ] || LAB_CGROUP=v2
LAB_OCI=$(sed -n 's/.*[[:space:]]lab.oci=\([^[:space:]]*\).*/\1/p' /proc/cmdline)
LAB_OCI=${LAB_OCI:-runc-1.1}
# cgroup_dir CONTROLLER PATH: the directory with CONTROLLER's files of the cgroup PATH (an OCI
# cgroupsPath, /kubepods/...): /sys/fs/cgroup/PATH on v2, /sys/fs/cgroup/CONTROLLER/PATH on v1
# (the systemd driver's SLICE:PREFIX:NAME: its scope's path, node-kind.sh's cgroup_path)
cgroup_dir() { _cg=$(cgroup_path "$2"); if [ "$LAB_CGROUP" = v1 ]; then echo "/sys/fs/cgroup/$1$_cg"; else echo "/sys/fs/cgroup$_cg"; fi; }

# oci_config FILE: containerd's runc runtime (FILE, its config) runs crun when lab.oci=crun
# (BinaryName; crun takes runc's command line). runc stays the binary otherwise.
oci_config() {
  [ "$LAB_OCI" = crun ] || return 0
  command -v crun > /dev/null || { log "lab.oci=crun, but the image has no crun"; return 1; }
  if grep -q 'BinaryName = ' "$1"; then
    sed -i 's#BinaryName = .*#BinaryName = "/usr/local/bin/crun"#' "$1"
  else
    awk '{print} /SystemdCgroup = / {match($0, /^ */); printf "%sBinaryName = \"/usr/local/bin/crun\"\n", substr($0, 1, RLENGTH)}' \
      "$1" > "$1.new" && mv "$1.new" "$1"
  fi
  grep -q 'BinaryName = "/usr/local/bin/crun"' "$1" || { log "$1: no runc options to name crun in"; return 1; }
}

# runtime_up: idempotent; records its timings (runtime-start, runtime-image-import) in
# out/timings.txt. Fails (status 1) with a log line when the runtime is not in the image, has
# no configuration here, or is not the one the host built the image for (share's runtime-name).
runtime_up() {
  ctr version > /dev/null 2>&1 && return 0
  command -v containerd > /dev/null || { log "no container runtime in the guest image (lab_runtime did not run)"; return 1; }
  [ -f "$RUNTIME_CFG/$RT_NAME.toml" ] \
    || { log "no configuration for $RT_NAME ($(containerd --version)) in $RUNTIME_CFG"; return 1; }
  _want=$(cat /mnt/host/guest/runtime-name 2>/dev/null)
  [ -z "$_want" ] || [ "$_want" = "$RT_NAME" ] \
    || { log "the image's runtime is $RT_NAME ($(containerd --version)), the host asked for $_want"; return 1; }
  _rt=$(now)
  modprobe overlay || log "modprobe overlay failed"
  # cgroup v2 (mounted by /init): the controllers runc sets up for containers; the device
  # "controller" of v2 is an eBPF program runc attaches to each container's cgroup. On v1 each
  # controller is its own hierarchy (/init mounts them), devices among them: nothing to enable.
  if [ "$LAB_CGROUP" = v2 ]; then
    echo "+cpu +memory +pids +rdma" > /sys/fs/cgroup/cgroup.subtree_control || log "cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.controllers)"
  fi
  mkdir -p /var/lib/containerd /etc/containerd /etc/cni/net.d /opt/cni/bin /var/run/cdi /etc/cdi /var/log/pods /var/run/netns
  # overlayfs cannot use the initramfs (rootfs) as its upper layer's file system
  grep -q " /var/lib/containerd " /proc/mounts || mount -t tmpfs tmpfs /var/lib/containerd
  [ -e /etc/resolv.conf ] || : > /etc/resolv.conf
  cp "$RUNTIME_CFG/$RT_NAME.toml" /etc/containerd/config.toml
  oci_config /etc/containerd/config.toml || return 1
  node_kind_config /etc/containerd/config.toml || return 1
  cp "$RUNTIME_CFG/10-lab.conflist" /etc/cni/net.d/
  runtime_start info || return 1
  echo "runtime-start $(awk -v a="$_rt" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
  log "runtime: $RT_NAME: $(containerd --version | cut -d' ' -f1-3), $(runc --version | head -1), cgroup $LAB_CGROUP"
  case "$LAB_OCI" in
    runc-*) runc --version | head -1 | grep -q "version ${LAB_OCI#runc-}\." \
      || { log "the node kind asks for $LAB_OCI, the image has $(runc --version | head -1)"; return 1; } ;;
    crun) log "runtime: containerd runs $(crun --version | head -1)" ;;
  esac
  _rt=$(now)
  ctr -n k8s.io images import /var/lib/erdma-lab/rdma-tools.oci.tar > /tmp/import.out 2>&1 \
    || { log "image import failed:"; cat /tmp/import.out; return 1; }
  echo "runtime-image-import $(awk -v a="$_rt" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
  log "runtime: images $(ctr -n k8s.io images ls -q | tr '\n' ' ')"
}

# runtime_start LEVEL: starts containerd with the installed config, logging at LEVEL (info: to
# out/containerd.log, appended; debug: to $CTRD_DEBUG_LOG in guest memory, since a write to the
# share is a round trip to the host's qemu); waits until it answers.
runtime_start() {
  _log="$OUT/containerd.log"; [ "$1" = debug ] && _log=$CTRD_DEBUG_LOG
  # containers inherit containerd's RLIMIT_MEMLOCK (the CRI sets none): 8 MiB, the kernel's
  # default since 5.16 and a common distribution default, set here so that it does not depend on
  # the kernel (the nri scenario shows a non-root container's ibv_reg_mr failing with it)
  ulimit -l 8192
  # its own session: the scenario sessions are killed when a scenario ends, the runtime stays
  setsid containerd --config /etc/containerd/config.toml --log-level "$1" >> "$_log" 2>&1 < /dev/null &
  echo "$1" > "$CTRD_LEVEL_FILE"
  wait_for 60 ctr version || { log "containerd did not answer in 60 s:"; tail -20 "$_log"; return 1; }
}

# runtime_restart LEVEL: containerd stopped and started again at log level LEVEL (info or debug),
# when it runs at another level. The pods stay (their shims run on; the state is on tmpfs). Going
# back from debug copies the debug log to out/containerd-debug.log.
runtime_restart() {
  [ "$(cat "$CTRD_LEVEL_FILE" 2>/dev/null)" = "$1" ] && return 0
  _pid=$(pidof containerd)
  [ -n "$_pid" ] && kill "$_pid"
  wait_for 30 sh -c "! pidof containerd" || { log "containerd (pid $_pid) did not stop in 30 s"; return 1; }
  [ "$1" = debug ] || { [ -f "$CTRD_DEBUG_LOG" ] && cp "$CTRD_DEBUG_LOG" "$OUT/containerd-debug.log"; }
  runtime_start "$1" && log "runtime: containerd restarted at log level $1"
}

# runtime_clean: deletes every pod the lab kubelet recorded in $KDIR (between scenarios)
runtime_clean() {
  [ -d "$KDIR/pods" ] || return 0
  erdma-fake-kubelet pod delete --dir "$KDIR" --all > /dev/null 2> /tmp/clean.err || { log "pod cleanup failed:"; cat /tmp/clean.err; }
}

# cpod NAME COUNT [pod run flags...] [-- CMD...]: runs pod lab/NAME with COUNT slots of $RES
# (0: none); the record (JSON) goes to /tmp/NAME.pod.json, its path is printed. The container
# runs the image's command (sleep) unless CMD is given.
cpod() {
  _n=$1; _c=$2; shift 2
  erdma-fake-kubelet pod run --dir "$KDIR" --pod "lab/$_n" --resource "$RES" --count "$_c" "$@" \
    > "/tmp/$_n.pod.json" 2> "/tmp/$_n.pod.err" || { cat "/tmp/$_n.pod.err" >&2; return 1; }
  echo "/tmp/$_n.pod.json"
}
# cx NAME CMD...: runs CMD in pod lab/NAME's container (CRI ExecSync); its output and exit code
cx() { _n=$1; shift; erdma-fake-kubelet pod exec --dir "$KDIR" --pod "lab/$_n" -- "$@"; }
# cpod_ip NAME / cpod_netns NAME: the pod's address and network namespace (from the runtime)
cpod_ip() { jq -r '.ip // empty' "/tmp/$1.pod.json"; }
cpod_netns() { jq -r '.netns // empty' "/tmp/$1.pod.json"; }
# cpod_listening NAME PORT: a TCP listener on PORT in the pod's network namespace
cpod_listening() { nsenter --net="$(cpod_netns "$1")" ss -Hltn | grep -q ":$2 "; }
# cpod_state NAME: the container's state as the runtime reports it (CONTAINER_RUNNING, ...)
cpod_state() { erdma-fake-kubelet pod status --dir "$KDIR" --pod "lab/$1" | jq -r .state; }
# dev_of UVERBS: "MAJOR MINOR" of /dev/infiniband/UVERBS
dev_of() { tr ':' ' ' < "/sys/class/infiniband_verbs/$1/dev"; }
# cwrite_bw SRV_POD SRV_DEV CLI_POD CLI_DEV OUT: ib_write_bw, 1000 RDMA WRITEs of 64 KiB from
# CLI_DEV in CLI_POD's container to SRV_DEV in SRV_POD's container; the tool's output goes to
# OUT-cli.out and OUT-srv.out. Sets WB_CRC and WB_SRC (exit codes at each end), WB_PERF (the
# tool's average, MB/s), WB_RX (packets SRV_DEV received meanwhile), WB_SECS (the client's wall
# time) and WB_MBPS (1000 x 64 KiB over that wall time, connection set-up included).
# perftest times with the TSC, which under TCG is not to be trusted: once it printed 0.00 MB/s
# for a run that exited 0 at both ends. The proof that the bytes crossed is the receiving
# device's own counter (cwrite_bw_moved), the bandwidth figure comes from the wall clock.
# ib_write_bw -u 20: a 4 s QP ack timeout (4 us x 2^20) instead of 67 ms. Under TCG on a loaded
# machine an ack can take longer than 67 ms; rxe then retransmits mid-message and may answer the
# duplicate with a NAK (status 9, remote invalid request), failing a run that would have worked.
# The 300 s timeouts only guard against a hang: on a 2-core machine loaded by other builds the
# 64 MB of ib_write_bw took over 60 s (about 1 MB/s under TCG at load average 12).
cwrite_bw() {
  _sp=$1; _sd=$2; _cp=$3; _cd=$4; _o=$5
  _rx0=$(rx_pkts "$_sd")
  cx "$_sp" timeout 300 ib_write_bw -d "$_sd" -x "$(gid_v4 "$_sd")" -F -u 20 -n 1000 > "$_o-srv.out" 2>&1 &
  _srv=$!
  wait_for 60 cpod_listening "$_sp" 18515
  _t0=$(now)
  cx "$_cp" timeout 300 ib_write_bw -d "$_cd" -x "$(gid_v4 "$_cd")" -F -u 20 -n 1000 "$(cpod_ip "$_sp")" \
    > "$_o-cli.out" 2>&1; WB_CRC=$?
  _t1=$(now)
  wait $_srv; WB_SRC=$?
  _rx1=$(rx_pkts "$_sd")
  # -1 when either counter could not be read: never a pass
  case "$_rx0:$_rx1" in *[!0-9:]*|:*|*:) WB_RX=-1 ;; *) WB_RX=$((_rx1 - _rx0)) ;; esac
  # the packets 1000 x 64 KiB take at the port's active MTU (4096, RoCE's largest, if unknown)
  _mtu=$(ibv_devinfo -d "$_sd" 2>/dev/null | awk '/active_mtu/ {print $2; exit}')
  case "$_mtu" in ''|*[!0-9]*) _mtu=4096 ;; esac
  WB_NEED=$((65536000 / _mtu))
  WB_PERF=$(awk '/^ *65536 / {print $4}' "$_o-cli.out" | tail -1)
  WB_SECS=$(awk -v a="$_t0" -v b="$_t1" 'BEGIN { printf "%.2f", b - a }')
  # the wall-clock bandwidth only for a run that moved its bytes
  if cwrite_bw_moved; then
    WB_MBPS=$(awk -v s="$WB_SECS" 'BEGIN { if (s > 0) printf "%.2f", 1000 * 65536 / 1e6 / s; else print 0 }')
  else
    WB_MBPS=0
  fi
}
# rx_pkts IBDEV: rcvd_pkts of port 1 (rxe's hardware counter), empty when unreadable
rx_pkts() { rdma -j statistic show link "$1/1" 2>/dev/null | jq -r '.[0].rcvd_pkts // empty' 2>/dev/null; }
# cwrite_bw_moved: the last cwrite_bw exited 0 at both ends and the receiving device took in at
# least the packets 1000 x 64 KiB need at the port's active MTU (WB_NEED: 64000 at rxe's 1024).
cwrite_bw_moved() { test "$WB_CRC" = 0 && test "$WB_SRC" = 0 && test "$WB_RX" -ge "$WB_NEED"; }

# --- the chart's agent pod ---------------------------------------------------------------------
# The agent as operators deploy it: the DaemonSet the chart renders for the lab's values
# (out of the share: chart/lab.json, from deploy/helm/ci/values/lab.yaml by the real Helm engine),
# from the image scripts/build-images.sh built (images/erdma-agent.oci.tar), run by the lab kubelet
# from the pod template as a kubelet would (`pod run --manifest`: image, args, env with fieldRefs,
# hostPath volumes with their type checks, mounts and propagation, capabilities, host network and
# PID namespaces, the readiness probe).
CHART=/mnt/host/chart/lab.json
IMAGES=/mnt/host/images
AGENT_POD=kube-system/alibabacloud-erdma-agent-lab
NODE_NAME_LAB=lab-node
NODE_IP_LAB=10.77.0.1
# chart_node: what a kubelet's node has and the initramfs lacks: bpffs at /sys/fs/bpf (systemd
# mounts it) and a shared root mount (systemd makes / shared, so that HostToContainer mounts
# receive later mounts, as the agent's view of /var/run/netns needs). Idempotent.
chart_node() {
  grep -q " /sys/fs/bpf bpf " /proc/mounts || mount -t bpf bpf /sys/fs/bpf
  mount --make-rshared /
}
# chart_agent_up: imports the agent image, runs the chart's agent pod and waits until the lab
# kubelet lists the agent's devices. The pod's record: /tmp/agent.pod.json (its errors:
# /tmp/agent.pod.err); sets AGENT_IMAGE (the chart's image reference) and AGENT_CID.
chart_agent_up() {
  [ -f "$CHART" ] || { log "no rendered chart in the share (lab_images did not run)"; return 1; }
  chart_node
  jq '.objects[] | select(.kind == "DaemonSet")' "$CHART" > /tmp/agent-ds.json
  AGENT_IMAGE=$(jq -r '.spec.template.spec.containers[0].image' /tmp/agent-ds.json)
  _t=$(now)
  import_image erdma-agent || return 1
  echo "agent-image-import $(awk -v a="$_t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
  erdma-fake-kubelet pod run --dir "$KDIR" --pod "$AGENT_POD" --manifest /tmp/agent-ds.json \
    --node-name "$NODE_NAME_LAB" --node-ip "$NODE_IP_LAB" > /tmp/agent.pod.json 2> /tmp/agent.pod.err \
    || { log "the chart's agent pod did not become ready:"; tail -5 /tmp/agent.pod.err; chart_agent_logs; return 1; }
  AGENT_CID=$(jq -r .container_id /tmp/agent.pod.json)
  echo "agent-pod-ready $(jq -r '(.ready_after_ms // 0) / 1000' /tmp/agent.pod.json)" >> "$OUT/timings.txt"
  wait_for 60 registered || { log "the agent pod is ready but did not register"; chart_agent_logs; return 1; }
}
# chart_agent_pid: the host PID of the agent container's process (hostPID: the node's PID space).
chart_agent_pid() { ctr_pid "$AGENT_CID"; }
# chart_agent_logs: the agent container's log into out/ (the container's name as the chart
# renders it: the original's alibabacloud-erdma-controller)
chart_agent_logs() {
  _c=$(jq -r '.spec.template.spec.containers[0].name' /tmp/agent-ds.json 2> /dev/null)
  pod_log "$AGENT_POD" "${_c:-alibabacloud-erdma-controller}" "$OUT/${SCEN}-agent-container.log"
}
# import_image NAME: imports the image build-images.sh built (IMAGES/NAME.oci.tar) into containerd
import_image() {
  ctr -n k8s.io images import "$IMAGES/$1.oci.tar" > "/tmp/import-$1.out" 2>&1 \
    || { log "image import of $1 failed:"; cat "/tmp/import-$1.out"; return 1; }
}
# ctr_pid CONTAINER_ID: the host PID of a container's process
ctr_pid() { ctr -n k8s.io tasks ls | awk -v c="$1" '$1 == c {print $2}'; }
# pod_log NS/NAME CONTAINER DEST: copies the container's CRI log (which stays in the pod's log
# directory after the container is removed) to DEST
pod_log() {
  for f in /var/log/pods/"${1%%/*}_${1#*/}"_*/"$2"/0.log; do
    [ -f "$f" ] && cp "$f" "$3"
  done
  return 0
}
