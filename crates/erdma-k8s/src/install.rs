//! Install manifests, rendered from typed k8s-openapi structs: the same objects as the Helm chart
//! in `deploy/helm` (the chart is the reference; `tests/chart.rs` compares both for every values
//! file of the chart's CI matrix). [`Values`] is the chart's values (the original
//! alibabacloud-erdma-controller chart's keys, plus erdma's additions); [`render`] returns every
//! object in apply order; [`apply`] server-side-applies them; [`delete`] removes them.
//!
//! Object names: the workloads, the webhook Service and configuration keep the original chart's
//! fixed names (`alibabacloud-erdma-agent`, `alibabacloud-erdma-controller`) and selectors, so an
//! upgrade of the original's release keeps them; per-release objects (ConfigMap, Secret, RBAC,
//! ServiceAccounts) are named after the release ([`Values::name`], default
//! `alibaba-erdma-controller`, the original's release name).

use crate::Error;
use crate::crd::ERdmaDevice;
use crate::labels::ANNOTATION_RRSA_ROLE;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, LocalObjectReference, Namespace,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    Secret, SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The erdma release these manifests install; image tags default to it (the chart's appVersion).
pub const APP_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `app.kubernetes.io/name` of every object (the original chart's name; part of the selectors).
pub const APP_NAME: &str = "alibabacloud-erdma-controller";

/// Name of the controller Deployment, its webhook Service and the webhook configuration (fixed,
/// as in the original chart, and the controller's `controllerName`).
pub const CONTROLLER_NAME: &str = "alibabacloud-erdma-controller";

/// Name of the agent DaemonSet (fixed, as in the original chart).
pub const AGENT_NAME: &str = "alibabacloud-erdma-agent";

/// Default release name (the original chart's README's).
pub const DEFAULT_RELEASE: &str = "alibaba-erdma-controller";

/// erdma's image repositories (built from `deploy/docker`).
pub const AGENT_IMAGE: &str = "ghcr.io/erdma/erdma-agent";
/// erdma's controller image repository.
pub const CONTROLLER_IMAGE: &str = "ghcr.io/erdma/erdma-controller";

/// An image reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageValues {
    /// Repository.
    pub repository: String,
    /// Tag; empty: [`APP_VERSION`].
    pub tag: String,
    /// `Always`, `IfNotPresent`, `Never`.
    pub pull_policy: String,
}

impl ImageValues {
    fn of(repo: &str) -> Self {
        Self {
            repository: repo.into(),
            tag: String::new(),
            pull_policy: "Always".into(),
        }
    }

    /// Whether this is one of the original's Go images (any `*aliyuncs.com/erdma/{agent,controller}`).
    pub fn is_original(&self) -> bool {
        let r = self.repository.as_str();
        ["agent", "controller"].iter().any(|c| {
            r.strip_suffix(&format!("aliyuncs.com/erdma/{c}"))
                .is_some_and(|head| head.is_empty() || head.ends_with(['.', '/']))
        })
    }

    /// Whether this is the original chart's unchanged default for `component` (carried by a
    /// values file copied from the original), which erdma's image replaces.
    pub fn is_original_default(&self, component: &str) -> bool {
        self.repository == format!("registry.aliyuncs.com/erdma/{component}")
            && matches!(self.tag.as_str(), "" | "latest")
    }

    /// `repository:tag` for `component` (`agent`, `controller`): the tag defaults to
    /// [`APP_VERSION`]; the original's default Go image becomes erdma's; any other Go image is
    /// refused (it does not understand erdma's flags).
    pub fn reference(&self, component: &str) -> Result<String, Error> {
        let tag = if self.tag.is_empty() {
            APP_VERSION
        } else {
            &self.tag
        };
        if self.is_original() {
            if self.is_original_default(component) {
                return Ok(format!("ghcr.io/erdma/erdma-{component}:{APP_VERSION}"));
            }
            return Err(Error::Invalid(format!(
                "{component}.image {}:{tag} is the original alibabacloud-erdma-controller's Go image: it does not understand erdma's flags, so pods would crash. Use erdma's image (default ghcr.io/erdma/erdma-{component}, built from deploy/docker/{component}.Dockerfile) or keep the original chart for the Go images.",
                self.repository
            )));
        }
        Ok(format!("{}:{tag}", self.repository))
    }
}

impl Default for ImageValues {
    fn default() -> Self {
        Self::of("")
    }
}

/// `controller.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ControllerValues {
    /// Replicas (leader election picks one active).
    pub replica_count: i32,
    /// Image.
    pub image: ImageValues,
    /// Pull secrets of the controller pods.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Accepted for compatibility; names are fixed.
    pub name_override: String,
    /// Accepted for compatibility; names are fixed.
    pub fullname_override: String,
    /// nodeSelector of the controller pods.
    pub node_selector: BTreeMap<String, String>,
    /// Affinity of the controller pods.
    pub affinity: Option<Affinity>,
}

