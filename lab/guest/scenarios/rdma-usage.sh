#!/bin/sh
# rdma-usage: per-pod RDMA usage (issue 32) end to end, checked against the kernel's own account.
# The agent (--rdma-usage, on by default) serves GET /usage on its metrics address; `erdmactl top`
# reads it. pod-a and pod-b hold one slot of aliyun/erdma each (--slots-per-device 1: rxe0 and
# rxe1) and run ib_write_bw between them (server in pod-a, client in pod-b, --run_infinitely,
# bidirectional -b: each end WRITEs, so both QPs are in RTS; one-way, the target's stays in RTR).
# While it runs:
# - `erdmactl top pods -o json` lists both pods, each with its allocated device, >= 1 QP in RTS and
#   MR bytes > 0, and its QPs (total and per state), MRs, MR bytes, CQs and PDs per device EQUAL
#   what `rdma -j resource show qp|mr|cq|pd` says for the PIDs of that pod's processes. Those PIDs
#   are mapped to pods here without the agent's parser: a PID belongs to a pod when its
#   /proc/<pid>/cgroup is the container's cgroup the runtime made (`ctr containers info`:
#   the OCI spec's cgroupsPath, which names the pod UID from the lab kubelet's record). The kernel
#   is read before and after the agent; both must agree (else read again, 3 times at most).
# - `erdmactl top devices -o json --interval 3s` (two samples; the agent reuses a result for 2 s)
#   shows tx and rx rates > 0 on both devices: bytes per second where the driver counts bytes
#   (rxe on 7.3: sent_bytes/rcvd_bytes; then txBytes/rxBytes must be the kernel's, between its
#   reads before and after), else packets per second (and txBytes must be absent, as the
#   kernel has no byte counter either). Every raw
#   counter top prints lies within the kernel's own figures read just before and just after it
#   (`rdma -j statistic` and sysfs hw_counters), and the packet counters grew on both sides.
# After the pods are deleted, `top pods` lists no QP of theirs (polled up to 20 s), then neither
# pod nor either as a device's holder (25 s: the agent's pod-resources view is refreshed every
# 10 s), and `rdma resource show qp` holds none of their PIDs.
# Figures: out/rdma-usage.txt (and the JSON answers in out/rdma-usage-*.json).
# Would fail if: the agent did not attribute a pod's processes to its pod (cgroup parsing, the
# lab kubelet's pod cgroups), mis-named a pod (the runtime's sandbox list), counted a QP, MR, CQ
# or PD of another process or missed one, lost the QP state, summed MR bytes wrongly, put a
# pod's objects on the wrong device, read port counters from the wrong device or not at all,
# showed no byte rate where the kernel counts bytes (as before rxe's sent_bytes was read), or kept
# a deleted pod's QPs, or the pod, in its answer.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --rdma-usage; need erdmactl
erdmactl top --help > /dev/null 2>&1 || { skip "$SCEN" "erdmactl has no top command yet"; exit 0; }
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
F="$OUT/rdma-usage.txt"; : > "$F"
fig() { echo "$*" >> "$F"; echo "  $*"; }
# within SECONDS CMD...: poll CMD until it succeeds, for SECONDS of wall time (lib.sh's wait_for
# counts 0.1 s sleeps, and a poll here runs rdma and jq, which take seconds under TCG)
within() {
  _end=$(awk -v n="$(now)" -v s="$1" 'BEGIN {print n + s}'); shift
  while :; do
    "$@" > /dev/null 2>&1 && return 0
    awk -v n="$(now)" -v e="$_end" 'BEGIN {exit !(n >= e)}' && return 1
    sleep 0.5
  done
}
# tools: the ib_write_bw outputs so far (for a failure's message and out/)
tools() {
  cp /tmp/rdu-srv.out "$OUT/rdma-usage-ib_write_bw-srv.out" 2> /dev/null
  cp /tmp/rdu-cli.out "$OUT/rdma-usage-ib_write_bw-cli.out" 2> /dev/null
  echo "server: $(tail -3 /tmp/rdu-srv.out 2> /dev/null | tr '\n' ' '); client: $(tail -3 /tmp/rdu-cli.out 2> /dev/null | tr '\n' ' ')"
}
ADDR=127.0.0.1:9464
top_pods() { erdmactl top pods --agent-addr "$ADDR" -o json; }

