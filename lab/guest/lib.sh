# Guest helpers for the lab scenarios (sourced by dash).
#
# The VM is one Kubernetes "node":
#   eth0 (NUMA node 0, 10.77.0.1) and eth1 (NUMA node 1, 10.77.0.2): two virtio NICs behind
#   PCI expander buses, on one qemu hub; rxe0 on eth0, rxe1 on eth1, both in the init netns.
#   Policy routing sends 10.77.0.1 <-> 10.77.0.2 over the wire instead of the local loopback,
#   so rxe0 and rxe1 really exchange RoCEv2 packets (two NICs of one host cabled to one switch).
#   cni0: a bridge, 10.88.0.1/24, where pods' veths plug in (pod IPs 10.88.0.11...).
# The agent and the fake kubelet run in the init netns (the fake kubelet also serves the
# pod-resources API, which the agent reads to count slots in use). Pods are containers on the
# guest's containerd, run by the fake kubelet over CRI (runtime.sh); the numa scenario still
# uses erdma-labpod processes (`pod` below).
OUT=/mnt/host/out
# where the daemons log: $OUT (the host share) unless a scenario keeps them in guest memory
LOGS=${LOGS:-$OUT}
KDIR=/var/lib/kubelet/device-plugins
STATE=$KDIR/fake-kubelet-state.json
RES=aliyun/erdma
SCEN=${SCEN:-lab}

now() { cut -d' ' -f1 /proc/uptime; }
log() { echo "[$(now)] $*"; }
result() { echo "$*"; echo "$*" >> "$OUT/results.txt"; }
pass() { result "PASS: $1"; }
fail() { result "FAIL: $1 ($2)"; }
skip() { result "SKIP: $1 ($2)"; }

# checks: ck DESCRIPTION CMD... runs CMD, records the description when it fails
FAILED=""
ck() {
  _d=$1; shift
  if "$@" > /tmp/ck.out 2>&1; then echo "  ok    $_d"
  else echo "  FAIL  $_d"; sed 's/^/        | /' /tmp/ck.out | tail -8; FAILED="${FAILED:+$FAILED; }$_d"; fi
}
# note DESCRIPTION: a failed check without a command (for conditions computed in shell)
bad() { echo "  FAIL  $1"; FAILED="${FAILED:+$FAILED; }$1"; }
good() { echo "  ok    $1"; }
finish() { if [ -z "$FAILED" ]; then pass "$SCEN"; else fail "$SCEN" "$FAILED"; fi; }

# wait_for SECONDS CMD...: poll CMD every 0.1 s
wait_for() {
  _t=$(( $1 * 10 )); shift
  while [ $_t -gt 0 ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; _t=$((_t - 1)); done
  return 1
}

# need BIN [FLAG]: SKIP the scenario when BIN (or its FLAG) is not built yet
need() {
  if ! command -v "$1" >/dev/null 2>&1; then skip "$SCEN" "$1 not built yet"; exit 0; fi
  if [ -n "${2:-}" ] && ! "$1" --help 2>&1 | grep -q -- "$2"; then
    skip "$SCEN" "$1 not built yet (no $2 flag)"; exit 0
  fi
}

# --- the node ---------------------------------------------------------------------------
node_up() {
  for m in virtio_net rdma_rxe ib_uverbs rdma_ucm ib_umad veth bridge; do modprobe $m || log "modprobe $m failed"; done
  # stable names: eth0 = the NIC with MAC ..:01 (NUMA node 0), eth1 = ..:02 (NUMA node 1)
  for d in /sys/class/net/eth*; do
    case $(cat "$d/address") in *:01) ip link set "${d##*/}" name lab0 ;; *:02) ip link set "${d##*/}" name lab1 ;; esac
  done
  ip link set lab0 name eth0; ip link set lab1 name eth1
  ip addr add 10.77.0.1/24 dev eth0; ip addr add 10.77.0.2/24 dev eth1
  for i in all default eth0 eth1; do
    sysctl -qw net.ipv4.conf.$i.accept_local=1 net.ipv4.conf.$i.rp_filter=0 \
      net.ipv4.conf.$i.arp_ignore=1 net.ipv4.conf.$i.arp_announce=2
  done
  ip link set eth0 up; ip link set eth1 up
  ip rule add pref 10 iif lo from 10.77.0.1 to 10.77.0.2 lookup 101
  ip rule add pref 11 iif lo from 10.77.0.2 to 10.77.0.1 lookup 102
  ip route add 10.77.0.2 dev eth0 src 10.77.0.1 table 101
  ip route add 10.77.0.1 dev eth1 src 10.77.0.2 table 102
  ip rule add pref 1000 lookup local; ip rule del pref 0
  rdma link add rxe0 type rxe netdev eth0; rdma link add rxe1 type rxe netdev eth1
  ip link add cni0 type bridge; ip addr add 10.88.0.1/24 dev cni0; ip link set cni0 up
  sysctl -qw net.ipv4.ip_forward=1
  wait_for 10 port_active rxe0; wait_for 10 port_active rxe1
  log "node: $(rdma link show | tr '\n' ';')"
}
port_active() { [ "$(cat /sys/class/infiniband/$1/ports/1/state 2>/dev/null)" = "4: ACTIVE" ]; }
# uverbs_of IBDEV: the uverbsN name of an RDMA device
uverbs_of() {
  for f in /sys/class/infiniband_verbs/uverbs*/ibdev; do
    [ "$(cat "$f")" = "$1" ] && { _u=${f%/ibdev}; echo "${_u##*/}"; return 0; }
  done
  return 1
}
# gid_v4 IBDEV: index of the RoCEv2 GID holding the IPv4 address of port 1
gid_v4() {
  _i=0
  while [ $_i -lt 16 ]; do
    read -r _g < /sys/class/infiniband/$1/ports/1/gids/$_i 2>/dev/null || _g=
    case "$_g" in 0000:0000:0000:0000:0000:ffff:*) echo $_i; return 0 ;; esac
    _i=$((_i + 1))
  done
  echo 1
}
numa_of_netdev() { cat "$(readlink -f /sys/class/net/$1/device)/../numa_node"; }