impl Default for ControllerValues {
    fn default() -> Self {
        Self {
            replica_count: 2,
            image: ImageValues::of(CONTROLLER_IMAGE),
            image_pull_secrets: Vec::new(),
            name_override: String::new(),
            fullname_override: String::new(),
            node_selector: BTreeMap::new(),
            affinity: None,
        }
    }
}

/// `agent.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentValues {
    /// Image.
    pub image: ImageValues,
    /// `--prefer-driver`: `default`, `compat`, `ofed`; empty = auto.
    pub prefer_driver: String,
    /// `--allocate-all-devices`.
    pub allocate_all_devices: bool,
    /// `--jumbo-frame-mtu`; 0 leaves the MTU alone (flag omitted).
    #[serde(rename = "jumboFrameMTU")]
    pub jumbo_frame_mtu: u32,
    /// `--exposed-local-eris` entries (`<instance-id|i-*> <ibdev>[/<ibdev>…]`), applied with local
    /// discovery only (as in the original), or also in cluster mode with `filterClusterERIs`.
    #[serde(rename = "exposedLocalERIs")]
    pub exposed_local_eris: Vec<String>,
    /// (new) Apply `exposedLocalERIs` in cluster mode too (`--filter-cluster-eris`).
    #[serde(rename = "filterClusterERIs")]
    pub filter_cluster_eris: bool,
    /// `--cri-socket` for the SMC-R pre-start hook (webhook off); empty: containerd's
    /// `/run/containerd/containerd.sock`. Its directory is mounted into the agent, so it must
    /// have one of its own (not directly in `/run` or `/var/run`).
    pub cri_socket: String,
    /// (new) The driver installer the agent runs when the driver is missing.
    pub driver_installer: DriverInstallerValues,
    /// (new) `--nri`: `auto` (NRI when the runtime's socket exists), `on` or `off`.
    pub nri: String,
    /// (new) `--nri-memlock` for containers holding `aliyun/erdma`.
    pub nri_memlock: String,
    /// (new) `--nri-rdma-max`: default `rdma.max` limits (empty: none).
    pub nri_rdma_max: String,
    /// Pull secrets of the agent pods.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Accepted for compatibility; names are fixed.
    pub name_override: String,
    /// Accepted for compatibility; names are fixed.
    pub fullname_override: String,
}

impl Default for AgentValues {
    fn default() -> Self {
        Self {
            image: ImageValues::of(AGENT_IMAGE),
            prefer_driver: String::new(),
            allocate_all_devices: false,
            jumbo_frame_mtu: 8500,
            exposed_local_eris: vec!["i-XXX erdma_0/erdma_1".into()],
            filter_cluster_eris: false,
            cri_socket: String::new(),
            driver_installer: DriverInstallerValues::default(),
            nri: "auto".into(),
            nri_memlock: "unlimited".into(),
            nri_rdma_max: String::new(),
            image_pull_secrets: Vec::new(),
            name_override: String::new(),
            fullname_override: String::new(),
        }
    }
}

/// `agent.driverInstaller.*` (new): the eRDMA driver installer (docs/operations.md, "Driver
/// installer trust"). Empty strings leave the agent's defaults; without `sha256` the agent never
/// runs a downloaded installer and says so in its `ERdmaDriverReady` condition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DriverInstallerValues {
    /// `--erdma-installer-version` (dot-separated numbers).
    pub version: String,
    /// `--driver-installer-sha256` of `erdma_installer-<version>.tar.gz`.
    pub sha256: String,
    /// `--gpu-installer-sha256` of `env_setup.sh` (`preferDriver: ofed`).
    pub gpu_sha256: String,
    /// `--driver-installer-base-url` (`https://`).
    #[serde(rename = "baseURL")]
    pub base_url: String,
    /// `--allow-insecure-driver-download`: accept an `http://` base URL.
    pub allow_insecure_download: bool,
}

/// `serviceAccount.*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceAccountValues {
    /// Create the ServiceAccounts (false: both workloads run as `name`, default `default`).
    pub create: bool,
    /// Annotations of the controller's ServiceAccount (RRSA: `pod-identity.alibabacloud.com/role-name`).
    pub annotations: BTreeMap<String, String>,
    /// ServiceAccount name (created: the controller's, default `<release>-alibabacloud-erdma-controller`).
    pub name: String,
}

