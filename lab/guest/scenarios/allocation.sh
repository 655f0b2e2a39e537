#!/bin/sh
# allocation: real containers on containerd. The lab kubelet (erdma-fake-kubelet pod run) runs
# pod-a and pod-b with one aliyun/erdma slot each over CRI: RunPodSandbox (CNI gives each its own
# network namespace and address), Allocate, CreateContainer with the Allocate response's devices,
# mounts and envs, StartContainer. Each container's /dev/infiniband holds exactly what Allocate
# returned; RDMA traffic flows between the two containers over exactly those devices. pod-c,
# without the resource, has no /dev/infiniband, no RDMA device, and when it creates the uverbs
# node itself with mknod, runc's device cgroup refuses to open it (EPERM) - as pod-a is refused
# pod-b's device. Deleting the pods (StopContainer, RemoveContainer, StopPodSandbox,
# RemovePodSandbox) removes them from the runtime and returns the devices.
# Would fail if: Allocate handed out the wrong or too many device nodes or envs, the lab kubelet
# did not pass the DeviceSpecs to CreateContainer (or passed another pod's), the agent's
# DeviceSpecs did not make a working RDMA device in a container (ibv_rc_pingpong / ib_write_bw
# fail or the rxe packet counters of both devices do not rise), the runtime let a container open a
# device it was not given (device cgroup), a pod without the resource could use RDMA, or pod
# deletion left the container, its network namespace or its allocation behind.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --kubelet-dir
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 1 || { fail "$SCEN" "agent did not register with the fake kubelet"; exit 0; }
PA=$(cpod pod-a 1) || { fail "$SCEN" "pod-a did not start: $(tail -1 /tmp/pod-a.pod.err)"; exit 0; }
PB=$(cpod pod-b 1) || { fail "$SCEN" "pod-b did not start: $(tail -1 /tmp/pod-b.pod.err)"; exit 0; }
PC=$(cpod pod-c 0) || { fail "$SCEN" "pod-c did not start: $(tail -1 /tmp/pod-c.pod.err)"; exit 0; }
for p in a b c; do
  echo "pod-run-pod-$p $(jq -r '.timings_ms.total / 1000' /tmp/pod-$p.pod.json)" >> "$OUT/timings.txt"
  log "pod-$p: ip $(cpod_ip pod-$p), netns $(cpod_netns pod-$p), ms $(jq -c .timings_ms /tmp/pod-$p.pod.json)"
done
jq .allocation "$PA" > /tmp/pod-a.json; jq .allocation "$PB" > /tmp/pod-b.json
A=/tmp/pod-a.json; B=/tmp/pod-b.json
echo " pod-a: $(jq -c . "$A")"; echo " pod-b: $(jq -c . "$B")"
ck "each pod has its own network namespace and address from CNI: pod-a $(cpod_ip pod-a), pod-b $(cpod_ip pod-b), pod-c $(cpod_ip pod-c)" \
  sh -c "test -n '$(cpod_ip pod-a)' && test '$(cpod_ip pod-a)' != '$(cpod_ip pod-b)' && test -e '$(cpod_netns pod-a)' && test '$(cpod_netns pod-a)' != '$(cpod_netns pod-b)'"
