#!/bin/sh
# chart-webhook: the controller as operators deploy it, with its webhook, and the pod it changes.
# The chart rendered for deploy/helm/ci/values/lab-webhook.yaml (local discovery with the webhook:
# the controller serves only the webhook) is loaded into the lab's API server (HTTPS, a token per
# ServiceAccount, the chart's RBAC enforced), as after `helm install`. The lab kubelet runs the
# controller's Deployment pod from the controller image (pod network, its ConfigMap volume, the
# service account projected as a kubelet does, non-root, read-only root file system, its
# readiness probe) and the agent's DaemonSet pod (with its service account now: node labels,
# condition and Events go to the API server). Then the API server's admission step: a pod
# annotated network.alibabacloud.com/erdma-smcr: "true" is sent to the webhook the
# MutatingWebhookConfiguration names (TLS checked against the caBundle the controller wrote into
# it), and the lab kubelet runs the pod as changed: the smcr-init init container from the smcr-init
# image, with its device, to completion (on 7.3 the kernel has no SMC: it says so and exits 0, and
# the pod starts on TCP), then the app container. A pod without the annotation is left as it was.
# Issue 45: the injected smcr-init is unprivileged (`smcr_init verify`: the agent configured the
# pod's namespace at PreStartContainer before it started; it reports what it finds), so pod-b in
# a namespace labelled pod-security.kubernetes.io/enforce: baseline (the lab API server's Pod
# Security admission, after the webhooks) is admitted and runs, and the agent decided SMC-R for
# it (7.3: unsupported); the original's privileged smcr-init is refused there. pod-h
# (hostNetwork, annotated) is left without an init container, with the webhook's warning, and the
# controller logs the SmcrSkippedHostNetwork Event it writes.
# Would fail if: the controller image does not start as the chart runs it (non-root 65532,
# read-only root, no capabilities), the chart's ConfigMap, service account or RBAC does not let it
# serve and publish its webhook certificate, its readiness probe is wrong, the webhook's Service or
# caBundle does not match what the controller serves, the webhook does not inject smcr-init with
# the chart's default smcr-init image (or injects it into a pod without the annotation), the
# smcr-init image cannot run as injected, the injected container is privileged or adds a
# capability (baseline refuses pod-b), the agent does not act for a webhook pod, or the webhook
# changes a hostNetwork pod.
. /mnt/host/guest/lib.sh
need erdma-fake-kubelet
erdma-fake-kubelet --help 2>&1 | grep -qw admit || { skip "$SCEN" "erdma-fake-kubelet has no admit yet"; exit 0; }
CHARTW=/mnt/host/chart/lab-webhook.json
SA=/var/lib/erdma-lab/serviceaccounts
KC=/tmp/lab-apiserver.kubeconfig
APISERVER=$NODE_IP_LAB:6443
CTRL_POD=kube-system/alibabacloud-erdma-controller-lab
runtime_up || { fail "$SCEN" "the container runtime did not start (see out/containerd.log)"; exit 0; }
chart_node
for i in erdma-controller erdma-agent smcr-init; do
  import_image "$i" || { fail "$SCEN" "image import of $i failed: $(tail -1 /tmp/import-$i.out)"; exit 0; }
done
rm -rf "$SA" "$KC"
cat > /tmp/ns-baseline.json <<'EOF2'
{"objects": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lab-baseline",
  "labels": {"kubernetes.io/metadata.name": "lab-baseline", "pod-security.kubernetes.io/enforce": "baseline"}}}]}
EOF2
erdma-fake-kubelet apiserver --listen "$APISERVER" --tls --service-account-dir "$SA" --objects "$CHARTW" --objects /tmp/ns-baseline.json \
  --enforce-rbac --node "$NODE_NAME_LAB" --kubeconfig "$KC" > "$LOGS/$SCEN-apiserver.log" 2>&1 &
