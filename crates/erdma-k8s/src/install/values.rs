//! The chart's values (the original chart's keys plus erdma's additions) and their validation.

use super::*;

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
    pub(super) fn of(repo: &str) -> Self {
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
    /// values file copied from the original): `registry.aliyuncs.com/erdma/<component>` or its
    /// regional or VPC mirror `registry[-vpc].<region>.aliyuncs.com/erdma/<component>`, tag
    /// `latest` or none. erdma's image replaces it.
    pub fn is_original_default(&self, component: &str) -> bool {
        let Some(host) = self
            .repository
            .strip_suffix(&format!(".aliyuncs.com/erdma/{component}"))
        else {
            return false;
        };
        let registry = host == "registry"
            || host.strip_prefix("registry.").is_some_and(is_region)
            || host.strip_prefix("registry-vpc.").is_some_and(is_region);
        registry && matches!(self.tag.as_str(), "" | "latest")
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

/// An Alibaba Cloud region id as registry host names carry it (`cn-beijing`, `ap-southeast-1`).
fn is_region(r: &str) -> bool {
    !r.is_empty()
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An image block as a values file gives it: any key may be missing. Helm merges such a block
/// key by key into the chart's default, so a file that sets only `pullPolicy` keeps erdma's
/// repository; [`agent_image`] and [`controller_image`] do the same.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImagePatch {
    repository: Option<String>,
    tag: Option<String>,
    pull_policy: Option<String>,
}

fn image_over<'de, D: serde::Deserializer<'de>>(
    d: D,
    repository: &str,
) -> Result<ImageValues, D::Error> {
    let mut image = ImageValues::of(repository);
    if let Some(p) = Option::<ImagePatch>::deserialize(d)? {
        if let Some(r) = p.repository {
            image.repository = r;
        }
        if let Some(t) = p.tag {
            image.tag = t;
        }
        if let Some(pp) = p.pull_policy {
            image.pull_policy = pp;
        }
    }
    Ok(image)
}

fn agent_image<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ImageValues, D::Error> {
    image_over(d, AGENT_IMAGE)
}

fn controller_image<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ImageValues, D::Error> {
    image_over(d, CONTROLLER_IMAGE)
}

/// `controller.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ControllerValues {
    /// Replicas (leader election picks one active).
    pub replica_count: i32,
    /// Image (keys missing from a values file keep erdma's defaults, as Helm's merge does).
    #[serde(deserialize_with = "controller_image")]
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
    /// (new) priorityClassName of the controller pods (empty: none).
    pub priority_class_name: String,
    /// (new) The Deployment's strategy (empty: Kubernetes' default).
    pub strategy: Option<DeploymentStrategy>,
    /// (new) Resources of the controller container.
    pub resources: Option<ResourceRequirements>,
    /// (new) The controller container's securityContext.
    pub security_context: Option<SecurityContext>,
    /// (new) Extra arguments, after the chart's own.
    pub extra_args: Vec<String>,
    /// (new) Extra environment variables.
    pub extra_env: Vec<EnvVar>,
    /// (new) Extra volumes of the pods.
    pub extra_volumes: Vec<Volume>,
    /// (new) Extra mounts of the container.
    pub extra_volume_mounts: Vec<VolumeMount>,
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
            priority_class_name: "system-cluster-critical".into(),
            strategy: None,
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
                    add: None,
                }),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            extra_args: Vec::new(),
            extra_env: Vec::new(),
            extra_volumes: Vec::new(),
            extra_volume_mounts: Vec::new(),
        }
    }
}

