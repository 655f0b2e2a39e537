{{/*
Names. Workload, Service, webhook and container names are fixed, as in
alibabacloud-erdma-controller (its templates write them literally or from its chart name), so that
`helm upgrade` of that release keeps the same objects. The top-level nameOverride and
fullnameOverride mean what they meant there: nameOverride is the `app.kubernetes.io/name` label
(part of the workloads' immutable selectors) and, with fullnameOverride, names the controller's
ServiceAccount. controller.nameOverride and agent.nameOverride were never read; they still are not.
*/}}
{{- define "erdma.appName" -}}{{ default "alibabacloud-erdma-controller" .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end }}
{{- define "erdma.controllerName" -}}alibabacloud-erdma-controller{{- end }}
{{- define "erdma.agentName" -}}alibabacloud-erdma-agent{{- end }}
{{/* The container name of both workloads: the original chart's name, which it used for both. */}}
{{- define "erdma.containerName" -}}alibabacloud-erdma-controller{{- end }}
{{/* The webhook entry and the path the original registered (erdma serves /mutating too). */}}
{{- define "erdma.webhookEntry" -}}alibabacloud-erdma-controller.mutating.k8s.io{{- end }}
{{- define "erdma.webhookPath" -}}/mutating{{- end }}

{{/* The original's "fullname": fullnameOverride, else <release>-<name> (the release alone when it contains the name). */}}
{{- define "erdma.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "erdma.appName" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The controller's ServiceAccount: the original's naming. */}}
{{- define "erdma.controllerServiceAccount" -}}
{{- include "erdma.refuseDefaultServiceAccount" . -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "erdma.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* The agent's ServiceAccount: its own when created (least privilege), else the shared one. */}}
{{- define "erdma.agentServiceAccount" -}}
{{- include "erdma.refuseDefaultServiceAccount" . -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-agent" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* The roles are never bound to a namespace's `default` ServiceAccount: every pod of the
namespace that names no account runs as it and would get them. */}}
{{- define "erdma.refuseDefaultServiceAccount" -}}
{{- $sa := .Values.serviceAccount -}}
{{- if or (eq $sa.name "default") (and (not $sa.create) (not $sa.name)) -}}
{{- fail (printf "serviceAccount.name %q: the controller's and agent's roles would be bound to the namespace's default ServiceAccount, which every pod there runs as unless it names another; set serviceAccount.create=true (one account each is created), or serviceAccount.name to an existing account of their own" ($sa.name | default "")) -}}
{{- end -}}
{{- end }}

{{/* The Secret holding credential.json: credentials.existingSecret, else the chart's. */}}
{{- define "erdma.credentialsSecret" -}}
{{- .Values.credentials.existingSecret | default .Release.Name -}}
{{- end }}

{{/* The controller runs for cloud provisioning, or to serve the webhook in local mode. */}}
{{- define "erdma.runsController" -}}
{{- if or (not .Values.config.localERIDiscovery) .Values.config.enableWebhook }}true{{ end -}}
{{- end }}

{{/* Selector labels (immutable on the workloads: the original's exactly). Argument: dict root, tier. */}}
{{- define "erdma.selectorLabels" -}}
app.kubernetes.io/name: {{ include "erdma.appName" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .tier }}
tier: {{ . }}
{{- end }}
{{- end }}

{{/* Labels of a workload's pods: podLabels, then the selector labels (which win). Argument: dict root, tier. */}}
{{- define "erdma.podLabels" -}}
{{- $sel := include "erdma.selectorLabels" . | fromYaml -}}
{{- merge $sel (.root.Values.podLabels | default dict) | toYaml -}}
{{- end }}

{{/* The kubelet's root directory, without a trailing slash. */}}
{{- define "erdma.kubeletRootDir" -}}
{{- $d := .Values.kubeletRootDir | default "/var/lib/kubelet" | trimSuffix "/" -}}
{{- if or (not (isAbs $d)) (contains "/../" (printf "%s/" $d)) (eq $d "") -}}
{{- fail (printf "kubeletRootDir %q must be an absolute directory (the kubelet's --root-dir, e.g. /var/lib/kubelet or /var/lib/k0s/kubelet)" .Values.kubeletRootDir) -}}
{{- end -}}
{{- $d -}}
{{- end }}

{{/* Labels of every object. Argument: dict root, tier ("" for none). */}}
{{- define "erdma.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "erdma.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{/*
An image reference. Argument: dict root, image (the values' image), component.
The original's images run the Go binaries, whose flags differ from erdma's: pairing them would
start pods that exit on unknown flags, so they are refused. Only the original's unchanged default
(repository registry.aliyuncs.com/erdma/<component>, or its regional or VPC mirror
registry[-vpc].<region>.aliyuncs.com/erdma/<component>, tag latest or empty), which a values file
copied from the original chart carries, is read as "the default" and replaced by erdma's image
(NOTES.txt says so).
*/}}
{{- define "erdma.image" -}}
{{- $img := .image -}}
{{- $tag := $img.tag | default .root.Chart.AppVersion -}}
{{- $repo := $img.repository -}}
{{- if regexMatch "(^|[./])aliyuncs\\.com/erdma/(agent|controller)$" $repo -}}
{{- if and (regexMatch (printf "^(registry|registry\\.[a-z0-9-]+|registry-vpc\\.[a-z0-9-]+)\\.aliyuncs\\.com/erdma/%s$" .component) $repo) (has ($img.tag | toString) (list "latest" "")) -}}
{{- $repo = printf "ghcr.io/erdma/erdma-%s" .component -}}
{{- $tag = .root.Chart.AppVersion -}}
{{- else -}}
{{- fail (printf "%s.image %s:%s is the original alibabacloud-erdma-controller's Go image: it does not understand erdma's flags, so pods would crash. Use erdma's image (default ghcr.io/erdma/erdma-%s, built from deploy/docker/%s.Dockerfile) or keep the original chart for the Go images." .component $repo $tag .component .component) -}}
{{- end -}}
{{- end -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end }}

{{/* Whether an image value is the original's default, replaced (for NOTES.txt). */}}
{{- define "erdma.replacedLegacyImage" -}}
{{- if regexMatch "(^|[./])aliyuncs\\.com/erdma/(agent|controller)$" .repository }}true{{ end -}}
{{- end }}

{{/*
The original's smcr_init image at its default tag (registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init
or a registry-vpc.<region>.aliyuncs.com mirror, tag latest or none), as a values file copied from
the original chart may carry it. Argument: the config.smcInitImage value.
*/}}
{{- define "erdma.originalSmcInitImage" -}}
{{- if regexMatch "^(registry\\.cn-hangzhou|registry-vpc\\.[a-z0-9-]+)\\.aliyuncs\\.com/erdma/smcr_init(:latest)?$" (toString .) }}true{{ end -}}
{{- end }}

{{/*
The smcr-init image the webhook injects (config.json's smcInitImage): config.smcInitImage, or
erdma's ghcr.io/erdma/smcr-init at the chart's appVersion when it is empty or the original's
default (which erdma's image replaces: same command, same SMCR_PNET).
*/}}
{{- define "erdma.smcInitImage" -}}
{{- $img := .Values.config.smcInitImage | default "" | toString -}}
{{- if or (not $img) (include "erdma.originalSmcInitImage" $img) -}}
{{- printf "ghcr.io/erdma/smcr-init:%s" .Chart.AppVersion -}}
{{- else -}}
{{- $img -}}
{{- end -}}
{{- end }}

{{/* The CRI socket directory mounted in pre-start mode; fails with the fix on a bad path. */}}
{{- define "erdma.criSocketDir" -}}
{{- $s := .Values.agent.criSocket -}}
{{- if not $s -}}
/run/containerd
{{- else -}}
{{- $dir := dir $s -}}
{{- if or (not (isAbs $s)) (contains ".." $s) (hasPrefix "unix:" $s) (has $dir (list "" "/" "." "/run" "/var/run" "/var")) -}}
{{- fail (printf "agent.criSocket %q must be an absolute socket path inside a directory of its own (e.g. /run/k3s/containerd/containerd.sock, /var/run/crio/crio.sock); that directory is mounted into the agent, and mounting all of /run would put the mount point of the agent's ServiceAccount token (/var/run/secrets) into the host's /run. For cri-dockerd, start it with --container-runtime-endpoint unix:///var/run/cri-dockerd/cri-dockerd.sock" $s) -}}
{{- end -}}
{{- $dir -}}
{{- end -}}
{{- end }}

{{/* Warnings (missing credentials), one per line; rendered into NOTES.txt. */}}
{{- define "erdma.warnings" -}}
{{- if or .Values.config.localERIDiscovery .Values.agent.filterClusterERIs }}
{{- range .Values.agent.exposedLocalERIs }}
{{- if eq (first (splitList " " (trim .))) "i-XXX" }}
WARNING: agent.exposedLocalERIs entry {{ . | quote }} is the original chart's placeholder: it matches no instance, so agents expose nothing. Use real instance IDs or i-* (e.g. "i-* erdma_0"), or set the list to [] to expose every device.
{{- end }}
{{- end }}
{{- end }}
{{- if not .Values.config.localERIDiscovery -}}
{{- $c := .Values.credentials -}}
{{- if and (not $c.existingSecret) (has $c.type (list "" "access_key")) (or (not $c.accessKeyID) (not $c.accessKeySecret)) }}
WARNING: credentials.type {{ $c.type | default "access_key" | quote }} needs credentials.accessKeyID and credentials.accessKeySecret, which are missing: the controller cannot create ERIs and agents serve nothing until they are set (or choose credentials.type ecs_ram_role, oidc_role_arn, ram_role_sts, or config.localERIDiscovery).
{{- end }}
{{- if and (eq $c.type "oidc_role_arn") (not (hasKey .Values.serviceAccount.annotations "pod-identity.alibabacloud.com/role-name")) }}
WARNING: credentials.type oidc_role_arn needs serviceAccount.annotations."pod-identity.alibabacloud.com/role-name" (the RAM role name), which is missing.
{{- end }}
{{- end -}}
{{- end }}
