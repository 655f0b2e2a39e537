//! Install manifests, rendered from typed k8s-openapi structs: the same objects as the Helm chart
//! in `deploy/helm` (the chart is the reference; `tests/chart.rs` compares both for every values
//! file of the chart's CI matrix). [`Values`] is the chart's values (the original
//! alibabacloud-erdma-controller chart's keys, plus erdma's additions); [`render`] returns every
//! object in apply order; [`apply`] server-side-applies them (and says when the API server
//! dropped the DeviceClass's `extendedResourceName`); [`delete`] removes them.
//!
//! Object names: the workloads, the webhook Service and configuration keep the original chart's
//! fixed names (`alibabacloud-erdma-agent`, `alibabacloud-erdma-controller`) and selectors, so an
//! upgrade of the original's release keeps them; per-release objects (ConfigMap, Secret, RBAC,
//! ServiceAccounts) are named after the release ([`Values::name`], default
//! `alibaba-erdma-controller`, the original's release name).

use crate::Error;
use crate::crd::ERdmaDevice;
use crate::labels::{ANNOTATION_RRSA_ROLE, ANNOTATION_SMCR};
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, LocalObjectReference, Namespace,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    Secret, SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

mod agent;
mod cluster;
mod contract;
mod controller;
mod existing;
mod node_scope;
mod rules;
mod values;

pub use agent::*;
pub use cluster::*;
pub use contract::*;
use controller::*;
pub use existing::*;
pub use node_scope::*;
pub use rules::*;
pub use values::*;

/// The erdma release these manifests install; image tags default to it (the chart's appVersion).
pub const APP_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `app.kubernetes.io/name` of every object (the original chart's name; part of the selectors).
pub const APP_NAME: &str = "alibabacloud-erdma-controller";

/// Name of the controller Deployment, its webhook Service and the webhook configuration (fixed,
/// as in the original chart, and the controller's `controllerName`).
pub const CONTROLLER_NAME: &str = "alibabacloud-erdma-controller";

/// Name of the agent DaemonSet (fixed, as in the original chart).
pub const AGENT_NAME: &str = "alibabacloud-erdma-agent";

/// The container name of both workloads: the original chart's name, which it gave both (so
/// `kubectl logs -c alibabacloud-erdma-controller` keeps working).
pub const CONTAINER_NAME: &str = "alibabacloud-erdma-controller";

/// The webhook entry's name and service path, the original's: an upgrade keeps the entry with
/// its `caBundle`, and old and new controller pods both serve the path during the rollout.
pub const WEBHOOK_ENTRY: &str = "alibabacloud-erdma-controller.mutating.k8s.io";
/// See [`WEBHOOK_ENTRY`].
pub const WEBHOOK_PATH: &str = "/mutating";

/// Default release name (the original chart's README's).
pub const DEFAULT_RELEASE: &str = "alibaba-erdma-controller";

/// erdma's image repositories (built from `deploy/docker`).
pub const AGENT_IMAGE: &str = "ghcr.io/erdma/erdma-agent";
/// erdma's controller image repository.
pub const CONTROLLER_IMAGE: &str = "ghcr.io/erdma/erdma-controller";
/// erdma's `smcr-init` image repository (the init container the webhook injects; tag
/// [`APP_VERSION`], as the controller's own default).
pub const SMC_INIT_IMAGE: &str = "ghcr.io/erdma/smcr-init";

fn non_empty_or(s: &str, default: &str) -> String {
    if s.is_empty() {
        default.into()
    } else {
        s.into()
    }
}

fn trunc63(s: &str) -> String {
    let cut: String = s.chars().take(63).collect();
    cut.trim_end_matches('-').to_string()
}

fn selector(v: &Values, tier: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), v.app_name()),
        ("app.kubernetes.io/instance".to_string(), v.name.clone()),
    ]);
    if !tier.is_empty() {
        m.insert("tier".into(), tier.into());
    }
    m
}

fn labels(v: &Values, tier: &str) -> BTreeMap<String, String> {
    let mut m = selector(v, tier);
    m.insert("app.kubernetes.io/version".into(), APP_VERSION.into());
    m.insert("app.kubernetes.io/managed-by".into(), "erdmactl".into());
    m
}

