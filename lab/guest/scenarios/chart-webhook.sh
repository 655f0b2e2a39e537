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
# Would fail if: the controller image does not start as the chart runs it (non-root 65532,
# read-only root, no capabilities), the chart's ConfigMap, service account or RBAC does not let it
# serve and publish its webhook certificate, its readiness probe is wrong, the webhook's Service or
# caBundle does not match what the controller serves, the webhook does not inject smcr-init with
# the chart's default smcr-init image (or injects it into a pod without the annotation), or the
# smcr-init image cannot run as injected.
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
erdma-fake-kubelet apiserver --listen "$APISERVER" --tls --service-account-dir "$SA" --objects "$CHARTW" \
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

erdma-fake-kubelet pod delete --dir "$KDIR" --pod lab/pod-s > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod "$AGENT_POD" > /dev/null 2>&1
erdma-fake-kubelet pod delete --dir "$KDIR" --pod "$CTRL_POD" > /dev/null 2>&1
finish