wait_for 30 test -s "$KC" || { fail "$SCEN" "the lab API server did not start: $(tail -1 "$LOGS/$SCEN-apiserver.log")"; exit 0; }
start_kubelet || { fail "$SCEN" "fake kubelet did not start"; exit 0; }
API="--api-server $APISERVER --service-account-dir $SA --kubeconfig $KC"

# shellcheck disable=SC2086
erdma-fake-kubelet pod run --dir "$KDIR" --manifest "$CHARTW" --object Deployment/alibabacloud-erdma-controller \
  --pod "$CTRL_POD" --node-name "$NODE_NAME_LAB" --node-ip "$NODE_IP_LAB" $API > /tmp/ctrl.pod.json 2> /tmp/ctrl.pod.err
crc=$?
CTRL_CONTAINER=$(jq -r '.objects[] | select(.kind == "Deployment") | .spec.template.spec.containers[0].name' "$CHARTW")
pod_log "$CTRL_POD" "$CTRL_CONTAINER" "$OUT/$SCEN-controller-container.log"
if [ $crc != 0 ]; then fail "$SCEN" "the chart's controller pod did not become ready: $(tail -1 /tmp/ctrl.pod.err)"; exit 0; fi
CIP=$(jq -r '.ip // empty' /tmp/ctrl.pod.json)
CCID=$(jq -r .container_id /tmp/ctrl.pod.json)
CPID=$(ctr_pid "$CCID")
log "controller pod: $(jq -c '{ip, ready, ready_after_ms, notes}' /tmp/ctrl.pod.json)"
ck "the controller pod is ready by its readiness probe after $(jq -r '.ready_after_ms // "?"' /tmp/ctrl.pod.json) ms, on the pod network ($CIP)" \
  sh -c "jq -e '.ready == true' /tmp/ctrl.pod.json && test -n '$CIP'"
ck "the controller runs as UID 65532 with no capabilities (the chart's securityContext), PID ${CPID:-none}" \
  sh -c "test -n '$CPID' && grep -qE '^Uid:[[:space:]]+65532[[:space:]]' /proc/$CPID/status && grep -qE '^CapEff:[[:space:]]+0+$' /proc/$CPID/status"
ck "its config is the chart's ConfigMap and its service account token is projected" \
  sh -c "grep -q smcInitImage /proc/$CPID/root/etc/erdma-controller/config.json && test -s /proc/$CPID/root/var/run/secrets/kubernetes.io/serviceaccount/token && test -s /proc/$CPID/root/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

# shellcheck disable=SC2086
erdma-fake-kubelet pod run --dir "$KDIR" --manifest "$CHARTW" --object DaemonSet/alibabacloud-erdma-agent \
  --pod "$AGENT_POD" --node-name "$NODE_NAME_LAB" --node-ip "$NODE_IP_LAB" $API > /tmp/agent.pod.json 2> /tmp/agent.pod.err \
  || { chart_agent_logs; fail "$SCEN" "the chart's agent pod did not become ready: $(tail -1 /tmp/agent.pod.err)"; exit 0; }
AGENT_CID=$(jq -r .container_id /tmp/agent.pod.json)
wait_for 60 registered || { chart_agent_logs; fail "$SCEN" "the agent pod is ready but did not register"; exit 0; }
ck "the agent pod (with its service account) registered aliyun/erdma" registered

cat > /tmp/pod-s.yaml <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: pod-s
  namespace: lab
  annotations:
    network.alibabacloud.com/erdma-smcr: "true"
spec:
  automountServiceAccountToken: false
  containers:
    - name: app
      image: lab.local/rdma-tools:1
      imagePullPolicy: IfNotPresent
      command: ["sleep", "3600"]
      resources:
        limits:
          aliyun/erdma: "1"
