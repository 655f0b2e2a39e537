#!/bin/sh
# faults: what a node does to the agent, done on purpose, and what is left afterwards. Each fault
# prints one "FAULT name | outcome" line (collected into out/faults.txt, the table in
# docs/operations.md) and is followed by the same checks: no pod with a half-applied state, no
# device held twice, the kubelet's record (the lab kubelet's allocation ledger) or the DRA
# driver's checkpoint intact and equal to what runs, and the agent back in service.
# Device plugin and NRI (agent --nri on, 2 slots per device):
# - agent-kill-allocate: the agent is stopped (SIGSTOP) as the lab kubelet sends Allocate for
#   pod-k and killed (SIGKILL) with the call in flight; the DaemonSet's restart is played by
#   starting it again. pod-k must fail without a container or a ledger entry, then start once
#   the agent has registered again.
# - agent-kill-nri: the agent is stopped as containerd runs pod-n's sandbox (pod-n asks for
#   rdma.max hca_handle=2) and killed while containerd waits on its NRI call: containerd gives up
#   on the plugin and creates the container without the agent's adjustment. The restarted agent's
#   Synchronize must give the running container its rdma.max (cgroup) and name the memlock limit
#   it cannot give a running process.
# - containerd-restart: containerd is stopped and started with pod-k and pod-n running; their
#   containers must keep running with their devices, the agent's NRI plugin must reconnect, and a
#   pod started afterwards must get its rdma.max.
# DRA (agent --resource-api dra, the lab API server):
# - agent-kill-prepare: the agent is stopped as the lab kubelet calls NodePrepareResources for
#   claim-p and killed with the call in flight; after the restart the retried prepare must give
#   the claim exactly one CDI device, the checkpoint must hold it once, and the pod must start.
# - kubelet-kill-prepare: the lab kubelet (pod run) is killed while its NodePrepareResources for
#   claim-r is being answered (the agent held with SIGSTOP, then let go); the kubelet's retry must
#   be answered from the same preparation (same CDI device, one checkpoint entry).
# - api-500, api-429, api-hang: the lab API server answers every request with 500, with 429 and
#   Retry-After: 5, or not at all, while eth1 goes down or up (the ResourceSlice must change).
#   The agent must stay alive and answer /healthz within 2 s throughout, must not ask again
#   sooner than Retry-After, and must publish the change once the API server answers again.
# Would fail if: a killed agent left a container created with half of what it asked, a ledger
# entry or checkpoint entry without its pod (or a pod without one), a device slot held twice; the
# restarted agent did not register or reconnect to NRI; Synchronize did not repair the rdma.max
# of a container created without it; a containerd restart stopped the pods or the agent's NRI
# plugin for good; a retried prepare prepared a claim twice or differently; the agent died,
# hung its health endpoint, ignored Retry-After, or never published after an API outage.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet apiserver; need erdma-agent --resource-api
export SSL_CERT_FILE=/mnt/host/guest/lab-root.pem
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
FAULTS=$OUT/faults.txt; : > "$FAULTS"
# fault NAME OUTCOME: one row of the fault table
fault() { echo "FAULT $1 | $2" | tee -a "$FAULTS"; }
# busybox wget's -T crashed (SIGSEGV) in the guest: timeout(1) bounds it instead
healthz() { timeout 2 wget -qO- http://127.0.0.1:9464/healthz; }
# answers: /healthz gave any HTTP answer within 2 s (503 while not ready counts: not hung)
answers() { timeout 2 wget -q -S -O /dev/null http://127.0.0.1:9464/healthz 2>&1 | grep -q 'HTTP/1'; }
ANN=network.alibabacloud.com/erdma-rdma-max=hca_handle=2
AGENT_LOG=$OUT/$SCEN-agent.log; : > "$AGENT_LOG"
# agent FLAGS: starts the agent (the DaemonSet's restart), its log appended
agent() { erdma-agent "$@" >> "$AGENT_LOG" 2>&1 & AGENT_PID=$!; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
# the ledger: every allocated device ID once, and an entry only for a pod the runtime runs
ledger_ok() {
  jq -e '[.allocations[].device_ids[]] | length == (unique | length)' "$STATE" > /dev/null || return 1
  for p in $(jq -r '.allocations[].pod' "$STATE" | sort -u); do
    erdma-fake-kubelet pod status --dir "$KDIR" --pod "$p" | jq -e '.state == "CONTAINER_RUNNING"' > /dev/null || return 1
  done
}
registrations() { jq -r '.registrations // 0' "$STATE"; }
cgroup_of() { cgroup_dir rdma "$(ctr -n k8s.io containers info "$(jq -r .container_id "/tmp/$1.pod.json")" | jq -r .Spec.linux.cgroupsPath)"; }
rdma_max_of() { grep "^$2 " "$(cgroup_of "$1")/rdma.max" 2>/dev/null; }
dev_of_pod() { jq -r '.allocation.device_ids[0] | split("/")[0]' "/tmp/$1.pod.json"; }

# ====== device plugin and NRI ===========================================================
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
DP_FLAGS="--kubelet-dir $KDIR --pod-resources-socket $PODRES --resource-name $RES --rdma-driver rxe --prefer-driver none --local-eri-discovery --instance-id i-lab --metrics-addr 127.0.0.1:9464 --slots-per-device 2 --nri on --nri-budget-ms 8000"
nri_up() { healthz | jq -e '.nri.connected' > /dev/null; }
# shellcheck disable=SC2086
agent $DP_FLAGS
wait_for 30 registered && wait_for 30 nri_up || { fail "$SCEN" "the agent did not register or connect to NRI: $(tail -3 "$AGENT_LOG")"; exit 0; }
cpod pod-a 1 > /dev/null || { fail "$SCEN" "pod-a did not start: $(tail -1 /tmp/pod-a.pod.err)"; exit 0; }

# --- agent-kill-allocate -------------------------------------------------------------------
echo " -- agent-kill-allocate"
r0=$(registrations)
kill -STOP "$AGENT_PID"
cpod pod-k 1 > /dev/null 2>&1 &
RUN=$!
sleep 1
kill -KILL "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null
wait "$RUN"; rc=$?
err=$(tail -1 /tmp/pod-k.pod.err | cut -c1-160)
ck "pod-k's Allocate failed with the agent killed during it (exit $rc: $err)" test "$rc" != 0
ck "pod-k has no container and no ledger entry" sh -c "! erdma-fake-kubelet pod status --dir $KDIR --pod lab/pod-k && ! jq -e '.allocations[] | select(.pod == \"lab/pod-k\")' $STATE"
t=$(now)
# shellcheck disable=SC2086
agent $DP_FLAGS
if wait_for 30 sh -c "test \$(jq -r '.registrations // 0' $STATE) -gt $r0"; then back=$(took "$t"); else back=never; fi
ck "the restarted agent registered again (after ${back} s)" test "$back" != never
if cpod pod-k 1 > /dev/null; then good "pod-k started on the kubelet's retry ($(dev_of_pod pod-k))"; else bad "pod-k did not start on the retry: $(tail -1 /tmp/pod-k.pod.err)"; fi
ck "the ledger holds each device slot once, only for running pods: $(jq -c '[.allocations[] | [.pod, .device_ids]]' "$STATE")" ledger_ok
fault agent-kill-allocate "Allocate fails (\`$err\`); no container, no ledger entry; the restarted agent registers in ${back} s and the kubelet's retry starts the pod"

# --- agent-kill-nri -----------------------------------------------------------------------
echo " -- agent-kill-nri"
wait_for 30 nri_up || bad "the agent's NRI plugin is not connected before agent-kill-nri"
ctrd_lines=$(wc -l < "$OUT/containerd.log")
cpod pod-n 1 --annotation "$ANN" > /dev/null 2>&1 &
RUN=$!
# stop the agent once Allocate is answered (the ledger has pod-n): containerd's NRI calls for the
# sandbox and the container come next
wait_for 30 jq -e '.allocations[] | select(.pod == "lab/pod-n")' "$STATE"
kill -STOP "$AGENT_PID"
sleep 1
kill -KILL "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null
wait "$RUN"; rc=$?
said=$(tail -n +"$((ctrd_lines + 1))" "$OUT/containerd.log" | grep -iE 'nri|plugin' | grep -iE 'clos|fail|timeout|deadline' | head -2 | sed 's/.*msg="\([^"]*\)".*/\1/' | tr '\n' ';' | cut -c1-200)
echo "  containerd said: $said"
DN=$(dev_of_pod pod-n)
if [ "$rc" = 0 ]; then
  before=$(rdma_max_of pod-n "$DN")
  good "pod-n was created while the agent was killed (rdma.max then: [${before:-none}])"
  t=$(now)
  # shellcheck disable=SC2086
  agent $DP_FLAGS
  if wait_for 30 nri_up; then back=$(took "$t"); else back=never; fi
  ck "the restarted agent's NRI plugin reconnected (after ${back} s)" test "$back" != never
  wait_for 20 sh -c "grep -q '^$DN hca_handle=2' '$(cgroup_of pod-n)/rdma.max'"
  after=$(rdma_max_of pod-n "$DN")
  ck "Synchronize gave pod-n's running container its rdma.max: [${before:-none}] -> [$after]" sh -c "echo '$after' | grep -q '^$DN hca_handle=2'"
  # the memlock limit: named where the runtime tells the container's rlimits or PID
  named=$(grep 'lack their memlock limit' "$AGENT_LOG" | tail -1 | sed 's/.*containers=//')
  echo "  the agent named as lacking their memlock limit: ${named:-none}"
  ck "the agent named no container created while it answered (pod-a, pod-k) as lacking memlock" sh -c "! echo '$named' | grep -qE 'lab/pod-(a|k)/'"
  fault agent-kill-nri "containerd gives up on the plugin (${said:-nothing logged}) and creates pod-n without the adjustment (rdma.max [${before:-none}]); the restarted agent reconnects in ${back} s and its Synchronize writes rdma.max [$after] into the running container and names the containers whose memlock limit only a restart gives: [${named:-none}]"
else
  err=$(tail -1 /tmp/pod-n.pod.err | cut -c1-160)
  ck "pod-n left no container behind" sh -c "! erdma-fake-kubelet pod status --dir $KDIR --pod lab/pod-n"
  # shellcheck disable=SC2086
  agent $DP_FLAGS; t=$(now)
  if wait_for 30 nri_up; then back=$(took "$t"); else back=never; fi
  ck "the restarted agent's NRI plugin reconnected (after ${back} s)" test "$back" != never
  erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-n > /dev/null 2>&1
  cpod pod-n 1 --annotation "$ANN" > /dev/null || bad "pod-n did not start on the retry: $(tail -1 /tmp/pod-n.pod.err)"
  DN=$(dev_of_pod pod-n)
  ck "the retried pod-n has its rdma.max" grep -q "^$DN hca_handle=2" "$(cgroup_of pod-n)/rdma.max"
  fault agent-kill-nri "the sandbox or container creation fails (\`$err\`; containerd: ${said:-nothing logged}); nothing is left; the restarted agent reconnects in ${back} s and the retry gets its rdma.max"
fi
ck "the ledger holds each device slot once, only for running pods" ledger_ok

# --- containerd-restart ---------------------------------------------------------------------
echo " -- containerd-restart"
CTRD=$(pidof containerd)
kill "$CTRD"; wait_for 30 sh -c "! pidof containerd" || bad "containerd did not stop"
t=$(now)
runtime_start info || bad "containerd did not start again"
if wait_for 60 nri_up; then back=$(took "$t"); else back=never; fi
for p in pod-a pod-k pod-n; do
  ck "$p's container kept running across the restart, with its device" sh -c "test \"\$(erdma-fake-kubelet pod status --dir $KDIR --pod lab/$p | jq -r .state)\" = CONTAINER_RUNNING && erdma-fake-kubelet pod exec --dir $KDIR --pod lab/$p -- ibv_devices | grep -q rxe"
done
ck "the agent's NRI plugin reconnected to the new containerd (${back} s after it started)" test "$back" != never
erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-a > /dev/null
if cpod pod-z 1 --annotation "$ANN" > /dev/null; then
  DZ=$(dev_of_pod pod-z)
  ck "pod-z, started after the restart, has its rdma.max [$(rdma_max_of pod-z "$DZ")]" sh -c "grep -q '^$DZ hca_handle=2' '$(cgroup_of pod-z)/rdma.max'"
else bad "pod-z did not start after the containerd restart: $(tail -1 /tmp/pod-z.pod.err)"; fi
ck "the ledger holds each device slot once, only for running pods" ledger_ok
fault containerd-restart "running containers keep running with their devices; the agent's NRI plugin reconnects ${back} s after containerd starts; a new pod gets its rdma.max"
runtime_clean
kill "$AGENT_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null
stop_daemons

# ====== DRA and the API server ==============================================================
NODE=lab-node; DRV=erdma.alibabacloud.com; SLICE=$NODE-$DRV
KC=/run/erdma-lab/kubeconfig; API=http://127.0.0.1:6443; ROOT=/var/lib/kubelet; CDI=/var/run/cdi
CK=$ROOT/plugins/$DRV/checkpoint.json
rm -rf "$CDI" "$ROOT/plugins" "$ROOT/plugins_registry" "${KC%/*}"; mkdir -p "$CDI" "${KC%/*}"
erdma-fake-kubelet apiserver --listen 127.0.0.1:6443 --kubeconfig "$KC" --node "$NODE" > "$OUT/$SCEN-apiserver.log" 2>&1 &
API_PID=$!
wait_for 20 test -s "$KC" || { fail "$SCEN" "the lab API server did not start"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start (DRA part)"; exit 0; }
DRA_FLAGS="--resource-api dra --node-name $NODE --kubeconfig $KC --kubelet-root-dir $ROOT --cdi-spec-dir $CDI --kubelet-dir $KDIR --pod-resources-socket $PODRES --rdma-driver rxe --prefer-driver none --local-eri-discovery --instance-id i-lab --metrics-addr 127.0.0.1:9464 --nri off"
get() { wget -qO- "$API$1"; }
slice() { get "/apis/resource.k8s.io/v1/resourceslices/$SLICE"; }
# -s: jq -e on no input at all (the slice not there yet) would succeed
has_slice() { slice | jq -se '.[0].spec.devices | length == 2'; }
# shellcheck disable=SC2086
agent $DRA_FLAGS
wait_for 60 has_slice || { fail "$SCEN" "no ResourceSlice in 60 s: $(tail -3 "$AGENT_LOG")"; exit 0; }
lab_alloc() { erdma-fake-kubelet dra "$@" --kubeconfig "$KC" --node "$NODE"; }
claim() { _p=$1; _c=$2; shift 2; lab_alloc claim --pod "lab/$_p" --claim "$_c" --capacity "shares=$1" --device rxe0 > "/tmp/$_c.claim.json" 2> "/tmp/$_c.claim.err"; }
dpod() { cpod "$@" --kubeconfig "$KC" --kubelet-root-dir "$ROOT"; }
# the checkpoint's prepared claims (snapshot line with the appended records replayed)
ck_claims() { jq -s 'reduce .[1:][] as $r (.[0].claims; if $r.prepared then .[$r.prepared.uid] = $r.prepared.claim else del(.[$r.unprepared.uid]) end)' "$CK"; }
uid_of() { jq -r .metadata.uid "/tmp/$1.claim.json"; }
# checkpoint_ok UID...: the checkpoint parses and holds exactly these claims
checkpoint_ok() {
  _want='[]'; [ $# = 0 ] || _want=$(printf '%s\n' "$@" | sort | jq -R . | jq -sc .)
  test "$(ck_claims | jq -c 'keys | sort')" = "$_want"
}
specs_of() { ls "$CDI" | grep -c "claim_$1" ; }

# --- agent-kill-prepare --------------------------------------------------------------------
echo " -- agent-kill-prepare"
claim pod-p claim-p 50 || { fail "$SCEN" "allocating claim-p failed: $(tail -1 /tmp/claim-p.claim.err)"; exit 0; }
UP=$(uid_of claim-p)
served0=$(grep -c 'serving the DRA driver' "$AGENT_LOG")
kill -STOP "$AGENT_PID"
dpod pod-p 0 > /dev/null 2>&1 &
RUN=$!
sleep 2
kill -KILL "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null
wait "$RUN"; rc=$?
err=$(tail -1 /tmp/pod-p.pod.err | cut -c1-160)
ck "pod-p's NodePrepareResources failed with the agent killed during it (exit $rc: $err)" test "$rc" != 0
ck "pod-p left no container" sh -c "! erdma-fake-kubelet pod status --dir $KDIR --pod lab/pod-p"
t=$(now)
# shellcheck disable=SC2086
agent $DRA_FLAGS
# serving again: the new agent's line (the killed agent's socket files stay until it binds anew)
serving_dra() { test "$(grep -c 'serving the DRA driver' "$AGENT_LOG")" -gt "$served0"; }
if wait_for 30 serving_dra; then back=$(took "$t"); else back=never; fi
ck "the restarted agent serves the DRA socket again (after ${back} s)" test "$back" != never
if dpod pod-p 0 > /dev/null; then good "pod-p started on the retried prepare"; else bad "pod-p did not start on the retry: $(tail -1 /tmp/pod-p.pod.err)"; fi
ck "claim-p has one CDI spec [$(ls "$CDI" | grep "claim_$UP" | tr '\n' ' ')]" test "$(specs_of "$UP")" = 1
ck "the checkpoint holds exactly claim-p: $(ck_claims | jq -c keys)" checkpoint_ok "$UP"
fault agent-kill-prepare "NodePrepareResources fails (\`$err\`); no container; the restarted agent serves again in ${back} s; the retried prepare gives the claim one CDI spec and one checkpoint entry"

# --- kubelet-kill-prepare ------------------------------------------------------------------
echo " -- kubelet-kill-prepare"
claim pod-r claim-r 30 || { fail "$SCEN" "allocating claim-r failed: $(tail -1 /tmp/claim-r.claim.err)"; exit 0; }
UR=$(uid_of claim-r)
kill -STOP "$AGENT_PID"
dpod pod-r 0 > /dev/null 2>&1 &
RUN=$!
sleep 2
# the lab kubelet's pod worker dies with its NodePrepareResources in flight; then the agent goes on
for d in /proc/[0-9]*; do
  case "$(cat "$d/comm" 2>/dev/null)" in erdma-fake-kube*)
    tr '\0' ' ' < "$d/cmdline" 2>/dev/null | grep -q -- "--pod lab/pod-r " && kill -KILL "${d#/proc/}" ;;
  esac
done
wait "$RUN" 2>/dev/null
kill -CONT "$AGENT_PID"
wait_for 20 sh -c "ls $CDI | grep -q claim_$UR"
first=$(ls "$CDI" | grep "claim_$UR" | tr '\n' ' ')
good "the agent finished the abandoned prepare: [$first]"
if dpod pod-r 0 > /dev/null; then good "pod-r started on the kubelet's retry"; else bad "pod-r did not start on the retry: $(tail -1 /tmp/pod-r.pod.err)"; fi
ck "the retry was answered from the same preparation: one CDI spec [$(ls "$CDI" | grep "claim_$UR" | tr '\n' ' ')]" test "$(specs_of "$UR")" = 1
ck "the checkpoint holds exactly claim-p and claim-r: $(ck_claims | jq -c keys)" checkpoint_ok "$UP" "$UR"
ck "pod-r's container holds claim-r's device" sh -c "erdma-fake-kubelet pod exec --dir $KDIR --pod lab/pod-r -- ibv_devices | grep -q rxe0"
fault kubelet-kill-prepare "the agent completes the abandoned prepare; the kubelet's retry gets the same CDI device; one checkpoint entry; the pod starts"

# --- the API server: 500, 429 with Retry-After, hang ----------------------------------------
taint() { slice | jq -r --arg d "$1" '[.spec.devices[] | select(.name == $d) | (.taints // [])[] | .effect] | join(",")'; }
# busybox wget: POST (the fault control takes PUT or POST). No -T against the lab API server:
# busybox wget with a timeout got an empty answer from it (the agent's /healthz is fine)
set_fault() { wget -qO- --header 'Content-Type: application/json' --post-data="$1" "$API/lab/fault" > /dev/null; }
faulted() { wget -qO- "$API/lab/fault" | jq '[.faulted[] | select(.request | test("resourceslices") and (test("watch|limit") | not))]'; }
# api_fault NAME JSON LINK-ACTION HOLD: the fault for HOLD seconds while eth1 changes; the agent's
# health answered throughout; the change published afterwards
api_fault() {
  _name=$1; _json=$2; _act=$3; _hold=$4
  echo " -- $_name"
  _n0=$(faulted | jq length)
  set_fault "$_json" || { bad "$_name: the fault could not be set"; return; }
  ip link set eth1 "$_act"
  _slow=0; _i=0
  while [ $_i -lt "$_hold" ]; do
    answers || _slow=$((_slow + 1))
    sleep 1; _i=$((_i + 1))
  done
  _alive=yes; kill -0 "$AGENT_PID" 2>/dev/null || _alive=no
  _asked=$(faulted | jq --argjson n "$_n0" '.[$n:] | length')
  _gaps=$(faulted | jq -c --argjson n "$_n0" '.[$n:] | [.[].at_ms] as $t | [range(1; $t | length) | ($t[.] - $t[. - 1])]')
  set_fault '{"mode": "off"}'
  _t0=$(now)
  if [ "$_act" = down ]; then _want=NoSchedule; else _want=none; fi
  if wait_for 90 sh -c "test \"\$(wget -qO- $API/apis/resource.k8s.io/v1/resourceslices/$SLICE | jq -r '[.spec.devices[] | select(.name == \"rxe1\")] | if length == 0 then \"missing\" else ([.[0].taints // [] | .[].effect] | join(\",\") | if . == \"\" then \"none\" else . end) end')\" = '$_want'"; then
    _pub=$(took "$_t0")
  else _pub=never; fi
  ck "$_name: the agent stayed alive ($_alive) and /healthz answered in every second of the fault (missed: $_slow)" sh -c "test $_alive = yes && test $_slow = 0"
  ck "$_name: eth1 $_act published ${_pub} s after the API server answered again (rxe1 taints: [$(taint rxe1)])" test "$_pub" != never
  echo "  $_name: the agent's publishing requests during the fault: $_asked, gaps (ms): $_gaps"
  API_ASKED=$_asked; API_GAPS=$_gaps; API_PUB=$_pub
}
api_fault api-500 '{"mode": "status", "code": 500}' down 12
fault api-500 "the agent stays alive and healthy; $API_ASKED publishing attempts in 12 s (back-off, gaps ms $API_GAPS); the change is published ${API_PUB} s after the API server answers"
api_fault api-429 '{"mode": "status", "code": 429, "retryAfterSeconds": 5}' up 16
ck "api-429: no publishing request sooner than Retry-After (5 s) after the last: gaps (ms) $API_GAPS" \
  sh -c "echo '$API_GAPS' | jq -e 'all(.[]; . >= 4900)'"
fault api-429 "the agent stays alive and healthy; $API_ASKED publishing attempts in 16 s, none sooner than Retry-After 5 s (gaps ms $API_GAPS); published ${API_PUB} s after the API server answers"
api_fault api-hang '{"mode": "hang"}' down 15
fault api-hang "the agent stays alive and /healthz answers while its requests hang; published ${API_PUB} s after the API server answers again"
ip link set eth1 up; wait_for 10 port_active rxe1
ck "after the API faults the checkpoint holds exactly claim-p and claim-r: $(ck_claims | jq -c keys)" checkpoint_ok "$UP" "$UR"
ck "pod-p and pod-r still run" sh -c "for p in pod-p pod-r; do erdma-fake-kubelet pod status --dir $KDIR --pod lab/\$p | jq -e '.state == \"CONTAINER_RUNNING\"' || exit 1; done"
runtime_clean
ck "after every pod is deleted no CDI spec of a claim is left: [$(ls $CDI | tr '\n' ' ')]" test "$(ls "$CDI" | grep -c claim_)" = 0
ck "after every pod is deleted the checkpoint holds no claim: $(ck_claims | jq -c keys)" checkpoint_ok
kill "$AGENT_PID" "$API_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null; wait "$API_PID" 2>/dev/null; AGENT_PID=
stop_daemons
rm -rf "$CDI"/*
finish