start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 1 || { fail "$SCEN" "the agent did not register"; exit 0; }
for p in pod-a pod-b; do
  cpod $p 1 > /dev/null || { fail "$SCEN" "$p did not start: $(tail -1 /tmp/$p.pod.err)"; exit 0; }
done
DA=$(jq -r '.allocation.device_ids[0] | split("/")[0]' /tmp/pod-a.pod.json)
DB=$(jq -r '.allocation.device_ids[0] | split("/")[0]' /tmp/pod-b.pod.json)
fig "pods: lab/pod-a on $DA (uid $(jq -r .uid /tmp/pod-a.pod.json)), lab/pod-b on $DB (uid $(jq -r .uid /tmp/pod-b.pod.json))"
[ -n "$DA" ] && [ -n "$DB" ] && [ "$DA" != "$DB" ] || { fail "$SCEN" "the pods did not get one distinct device each: pod-a '$DA', pod-b '$DB'"; exit 0; }

# cgroup_of NAME: the container's cgroup path as the runtime made it (the OCI spec's cgroupsPath;
# the systemd driver's SLICE:PREFIX:NAME as the path of its scope, node-kind.sh's cgroup_path)
cgroup_of() { cgroup_path "$(ctr -n k8s.io containers info "$(jq -r .container_id "/tmp/$1.pod.json")" | jq -r .Spec.linux.cgroupsPath)"; }
CGA=$(cgroup_of pod-a); CGB=$(cgroup_of pod-b)
fig "container cgroups (OCI spec): pod-a $CGA, pod-b $CGB"
ck "the containers' cgroups are the kubelet's pod cgroups (/kubepods/.../pod<UID>/<container id>; systemd: .../kubepods-besteffort-pod<UID_>.slice/cri-containerd-<id>.scope)" \
  sh -c "echo '$CGA' | grep -qF -- '$(pod_cgroup_mark "$(jq -r .uid /tmp/pod-a.pod.json)")' && echo '$CGB' | grep -qF -- '$(pod_cgroup_mark "$(jq -r .uid /tmp/pod-b.pod.json)")'"

# --- ib_write_bw between the pods, running until the pods end --------------------------------
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB")
cx pod-a ib_write_bw -d "$DA" -x "$GA" -F -u 20 -b --run_infinitely -D 5 > /tmp/rdu-srv.out 2>&1 &
SRV=$!
within 90 cpod_listening pod-a 18515 || { fail "$SCEN" "ib_write_bw's server in pod-a did not listen on 18515 in 90 s ($(tools))"; exit 0; }
cx pod-b ib_write_bw -d "$DB" -x "$GB" -F -u 20 -b --run_infinitely -D 5 "$(cpod_ip pod-a)" > /tmp/rdu-cli.out 2>&1 &
CLI=$!