EOF
sed -e 's/name: pod-s/name: pod-p/' -e '/annotations:/d' -e '/erdma-smcr/d' /tmp/pod-s.yaml > /tmp/pod-p.yaml
EP="kube-system/alibabacloud-erdma-controller=$CIP:9443"
erdma-fake-kubelet admit --kubeconfig "$KC" --manifest /tmp/pod-s.yaml --endpoint "$EP" -o /tmp/pod-s.admitted.json \
  > /tmp/admit-s.out 2>&1; arc=$?
cat /tmp/admit-s.out
SMC_IMAGE=$(jq -r '.objects[] | select(.kind == "ConfigMap") | .data["config.json"] | fromjson | .smcInitImage' "$CHARTW")
ck "the webhook (TLS checked against the caBundle the controller published) injected smcr-init with the chart's image $SMC_IMAGE" \
  sh -c "test $arc = 0 && jq -e --arg i '$SMC_IMAGE' '.spec.initContainers | length == 1 and .[0].image == \$i and .[0].command == [\"/usr/local/bin/smcr_init\"]' /tmp/pod-s.admitted.json"
erdma-fake-kubelet admit --kubeconfig "$KC" --manifest /tmp/pod-p.yaml --endpoint "$EP" -o /tmp/pod-p.admitted.json \
  > /tmp/admit-p.out 2>&1; prc=$?
ck "a pod without the annotation is left without an init container" \
  sh -c "test $prc = 0 && jq -e '(.spec.initContainers // []) | length == 0' /tmp/pod-p.admitted.json"

erdma-fake-kubelet pod run --dir "$KDIR" --manifest /tmp/pod-s.admitted.json --node-name "$NODE_NAME_LAB" \
  --node-ip "$NODE_IP_LAB" > /tmp/pod-s.pod.json 2> /tmp/pod-s.pod.err; src=$?
pod_log lab/pod-s smcr-init "$OUT/$SCEN-smcr-init.log"
log "pod-s: $(jq -c '{init_containers: [.init_containers[]? | {name, exit_code}], allocation: .allocation.device_ids}' /tmp/pod-s.pod.json 2>/dev/null)"
ck "pod-s ran: the smcr-init init container from $SMC_IMAGE completed with exit 0, then its app container started (rc $src: $(tail -1 /tmp/pod-s.pod.err))" \
  sh -c "test $src = 0 && jq -e '[.init_containers[] | select(.exit_code == 0)] | length == 1' /tmp/pod-s.pod.json"