fn meta(name: &str, namespace: Option<&str>, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels),
        ..Default::default()
    }
}

fn to_value<T: Serialize>(t: &T) -> Result<Value, Error> {
    serde_json::to_value(t).map_err(|e| Error::Serialize(e.to_string()))
}

fn host_path(name: &str, path: &str, kind: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(kind.into()),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The name of the webhook certificate's Secret (rendered empty; the controller fills it).
pub fn webhook_cert_secret_name() -> String {
    format!("{CONTROLLER_NAME}-webhook-tls")
}

/// The controller's `config.json`.
pub fn config_json(v: &Values) -> Result<String, Error> {
    let c = &v.config;
    let j = serde_json::json!({
        "region": c.region, "vpcId": c.vpc_id, "manageNonOwnedENIs": c.manage_non_owned_enis,
        "controllerNamespace": v.namespace, "controllerName": CONTROLLER_NAME,
        "clusterDomain": if c.cluster_domain.is_empty() { "cluster.local" } else { c.cluster_domain.as_str() },
        "certDir": "/var/lib/certDir", "enableDevicePlugin": c.enable_device_plugin, "enableWebhook": c.enable_webhook,
        "smcInitImage": c.smc_init_image_ref(), "enableInitContainerInject": c.enable_init_container_inject,
        "localERIDiscovery": c.local_eri_discovery, "nodeSelector": v.node_selector,
    });
    serde_json::to_string_pretty(&j).map_err(|e| Error::Serialize(e.to_string()))
}

/// Every manifest, in apply order, as JSON values of typed objects, for an unknown cluster (as
/// `helm template` renders: [`Cluster::offline`]).
pub fn render(v: &Values) -> Result<Vec<Value>, Error> {
    render_for(v, &Cluster::offline())
}

/// Every manifest for `cluster`, in apply order, as JSON values of typed objects.
pub fn render_for(v: &Values, cluster: &Cluster) -> Result<Vec<Value>, Error> {
    v.validate()?;
    let ns = v.namespace.as_str();
    let mut out: Vec<Value> = Vec::new();
    if !matches!(ns, "kube-system" | "default") {
        out.push(to_value(&Namespace {
            metadata: meta(ns, None, labels(v, "")),
            ..Default::default()
        })?);
    }
    let mut crd = ERdmaDevice::crd();
    crd.metadata.labels = Some(labels(v, ""));
    // `helm uninstall` keeps the CRD (and every ERdmaDevice); `erdmactl uninstall --include-crd`.
    crd.metadata.annotations = Some(BTreeMap::from([(
        "helm.sh/resource-policy".to_string(),
        "keep".to_string(),
    )]));
    out.push(to_value(&crd)?);
    let bind = |sa: &str| Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    if v.service_account.create {
        if v.runs_controller() {
            let mut sa = ServiceAccount {
                metadata: meta(&v.controller_sa(), Some(ns), labels(v, "controller")),
                ..Default::default()
            };
            if !v.service_account.annotations.is_empty() {
                sa.metadata.annotations = Some(v.service_account.annotations.clone());
            }
            out.push(to_value(&sa)?);
        }
        out.push(to_value(&ServiceAccount {
            metadata: meta(&v.agent_sa(), Some(ns), labels(v, "agent")),
            ..Default::default()
        })?);
    }
    if v.runs_controller() {
        out.push(to_value(&ConfigMap {
            metadata: meta(&v.name, Some(ns), labels(v, "controller")),
            data: Some(BTreeMap::from([(
                "config.json".to_string(),
                config_json(v)?,
            )])),
            ..Default::default()
        })?);
    }
    if !v.config.local_eri_discovery && v.credentials.existing_secret.is_empty() {
        let cred = serde_json::json!({"type": v.credentials.kind, "accessKeyID": v.credentials.access_key_id,
            "accessKeySecret": v.credentials.access_key_secret});
        out.push(to_value(&Secret {
            metadata: meta(&v.name, Some(ns), labels(v, "controller")),
            type_: Some("Opaque".into()),
            string_data: Some(BTreeMap::from([(
                "credential.json".to_string(),
                cred.to_string(),
            )])),
            ..Default::default()
        })?);
    }
    if v.runs_controller() {
        // Empty: the controller writes the webhook certificate into it (it cannot create
        // Secrets); no data here, so applying again keeps what the controller wrote.
        out.push(to_value(&Secret {
            metadata: meta(
                &webhook_cert_secret_name(),
                Some(ns),
                labels(v, "controller"),
            ),
            type_: Some("Opaque".into()),
            ..Default::default()
        })?);
    }
    if v.runs_controller() {
        let sa = v.controller_sa();
        out.push(to_value(&ClusterRole {
            metadata: meta(&v.name, None, labels(v, "controller")),
            rules: Some(controller_cluster_rules()),
            ..Default::default()
        })?);
        out.push(to_value(&ClusterRoleBinding {
            metadata: meta(&v.name, None, labels(v, "controller")),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: v.name.clone(),
            },
            subjects: Some(vec![bind(&sa)]),
        })?);
        out.push(to_value(&Role {
            metadata: meta(&v.name, Some(ns), labels(v, "controller")),
            rules: Some(controller_namespace_rules()),
        })?);
        out.push(to_value(&RoleBinding {
            metadata: meta(&v.name, Some(ns), labels(v, "controller")),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: v.name.clone(),
            },
            subjects: Some(vec![bind(&sa)]),
        })?);
        if v.credentials.kind == "ram_role_sts" {
            let name = format!("{}-sts-token", v.name);
            out.push(to_value(&Role {
                metadata: meta(&name, Some("kube-system"), labels(v, "controller")),
                rules: Some(vec![rule(
                    &[""],
                    &["secrets"],
                    &["get"],
                    &["addon.network.token"],
                )]),
            })?);
            out.push(to_value(&RoleBinding {
                metadata: meta(&name, Some("kube-system"), labels(v, "controller")),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name,
                },
                subjects: Some(vec![bind(&sa)]),
            })?);
        }
    }
    let agent_rbac = v.agent_rbac();
    let mut agent_rules = agent_cluster_rules();
    if v.dra.enabled {
        agent_rules.extend(agent_dra_rules());
    }
    out.push(to_value(&ClusterRole {
        metadata: meta(&agent_rbac, None, labels(v, "agent")),
        rules: Some(agent_rules),
        ..Default::default()
    })?);
    out.push(to_value(&ClusterRoleBinding {
        metadata: meta(&agent_rbac, None, labels(v, "agent")),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: agent_rbac.clone(),
        },
        subjects: Some(vec![bind(&v.agent_sa())]),
    })?);
    if v.dra.enabled {
        out.push(to_value(&dra_device_class(v))?);
    }
    if renders_node_scope(v, cluster) {
        // Before the agents start writing.
        out.push(to_value(&node_scope_policy(v))?);
        out.push(to_value(&node_scope_binding(v))?);
    }
    if v.runs_controller() {
        out.push(to_value(&controller_deployment(v)?)?);
        if v.controller.replica_count > 1 {
            out.push(to_value(&controller_disruption_budget(v))?);
        }
        // Headless, as the original's (clusterIP cannot change on upgrade); port name and target
        // as the original's; selects controller pods only (the original's also matched agents).
        out.push(to_value(&Service {
            metadata: meta(CONTROLLER_NAME, Some(ns), labels(v, "controller")),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                selector: Some(selector(v, "controller")),
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    target_port: Some(IntOrString::String("webhook".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })?);
        out.push(to_value(&Service {
            metadata: meta(
                &format!("{CONTROLLER_NAME}-metrics"),
                Some(ns),
                labels(v, "controller"),
            ),
            spec: Some(ServiceSpec {
                selector: Some(selector(v, "controller")),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 8080,
                    target_port: Some(IntOrString::Int(8080)),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })?);
    }
    out.push(to_value(&agent_daemonset(v, cluster)?)?);
    out.push(to_value(&Service {
        metadata: meta(
            &format!("{AGENT_NAME}-metrics"),
            Some(ns),
            labels(v, "agent"),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector(v, "agent")),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: v.agent.metrics_port,
                target_port: Some(IntOrString::Int(v.agent.metrics_port)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })?);
    if v.config.enable_webhook {
        out.push(to_value(&MutatingWebhookConfiguration {
            metadata: meta(CONTROLLER_NAME, None, labels(v, "controller")),
            webhooks: Some(vec![MutatingWebhook {
                name: WEBHOOK_ENTRY.into(),
                admission_review_versions: vec!["v1".into(), "v1beta1".into()],
                client_config: WebhookClientConfig {
                    service: Some(ServiceReference {
                        name: CONTROLLER_NAME.into(),
                        namespace: ns.into(),
                        path: Some(WEBHOOK_PATH.into()),
                        port: Some(443),
                    }),
                    ..Default::default()
                },
                failure_policy: Some(v.webhook_failure_policy.clone()),
                side_effects: "None".into(),
                timeout_seconds: Some(v.webhook_timeout_seconds.min(WEBHOOK_TIMEOUT_MAX)),
                reinvocation_policy: Some("Never".into()),
                namespace_selector: Some(webhook_namespaces(ns)),
                match_conditions: Some(vec![MatchCondition {
                    name: "erdma-smcr-annotation".into(),
                    expression: format!(
                        "has(object.metadata.annotations) && '{ANNOTATION_SMCR}' in object.metadata.annotations"
                    ),
                }]),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into()]),
                    resources: Some(vec!["pods".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                ..Default::default()
            }]),
        })?);
    }
    let sm = &v.service_monitor;
    if sm.enabled && (sm.trust_crds_exist || cluster.serves(SERVICE_MONITOR)) {
        out.push(service_monitor(v, "agent"));
        if v.runs_controller() {
            out.push(service_monitor(v, "controller"));
        }
    }
    Ok(out)
}

/// A Prometheus Operator ServiceMonitor for a tier's metrics Service (not a k8s-openapi type:
/// written as JSON in the CRD's `monitoring.coreos.com/v1` shape).
fn service_monitor(v: &Values, tier: &str) -> Value {
    let (name, port) = if tier == "agent" {
        (AGENT_NAME, "metrics")
    } else {
        (CONTROLLER_NAME, "http")
    };
    let mut labels = labels(v, tier);
    labels.extend(v.service_monitor.labels.clone());
    let mut endpoint = serde_json::json!({
        "port": port,
        "path": "/metrics",
        "interval": v.service_monitor.interval,
    });
    if tier == "agent" {
        endpoint["relabelings"] = serde_json::json!([
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
        ]);
    }
    serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "namespace": v.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector(v, tier)},
            "namespaceSelector": {"matchNames": [v.namespace]},
            "endpoints": [endpoint],
        },
    })
}