/// `agent.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentValues {
    /// Image (keys missing from a values file keep erdma's defaults, as Helm's merge does).
    #[serde(deserialize_with = "agent_image")]
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
    /// `--cri-socket` for the SMC-R pre-start hook (webhook off) and per-pod RDMA usage; empty: containerd's
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
    /// (new) Extra arguments of the agent, appended after all of the chart's own, as given
    /// (each non-empty). The agent refuses a one-value flag given twice (exit status 2), so one
    /// the chart already sets cannot be overridden here; list flags add to the chart's.
    pub extra_args: Vec<String>,
    /// Pull secrets of the agent pods.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Accepted for compatibility; names are fixed.
    pub name_override: String,
    /// Accepted for compatibility; names are fixed.
    pub fullname_override: String,
    /// (new) priorityClassName of the agent pods (empty: none).
    pub priority_class_name: String,
    /// (new) The DaemonSet's updateStrategy (empty: Kubernetes' default).
    pub update_strategy: Option<DaemonSetUpdateStrategy>,
    /// (new) The agent container's securityContext.
    pub security_context: Option<SecurityContext>,
    /// (new) The agent container's AppArmor profile: `Unconfined`, `RuntimeDefault` or empty
    /// (none set). `securityContext.appArmorProfile` from Kubernetes 1.30, the beta pod
    /// annotation before.
    pub app_armor_profile: String,
    /// (new) Extra environment variables.
    pub extra_env: Vec<EnvVar>,
    /// (new) Extra volumes of the pods.
    pub extra_volumes: Vec<Volume>,
    /// (new) Extra mounts of the container.
    pub extra_volume_mounts: Vec<VolumeMount>,
    /// (new) The agent's metrics and health port on the node (`--metrics-addr`).
    pub metrics_port: i32,
    /// (new) Per-pod RDMA usage (`--rdma-usage`).
    pub rdma_usage: RdmaUsageValues,
    /// `agent.admissionPolicy.*` (new): the chart's ValidatingAdmissionPolicy that keeps each
    /// agent to its own node, rendered where the cluster serves the API (see
    /// [`renders_node_scope`]).
    pub admission_policy: AdmissionPolicyValues,
}

/// `agent.rdmaUsage.*` (new): per-pod RDMA usage in the agent's metrics and `GET /usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RdmaUsageValues {
    /// Read the kernel's RDMA objects and counters on scrape; `false`: `--rdma-usage=false`.
    pub enabled: bool,
}

impl Default for RdmaUsageValues {
    fn default() -> Self {
        RdmaUsageValues { enabled: true }
    }
}

/// `agent.admissionPolicy.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AdmissionPolicyValues {
    /// Render the policy and its binding (where the API server serves them).
    pub enabled: bool,
}

impl Default for AdmissionPolicyValues {
    fn default() -> Self {
        AdmissionPolicyValues { enabled: true }
    }
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
            extra_args: Vec::new(),
            image_pull_secrets: Vec::new(),
            name_override: String::new(),
            fullname_override: String::new(),
            priority_class_name: "system-node-critical".into(),
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::String("10%".into())),
                    ..Default::default()
                }),
            }),
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
                read_only_root_filesystem: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            // containerd's default profile denies what the agent does through the host's PID 1
            // (docs/operations.md, "Agent DaemonSet: privileges and host paths").
            app_armor_profile: "Unconfined".into(),
            extra_env: Vec::new(),
            extra_volumes: Vec::new(),
            extra_volume_mounts: Vec::new(),
            metrics_port: AGENT_METRICS_PORT,
            rdma_usage: RdmaUsageValues::default(),
            admission_policy: AdmissionPolicyValues::default(),
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
    /// Create the ServiceAccounts (false: both workloads run as `name`, an existing account;
    /// never the namespace's `default`, see [`Values::validate`]).
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
    /// The cluster's VPC (only its instances are changed); empty: the controller's own.
    pub vpc_id: String,
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
    /// `smcr-init` image; empty: erdma's [`SMC_INIT_IMAGE`] at [`APP_VERSION`] (see
    /// [`ConfigValues::smc_init_image_ref`]).
    pub smc_init_image: String,
    /// Local ERI discovery (no cloud credentials needed).
    #[serde(rename = "localERIDiscovery")]
    pub local_eri_discovery: bool,
}