# the node kind's own marks on a container (systemd scope, AppArmor profile; lab/guest/node-kind.sh)
node_kind_checks pod-a
DA=$(ibdevs "$A"); DB=$(ibdevs "$B")
ck "pod-a got one device ($DA), pod-b another ($DB)" sh -c "test '$DA' != '$DB' && test \$(echo $DA | wc -w) = 1 && test \$(echo $DB | wc -w) = 1"
UA=$(uverbs_of "$DA"); UB=$(uverbs_of "$DB")
ck "pod-a's Allocate has /dev/infiniband/$UA, not $UB" jq -e "[.devices[].container_path] | (index(\"/dev/infiniband/$UA\") != null) and (index(\"/dev/infiniband/$UB\") == null)" "$A"
ck "pod-b's Allocate has /dev/infiniband/$UB, not $UA" jq -e "[.devices[].container_path] | (index(\"/dev/infiniband/$UB\") != null) and (index(\"/dev/infiniband/$UA\") == null)" "$B"
for p in a b; do
  eval "f=\$$(echo $p | tr ab AB)"; eval "d=\$D$(echo $p | tr ab AB)"
  want=$(jq -r '.devices[].container_path | select(startswith("/dev/infiniband/")) | ltrimstr("/dev/infiniband/")' "$f" | sort | tr '\n' ' ')
  seen=$(cx "pod-$p" ls /dev/infiniband | sort | tr '\n' ' ')
  ck "pod-$p's container sees exactly its entries in /dev/infiniband: [$seen] = Allocate [$want]" test "$seen" = "$want"
  want=$(jq -r '.envs | to_entries | map("\(.key)=\(.value)") | sort | join(" ")' "$f")
  seen=$(cx "pod-$p" env | grep -F "$(jq -r '.envs | keys[]' "$f")" | sort | tr '\n' ' ' | sed 's/ $//')
  ck "pod-$p's environment carries Allocate's envs [$want]" test "$seen" = "$want"
  seen=$(cx "pod-$p" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  ck "pod-$p's ibv_devices lists only $d: [$seen]" test "$seen" = "$d "
done
# the runtime's device cgroup: pod-a may create pod-b's node, but not open it
set -- $(dev_of "$UB")
cx pod-a sh -c "mknod /tmp/uv c $1 $2 && echo mknod-ok; cat /tmp/uv" > /tmp/cg.out 2>&1
sed 's/^/        pod-a| /' /tmp/cg.out
ck "pod-a: mknod of $UB ($1:$2) works, opening it is refused by the device cgroup (EPERM)" \
  sh -c "grep -q mknod-ok /tmp/cg.out && grep -q 'Operation not permitted' /tmp/cg.out"

GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB"); IPA=$(cpod_ip pod-a)
pkts() { rdma -j statistic show link "$1/1" | jq -r '.[0].rcvd_pkts'; }
ra0=$(pkts "$DA"); rb0=$(pkts "$DB")
# ibv_rc_pingpong: server in pod-a, client in pod-b (CRI ExecSync in each container)
cx pod-a timeout 300 ibv_rc_pingpong -d "$DA" -g "$GA" -n 200 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 60 cpod_listening pod-a 18515
cx pod-b timeout 300 ibv_rc_pingpong -d "$DB" -g "$GB" -n 200 "$IPA" > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
sed 's/^/        client| /' /tmp/cli.out; sed 's/^/        server| /' /tmp/srv.out
ck "ibv_rc_pingpong container pod-b -> pod-a: 200 iterations (client rc $crc, server rc $src)" \
  sh -c "test $crc = 0 && test $src = 0 && grep -q '200 iters' /tmp/cli.out"
ra1=$(pkts "$DA"); rb1=$(pkts "$DB")
ck "RoCE packets went through $DA (+$((ra1 - ra0))) and $DB (+$((rb1 - rb0)))" sh -c "test $((ra1 - ra0)) -ge 200 && test $((rb1 - rb0)) -ge 200"
cwrite_bw pod-a "$DA" pod-b "$DB" /tmp/wb
sed 's/^/        client| /' /tmp/wb-cli.out | tail -6; sed 's/^/        server| /' /tmp/wb-srv.out | tail -3
ck "ib_write_bw container pod-b -> pod-a: $DA received $WB_RX packets (at least $WB_NEED), $WB_MBPS MB/s by the wall clock over $WB_SECS s (perftest: ${WB_PERF:-?} MB/s), client rc $WB_CRC, server rc $WB_SRC" \
  cwrite_bw_moved
echo "REPORT: ib_write_bw pod-b($DB) -> pod-a($DA) $WB_MBPS MB/s by the wall clock; $DA received $WB_RX packets; perftest's own figure ${WB_PERF:-none}" >> "$OUT/report.txt"

# pod-c: no resource
ck "pod-c has no /dev/infiniband" cx pod-c sh -c '! test -e /dev/infiniband'
seen=$(cx pod-c ibv_devices 2>/dev/null | awk 'NR > 2 {print $1}' | tr '\n' ' ')
ck "pod-c's ibv_devices lists no device: [$seen]" test -z "$seen"
set -- $(dev_of "$UA")
cx pod-c sh -c "mknod /tmp/uv c $1 $2 && echo mknod-ok; cat /tmp/uv" > /tmp/cg.out 2>&1
sed 's/^/        pod-c| /' /tmp/cg.out
ck "pod-c: mknod of $UA ($1:$2) works, opening it is refused by the device cgroup (EPERM)" \
  sh -c "grep -q mknod-ok /tmp/cg.out && grep -q 'Operation not permitted' /tmp/cg.out"

# deletion, as the kubelet does it
CA=$(jq -r .container_id "$PA"); NA=$(cpod_netns pod-a)
t=$(now)
ck "pod-a deleted (StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox)" erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-a
echo "pod-delete-pod-a $(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" >> "$OUT/timings.txt"
ck "the runtime no longer has pod-a's container" sh -c "! ctr -n k8s.io containers ls -q | grep -q $CA"
ck "pod-a's network namespace is gone ($NA)" sh -c "! test -e $NA"
ck "pod-a's devices are back in the pool (not in the kubelet's allocations)" jq -e '[.allocations[].pod] | index("lab/pod-a") == null' "$STATE"
finish
