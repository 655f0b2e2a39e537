#!/bin/sh
# smcr-prestart: the agent's SMC-R PreStartContainer hook finds pods through the real container
# runtime. The agent runs with --deviceplugin-prestart-container and --cri-socket pointing at the
# guest's containerd; the lab kubelet runs each pod's sandbox before Allocate/PreStartContainer,
# as the kubelet does. For every pre-start the agent goes device IDs -> pod (the kubelet's
# pod-resources) -> sandbox (CRI ListPodSandbox by the kubelet's labels, then verbose
# PodSandboxStatus: containerd's runtimeSpec network namespace path, host-network flag,
# annotations). pod-s (annotated erdma-smcr: "true", CNI network) must get a decision past the
# lookup (its netns path resolved: not "lookup_failed", not "host_network"), pod-t (no
# annotation) "not_requested", pod-h (annotated, host network) "host_network". This kernel
# (7.3) has no SMC, so pod-s's SMC-R itself is not configured here; the 6.12 runners test that.
# Would fail if: the agent could not reach the runtime or find the sandbox of a pod (label
# filter, ready state, pod identity), could not read the network namespace path from containerd's
# verbose status (lookup_failed), misread the host-network flag, or lost the pod's annotations.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet; need erdma-agent --cri-socket
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
start_agent --slots-per-device 2 --deviceplugin-prestart-container true --nri off --cri-socket "$CTRD_SOCK" \
  || { fail "$SCEN" "agent (pre-start, CRI) did not register"; exit 0; }
ANN=network.alibabacloud.com/erdma-smcr=true
cpod pod-s 1 --annotation "$ANN" > /dev/null || { fail "$SCEN" "pod-s did not start: $(tail -1 /tmp/pod-s.pod.err)"; exit 0; }
cpod pod-t 1 > /dev/null || { fail "$SCEN" "pod-t did not start: $(tail -1 /tmp/pod-t.pod.err)"; exit 0; }
cpod pod-h 1 --annotation "$ANN" --host-network > /dev/null || { fail "$SCEN" "pod-h did not start: $(tail -1 /tmp/pod-h.pod.err)"; exit 0; }
wget -qO /tmp/healthz.json http://127.0.0.1:9464/healthz || bad "the agent's /healthz did not answer"
cp /tmp/healthz.json "$OUT/$SCEN-healthz.json"
jq -c '.smcr[]' /tmp/healthz.json | sed 's/^/    decision: /'
decision() { jq -r --arg p "lab/$1" '[.smcr[] | select(.pod == $p)] | last | .outcome // "none"' /tmp/healthz.json; }
ck "no pre-start lookup failed ($(jq -r '[.smcr[] | select(.outcome == "lookup_failed") | .message] | join("; ")' /tmp/healthz.json))" \
  jq -e '[.smcr[] | select(.outcome == "lookup_failed")] | length == 0' /tmp/healthz.json
o=$(decision pod-s)
ck "pod-s (annotated, netns $(cpod_netns pod-s)): found through CRI with its netns, decided '$o'" \
  sh -c "case '$o' in configured|failed|unsupported) true ;; *) false ;; esac"
o=$(decision pod-t)
ck "pod-t (no annotation): found through CRI, decided '$o' (not_requested)" test "$o" = not_requested
o=$(decision pod-h)
ck "pod-h (annotated, host network): the runtime's NODE network mode was read, decided '$o' (host_network)" test "$o" = host_network
ck "the pods were pre-started before their containers were created (pre_start_called)" \
  sh -c "jq -e '.allocation.pre_start_called' /tmp/pod-s.pod.json && jq -e '.allocation.pre_start_called' /tmp/pod-h.pod.json"
finish