impl Default for ServiceAccountValues {
    fn default() -> Self {
        Self {
            create: true,
            annotations: BTreeMap::new(),
            name: String::new(),
        }
    }
}

/// `config.*` (rendered into `config.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConfigValues {
    /// Region; empty: from the metadata service.
    pub region: String,
    /// Adopt HighPerformance ENIs the controller did not create.
    #[serde(rename = "manageNonOwnedENIs")]
    pub manage_non_owned_enis: bool,
    /// Cluster DNS domain; empty: `cluster.local`.
    pub cluster_domain: String,
    /// The webhook injects only with the device plugin.
    pub enable_device_plugin: bool,
    /// Mutating webhook (false: the agent does SMC-R in PreStartContainer).
    pub enable_webhook: bool,
    /// Inject `smcr-init`.
    pub enable_init_container_inject: bool,
    /// `smcr-init` image; empty: the default.
    pub smc_init_image: String,
    /// Local ERI discovery (no cloud credentials needed).
    #[serde(rename = "localERIDiscovery")]
    pub local_eri_discovery: bool,
}

impl Default for ConfigValues {
    fn default() -> Self {
        Self {
            region: String::new(),
            manage_non_owned_enis: true,
            cluster_domain: String::new(),
            enable_device_plugin: true,
            enable_webhook: false,
            enable_init_container_inject: true,
            smc_init_image: String::new(),
            local_eri_discovery: false,
        }
    }
}

/// `credentials.*`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct CredentialValues {
    /// `access_key` (or empty), `oidc_role_arn`, `ecs_ram_role`, `ram_role_sts`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Access key ID.
    #[serde(rename = "accessKeyID")]
    pub access_key_id: String,
    /// Access key secret.
    pub access_key_secret: String,
}

impl std::fmt::Debug for CredentialValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialValues")
            .field("kind", &self.kind)
            .field("access_key_secret", &"***")
            .finish()
    }
}

/// All install options: the chart's values, plus `namespace` and `name` (the release).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Values {
    /// Namespace of the controller and agent.
    pub namespace: String,
    /// Release name (names of the ConfigMap, Secret, RBAC and ServiceAccounts).
    pub name: String,
    /// Controller.
    pub controller: ControllerValues,
    /// Agent.
    pub agent: AgentValues,
    /// ServiceAccounts.
    pub service_account: ServiceAccountValues,
    /// Annotations of the controller and agent pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// Nodes that run the agent and get ERIs.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the agent and controller.
    pub tolerations: Vec<Toleration>,
    /// Affinity of the agent pods.
    pub affinity: Option<Affinity>,
    /// Resources of the agent container (empty: erdma's requests).
    pub resources: Option<ResourceRequirements>,
    /// `Ignore` (default) or `Fail`.
    pub webhook_failure_policy: String,
    /// Webhook timeout.
    pub webhook_timeout_seconds: i32,
    /// `config.json`.
    pub config: ConfigValues,
    /// Cloud credentials.
    pub credentials: CredentialValues,
}

impl Default for Values {
    fn default() -> Self {
        Self {
            namespace: "kube-system".into(),
            name: DEFAULT_RELEASE.into(),
            controller: ControllerValues::default(),
            agent: AgentValues::default(),
            service_account: ServiceAccountValues::default(),
            pod_annotations: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            affinity: None,
            resources: None,
            webhook_failure_policy: "Ignore".into(),
            webhook_timeout_seconds: 10,
            config: ConfigValues::default(),
            credentials: CredentialValues::default(),
        }
    }
}

const DRIVERS: [&str; 3] = ["default", "compat", "ofed"];
const CREDENTIAL_TYPES: [&str; 5] = [
    "",
    "access_key",
    "oidc_role_arn",
    "ecs_ram_role",
    "ram_role_sts",
];