# --- kubelet, agent, pods ---------------------------------------------------------------
PODRES=/var/lib/kubelet/pod-resources/kubelet.sock
start_kubelet() {
  rm -rf "$KDIR" "${PODRES%/*}"; mkdir -p "$KDIR" "${PODRES%/*}"
  erdma-fake-kubelet run --dir "$KDIR" --pod-resources-socket "$PODRES" > "$LOGS/$SCEN-kubelet.log" 2>&1 &
  KUBELET_PID=$!
  wait_for 20 test -S "$KDIR/kubelet.sock" || { log "fake kubelet did not create kubelet.sock"; return 1; }
}
# start_agent [EXTRA FLAGS]: the agent serving rxe devices; waits for its registration
start_agent() {
  erdma-agent --kubelet-dir "$KDIR" --pod-resources-socket "$PODRES" --resource-name "$RES" --rdma-driver rxe \
    --prefer-driver none --local-eri-discovery --instance-id i-lab --metrics-addr 127.0.0.1:9464 "$@" > "$LOGS/$SCEN-agent.log" 2>&1 &
  AGENT_PID=$!
  wait_for 30 registered || { log "agent did not register; its log:"; tail -20 "$LOGS/$SCEN-agent.log"; return 1; }
}
registered() { jq -e --arg r "$RES" '.resources[$r].devices | length > 0' "$STATE"; }
stop_daemons() {
  for p in ${AGENT_PID:-} ${KUBELET_PID:-}; do kill "$p" 2>/dev/null; done
  for p in ${AGENT_PID:-} ${KUBELET_PID:-}; do wait "$p" 2>/dev/null; done
  AGENT_PID=; KUBELET_PID=
}
# alloc POD COUNT: Allocate through the fake kubelet; prints the response path
alloc() {
  erdma-fake-kubelet allocate --dir "$KDIR" --resource "$RES" --count "$2" --pod "lab/$1" -o json > "/tmp/$1.json" \
    2> "/tmp/$1.alloc.err" || { cat "/tmp/$1.alloc.err" >&2; return 1; }
  echo "/tmp/$1.json"
}
# pod_net NAME IP: a pod network namespace with a veth on cni0
pod_net() {
  ip netns add "$1"
  ip link add "v-$1" type veth peer name eth0 netns "$1"
  ip link set "v-$1" master cni0 up
  ip -n "$1" addr add "$2/24" dev eth0; ip -n "$1" link set eth0 up; ip -n "$1" link set lo up
  ip -n "$1" route add default via 10.88.0.1
}
# pod NAME ALLOC|- CMD...: run CMD in pod NAME (its netns) with the allocation (or none)
pod() {
  _n=$1; _a=$2; shift 2
  if [ "$_a" = - ]; then erdma-labpod run --name "$_n" --netns "$_n" -- "$@"
  else erdma-labpod run --name "$_n" --netns "$_n" --alloc "$_a" -- "$@"; fi
}
# ids ALLOC: the device IDs of an allocation, space separated; ibdevs ALLOC: their devices
ids() { jq -r '.device_ids | join(" ")' "$1"; }
ibdevs() { jq -r '[.device_ids[] | split("/")[0]] | unique | join(" ")' "$1"; }
# ipv4_of IBDEV: the IPv4 address of the RDMA device's netdev
ipv4_of() { ip -4 -o addr show dev "$(cat /sys/class/infiniband/$1/parent)" | awk '{split($4, a, "/"); print a[1]; exit}'; }
. /mnt/host/guest/runtime.sh
