#!/bin/sh
# allocation: pods pod-a and pod-b each get aliyun/erdma from the agent through the fake
# kubelet; each pod's /dev/infiniband holds exactly what Allocate returned; RDMA traffic flows
# between the two pods over exactly those devices; pod-c, without the resource, has no
# /dev/infiniband and the same command fails there.
# Would fail if: Allocate handed out the wrong or too many device nodes or envs, erdma-labpod
# leaked a device into a pod that was not allocated it, the agent's DeviceSpecs did not make a
# working RDMA device (ibv_rc_pingpong / ib_write_bw fail or the rxe packet counters of both
# devices do not rise), or a pod without the resource could use RDMA.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --kubelet-dir; need erdma-labpod
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 1 || { fail "$SCEN" "agent did not register with the fake kubelet"; exit 0; }
pod_net pod-a 10.88.0.11; pod_net pod-b 10.88.0.12; pod_net pod-c 10.88.0.13
A=$(alloc pod-a 1) || { fail "$SCEN" "Allocate for pod-a failed: $(tail -1 /tmp/pod-a.alloc.err)"; exit 0; }
B=$(alloc pod-b 1) || { fail "$SCEN" "Allocate for pod-b failed: $(tail -1 /tmp/pod-b.alloc.err)"; exit 0; }
echo " pod-a: $(jq -c . "$A")"; echo " pod-b: $(jq -c . "$B")"
DA=$(ibdevs "$A"); DB=$(ibdevs "$B")
ck "pod-a got one device ($DA), pod-b another ($DB)" sh -c "test '$DA' != '$DB' && test \$(echo $DA | wc -w) = 1 && test \$(echo $DB | wc -w) = 1"
UA=$(uverbs_of "$DA"); UB=$(uverbs_of "$DB")
ck "pod-a's Allocate has /dev/infiniband/$UA, not $UB" sh -c "$(command -v jq) -e '[.devices[].container_path] | (index(\"/dev/infiniband/$UA\") != null) and (index(\"/dev/infiniband/$UB\") == null)' $A"
ck "pod-b's Allocate has /dev/infiniband/$UB, not $UA" sh -c "$(command -v jq) -e '[.devices[].container_path] | (index(\"/dev/infiniband/$UB\") != null) and (index(\"/dev/infiniband/$UA\") == null)' $B"
for p in a b; do
  eval "f=\$$(echo $p | tr ab AB)"; eval "d=\$D$(echo $p | tr ab AB)"
  want=$(jq -r '.devices[].container_path | select(startswith("/dev/infiniband/")) | ltrimstr("/dev/infiniband/")' "$f" | sort | tr '\n' ' ')
  seen=$(pod "pod-$p" "$f" ls /dev/infiniband | sort | tr '\n' ' ')
  ck "pod-$p sees exactly its entries in /dev/infiniband: [$seen] = Allocate [$want]" test "$seen" = "$want"
  want=$(jq -r '.envs | to_entries | map("\(.key)=\(.value)") | sort | join(" ")' "$f")
  seen=$(pod "pod-$p" "$f" env | grep -F "$(jq -r '.envs | keys[]' "$f")" | sort | tr '\n' ' ' | sed 's/ $//')
  ck "pod-$p's environment carries Allocate's envs [$want]" test "$seen" = "$want"
  seen=$(pod "pod-$p" "$f" ibv_devices | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  ck "pod-$p's ibv_devices lists only $d: [$seen]" test "$seen" = "$d "
done
GA=$(gid_v4 "$DA"); GB=$(gid_v4 "$DB")
pkts() { rdma -j statistic show link "$1/1" | jq -r '.[0].rcvd_pkts'; }
ra0=$(pkts "$DA"); rb0=$(pkts "$DB")
listening() { ip netns exec pod-a ss -Hltn | grep -q ":$1 "; }

# ibv_rc_pingpong: server in pod-a, client in pod-b
pod pod-a "$A" timeout 300 ibv_rc_pingpong -d "$DA" -g "$GA" -n 200 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 60 listening 18515
pod pod-b "$B" timeout 300 ibv_rc_pingpong -d "$DB" -g "$GB" -n 200 10.88.0.11 > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
sed 's/^/        client| /' /tmp/cli.out; sed 's/^/        server| /' /tmp/srv.out
ck "ibv_rc_pingpong pod-b -> pod-a: 200 iterations (client rc $crc, server rc $src)" \
  sh -c "test $crc = 0 && test $src = 0 && grep -q '200 iters' /tmp/cli.out"
IPA=$(ipv4_of "$DA"); IPB=$(ipv4_of "$DB")
ck "the client used $DB's GID (::ffff:$IPB) and reached $DA's (::ffff:$IPA)" \
  sh -c "grep -q 'local address.*GID ::ffff:$IPB\$' /tmp/cli.out && grep -q 'remote address.*GID ::ffff:$IPA\$' /tmp/cli.out"
ra1=$(pkts "$DA"); rb1=$(pkts "$DB")
ck "RoCE packets went through $DA (+$((ra1 - ra0))) and $DB (+$((rb1 - rb0)))" sh -c "test $((ra1 - ra0)) -ge 200 && test $((rb1 - rb0)) -ge 200"

# ib_write_bw: RDMA WRITE bandwidth pod-b -> pod-a
pod pod-a "$A" timeout 300 ib_write_bw -d "$DA" -x "$GA" -F -u 20 -n 1000 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 60 listening 18515
pod pod-b "$B" timeout 300 ib_write_bw -d "$DB" -x "$GB" -F -u 20 -n 1000 10.88.0.11 > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
bw=$(awk '/^ *65536 / {print $4}' /tmp/cli.out | tail -1)
ck "ib_write_bw pod-b -> pod-a: ${bw:-?} MB/s (client rc $crc, server rc $src)" sh -c "test $crc = 0 && test $src = 0 && awk 'BEGIN { exit !(\"$bw\" + 0 > 0) }'"
echo "REPORT: ib_write_bw pod-b($DB) -> pod-a($DA) ${bw:-?} MB/s" >> "$OUT/report.txt"

# pod-c has no resource: no /dev/infiniband, and the same client command fails
ck "pod-c has no /dev/infiniband" pod pod-c - sh -c '! test -e /dev/infiniband'
pod pod-a "$A" timeout 300 ibv_rc_pingpong -d "$DA" -g "$GA" -n 50 > /tmp/srv.out 2>&1 &
srv=$!; wait_for 60 listening 18515
pod pod-c - timeout 30 ibv_rc_pingpong -d "$DB" -g "$GB" -n 50 10.88.0.11 > /tmp/c.out 2>&1; ccrc=$?
sed 's/^/        pod-c| /' /tmp/c.out
ck "pod-c: the same ibv_rc_pingpong fails (rc $ccrc) for lack of devices" \
  sh -c "test $ccrc != 0 && grep -qiE 'no IB devices|not found' /tmp/c.out"
pod pod-b "$B" timeout 300 ibv_rc_pingpong -d "$DB" -g "$GB" -n 50 10.88.0.11 > /tmp/cli.out 2>&1; crc=$?
wait $srv; src=$?
ck "while pod-b, with its allocation, reaches the same server (rc $crc/$src)" sh -c "test $crc = 0 && test $src = 0"
finish