impl Values {
    /// Checks the values (as the chart's schema and templates do); the error names the value and
    /// the fix. Missing credentials are not an error here: see [`Values::warnings`].
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Invalid(m));
        if !self.agent.prefer_driver.is_empty()
            && !DRIVERS.contains(&self.agent.prefer_driver.as_str())
        {
            return bad(format!(
                "agent.preferDriver {:?} is not one of default, compat, ofed (or empty for auto)",
                self.agent.prefer_driver
            ));
        }
        if !CREDENTIAL_TYPES.contains(&self.credentials.kind.as_str()) {
            return bad(format!(
                "credentials.type {:?} is not one of access_key, oidc_role_arn, ecs_ram_role, ram_role_sts",
                self.credentials.kind
            ));
        }
        if !["Ignore", "Fail"].contains(&self.webhook_failure_policy.as_str()) {
            return bad(format!(
                "webhookFailurePolicy {:?} must be Ignore or Fail",
                self.webhook_failure_policy
            ));
        }
        if !(1..=30).contains(&self.webhook_timeout_seconds) {
            return bad(format!(
                "webhookTimeoutSeconds {} must be 1..30 (the API server's limit)",
                self.webhook_timeout_seconds
            ));
        }
        // The same parsers the agent applies to --jumbo-frame-mtu and --exposed-local-eris.
        let mtu = self.agent.jumbo_frame_mtu;
        if mtu != 0
            && let Err(e) = erdma_model::names::check_jumbo_mtu(mtu.into())
        {
            return bad(format!(
                "agent.jumboFrameMTU: {e}; or 0 to leave --jumbo-frame-mtu out (the agent's default, {})",
                erdma_model::names::DEFAULT_JUMBO_MTU
            ));
        }
        if let Err(e) = erdma_model::EriSelector::from_entries(&self.agent.exposed_local_eris) {
            return bad(format!("agent.{e}"));
        }
        let cri = self.agent.cri_socket.as_str();
        if !cri.is_empty() {
            let path = std::path::Path::new(cri);
            let dir = path.parent().map(|p| p.display().to_string());
            let own_dir = dir
                .as_deref()
                .is_some_and(|d| !matches!(d, "" | "/" | "/run" | "/var/run" | "/var"));
            if !path.is_absolute() || cri.contains("..") || cri.starts_with("unix:") || !own_dir {
                return bad(format!(
                    "agent.criSocket {cri:?} must be an absolute socket path inside a directory of its own (e.g. /run/k3s/containerd/containerd.sock, /var/run/crio/crio.sock); that directory is mounted into the agent, and mounting all of /run would put the mount point of the agent's ServiceAccount token (/var/run/secrets) into the host's /run. For cri-dockerd, start it with --container-runtime-endpoint unix:///var/run/cri-dockerd/cri-dockerd.sock"
                ));
            }
        }
        let di = &self.agent.driver_installer;
        if !di.version.is_empty()
            && let Err(e) = erdma_model::installer::InstallerVersion::parse(&di.version)
        {
            return bad(format!("agent.driverInstaller.version: {e}"));
        }
        for (key, pin) in [("sha256", &di.sha256), ("gpuSha256", &di.gpu_sha256)] {
            if !pin.is_empty()
                && let Err(e) = erdma_model::installer::Sha256Pin::parse(pin)
            {
                return bad(format!("agent.driverInstaller.{key}: {e}"));
            }
        }
        if !di.base_url.is_empty()
            && let Err(e) =
                erdma_model::installer::check_base_url(&di.base_url, di.allow_insecure_download)
        {
            return bad(format!(
                "agent.driverInstaller.baseURL: {e} (agent.driverInstaller.allowInsecureDownload accepts http://)"
            ));
        }
        if !["auto", "on", "off"].contains(&self.agent.nri.as_str()) {
            return bad(format!(
                "agent.nri {:?} must be auto, on or off",
                self.agent.nri
            ));
        }
        if let Err(e) = erdma_model::rdma_limit::Memlock::parse(&self.agent.nri_memlock) {
            return bad(format!("agent.nriMemlock: {e}"));
        }
        if !self.agent.nri_rdma_max.trim().is_empty()
            && let Err(e) = erdma_model::rdma_limit::RdmaLimit::parse(&self.agent.nri_rdma_max)
        {
            return bad(format!("agent.nriRdmaMax: {e}"));
        }
        if self.controller.replica_count < 1 {
            return bad("controller.replicaCount must be at least 1".into());
        }
        self.controller.image.reference("controller")?;
        self.agent.image.reference("agent")?;
        Ok(())
    }

    /// What is missing for a working install (the chart prints the same in NOTES.txt): cloud
    /// credentials in cluster mode, the RRSA role annotation.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.config.local_eri_discovery || self.agent.filter_cluster_eris {
            for e in &self.agent.exposed_local_eris {
                if e.split_whitespace().next() == Some("i-XXX") {
                    w.push(format!("agent.exposedLocalERIs entry {e:?} is the original chart's placeholder: it matches no instance, so agents expose nothing. Use real instance IDs or i-* (e.g. \"i-* erdma_0\"), or set the list to [] to expose every device"));
                }
            }
        }
        if self.config.local_eri_discovery {
            return w;
        }
        let c = &self.credentials;
        if matches!(c.kind.as_str(), "" | "access_key")
            && (c.access_key_id.is_empty() || c.access_key_secret.is_empty())
        {
            w.push(format!("credentials.type {:?} needs credentials.accessKeyID and credentials.accessKeySecret, which are missing: the controller cannot create ERIs and agents serve nothing until they are set (or choose credentials.type ecs_ram_role, oidc_role_arn, ram_role_sts, or config.localERIDiscovery)", if c.kind.is_empty() { "access_key" } else { &c.kind }));
        }
        if c.kind == "oidc_role_arn"
            && !self
                .service_account
                .annotations
                .contains_key(ANNOTATION_RRSA_ROLE)
        {
            w.push(format!("credentials.type oidc_role_arn needs serviceAccount.annotations.\"{ANNOTATION_RRSA_ROLE}\" (the RAM role name), which is missing"));
        }
        w
    }

    /// The controller's ServiceAccount (the original chart's naming).
    pub fn controller_sa(&self) -> String {
        if !self.service_account.create {
            return non_empty_or(&self.service_account.name, "default");
        }
        if !self.service_account.name.is_empty() {
            return self.service_account.name.clone();
        }
        let full = if self.name.contains(APP_NAME) {
            self.name.clone()
        } else {
            format!("{}-{APP_NAME}", self.name)
        };
        trunc63(&full)
    }

    /// The agent's ServiceAccount: its own when created, else the shared one.
    pub fn agent_sa(&self) -> String {
        if self.service_account.create {
            trunc63(&format!("{}-agent", self.name))
        } else {
            non_empty_or(&self.service_account.name, "default")
        }
    }

    fn agent_rbac(&self) -> String {
        format!("{}-agent", self.name)
    }

    /// Whether the controller runs: cloud provisioning, or the webhook in local mode.
    pub fn runs_controller(&self) -> bool {
        !self.config.local_eri_discovery || self.config.enable_webhook
    }
}

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
        ("app.kubernetes.io/name".to_string(), APP_NAME.to_string()),
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

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let s = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        resource_names: if names.is_empty() {
            None
        } else {
            Some(s(names))
        },
        ..Default::default()
    }
}

