#!/bin/sh
# health: `ip link set eth0 down` (one ioctl by erdma-labprobe, timed from that moment) makes
# rxe0's slots Unhealthy on ListAndWatch (as the fake kubelet records it) within 250 ms; they
# are Healthy again after `up`; rxe1 is untouched. A kubelet restart is survived: the agent
# re-registers, keeps serving allocations and keeps reporting health.
. /mnt/host/guest/lib.sh
LIMIT_MS=250
need erdma-fake-kubelet; need erdma-agent --kubelet-dir; need erdma-labprobe
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 2 || { fail "$SCEN" "agent did not register with the fake kubelet"; exit 0; }
probe() { erdma-labprobe "$@" --state "$STATE" --resource "$RES"; }
ms() { sed -n 's/^elapsed_ms=//p' /tmp/probe.out; }
ck "rxe0 and rxe1 start Healthy" sh -c "$(command -v erdma-labprobe) wait --state $STATE --ibdev rxe0 --expect Healthy && $(command -v erdma-labprobe) wait --state $STATE --ibdev rxe1 --expect Healthy"

flip() {  # flip ROUND: eth0 down -> Unhealthy within LIMIT_MS, up -> Healthy
  if probe link --netdev eth0 --set down --ibdev rxe0 --expect Unhealthy --timeout-ms 5000 > /tmp/probe.out 2>&1; then
    d=$(ms); echo "REPORT: health $1: eth0 down -> rxe0 Unhealthy on ListAndWatch in $d ms" >> "$OUT/report.txt"
    if [ "$d" -le $LIMIT_MS ]; then good "$1: eth0 down -> rxe0 Unhealthy in $d ms (limit $LIMIT_MS ms)"
    else
      bad "$1: eth0 down -> rxe0 Unhealthy took $d ms (limit $LIMIT_MS ms)"
      echo "        link down at $(sed -n 's/^started_utc=//p' /tmp/probe.out) UTC; the agent logged:"
      tr -d '\033' < "$OUT/$SCEN-agent.log" | sed 's/\[[0-9;]*m//g' | grep 'health changed' | tail -2 | cut -c1-160 | sed 's/^/        | /'
    fi
  else bad "$1: rxe0 not Unhealthy after eth0 down: $(cat /tmp/probe.out)"; fi
  ck "$1: rxe1 stays Healthy while eth0 is down" probe wait --ibdev rxe1 --expect Healthy --timeout-ms 200
  if probe link --netdev eth0 --set up --ibdev rxe0 --expect Healthy --timeout-ms 10000 > /tmp/probe.out 2>&1; then
    d=$(ms); echo "REPORT: health $1: eth0 up -> rxe0 Healthy in $d ms" >> "$OUT/report.txt"
    good "$1: eth0 up -> rxe0 Healthy again in $d ms"
  else bad "$1: rxe0 not Healthy again after eth0 up: $(cat /tmp/probe.out)"; fi
}
flip "before restart"

ck "Allocate for pod-g before the restart" alloc pod-g 1
regs=$(jq -r '.registrations' "$STATE")
t=$(now)
ck "erdma-fake-kubelet restart" erdma-fake-kubelet restart --dir "$KDIR"
if probe wait --ibdev rxe0 --expect Healthy --min-registrations $((regs + 1)) --timeout-ms 10000 > /tmp/probe.out 2>&1; then
  d=$(awk -v a="$t" -v b="$(now)" 'BEGIN {printf "%d", (b - a) * 1000}')
  good "agent re-registered after the kubelet restart (registrations $regs -> $(jq -r .registrations "$STATE"), ${d} ms incl. the restart command)"
  echo "REPORT: health: kubelet restart -> re-registered in ${d} ms (including the restart command)" >> "$OUT/report.txt"
else bad "agent did not re-register after the kubelet restart: $(cat /tmp/probe.out)"; fi
ck "the agent process survived the restart" kill -0 "$AGENT_PID"
ck "pod-g's allocation is still recorded after the restart" jq -e '[.allocations[].pod] | index("lab/pod-g") != null' "$STATE"
ck "Allocate works after the restart" alloc pod-h 1
flip "after restart"
finish