fn non_empty<T: Clone>(v: &[T]) -> Option<Vec<T>> {
    (!v.is_empty()).then(|| v.to_vec())
}

fn non_empty_map(m: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!m.is_empty()).then(|| m.clone())
}

/// `affinity: {}` in a values file means none (Helm's `with` skips an empty map).
fn some_affinity(a: &Option<Affinity>) -> Option<Affinity> {
    a.clone().filter(|a| *a != Affinity::default())
}

/// `with` in a template: an absent or empty object renders nothing.
fn some_nonempty<T: Default + PartialEq + Clone>(o: &Option<T>) -> Option<T> {
    o.clone().filter(|x| *x != T::default())
}

/// `--log-format` and `--log-level` where they differ from the binaries' defaults.
fn log_args(v: &Values) -> Vec<String> {
    let mut out = Vec::new();
    if v.log_format != "text" {
        out.push(format!("--log-format={}", v.log_format));
    }
    if v.log_level != "info" {
        out.push(format!("--log-level={}", v.log_level));
    }
    out
}

/// Pod labels: `podLabels`, then the selector labels (which win).
fn pod_meta(v: &Values, tier: &str) -> ObjectMeta {
    let mut labels = v.pod_labels.clone();
    labels.extend(selector(v, tier));
    ObjectMeta {
        labels: Some(labels),
        annotations: non_empty_map(&v.pod_annotations),
        ..Default::default()
    }
}