/// The controller's cluster-wide rules (each justified in `docs/operations.md`; that every one
/// is used, and nothing else is needed, is proven by `erdma-controller`'s `tests/rbac.rs`).
pub fn controller_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[""], &["nodes"], &["get", "list", "watch"], &[]),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices"],
            &["get", "list", "watch", "create", "patch", "delete"],
            &[],
        ),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices/status"],
            &["patch"],
            &[],
        ),
        rule(&["events.k8s.io"], &["events"], &["create", "patch"], &[]),
        rule(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            &["get", "update"],
            &[CONTROLLER_NAME],
        ),
    ]
}

/// The controller's rules in its namespace.
pub fn controller_namespace_rules() -> Vec<PolicyRule> {
    let cert = format!("{CONTROLLER_NAME}-webhook-cert");
    vec![
        rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "update"],
            &["26dc1c71.alibabacloud.com"],
        ),
        rule(&[""], &["secrets"], &["create"], &[]),
        rule(&[""], &["secrets"], &["get", "update"], &[cert.as_str()]),
    ]
}

/// The agent's cluster-wide rules (proven exactly needed by `erdma-agent`'s `rbac_tests`).
pub fn agent_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices"],
            &["list"],
            &[],
        ),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices/status"],
            &["get", "patch"],
            &[],
        ),
        rule(&[""], &["nodes"], &["patch"], &[]),
        rule(&[""], &["nodes/status"], &["patch"], &[]),
        // patch: a repeated Event becomes a series on the first one (kube's Recorder).
        rule(&["events.k8s.io"], &["events"], &["create", "patch"], &[]),
    ]
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

/// The controller's `config.json`.
pub fn config_json(v: &Values) -> Result<String, Error> {
    let c = &v.config;
    let j = serde_json::json!({
        "region": c.region, "manageNonOwnedENIs": c.manage_non_owned_enis,
        "controllerNamespace": v.namespace, "controllerName": CONTROLLER_NAME,
        "clusterDomain": if c.cluster_domain.is_empty() { "cluster.local" } else { c.cluster_domain.as_str() },
        "certDir": "/var/lib/certDir", "enableDevicePlugin": c.enable_device_plugin, "enableWebhook": c.enable_webhook,
        "smcInitImage": c.smc_init_image, "enableInitContainerInject": c.enable_init_container_inject,
        "localERIDiscovery": c.local_eri_discovery, "nodeSelector": v.node_selector,
    });
    serde_json::to_string_pretty(&j).map_err(|e| Error::Serialize(e.to_string()))
}