# kernel: the kernel's objects (rdma -j resource show KIND for qp mr cq pd) in /tmp/rdu-K.KIND,
# and /tmp/rdu-K.pids: "PID POD" for every owner PID in a pod's container cgroup
kernel() {
  for k in qp mr cq pd; do rdma -j resource show $k 2> /dev/null | jq -s 'flatten(1)' > "/tmp/rdu-$1.$k" || echo '[]' > "/tmp/rdu-$1.$k"; done
  : > "/tmp/rdu-$1.pids"
  for pid in $(jq -r '.[].pid // empty' /tmp/rdu-$1.qp /tmp/rdu-$1.mr /tmp/rdu-$1.cq /tmp/rdu-$1.pd | sort -un); do
    # v2: the "0::PATH" line; v1: the rdma hierarchy's "N:rdma:PATH"
    if [ "$LAB_CGROUP" = v1 ]; then cg=$(sed -n 's/^[0-9]*:rdma://p' "/proc/$pid/cgroup" 2> /dev/null)
    else cg=$(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2> /dev/null); fi
    case "$cg" in "$CGA") echo "$pid lab/pod-a" ;; "$CGB") echo "$pid lab/pod-b" ;; esac
  done >> "/tmp/rdu-$1.pids"
}
# kview TAG: per pod and device, the kernel's counts for the pods' PIDs (JSON, sorted keys)
kview() {
  jq -n -S --rawfile pids "/tmp/rdu-$1.pids" \
    --slurpfile qp "/tmp/rdu-$1.qp" --slurpfile mr "/tmp/rdu-$1.mr" \
    --slurpfile cq "/tmp/rdu-$1.cq" --slurpfile pd "/tmp/rdu-$1.pd" '
    ($pids | split("\n") | map(select(. != "") | split(" ")) | map({key: .[0], value: .[1]}) | from_entries) as $pod
    | def mine($l): [$l[] | select(.pid != null and $pod[.pid | tostring] != null) | . + {pod: $pod[.pid | tostring]}];
    (mine($qp[0]) | map(. + {k: "qp"})) + (mine($mr[0]) | map(. + {k: "mr"}))
      + (mine($cq[0]) | map(. + {k: "cq"})) + (mine($pd[0]) | map(. + {k: "pd"}))
    | group_by(.pod) | map({key: .[0].pod, value: (group_by(.ifname) | map({key: .[0].ifname, value: {
        qps: map(select(.k == "qp")) | length,
        qpsByState: (map(select(.k == "qp")) | group_by(.state) | map({key: .[0].state, value: length}) | from_entries),
        mrs: map(select(.k == "mr")) | length,
        mrBytes: (map(select(.k == "mr") | .mrlen // 0) | add // 0),
        cqs: map(select(.k == "cq")) | length,
        pds: map(select(.k == "pd")) | length }}) | from_entries)}) | from_entries'
}
# aview FILE: the same view of `top pods -o json` (pods lab/pod-a and lab/pod-b, devices with objects)
aview() {
  jq -S '[.items[].pods[] | select(.namespace == "lab" and (.name == "pod-a" or .name == "pod-b"))
    | {key: "\(.namespace)/\(.name)", value: ([.devices[] | select(.qps + .mrs + .cqs + .pds > 0)
        | {key: .device, value: {qps, qpsByState, mrs, mrBytes, cqs, pds}}] | from_entries)}]
    | map(select(.value != {})) | from_entries' "$1"
}
rts_of() { jq -r --arg p "$1" --arg d "$2" '.[$p][$d].qpsByState.RTS // 0' "$3"; }

# wait until both ends hold an RC QP in RTS (the connection is up and the WRITEs flow)
up() {
  rdma -j resource show qp | jq -s 'flatten(1)' > /tmp/rdu-w.qp
  jq -e --arg a "$DA" --arg b "$DB" '[.[] | select(.type == "RC" and .state == "RTS" and .pid != null) | .ifname] as $d
    | ($d | index($a)) != null and ($d | index($b)) != null' /tmp/rdu-w.qp
}
within 120 up || { fail "$SCEN" "ib_write_bw's QPs did not reach RTS on $DA and $DB in 120 s (rdma resource show qp: $(jq -c '[.[] | {ifname, lqpn, type, state, pid}]' /tmp/rdu-w.qp 2>/dev/null); $(tools))"; exit 0; }
fig "ib_write_bw running: $DB in pod-b -> $DA in pod-a (client output so far: $(grep -c . /tmp/rdu-cli.out) lines)"

# --- top pods against rdma resource show ------------------------------------------------------
n=0; stable=0
while [ $n -lt 3 ]; do
  n=$((n + 1))
  kernel k0
  top_pods > /tmp/rdu-top-pods.json 2> /tmp/rdu-top-pods.err; trc=$?
  kernel k1
  kview k0 > /tmp/rdu-k0.view; kview k1 > /tmp/rdu-k1.view
  cmp -s /tmp/rdu-k0.view /tmp/rdu-k1.view && { stable=1; break; }
  echo "  (the kernel's objects changed while top ran; reading again)"
done
cp /tmp/rdu-top-pods.json "$OUT/rdma-usage-top-pods.json" 2> /dev/null
aview /tmp/rdu-top-pods.json > /tmp/rdu-a.view 2> /tmp/rdu-a.err || echo '{}' > /tmp/rdu-a.view
fig "top pods (exit $trc, read $n time(s)): $(jq -c . /tmp/rdu-a.view)"
fig "kernel   (rdma resource show, PIDs $(awk '{printf "%s=%s ", $2, $1}' /tmp/rdu-k1.pids)): $(jq -c . /tmp/rdu-k1.view)"
ck "erdmactl top pods answered (exit $trc$(test -s /tmp/rdu-top-pods.err && echo ": $(tail -1 /tmp/rdu-top-pods.err)"))" test "$trc" = 0
[ "$stable" = 1 ] || bad "the kernel's objects of the pods changed under every one of 3 reads (before: $(jq -c . /tmp/rdu-k0.view), after: $(jq -c . /tmp/rdu-k1.view))"
for p in a b; do
  eval "d=\$D$(echo $p | tr ab AB)"
  row=$(jq -c --arg d "$d" '[.items[].pods[] | select(.namespace == "lab" and .name == "pod-'$p'")][0] // {} | {uid, devices: [.devices[]? | {device, allocated, qps, rts: (.qpsByState.RTS // 0), mrBytes}]}' /tmp/rdu-top-pods.json)
  ck "top pods lists lab/pod-$p with its device $d allocated, >= 1 QP in RTS and MR bytes > 0: $row" \
    jq -e --arg d "$d" --arg uid "$(jq -r .uid /tmp/pod-$p.pod.json)" \
      '[.items[].pods[] | select(.namespace == "lab" and .name == "pod-'$p'")] | length == 1 and (.[0].uid == $uid)
       and ([.[0].devices[] | select(.device == $d and .allocated and (.qpsByState.RTS // 0) >= 1 and .mrBytes > 0)] | length == 1)' \
      /tmp/rdu-top-pods.json
  a=$(jq -c --arg k lab/pod-$p '.[$k] // {}' /tmp/rdu-a.view); k=$(jq -c --arg k lab/pod-$p '.[$k] // {}' /tmp/rdu-k1.view)
  ck "lab/pod-$p: top's QPs (per state), MRs, MR bytes, CQs, PDs per device equal the kernel's for its PIDs: top $a, kernel $k" \
    test "$a" = "$k"
done
ck "the kernel saw the pods' objects at all (PIDs mapped: $(wc -l < /tmp/rdu-k1.pids))" test -s /tmp/rdu-k1.pids
for p in a b; do
  eval "d=\$D$(echo $p | tr ab AB)"
  h=$(jq -c --arg d "$d" '[.items[].devices[] | select(.device == $d) | {holders, traffic, trafficPod}][0]' /tmp/rdu-top-pods.json)
  fig "device $d in the answer: $h"
  ck "$d's holders are [lab/pod-$p]: $h" \
    jq -e --arg d "$d" '[.items[].devices[] | select(.device == $d)][0].holders == ["lab/pod-'$p'"]' /tmp/rdu-top-pods.json
done

# --- top devices against rdma statistic and sysfs hw_counters -----------------------------------
# stats TAG: per device, `rdma -j statistic show link DEV/1` and sysfs hw_counters (JSON)
stats() {
  for d in "$DA" "$DB"; do
    rdma -j statistic show link "$d/1" | jq -c --arg d "$d" '{($d): {rdma: (.[0] | with_entries(select(.value | type == "number")) | del(.ifindex, .port))}}'
    for f in /sys/class/infiniband/$d/ports/1/hw_counters/*; do
      [ "${f##*/}" = lifespan ] || printf '%s %s\n' "${f##*/}" "$(cat "$f")"
    done | jq -R -s -c --arg d "$d" '{($d): {sysfs: (split("\n") | map(select(. != "") | split(" ") | {key: .[0], value: (.[1] | tonumber)}) | from_entries)}}'
  done | jq -s -S 'reduce .[] as $x ({}; . * $x)' > "/tmp/rdu-$1.stats"
}
stats s0
erdmactl top devices --agent-addr "$ADDR" -o json --interval 3s > /tmp/rdu-top-devices.json 2> /tmp/rdu-top-devices.err; drc=$?
stats s1
cp /tmp/rdu-top-devices.json "$OUT/rdma-usage-top-devices.json" 2> /dev/null
ck "erdmactl top devices answered (exit $drc$(test -s /tmp/rdu-top-devices.err && echo ": $(tail -1 /tmp/rdu-top-devices.err)"))" test "$drc" = 0
for d in "$DA" "$DB"; do
  r=$(jq -c --arg d "$d" '[.items[] | select(.device == $d)][0] // {} | {txBytes, rxBytes, txPackets, rxPackets, txBytesPerSecond, rxBytesPerSecond, txPacketsPerSecond, rxPacketsPerSecond, intervalSeconds}' /tmp/rdu-top-devices.json)
  k0=$(jq -c --arg d "$d" '.[$d].rdma | {sent_pkts, rcvd_pkts}' /tmp/rdu-s0.stats); k1=$(jq -c --arg d "$d" '.[$d].rdma | {sent_pkts, rcvd_pkts}' /tmp/rdu-s1.stats)
  fig "top devices $d: $r; kernel before $k0, after $k1"
  # bytes where the driver counts them (a byte counter among hw_counters: erdma's tx_bytes_cnt,
  # bnxt_re's tx_bytes, rxe's sent_bytes on 7.3), else packets
  TXB=$(jq -r --arg d "$d" '.[$d].sysfs | [("tx_bytes_cnt", "hw_tx_bytes_cnt", "tx_bytes", "sent_bytes") as $n | select(has($n)) | $n][0] // empty' /tmp/rdu-s1.stats)
  RXB=$(jq -r --arg d "$d" '.[$d].sysfs | [("rx_bytes_cnt", "hw_rx_bytes_cnt", "rx_bytes", "rcvd_bytes") as $n | select(has($n)) | $n][0] // empty' /tmp/rdu-s1.stats)
  if [ -n "$TXB" ] && [ -n "$RXB" ]; then
    kb=$(jq -c --arg d "$d" --arg t "$TXB" --arg r "$RXB" --slurpfile s0 /tmp/rdu-s0.stats '{($t): "\($s0[0][$d].rdma[$t])..\(.[$d].rdma[$t])", ($r): "\($s0[0][$d].rdma[$r])..\(.[$d].rdma[$r])"}' /tmp/rdu-s1.stats)
    fig "$d: bytes by the kernel over the window (before..after): $kb"
    ck "$d: byte rates > 0 both ways (the kernel counts bytes: $TXB, $RXB): $r" \
      jq -e --arg d "$d" '[.items[] | select(.device == $d)][0] | .txBytesPerSecond > 0 and .rxBytesPerSecond > 0' /tmp/rdu-top-devices.json
    ck "$d: top's txBytes and rxBytes are the kernel's $TXB and $RXB, between its reads before and after: $kb" \
      jq -e --arg d "$d" --arg t "$TXB" --arg x "$RXB" --slurpfile s0 /tmp/rdu-s0.stats --slurpfile s1 /tmp/rdu-s1.stats \
        '[.items[] | select(.device == $d)][0] | .txBytes >= $s0[0][$d].rdma[$t] and .txBytes <= $s1[0][$d].rdma[$t]
         and .rxBytes >= $s0[0][$d].rdma[$x] and .rxBytes <= $s1[0][$d].rdma[$x]' /tmp/rdu-top-devices.json
  else
    fig "$d: the driver counts no bytes (hw_counters: $(jq -r --arg d "$d" '.[$d].sysfs | keys | join(" ")' /tmp/rdu-s1.stats)): rates in packets"
    ck "$d: no byte figure where the kernel has none (txBytes, rxBytes absent), packet rates > 0 both ways: $r" \
      jq -e --arg d "$d" '[.items[] | select(.device == $d)][0] | .txBytes == null and .rxBytes == null and .txPacketsPerSecond > 0 and .rxPacketsPerSecond > 0' /tmp/rdu-top-devices.json
  fi
  # every raw counter top shows lies between the kernel's reads before and after it, both ways
  # of reading the kernel (RDMA netlink through rdma(8), and sysfs); the first sample (the
  # rate's start, cur - rate x interval) is not before the kernel's first read
  out=$(jq -r --arg d "$d" --slurpfile s0 /tmp/rdu-s0.stats --slurpfile s1 /tmp/rdu-s1.stats '
    [.items[] | select(.device == $d)][0] as $r | ($r.ports[0].counters // {}) as $c
    | if ($c | length) == 0 then "no counters in top'"'"'s answer" else
      ([$c | to_entries[] | .key as $k | .value as $v | (["rdma", "sysfs"][] as $src
        | ($s0[0][$d][$src][$k]) as $a | ($s1[0][$d][$src][$k]) as $b
        | if $a == null or $b == null then empty
          elif $v < $a or $v > $b then "\($k): top \($v) outside \($src) [\($a), \($b)]" else empty end)]
      + [("tx", "rx") as $w | ($r["\($w)PacketsPerSecond"]) as $rate | ($r["\($w)Packets"]) as $cur
         | ($s0[0][$d].rdma[if $w == "tx" then "sent_pkts" else "rcvd_pkts" end]) as $a
         | if $rate == null or $cur == null or $a == null then empty
           else ($cur - $rate * $r.intervalSeconds) as $first
           | if $first < $a - 1 then "\($w) packets: top'"'"'s first sample \($first) before the kernel'"'"'s read \($a)" else empty end end])
      | join("; ") end' /tmp/rdu-top-devices.json)
  nc=$(jq -r --arg d "$d" '[.items[] | select(.device == $d)][0].ports[0].counters | length' /tmp/rdu-top-devices.json)
  ck "$d: top's $nc raw counters lie within rdma statistic's and sysfs hw_counters' reads before and after it${out:+: $out}" test -z "$out"
  ck "$d: the kernel's packet counters grew over the window (before $k0, after $k1)" \
    jq -e --arg d "$d" --slurpfile s0 /tmp/rdu-s0.stats '.[$d].rdma.sent_pkts > $s0[0][$d].rdma.sent_pkts and .[$d].rdma.rcvd_pkts > $s0[0][$d].rdma.rcvd_pkts' /tmp/rdu-s1.stats
done

# --- the pods end -----------------------------------------------------------------------------
PIDS=$(awk '{print $1}' /tmp/rdu-k1.pids | tr '\n' ' ')
for p in pod-a pod-b; do
  erdma-fake-kubelet pod delete --dir "$KDIR" --pod "lab/$p" > /dev/null 2> /tmp/rdu-del.err || bad "pod delete lab/$p failed: $(tail -1 /tmp/rdu-del.err)"
done
wait $SRV $CLI 2> /dev/null
t0=$(now)
gone() {
  top_pods > /tmp/rdu-after.json 2> /dev/null || return 1
  jq -e '[.items[].pods[] | select(.namespace == "lab" and (.name == "pod-a" or .name == "pod-b")) | .devices[] | .qps] | add // 0 | . == 0' /tmp/rdu-after.json
}
within 20 gone; gone_rc=$?
cp /tmp/rdu-after.json "$OUT/rdma-usage-top-pods-after.json" 2> /dev/null
left=$(jq -c '[.items[].pods[] | select(.namespace == "lab" and (.name == "pod-a" or .name == "pod-b")) | {pod: "\(.namespace)/\(.name)", devices: [.devices[] | {device, qps}]}]' /tmp/rdu-after.json 2> /dev/null)
fig "after pod delete ($(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s): top pods lists for lab/pod-a, lab/pod-b: ${left:-?}"
ck "after the pods ended, top pods lists no QP of theirs within 20 s: ${left:-no answer}" test "$gone_rc" = 0
# and the pods themselves leave the answer (no objects, no allocation: the agent's pod-resources
# view is refreshed at least every 10 s, and a usage read is reused for 2 s)
t1=$(now)
unlisted() {
  top_pods > /tmp/rdu-after2.json 2> /dev/null || return 1
  jq -e '[.items[] | (.pods[] | select(.namespace == "lab" and (.name == "pod-a" or .name == "pod-b"))), (.devices[].holders[] | select(. == "lab/pod-a" or . == "lab/pod-b"))] | length == 0' /tmp/rdu-after2.json
}
within 25 unlisted; unl_rc=$?
cp /tmp/rdu-after2.json "$OUT/rdma-usage-top-pods-after2.json" 2> /dev/null
left2=$(jq -c '{pods: [.items[].pods[] | select(.namespace == "lab") | .name], holders: [.items[].devices[] | {device, holders}]}' /tmp/rdu-after2.json 2> /dev/null)
fig "after pod delete (+$(awk -v a="$t1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s more): top pods: ${left2:-?}"
ck "the deleted pods leave top pods and the devices' holders within 25 s: ${left2:-no answer}" test "$unl_rc" = 0
kernel z
still=$(for pid in $PIDS; do jq -r --arg p "$pid" '.[] | select((.pid // 0 | tostring) == $p) | "\(.ifname) lqpn \(.lqpn) pid \(.pid)"' /tmp/rdu-z.qp; done | tr '\n' ';')
fig "after pod delete, rdma resource show qp: $(jq -c '[.[] | {ifname, lqpn, state, pid, comm}]' /tmp/rdu-z.qp)"
ck "rdma resource show qp holds none of the pods' PIDs ($PIDS)${still:+: $still}" test -z "$still"
tools > /dev/null
finish
