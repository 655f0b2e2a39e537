# The guest side of the node kinds with the systemd cgroup driver or AppArmor (lab/nodes.conf;
# the kind comes on the kernel command line: lab.cgroup_driver, lab.lsm). Sourced by runtime.sh.
# Absent options mean today's node: the cgroupfs driver, no LSM.
node_opt() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" /proc/cmdline; }
NODE_CGROUP_DRIVER=$(node_opt lab.cgroup_driver); NODE_CGROUP_DRIVER=${NODE_CGROUP_DRIVER:-cgroupfs}
NODE_LSM=$(node_opt lab.lsm); NODE_LSM=${NODE_LSM:-none}
# The lab kubelet names pod cgroups as a kubelet with the node's driver does (`pod run
# --cgroup-driver`: /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID_>.slice).
export ERDMA_FAKE_KUBELET_CGROUP_DRIVER="$NODE_CGROUP_DRIVER"

# node_kind_config FILE: containerd's configuration FILE (installed) made the kind's: runc's
# systemd cgroup driver (SystemdCgroup = true; runc reaches systemd over its private socket
# /run/systemd/private, as root does without a D-Bus daemon), and containerd's default AppArmor
# profile for unprivileged containers (disable_apparmor = false: containerd loads
# cri-containerd.apparmor.d with apparmor_parser and runc applies it). Fails (status 1) with a log
# line when the node cannot be that kind.
node_kind_config() {
  if [ "$NODE_CGROUP_DRIVER" = systemd ]; then
    [ "$(cat /proc/1/comm)" = systemd ] \
      || { log "lab.cgroup_driver=systemd, but PID 1 is $(cat /proc/1/comm), not systemd"; return 1; }
    sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' "$1"
    grep -q 'SystemdCgroup = true' "$1" || { log "$1 has no SystemdCgroup option to turn on"; return 1; }
    log "node: systemd $(systemctl --version | head -1 | cut -d' ' -f2) is PID 1; containerd with SystemdCgroup = true"
  fi
  if [ "$NODE_LSM" = apparmor ]; then
    grep -q " /sys/kernel/security securityfs " /proc/mounts || mount -t securityfs securityfs /sys/kernel/security
    [ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" = Y ] \
      || { log "lab.lsm=apparmor, but AppArmor is not enabled (boot with apparmor=1 security=apparmor); LSMs: $(cat /sys/kernel/security/lsm 2>/dev/null)"; return 1; }
    command -v apparmor_parser > /dev/null || { log "lab.lsm=apparmor, but the image has no apparmor_parser"; return 1; }
    sed -i 's/disable_apparmor = true/disable_apparmor = false/' "$1"
    grep -q 'disable_apparmor = false' "$1" || { log "$1 has no disable_apparmor option to turn off"; return 1; }
    log "node: AppArmor enabled (LSMs $(cat /sys/kernel/security/lsm)); containerd applies its default profile"
  fi
  return 0
}

# node_kind_checks NAME: what the kind changes for pod NAME's container (its record
# /tmp/NAME.pod.json, a BestEffort pod of cpod), as ck checks; nothing on today's node.
# systemd: the container's cgroup is runc's transient unit cri-containerd-<id>.scope in the pod's
# slice, and systemd has it active. apparmor: the container's process is confined by containerd's
# default profile in enforce mode.
node_kind_checks() {
  _cid=$(jq -r .container_id "/tmp/$1.pod.json"); _uid=$(jq -r .uid "/tmp/$1.pod.json")
  _pid=$(ctr_pid "$_cid")
  if [ "$NODE_CGROUP_DRIVER" = systemd ]; then
    _want="0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod$(echo "$_uid" | tr - _).slice/cri-containerd-$_cid.scope"
    ck "$1's container cgroup is its systemd scope in the pod's slice: $(cat "/proc/$_pid/cgroup")" \
      test "$(cat "/proc/$_pid/cgroup")" = "$_want"
    ck "systemd has $1's scope active (cri-containerd-$_cid.scope)" systemctl is-active "cri-containerd-$_cid.scope"
  fi
  if [ "$NODE_LSM" = apparmor ]; then
    ck "$1's container is confined, enforcing: $(cat "/proc/$_pid/attr/current")" \
      test "$(cat "/proc/$_pid/attr/current")" = "cri-containerd.apparmor.d (enforce)"
  fi
  return 0
}

# cgroup_path CGROUPS_PATH: the cgroup an OCI spec's cgroupsPath names, as /proc/<pid>/cgroup
# shows it. A path (the cgroupfs driver) is itself; the systemd driver's SLICE:PREFIX:NAME is the
# scope PREFIX-NAME.scope in SLICE, and a slice's path nests every dash-separated prefix of its
# name (kubepods-besteffort-pod<UID_>.slice is /kubepods.slice/kubepods-besteffort.slice/...).
cgroup_path() {
  case "$1" in
    *:*:*)
      _slice=${1%%:*}; _rest=${1#*:}; _p=""; _acc=""
      for _part in $(echo "${_slice%.slice}" | tr - ' '); do _acc="${_acc:+$_acc-}$_part"; _p="$_p/$_acc.slice"; done
      echo "$_p/${_rest%%:*}-${_rest#*:}.scope" ;;
    *) echo "$1" ;;
  esac
}
# pod_cgroup_mark UID: what the cgroup path of pod UID's containers holds of the UID, by the node's
# driver: /pod<UID>/ (cgroupfs), -pod<UID with _ for ->.slice/ (systemd)
pod_cgroup_mark() {
  if [ "$NODE_CGROUP_DRIVER" = systemd ]; then echo "-pod$(echo "$1" | tr - _).slice/"; else echo "/pod$1/"; fi
}