/// The agent's arguments (the original's flag names, then the port its probes use and, in
/// pre-start mode, an explicit `agent.criSocket`). `--exposed-local-eris` only where it applies:
/// local discovery, or `agent.filterClusterERIs`.
pub fn agent_args(v: &Values) -> Vec<String> {
    let a = &v.agent;
    let mut args = Vec::new();
    if !a.prefer_driver.is_empty() {
        args.push(format!("--prefer-driver={}", a.prefer_driver));
    }
    if a.allocate_all_devices {
        args.push("--allocate-all-devices".into());
    }
    if a.jumbo_frame_mtu != 0 {
        args.push(format!("--jumbo-frame-mtu={}", a.jumbo_frame_mtu));
    }
    if !a.exposed_local_eris.is_empty() && (v.config.local_eri_discovery || a.filter_cluster_eris) {
        args.push(format!(
            "--exposed-local-eris={}",
            a.exposed_local_eris.join(",")
        ));
    }
    if a.filter_cluster_eris {
        args.push("--filter-cluster-eris".into());
    }
    if v.config.local_eri_discovery {
        args.push("--local-eri-discovery".into());
    }
    if agent_prestart(v) {
        args.push("--deviceplugin-prestart-container".into());
        if !a.cri_socket.is_empty() {
            args.push(format!("--cri-socket={}", a.cri_socket));
        }
    }
    let di = &a.driver_installer;
    for (flag, value) in [
        ("--erdma-installer-version", &di.version),
        ("--driver-installer-sha256", &di.sha256),
        ("--gpu-installer-sha256", &di.gpu_sha256),
        ("--driver-installer-base-url", &di.base_url),
    ] {
        if !value.is_empty() {
            args.push(format!("{flag}={value}"));
        }
    }
    if di.allow_insecure_download {
        args.push("--allow-insecure-driver-download".into());
    }
    if a.nri != "auto" {
        args.push(format!("--nri={}", a.nri));
    }
    if a.nri_memlock != "unlimited" {
        args.push(format!("--nri-memlock={}", a.nri_memlock));
    }
    if !a.nri_rdma_max.trim().is_empty() {
        args.push(format!("--nri-rdma-max={}", a.nri_rdma_max.trim()));
    }
    args.push("--dev-root=/host/dev".into());
    args.push(format!("--metrics-addr=0.0.0.0:{AGENT_METRICS_PORT}"));
    args
}