/// Renders as a `---`-joined YAML stream (for an unknown cluster, see [`render`]).
pub fn render_yaml(v: &Values) -> Result<String, Error> {
    render_yaml_for(v, &Cluster::offline())
}

/// Renders for `cluster` as a `---`-joined YAML stream.
pub fn render_yaml_for(v: &Values, cluster: &Cluster) -> Result<String, Error> {
    crate::yaml::to_yaml_stream(&render_for(v, cluster)?)
}

/// Renders as a JSON `List` (for an unknown cluster, see [`render`]).
pub fn render_json(v: &Values) -> Result<String, Error> {
    render_json_for(v, &Cluster::offline())
}

/// Renders for `cluster` as a JSON `List`.
pub fn render_json_for(v: &Values, cluster: &Cluster) -> Result<String, Error> {
    let list =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": render_for(v, cluster)?});
    serde_json::to_string_pretty(&list).map_err(|e| Error::Serialize(e.to_string()))
}

/// The dynamic API of one rendered object, found through discovery.
async fn api_for(
    client: &kube::Client,
    v: &Values,
    obj: &Value,
) -> Result<(kube::Api<kube::api::DynamicObject>, String, String), Error> {
    use kube::api::{Api, DynamicObject};
    use kube::discovery::{self, Scope};
    let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, &kind);
    let (ar, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| Error::Kube {
            what: format!("discover {api_version} {kind}"),
            source,
        })?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or(&v.namespace),
            &ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    Ok((api, kind, name))
}