ck "smcr_init said what it did on this kernel (7.3 has no SMC: the pod starts on TCP): $(grep -ioE 'SMC unsupported[^"]*|configured[^"]*' "$OUT/$SCEN-smcr-init.log" 2>/dev/null | head -1)" \
  grep -qiE "unsupported|configured" "$OUT/$SCEN-smcr-init.log"
SEEN_S=$(cx pod-s ls /dev/infiniband 2>&1 | tr '\n' ' ')
ck "pod-s's app container holds its device ($(jq -r '.allocation.device_ids | join(" ")' /tmp/pod-s.pod.json 2>/dev/null)): /dev/infiniband [$SEEN_S]" \
  sh -c "echo '$SEEN_S' | grep -q uverbs"

ck "the injected smcr-init is unprivileged (no privileged, no added capability, runs as non-root)" \
  jq -e '.spec.initContainers[0].securityContext | .privileged != true and (.capabilities.add // [] | length == 0) and .runAsNonRoot == true' /tmp/pod-s.admitted.json

# A hostNetwork pod asking for SMC-R: left alone, with the webhook's warning.
sed -e 's/name: pod-s/name: pod-h/' -e 's/^spec:$/spec:\n  hostNetwork: true/' /tmp/pod-s.yaml > /tmp/pod-h.yaml
erdma-fake-kubelet admit --kubeconfig "$KC" --manifest /tmp/pod-h.yaml --endpoint "$EP" -o /tmp/pod-h.admitted.json \
  > /tmp/admit-h.out 2>&1; hrc=$?
cat /tmp/admit-h.out
ck "a hostNetwork pod with the annotation is left without an init container, with the webhook's warning" \
  sh -c "test $hrc = 0 && jq -e '.spec.hostNetwork == true and ((.spec.initContainers // []) | length == 0)' /tmp/pod-h.admitted.json && grep -q 'uses hostNetwork: SMC-R is not configured' /tmp/admit-h.out"

# Pod Security baseline: the webhook's pod is admitted and runs; the original's privileged one is not.
sed -e 's/name: pod-s/name: pod-b/' -e 's/namespace: lab$/namespace: lab-baseline/' /tmp/pod-s.yaml > /tmp/pod-b.yaml
erdma-fake-kubelet admit --kubeconfig "$KC" --manifest /tmp/pod-b.yaml --endpoint "$EP" -o /tmp/pod-b.admitted.json \
  > /tmp/admit-b.out 2>&1; brc=$?
cat /tmp/admit-b.out
ck "pod-b with smcr-init injected is admitted in the namespace labelled pod-security.kubernetes.io/enforce: baseline" \
  sh -c "test $brc = 0 && jq -e '.spec.initContainers | length == 1' /tmp/pod-b.admitted.json"
jq '.spec.initContainers[0].securityContext = {"privileged": true} | .metadata.name = "pod-x"' /tmp/pod-b.admitted.json > /tmp/pod-x.json
erdma-fake-kubelet admit --kubeconfig "$KC" --manifest /tmp/pod-x.json --endpoint "$EP" -o /tmp/pod-x.admitted.json \
  > /tmp/admit-x.out 2>&1; xrc=$?
ck "the original's privileged smcr-init is refused there: $(grep -o 'violates PodSecurity[^.]*' /tmp/admit-x.out | head -1)" \
  sh -c "test $xrc != 0 && grep -q 'violates PodSecurity' /tmp/admit-x.out"
erdma-fake-kubelet pod run --dir "$KDIR" --manifest /tmp/pod-b.admitted.json --node-name "$NODE_NAME_LAB" \
  --node-ip "$NODE_IP_LAB" > /tmp/pod-b.pod.json 2> /tmp/pod-b.pod.err; bsrc=$?
pod_log lab-baseline/pod-b smcr-init "$OUT/$SCEN-smcr-init-baseline.log"
ck "pod-b ran: smcr_init verify completed with exit 0 as UID 65532 ($(grep -oE 'SMC[^"]*' "$OUT/$SCEN-smcr-init-baseline.log" | head -1))" \
  sh -c "test $bsrc = 0 && jq -e '[.init_containers[] | select(.exit_code == 0)] | length == 1' /tmp/pod-b.pod.json"
APORT=$(jq -r '.objects[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].ports[]? | select(.name == "metrics" or .name == "http") | .containerPort' "$CHARTW" | head -1)
wget -qO /tmp/healthz.json "http://127.0.0.1:${APORT:-9101}/healthz" || true
cp /tmp/healthz.json "$OUT/$SCEN-healthz.json" 2>/dev/null
ck "the agent configured SMC-R for pod-b itself (its decision: $(jq -r '[.smcr[]? | select(.pod == "lab-baseline/pod-b")] | last | .outcome // "none"' /tmp/healthz.json 2>/dev/null))" \
  jq -e '[.smcr[]? | select(.pod == "lab-baseline/pod-b" and .outcome != "lookup_failed")] | length > 0' /tmp/healthz.json
pod_log "$CTRL_POD" "$CTRL_CONTAINER" "$OUT/$SCEN-controller-container.log"
ck "the controller wrote the SmcrSkippedHostNetwork Event for pod-h" \
  sh -c "grep -q SmcrSkippedHostNetwork '$OUT/$SCEN-controller-container.log' && ! grep -q 'Event was not written' '$OUT/$SCEN-controller-container.log'"

erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab-baseline/pod-b > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-s > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod "$AGENT_POD" > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod "$CTRL_POD" > /dev/null 2>&1
finish