/// Every manifest, in apply order, as JSON values of typed objects.
pub fn render(v: &Values) -> Result<Vec<Value>, Error> {
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
    if !v.config.local_eri_discovery {
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
    out.push(to_value(&ClusterRole {
        metadata: meta(&agent_rbac, None, labels(v, "agent")),
        rules: Some(agent_cluster_rules()),
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
    if v.runs_controller() {
        out.push(to_value(&controller_deployment(v)?)?);
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
    out.push(to_value(&agent_daemonset(v)?)?);
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
                port: AGENT_METRICS_PORT,
                target_port: Some(IntOrString::Int(AGENT_METRICS_PORT)),
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
                name: "erdma-smcr.network.alibabacloud.com".into(),
                admission_review_versions: vec!["v1".into(), "v1beta1".into()],
                client_config: WebhookClientConfig {
                    service: Some(ServiceReference {
                        name: CONTROLLER_NAME.into(),
                        namespace: ns.into(),
                        path: Some("/mutate-pod".into()),
                        port: Some(443),
                    }),
                    ..Default::default()
                },
                failure_policy: Some(v.webhook_failure_policy.clone()),
                side_effects: "None".into(),
                timeout_seconds: Some(v.webhook_timeout_seconds),
                reinvocation_policy: Some("Never".into()),
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
    Ok(out)
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

fn pod_meta(v: &Values, tier: &str) -> ObjectMeta {
    ObjectMeta {
        labels: Some(selector(v, tier)),
        annotations: non_empty_map(&v.pod_annotations),
        ..Default::default()
    }
}

fn controller_deployment(v: &Values) -> Result<Deployment, Error> {
    let ns = v.namespace.as_str();
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: v.name.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut mounts = vec![mount("config", "/etc/erdma-controller", true)];
    if !v.config.local_eri_discovery {
        volumes.push(Volume {
            name: "credential".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(v.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(
            "credential",
            "/etc/erdma-controller-credential",
            true,
        ));
    }
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(8080),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let container = Container {
        name: "controller".into(),
        image: Some(v.controller.image.reference("controller")?),
        image_pull_policy: Some(v.controller.image.pull_policy.clone()),
        args: Some(vec![
            "--config-path=/etc/erdma-controller/config.json".into(),
            "--credential-path=/etc/erdma-controller-credential/credential.json".into(),
        ]),
        env: Some(vec![field_env("POD_NAME", "metadata.name")]),
        ports: Some(vec![
            ContainerPort {
                name: Some("webhook".into()),
                container_port: 9443,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/healthz")),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("50m".into())),
                ("memory".to_string(), Quantity("64Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("256Mi".into()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Ok(Deployment {
        metadata: meta(CONTROLLER_NAME, Some(ns), labels(v, "controller")),
        spec: Some(DeploymentSpec {
            replicas: Some(v.controller.replica_count),
            selector: LabelSelector {
                match_labels: Some(selector(v, "controller")),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(pod_meta(v, "controller")),
                spec: Some(PodSpec {
                    service_account_name: Some(v.controller_sa()),
                    priority_class_name: Some("system-cluster-critical".into()),
                    image_pull_secrets: non_empty(&v.controller.image_pull_secrets),
                    node_selector: non_empty_map(&v.controller.node_selector),
                    affinity: some_affinity(&v.controller.affinity),
                    tolerations: non_empty(&v.tolerations),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The agent's `/metrics` and `/healthz` port (`--metrics-addr`, the agent's default port).
pub const AGENT_METRICS_PORT: i32 = 9101;

/// Where the agent's CRI client looks without `agent.criSocket` (containerd, the ACK default).
pub const DEFAULT_CRI_SOCKET_DIR: &str = "/run/containerd";

/// One host path of the agent. Each is justified in `docs/operations.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHostPath {
    /// Volume name.
    pub volume: &'static str,
    /// Path on the host.
    pub host_path: String,
    /// hostPath `type`.
    pub kind: &'static str,
    /// Path in the agent container.
    pub mount_path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// `mountPropagation` (`None`: the default, no propagation).
    pub propagation: Option<&'static str>,
}

impl AgentHostPath {
    fn same(volume: &'static str, path: &str, kind: &'static str, read_only: bool) -> Self {
        AgentHostPath {
            volume,
            host_path: path.into(),
            kind,
            mount_path: path.into(),
            read_only,
            propagation: None,
        }
    }
}

/// Whether the agent runs the SMC-R pre-start hook (`--deviceplugin-prestart-container`): when
/// the webhook (and its `smcr-init` init container) is off, as in the original chart.
fn agent_prestart(v: &Values) -> bool {
    !v.config.enable_webhook
}

/// The directory holding the CRI socket the agent uses in pre-start mode.
fn cri_socket_dir(v: &Values) -> String {
    std::path::Path::new(&v.agent.cri_socket)
        .parent()
        .map(|p| p.display().to_string())
        .filter(|p| !v.agent.cri_socket.is_empty() && !p.is_empty())
        .unwrap_or_else(|| DEFAULT_CRI_SOCKET_DIR.to_string())
}

/// The agent's host paths, in volume order.
///
/// Not mounted on purpose: `/lib/modules` (kmod runs in the host's mount namespace through
/// `setns`, so it reads the host's own `/lib/modules`), `/sys` (the container's sysfs is the
/// host's: sysfs is global except for net devices, and the pod is `hostNetwork`; read-only is
/// enough for the inventory), `/var/run` as a whole (it would carry the ServiceAccount token's
/// mount point into the host's `/run`).
pub fn agent_host_paths(v: &Values) -> Vec<AgentHostPath> {
    let mut p = vec![
        AgentHostPath::same(
            "device-plugins",
            "/var/lib/kubelet/device-plugins",
            "DirectoryOrCreate",
            false,
        ),
        AgentHostPath::same(
            "pod-resources",
            "/var/lib/kubelet/pod-resources",
            "DirectoryOrCreate",
            true,
        ),
        AgentHostPath {
            volume: "host-dev",
            host_path: "/dev".into(),
            kind: "Directory",
            mount_path: "/host/dev".into(),
            read_only: true,
            propagation: None,
        },
    ];
    if v.agent.nri != "off" {
        // The runtime's NRI socket (its directory only, never all of /var/run).
        p.push(AgentHostPath::same(
            "nri",
            "/var/run/nri",
            "DirectoryOrCreate",
            true,
        ));
    }
    if agent_prestart(v) {
        let cri = cri_socket_dir(v);
        let kind = if cri == DEFAULT_CRI_SOCKET_DIR {
            "DirectoryOrCreate"
        } else {
            "Directory"
        };
        p.push(AgentHostPath::same("cri-socket", &cri, kind, true));
        p.push(AgentHostPath {
            propagation: Some("HostToContainer"),
            ..AgentHostPath::same("netns", "/var/run/netns", "DirectoryOrCreate", true)
        });
        p.push(AgentHostPath::same(
            "bpffs",
            "/sys/fs/bpf",
            "Directory",
            false,
        ));
    }
    p
}

/// Linux capabilities added to the runtime's default set (not privileged). Why each: see
/// `docs/operations.md`.
pub const AGENT_CAPABILITIES: [&str; 5] = [
    "SYS_MODULE",
    "SYS_ADMIN",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "NET_ADMIN",
];

/// Capabilities dropped from the runtime's default set: nothing in the agent (or the host
/// commands it runs) opens raw IP or packet sockets; netlink sockets need no `NET_RAW`.
pub const AGENT_DROPPED_CAPABILITIES: [&str; 1] = ["NET_RAW"];

fn agent_probe(period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(5),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn agent_daemonset(v: &Values) -> Result<DaemonSet, Error> {
    let paths = agent_host_paths(v);
    let container = Container {
        name: "agent".into(),
        image: Some(v.agent.image.reference("agent")?),
        image_pull_policy: Some(v.agent.image.pull_policy.clone()),
        args: Some(agent_args(v)),
        env: Some(vec![field_env("NODE_NAME", "spec.nodeName")]),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: AGENT_METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // `/healthz` answers 200 while the agent's HTTP server runs, whatever the driver, ERI
        // source or kubelet state (those are in its JSON body, the node condition and Events).
        liveness_probe: Some(agent_probe(20, 3)),
        readiness_probe: Some(agent_probe(10, 3)),
        security_context: Some(SecurityContext {
            privileged: Some(false),
            capabilities: Some(Capabilities {
                add: Some(AGENT_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
                drop: Some(
                    AGENT_DROPPED_CAPABILITIES
                        .iter()
                        .map(|c| c.to_string())
                        .collect(),
                ),
            }),
            ..Default::default()
        }),
        resources: Some(
            v.resources
                .clone()
                .filter(|r| *r != ResourceRequirements::default())
                .unwrap_or_else(|| ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity("50m".into())),
                        ("memory".to_string(), Quantity("64Mi".into())),
                    ])),
                    ..Default::default()
                }),
        ),
        volume_mounts: Some(
            paths
                .iter()
                .map(|h| VolumeMount {
                    mount_propagation: h.propagation.map(str::to_string),
                    ..mount(h.volume, &h.mount_path, h.read_only)
                })
                .collect(),
        ),
        ..Default::default()
    };
    Ok(DaemonSet {
        metadata: meta(AGENT_NAME, Some(&v.namespace), labels(v, "agent")),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector(v, "agent")),
                ..Default::default()
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::String("10%".into())),
                    ..Default::default()
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(pod_meta(v, "agent")),
                spec: Some(PodSpec {
                    service_account_name: Some(v.agent_sa()),
                    image_pull_secrets: non_empty(&v.agent.image_pull_secrets),
                    affinity: some_affinity(&v.affinity),
                    host_network: Some(true),
                    host_pid: Some(true),
                    dns_policy: Some("ClusterFirstWithHostNet".into()),
                    priority_class_name: Some("system-node-critical".into()),
                    node_selector: non_empty_map(&v.node_selector),
                    tolerations: non_empty(&v.tolerations),
                    containers: vec![container],
                    volumes: Some(
                        paths
                            .iter()
                            .map(|h| host_path(h.volume, &h.host_path, h.kind))
                            .collect(),
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Renders as a `---`-joined YAML stream.
pub fn render_yaml(v: &Values) -> Result<String, Error> {
    crate::yaml::to_yaml_stream(&render(v)?)
}

/// Renders as a JSON `List`.
pub fn render_json(v: &Values) -> Result<String, Error> {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": render(v)?});
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

/// Deletes exactly the objects [`render`] produces for `v` (the ones `install` created), in
/// reverse apply order. The CRD (and with it every ERdmaDevice) only with `include_crd`; a
/// Namespace is never deleted.
pub async fn delete(
    client: &kube::Client,
    v: &Values,
    include_crd: bool,
) -> Result<Vec<Deleted>, Error> {
    use kube::api::DeleteParams;
    let mut done = Vec::new();
    for obj in render(v)?.iter().rev() {
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

/// Server-side-applies every manifest (field manager `erdmactl`, forced) in order; returns
/// `kind/name` of each applied object.
pub async fn apply(client: &kube::Client, v: &Values) -> Result<Vec<String>, Error> {
    use kube::api::{Patch, PatchParams};
    let mut done = Vec::new();
    for obj in render(v)? {
        let (api, kind, name) = api_for(client, v, &obj).await?;
        api.patch(
            &name,
            &PatchParams::apply("erdmactl").force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(|source| Error::Kube {
            what: format!("apply {kind}/{name}"),
            source,
        })?;
        done.push(format!("{kind}/{name}"));
    }
    Ok(done)
}