/// What [`delete`] did to one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted (`kind/name`).
    Deleted(String),
    /// Not there (`kind/name`).
    Absent(String),
    /// Kept on purpose (the CRD without `include_crd`).
    Kept(String),
}

/// Deletes exactly the objects [`render_for`] produces for `v` and the cluster (the ones
/// `install` created), in reverse apply order. The CRD (and with it every ERdmaDevice) only
/// with `include_crd`; a Namespace is never deleted.
pub async fn delete(
    client: &kube::Client,
    v: &Values,
    include_crd: bool,
) -> Result<Vec<Deleted>, Error> {
    use kube::api::DeleteParams;
    let cluster = Cluster::discover(client).await?;
    let mut done = Vec::new();
    for obj in render_for(v, &cluster)?.iter().rev() {
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let id = format!("{kind}/{name}");
        if kind == "Namespace" || (kind == "CustomResourceDefinition" && !include_crd) {
            done.push(Deleted::Kept(id));
            continue;
        }
        let (api, _, _) = api_for(client, v, obj).await?;
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => done.push(Deleted::Deleted(id)),
            Err(kube::Error::Api(e)) if e.code == 404 => done.push(Deleted::Absent(id)),
            Err(source) => {
                return Err(Error::Kube {
                    what: format!("delete {id}"),
                    source,
                });
            }
        }
    }
    Ok(done)
}

/// Server-side-applies every manifest rendered for the cluster `client` talks to
/// ([`Cluster::discover`]; field manager `erdmactl`, forced) in order; returns `kind/name` of each
/// applied object.
pub async fn apply(client: &kube::Client, v: &Values) -> Result<Vec<String>, Error> {
    use kube::api::{Patch, PatchParams};
    let cluster = Cluster::discover(client).await?;
    let mut done = Vec::new();
    for obj in render_for(v, &cluster)? {
        let (api, kind, name) = api_for(client, v, &obj).await?;
        let stored = api
            .patch(
                &name,
                &PatchParams::apply("erdmactl").force(),
                &Patch::Apply(&obj),
            )
            .await
            .map_err(|source| Error::Kube {
                what: format!("apply {kind}/{name}"),
                source,
            })?;
        let mut line = format!("{kind}/{name}");
        // The answer is the stored object: an API server with DRAExtendedResource off drops the
        // DeviceClass's extendedResourceName and stores the rest.
        let dropped = |p: &str| {
            obj.pointer(p).is_some_and(|x| !x.is_null())
                && stored.data.pointer(p).is_none_or(Value::is_null)
        };
        if kind == "DeviceClass" && dropped("/spec/extendedResourceName") {
            line.push_str(" (the API server dropped spec.extendedResourceName: feature gate DRAExtendedResource is off, so pods asking the extended resource are not served through DRA; turn it on and install again)");
        }
        done.push(line);
    }
    Ok(done)
}