impl Default for ConfigValues {
    fn default() -> Self {
        Self {
            region: String::new(),
            vpc_id: String::new(),
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

impl ConfigValues {
    /// Whether `smcInitImage` is the original's `smcr_init` image at its default tag
    /// (`registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init` or a
    /// `registry-vpc.<region>.aliyuncs.com` mirror, tag `latest` or none), which a values file
    /// copied from the original chart may carry; erdma's image replaces it.
    pub fn is_original_smc_init_image(&self) -> bool {
        let image = self.smc_init_image.as_str();
        let repo = image.strip_suffix(":latest").unwrap_or(image);
        let Some(host) = repo.strip_suffix(".aliyuncs.com/erdma/smcr_init") else {
            return false;
        };
        host == "registry.cn-hangzhou" || host.strip_prefix("registry-vpc.").is_some_and(is_region)
    }

    /// The `smcr-init` image written into `config.json` (what the webhook injects):
    /// `smcInitImage`, or `ghcr.io/erdma/smcr-init:<APP_VERSION>` when it is empty or the
    /// original's default (erdma's image runs the same command with the same `SMCR_PNET`).
    pub fn smc_init_image_ref(&self) -> String {
        if self.smc_init_image.is_empty() || self.is_original_smc_init_image() {
            format!("{SMC_INIT_IMAGE}:{APP_VERSION}")
        } else {
            self.smc_init_image.clone()
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
    /// An existing Secret (key `credential.json`) used instead of the rendered one.
    pub existing_secret: String,
}

impl std::fmt::Debug for CredentialValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialValues")
            .field("kind", &self.kind)
            .field("access_key_secret", &"***")
            .field("existing_secret", &self.existing_secret)
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
    /// The original chart's `nameOverride`: the `app.kubernetes.io/name` label (in the
    /// selectors) and part of the controller ServiceAccount's name.
    pub name_override: String,
    /// The original chart's `fullnameOverride`: the controller ServiceAccount's name.
    pub fullname_override: String,
    /// Annotations of the controller and agent pods.
    pub pod_annotations: BTreeMap<String, String>,
    /// (new) Labels of the controller and agent pods (the selector labels win).
    pub pod_labels: BTreeMap<String, String>,
    /// (new) `text` or `json` (`--log-format`, agent and controller).
    pub log_format: String,
    /// (new) Log filter (`--log-level`, agent and controller).
    pub log_level: String,
    /// (new) The kubelet's root directory on the nodes.
    pub kubelet_root_dir: String,
    /// (new) The Prometheus Operator ServiceMonitors.
    pub service_monitor: ServiceMonitorValues,
    /// Nodes that run the agent and get ERIs.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the agent and controller.
    pub tolerations: Vec<Toleration>,
    /// Affinity of the agent pods.
    pub affinity: Option<Affinity>,
    /// Resources of the agent container (empty: erdma's requests).
    pub resources: Option<ResourceRequirements>,
    /// (new) Install next to another installation serving `aliyun/erdma` (`erdmactl install
    /// --allow-existing`; the chart's pre-install check is skipped).
    pub allow_existing_installation: bool,
    /// `Ignore` (default) or `Fail`.
    pub webhook_failure_policy: String,
    /// Webhook timeout.
    pub webhook_timeout_seconds: i32,
    /// `config.json`.
    pub config: ConfigValues,
    /// Cloud credentials.
    pub credentials: CredentialValues,
    /// (new) The DRA driver.
    pub dra: DraValues,
    /// (new) `helm test` (the chart's hook; `erdmactl install` applies no hooks).
    pub tests: TestValues,
}

/// `tests.*` (new): the chart's `helm test` pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TestValues {
    /// Render the test pod and its RBAC.
    pub enabled: bool,
}

impl Default for TestValues {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// `dra.*` (new): the DRA driver `erdma.alibabacloud.com`. Off by default. When on, the install
/// adds the DeviceClass (with `extendedResourceName: aliyun/erdma`, so pods asking
/// `aliyun/erdma` are served through DRA on DRA nodes), the agent's RBAC for ResourceSlices,
/// ResourceClaims and reading its Node, the kubelet plugin directories and `/var/run/cdi`, and
/// runs the agent with `--resource-api=node-label`: nodes labelled
/// `erdma.alibabacloud.com/resource-api=dra` use DRA, every other node the device plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DraValues {
    /// Enable the DRA driver (per node, by label).
    pub enabled: bool,
}

/// `serviceMonitor.*` (new): ServiceMonitors for the agent's and controller's metrics, rendered
/// when enabled and the cluster serves `monitoring.coreos.com/v1` ServiceMonitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceMonitorValues {
    /// Render them (where the CRD exists).
    pub enabled: bool,
    /// Render them without checking that the cluster serves the kind.
    #[serde(rename = "trustCRDsExist")]
    pub trust_crds_exist: bool,
    /// Scrape interval.
    pub interval: String,
    /// Extra labels of the ServiceMonitors.
    pub labels: BTreeMap<String, String>,
}

impl Default for ServiceMonitorValues {
    fn default() -> Self {
        Self {
            enabled: true,
            trust_crds_exist: false,
            interval: "30s".into(),
            labels: BTreeMap::new(),
        }
    }
}

/// The DRA driver name.
pub const DRA_DRIVER: &str = "erdma.alibabacloud.com";
/// The extended resource the DeviceClass maps to DRA (KEP-5004).
pub const DRA_EXTENDED_RESOURCE: &str = "aliyun/erdma";

impl Default for Values {
    fn default() -> Self {
        Self {
            namespace: "kube-system".into(),
            name: DEFAULT_RELEASE.into(),
            controller: ControllerValues::default(),
            agent: AgentValues::default(),
            service_account: ServiceAccountValues::default(),
            name_override: String::new(),
            fullname_override: String::new(),
            pod_annotations: BTreeMap::new(),
            pod_labels: BTreeMap::new(),
            log_format: "text".into(),
            log_level: "info".into(),
            kubelet_root_dir: "/var/lib/kubelet".into(),
            service_monitor: ServiceMonitorValues::default(),
            node_selector: BTreeMap::new(),
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            affinity: None,
            resources: None,
            allow_existing_installation: false,
            webhook_failure_policy: "Ignore".into(),
            webhook_timeout_seconds: 5,
            config: ConfigValues::default(),
            credentials: CredentialValues::default(),
            dra: DraValues::default(),
            tests: TestValues::default(),
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
        let sa = &self.service_account;
        if sa.name == "default" || (!sa.create && sa.name.is_empty()) {
            return bad(format!(
                "serviceAccount.name {:?}: the controller's and agent's roles would be bound to the namespace's default ServiceAccount, which every pod there runs as unless it names another; set serviceAccount.create=true (one account each is created), or serviceAccount.name to an existing account of their own",
                sa.name
            ));
        }
        let c = &self.credentials;
        if !c.existing_secret.is_empty()
            && (!c.access_key_id.is_empty() || !c.access_key_secret.is_empty())
        {
            return bad(format!(
                "credentials.existingSecret {:?} and credentials.accessKeyID/accessKeySecret are both set: the keys in values would be ignored; keep the AccessKey in the existing Secret (key credential.json) and remove it from values",
                c.existing_secret
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
        if !["", "Unconfined", "RuntimeDefault"].contains(&self.agent.app_armor_profile.as_str()) {
            return bad(format!(
                "agent.appArmorProfile {:?} must be Unconfined, RuntimeDefault or \"\" (none set)",
                self.agent.app_armor_profile
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
        for (i, arg) in self.agent.extra_args.iter().enumerate() {
            if arg.trim().is_empty() {
                return bad(format!(
                    "agent.extraArgs[{i}] {arg:?} is empty: each entry is one argument of the agent (e.g. \"--rdma-driver=rxe\"); remove it"
                ));
            }
        }
        for (i, arg) in self.controller.extra_args.iter().enumerate() {
            if arg.trim().is_empty() {
                return bad(format!(
                    "controller.extraArgs[{i}] {arg:?} is empty: each entry is one argument of the controller; remove it"
                ));
            }
        }
        let root = self.kubelet_root_dir.trim_end_matches('/');
        if !root.starts_with('/') || format!("{root}/").contains("/../") {
            return bad(format!(
                "kubeletRootDir {:?} must be an absolute directory (the kubelet's --root-dir, e.g. /var/lib/kubelet or /var/lib/k0s/kubelet)",
                self.kubelet_root_dir
            ));
        }
        if !["text", "json"].contains(&self.log_format.as_str()) {
            return bad(format!(
                "logFormat {:?} must be text or json",
                self.log_format
            ));
        }
        if !(1..=65535).contains(&self.agent.metrics_port) {
            return bad(format!(
                "agent.metricsPort {} must be a port, 1..65535",
                self.agent.metrics_port
            ));
        }
        if let Err(e) = check_dns_label("namespace", &self.namespace, 63) {
            return bad(e);
        }
        if let Err(e) = check_release_name(&self.name) {
            return bad(e);
        }
        if !self.name_override.is_empty()
            && let Err(e) = check_dns_label("nameOverride", &self.name_override, 63)
        {
            return bad(e);
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
        if c.existing_secret.is_empty()
            && matches!(c.kind.as_str(), "" | "access_key")
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

    /// `app.kubernetes.io/name` of every object: `nameOverride`, else the original chart's name
    /// (the original's `name` template).
    pub fn app_name(&self) -> String {
        trunc63(&non_empty_or(&self.name_override, APP_NAME))
    }

    /// The original chart's `fullname`: `fullnameOverride`, else `<release>-<name>` (the release
    /// alone when it contains the name).
    pub fn fullname(&self) -> String {
        if !self.fullname_override.is_empty() {
            return trunc63(&self.fullname_override);
        }
        let name = self.app_name();
        if self.name.contains(&name) {
            trunc63(&self.name)
        } else {
            trunc63(&format!("{}-{name}", self.name))
        }
    }

    /// The controller's ServiceAccount (the original chart's naming).
    pub fn controller_sa(&self) -> String {
        if !self.service_account.create {
            return self.service_account.name.clone();
        }
        non_empty_or(&self.service_account.name, &self.fullname())
    }

    /// The kubelet's root directory without a trailing slash.
    pub fn kubelet_root(&self) -> String {
        let d = self.kubelet_root_dir.trim_end_matches('/');
        non_empty_or(d, "/var/lib/kubelet")
    }

    /// The credentials Secret the controller mounts: `credentials.existingSecret`, else the
    /// rendered one (the release's name).
    pub fn credentials_secret(&self) -> String {
        non_empty_or(&self.credentials.existing_secret, &self.name)
    }

    /// The agent's ServiceAccount: its own when created, else the shared one.
    pub fn agent_sa(&self) -> String {
        if self.service_account.create {
            trunc63(&format!("{}-agent", self.name))
        } else {
            self.service_account.name.clone()
        }
    }

    pub(super) fn agent_rbac(&self) -> String {
        format!("{}-agent", self.name)
    }

    /// Whether the controller runs: cloud provisioning, or the webhook in local mode.
    pub fn runs_controller(&self) -> bool {
        !self.config.local_eri_discovery || self.config.enable_webhook
    }
}

/// A DNS-1123 label (namespaces, label-like names): lowercase alphanumerics and `-`, starting
/// and ending alphanumeric, at most `max` characters; the error names the value and the rule,
/// as the API server's validation says it.
pub fn check_dns_label(what: &str, value: &str, max: usize) -> Result<(), String> {
    let ok_chars = value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if value.is_empty()
        || value.len() > max
        || !ok_chars
        || !ends(value.bytes().next())
        || !ends(value.bytes().last())
    {
        return Err(format!(
            "{what} {value:?} is not valid: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', start and end with an alphanumeric character, and be at most {max} characters (e.g. 'kube-system', regex '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ));
    }
    Ok(())
}

/// A Helm release name: at most 53 characters, DNS-1123 labels joined by dots (Helm's
/// `ValidateReleaseName`).
pub fn check_release_name(value: &str) -> Result<(), String> {
    let valid = !value.is_empty()
        && value.len() <= 53
        && value
            .split('.')
            .all(|l| check_dns_label("release", l, 63).is_ok());
    if valid {
        return Ok(());
    }
    Err(format!(
        "release name {value:?} is not valid: at most 53 characters of lowercase alphanumerics, '-' and '.', each dot-separated part starting and ending with an alphanumeric (as Helm requires; e.g. 'alibaba-erdma-controller')"
    ))
}
