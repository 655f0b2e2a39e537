//! Command-line flags, the optional config file, and their merge (flags win).

use anyhow::{Context, bail};
use clap::Parser;
use erdma_model::rdma_limit::{Memlock, RdmaLimit};
use erdma_model::{DriverMode, EriSelector};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The inventory's safety poll (`--poll-interval-ms`): health comes from events; this only
/// bounds how late a change that sends no event is seen, at a cost of one health re-read (about
/// 3 ms for 64 devices) per period.
pub const DEFAULT_POLL_MS: u64 = 10_000;

/// erdma node agent: serves eRDMA devices to pods through the kubelet device-plugin API
/// (`aliyun/erdma`), with NUMA-aware preferred allocation, health and kubelet-restart handling.
///
/// Every value may also come from `--config-path FILE` (YAML or JSON; keys are the flag names, e.g.
/// `kubelet-dir`, or the Helm names `preferDriver`, `allocateAllDevices`, `exposedLocalERIs`,
/// `jumboFrameMTU`, `localERIDiscovery`, `logFormat`, `logLevel`); flags win over the file.
#[derive(Debug, Parser, Default)]
#[command(
    name = "erdma-agent",
    version,
    after_help = "Exit status: 0 stopped cleanly (SIGTERM/SIGINT); 1 a fatal runtime error; 2 invalid flags or config file."
)]
pub struct Flags {
    /// sysfs root to read devices from [default: /sys].
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// dev root holding `infiniband/uverbsN` [default: /dev].
    #[arg(long, value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// Kubelet device-plugin directory holding kubelet.sock [default: /var/lib/kubelet/device-plugins].
    #[arg(long, value_name = "DIR")]
    pub kubelet_dir: Option<PathBuf>,
    /// Kubelet pod-resources socket, used to count slots in use for preferred allocation.
    #[arg(long, value_name = "PATH")]
    pub pod_resources_socket: Option<PathBuf>,
    /// Extended resource name [default: aliyun/erdma].
    #[arg(long, value_name = "NAME")]
    pub resource_name: Option<String>,
    /// RDMA drivers to serve, comma-separated (`erdma`, `rxe`, `siw`, or a kernel driver name) [default: erdma].
    #[arg(long, value_name = "NAME[,NAME]", value_delimiter = ',')]
    pub rdma_driver: Option<Vec<String>>,
    /// Shared slots advertised per device [default: 200].
    #[arg(long, value_name = "N")]
    pub slots_per_device: Option<u32>,
    /// Every container gets every usable device [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allocate_all_devices: Option<bool>,
    /// Address of /metrics and /healthz, or `off` [default: 0.0.0.0:9101].
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// ECS instance ID (overrides the metadata service).
    #[arg(long, value_name = "ID")]
    pub instance_id: Option<String>,
    /// Driver mode: default, compat, ofed, auto (empty), or none (serve devices as found, never
    /// touch the driver) [default: auto].
    #[arg(long, value_name = "MODE")]
    pub prefer_driver: Option<String>,
    /// Ask the kubelet for PreStartContainer (SMC-R pre-start mode) [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub deviceplugin_prestart_container: Option<bool>,
    /// Serve the local devices (filtered by --rdma-driver and --exposed-local-eris) instead of
    /// waiting for this node's ERdmaDevice. Without it the agent needs the Kubernetes API
    /// (NODE_NAME and in-cluster config or --kubeconfig) and serves only the ERdmaDevice's ERIs
    /// found locally; nothing is served until that object exists and is Ready [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub local_eri_discovery: Option<bool>,
    /// Allow-list `<instance-id|i-*> <ibdev>[/<ibdev>...]`, comma-separated or the flag repeated
    /// (the original agent's form). Applied with --local-eri-discovery only, as in the original;
    /// in cluster mode only with --filter-cluster-eris.
    #[arg(long, value_name = "LIST", action = clap::ArgAction::Append)]
    pub exposed_local_eris: Vec<String>,
    /// Apply --exposed-local-eris in cluster mode too, on top of the node's ERdmaDevice
    /// [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub filter_cluster_eris: Option<bool>,
    /// MTU applied when an ERI asks for jumbo frames [default: 8500].
    #[arg(long, value_name = "MTU")]
    pub jumbo_frame_mtu: Option<u32>,
    /// eRDMA driver installer version, run only when the driver is missing [default: 1.5.9].
    #[arg(long, value_name = "VERSION")]
    pub erdma_installer_version: Option<String>,
    /// SHA-256 (64 hex digits, as `sha256sum` prints) of the standard installer tarball of
    /// --erdma-installer-version. Required before the agent runs that installer; there is no
    /// built-in value (docs/operations.md, "Driver installer trust").
    #[arg(long, value_name = "HEX")]
    pub driver_installer_sha256: Option<String>,
    /// SHA-256 of `env_setup.sh` (the GPU/OFED installer); required before it runs.
    #[arg(long, value_name = "HEX")]
    pub gpu_installer_sha256: Option<String>,
    /// Base URL of the installers (`<base>/erdma_installer-<version>.tar.gz`,
    /// `<base>/env_setup.sh`) [default: https://mirrors.cloud.aliyuncs.com/erdma].
    #[arg(long, value_name = "URL")]
    pub driver_installer_base_url: Option<String>,
    /// Extra CA certificates (PEM) trusted for the installer download, besides the Mozilla roots.
    #[arg(long, value_name = "FILE")]
    pub driver_installer_ca_file: Option<PathBuf>,
    /// Accept a plain http:// installer base URL (logged as insecure; the SHA-256 pin is still
    /// required and checked). [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_insecure_driver_download: Option<bool>,
    /// Reload the erdma module for a mode change even while pods hold `aliyun/erdma` (breaks
    /// their RDMA connections; logged loudly) [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub force_driver_reload: Option<bool>,
    /// Set up the ERI netdevs (link up, MTU, primary IPv4 from the metadata service, routes that
    /// never override the primary interface) once the driver is ready. The primary interface
    /// (`eth0` or the ERdmaDevice's isPrimaryENI) is never touched. [default: true when
    /// --prefer-driver is not `none` and --local-eri-discovery is off; false otherwise]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub setup_eri_netdev: Option<bool>,
    /// Map each served eRDMA device's PNET ID to it in the host's SMC-R pnet table (best effort,
    /// devices in default/compat mode only). [default: true when --prefer-driver is not `none`]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub setup_smc_pnet: Option<bool>,
    /// Kubeconfig for the Kubernetes API (node labels, Events, the ERdmaDevice) when not running
    /// in-cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name; the Kubernetes API is used only when it is set.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Deadline of each Kubernetes API request that is not a watch (kubectl's syntax: 30s, 2m,
    /// 1m30s; 0 for none); watches end by the API server's timeoutSeconds [default: 70s].
    #[arg(long, value_name = "DURATION")]
    pub request_timeout: Option<String>,
    /// ECS metadata service endpoint (tests and emulators).
    #[arg(long, value_name = "URL", hide = true)]
    pub metadata_endpoint: Option<String>,
    /// CDI mode: write a CDI spec into this directory and answer Allocate with CDI device names.
    #[arg(long, value_name = "DIR")]
    pub cdi_spec_dir: Option<PathBuf>,
    /// Safety poll of the device inventory in milliseconds [default: 10000]. Health follows
    /// rtnetlink link events and /dev/infiniband changes at once; the poll only catches a port
    /// state change that comes with neither.
    #[arg(long, value_name = "MS")]
    pub poll_interval_ms: Option<u64>,
    /// Log format on stderr: `text` (ANSI colours only when stderr is a terminal and NO_COLOR is
    /// unset or empty) or `json` (one JSON object per line) [default: text].
    #[arg(long, value_name = "text|json")]
    pub log_format: Option<String>,
    /// Log filter in tracing's EnvFilter syntax (`info`, `debug`, `info,erdma_nri=debug`)
    /// [default: $RUST_LOG, else info].
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Container runtime (CRI) socket used by the SMC-R pre-start hook to find a pod's network
    /// namespace and annotations [default: $RUNTIME_SOCK, else the first that exists of
    /// /run/containerd/containerd.sock, /run/k3s/containerd/containerd.sock,
    /// /var/run/crio/crio.sock, /var/run/cri-dockerd.sock].
    #[arg(long, env = "RUNTIME_SOCK", value_name = "PATH")]
    pub cri_socket: Option<PathBuf>,
    /// SMC-R pre-start: fail the container when its pod asks for SMC-R
    /// (`network.alibabacloud.com/erdma-smcr: "true"`) and SMC-R cannot be configured, or when
    /// the pod cannot be looked up. Off: the pod gets an Event and starts on TCP. [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub smcr_strict: Option<bool>,
    /// SMC-R pre-start: leave IPv6 on in SMC-R pods (the default sets disable_ipv6, as the
    /// original agent does, because eRDMA SMC-R falls back to TCP on IPv6). [default: false]
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub smcr_keep_ipv6: Option<bool>,
    /// bpffs directory where the SMC-R BPF socket policy is pinned, so that it survives agent
    /// restarts and `smcr-init` finds it [default: /sys/fs/bpf/erdma-smc, the directory
    /// `erdma_smc::policy::PIN_DIR` and `smcr-init` use].
    #[arg(long, value_name = "DIR")]
    pub bpf_pin_dir: Option<PathBuf>,
    /// NRI plugin: `auto` (when the runtime's NRI socket exists at start: SMC-R at sandbox
    /// creation, memlock and rdma limits; else the PreStart path), `on` (NRI only, wait for the
    /// socket) or `off` [default: auto].
    #[arg(long, value_name = "MODE")]
    pub nri: Option<String>,
    /// The runtime's NRI socket [default: /var/run/nri/nri.sock].
    #[arg(long, value_name = "PATH")]
    pub nri_socket: Option<PathBuf>,
    /// RLIMIT_MEMLOCK for containers holding the resource, through NRI: `unlimited`, bytes with
    /// an optional K/M/G/T (the bound on what one container may pin), or `off` [default:
    /// unlimited].
    #[arg(long, value_name = "LIMIT")]
    pub nri_memlock: Option<String>,
    /// The `rdma.max` limits (`hca_handle=N hca_object=M`, either or both, `max` allowed) of
    /// containers holding the resource through the device plugin, through NRI: a ceiling the pod
    /// annotation `network.alibabacloud.com/erdma-rdma-max` may lower but not raise [default:
    /// none].
    #[arg(long, value_name = "LIMITS")]
    pub nri_rdma_max: Option<String>,
    /// Let the pod annotation `network.alibabacloud.com/erdma-rdma-max` raise a limit above
    /// `--nri-rdma-max` (it replaces it); off, an annotation only lowers it. A DRA claim's limit
    /// is never raised [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub nri_allow_annotation_raise: Option<bool>,
    /// Milliseconds one NRI call may take in the agent before the runtime is answered "no
    /// change"; keep it inside the runtime's plugin timeout (containerd's
    /// `plugin_request_timeout`, 2 s by default) [default: 800].
    #[arg(long, value_name = "MS")]
    pub nri_budget_ms: Option<u64>,
    /// Config file (YAML or JSON) with the same settings; flags win. The controller's flag name;
    /// `--config` is accepted too.
    #[arg(long = "config-path", alias = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How this node serves the resource: `device-plugin` (the kubelet device-plugin API), `dra`
    /// (the DRA driver erdma.alibabacloud.com: ResourceSlices, per-claim CDI specs), or
    /// `node-label` (this node's label erdma.alibabacloud.com/resource-api=dra|device-plugin,
    /// read at start; absent = device-plugin). Never both on one node. [default: device-plugin]
    #[arg(long, value_name = "API")]
    pub resource_api: Option<String>,
    /// The kubelet's root directory, holding plugins_registry/ and plugins/ for DRA
    /// [default: /var/lib/kubelet].
    #[arg(long, value_name = "DIR")]
    pub kubelet_root_dir: Option<PathBuf>,
    /// Per-pod RDMA usage: on each scrape of /metrics or GET /usage (results younger than 2 s
    /// reused), read the kernel's RDMA objects and port counters over RDMA netlink and attribute
    /// them to pods through /proc/<pid>/cgroup (needs the host PID namespace); `false`: no usage
    /// metrics and /usage answers 503 [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub rdma_usage: Option<bool>,
    /// Serve the per-pod RDMA usage (GET /usage, the per-pod families of /metrics) to every
    /// client that reaches --metrics-addr; `false`: to loopback clients only (processes on the
    /// node, `kubectl port-forward` to the agent's pod), the others get 403 and /metrics without
    /// pod names [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub usage_remote: Option<bool>,
}

pub use erdma_model::names::BPF_PIN_DIR as DEFAULT_BPF_PIN_DIR;

/// The config file. Unknown keys are rejected so that typos surface.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    sysfs_root: Option<PathBuf>,
    dev_root: Option<PathBuf>,
    kubelet_dir: Option<PathBuf>,
    pod_resources_socket: Option<PathBuf>,
    resource_name: Option<String>,
    rdma_driver: Option<StringOrList>,
    slots_per_device: Option<u32>,
    #[serde(alias = "allocateAllDevices")]
    allocate_all_devices: Option<bool>,
    metrics_addr: Option<String>,
    instance_id: Option<String>,
    #[serde(alias = "preferDriver")]
    prefer_driver: Option<String>,
    deviceplugin_prestart_container: Option<bool>,
    #[serde(alias = "localERIDiscovery")]
    local_eri_discovery: Option<bool>,
    #[serde(alias = "exposedLocalERIs")]
    exposed_local_eris: Option<StringOrList>,
    #[serde(alias = "filterClusterERIs")]
    filter_cluster_eris: Option<bool>,
    #[serde(alias = "jumboFrameMTU")]
    jumbo_frame_mtu: Option<u32>,
    cdi_spec_dir: Option<PathBuf>,
    poll_interval_ms: Option<u64>,
    #[serde(alias = "logFormat")]
    log_format: Option<String>,
    #[serde(alias = "logLevel")]
    log_level: Option<String>,
    #[serde(alias = "erdmaInstallerVersion")]
    erdma_installer_version: Option<String>,
    driver_installer_sha256: Option<String>,
    gpu_installer_sha256: Option<String>,
    driver_installer_base_url: Option<String>,
    driver_installer_ca_file: Option<PathBuf>,
    allow_insecure_driver_download: Option<bool>,
    force_driver_reload: Option<bool>,
    nri: Option<String>,
    nri_socket: Option<PathBuf>,
    nri_memlock: Option<String>,
    nri_rdma_max: Option<String>,
    nri_allow_annotation_raise: Option<bool>,
    nri_budget_ms: Option<u64>,
    setup_eri_netdev: Option<bool>,
    setup_smc_pnet: Option<bool>,
    kubeconfig: Option<PathBuf>,
    #[serde(alias = "requestTimeout")]
    request_timeout: Option<String>,
    cri_socket: Option<PathBuf>,
    smcr_strict: Option<bool>,
    smcr_keep_ipv6: Option<bool>,
    bpf_pin_dir: Option<PathBuf>,
    #[serde(alias = "resourceAPI")]
    resource_api: Option<String>,
    kubelet_root_dir: Option<PathBuf>,
    rdma_usage: Option<bool>,
    usage_remote: Option<bool>,
}

/// A comma-separated string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    fn items(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => s
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            StringOrList::Many(v) => v,
        }
    }
}

/// Where metrics are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    /// Not served.
    Off,
    /// Served on this address.
    On(SocketAddr),
}

/// The effective settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// sysfs root.
    pub sysfs_root: PathBuf,
    /// dev root.
    pub dev_root: PathBuf,
    /// Device-plugin directory.
    pub kubelet_dir: PathBuf,
    /// Pod-resources socket.
    pub pod_resources_socket: Option<PathBuf>,
    /// Resource name.
    pub resource_name: String,
    /// Driver keys served.
    pub rdma_drivers: Vec<String>,
    /// Slots per device.
    pub slots_per_device: u32,
    /// All-devices mode.
    pub allocate_all_devices: bool,
    /// Metrics address.
    pub metrics_addr: MetricsAddr,
    /// Instance ID from the flag or file.
    pub instance_id: Option<String>,
    /// Pre-start mode.
    pub prestart_container: bool,
    /// Local ERI discovery.
    pub local_eri_discovery: bool,
    /// ERI allow-list.
    pub exposed_local_eris: EriSelector,
    /// Jumbo-frame MTU.
    pub jumbo_frame_mtu: u32,
    /// CDI spec directory (CDI mode).
    pub cdi_spec_dir: Option<PathBuf>,
    /// Inventory poll interval.
    pub poll_interval: Duration,
    /// Log format (`--log-format`).
    pub log_format: erdma_host::logs::LogFormat,
    /// Log filter from `--log-level` or the file; `None`: `RUST_LOG`, else info.
    pub log_level: Option<String>,
    /// Driver manager settings (`--prefer-driver`, `--erdma-installer-version`,
    /// `--force-driver-reload`).
    pub driver: erdma_driver::DriverConfig,
    /// ERI netdev setup enabled.
    pub setup_eri_netdev: bool,
    /// Host SMC-R pnet setup enabled.
    pub setup_smc_pnet: bool,
    /// Kubeconfig path.
    pub kubeconfig: Option<PathBuf>,
    /// Node name (`NODE_NAME`).
    pub node_name: Option<String>,
    /// Deadline of each Kubernetes API request that is not a watch (`--request-timeout`);
    /// `None`: none.
    pub request_timeout: Option<Duration>,
    /// Metadata service endpoint.
    pub metadata_endpoint: String,
    /// CRI socket (`None`: auto-detect).
    pub cri_socket: Option<PathBuf>,
    /// SMC-R strict mode.
    pub smcr_strict: bool,
    /// Keep IPv6 on in SMC-R pods.
    pub smcr_keep_ipv6: bool,
    /// bpffs pin directory of the SMC-R BPF policy.
    pub bpf_pin_dir: PathBuf,
    /// How the resource is served on this node (`--resource-api`).
    pub resource_api: Choice,
    /// The kubelet's root directory (DRA sockets).
    pub kubelet_root_dir: PathBuf,
    /// Per-pod RDMA usage on scrape (`--rdma-usage`).
    pub rdma_usage: bool,
    /// Per-pod RDMA usage served to any client, not only loopback ones (`--usage-remote`).
    pub usage_remote: bool,
    /// NRI plugin mode.
    pub nri: NriMode,
    /// The runtime's NRI socket.
    pub nri_socket: PathBuf,
    /// NRI policy (memlock, default rdma limits).
    pub nri_policy: NriPolicy,
    /// Time one NRI call may take in the agent (`--nri-budget-ms`).
    pub nri_budget: std::time::Duration,
}

/// `--nri`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NriMode {
    /// NRI when the socket exists at start, else PreStart.
    Auto,
    /// NRI only.
    On,
    /// Never NRI.
    Off,
}

/// Reads a config file: JSON when it parses as JSON, YAML otherwise.
pub fn read_config(path: &std::path::Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read config file {}", path.display()))?;
    if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).with_context(|| {
            format!(
                "config file {} is not valid JSON for erdma-agent",
                path.display()
            )
        })
    } else if text.trim().is_empty() {
        Ok(FileConfig::default())
    } else {
        serde_saphyr::from_str(&text).with_context(|| {
            format!(
                "config file {} is not valid YAML for erdma-agent",
                path.display()
            )
        })
    }
}

impl Settings {
    /// Merges flags over the config file over the defaults, and validates.
    pub fn resolve(flags: Flags) -> anyhow::Result<Settings> {
        let file = match &flags.config {
            Some(p) => read_config(p)?,
            None => FileConfig::default(),
        };
        let prefer = flags
            .prefer_driver
            .or(file.prefer_driver)
            .unwrap_or_default();
        let installer = flags
            .erdma_installer_version
            .or(file.erdma_installer_version)
            .unwrap_or_else(|| erdma_driver::DEFAULT_INSTALLER_VERSION.to_string());
        let force = flags
            .force_driver_reload
            .or(file.force_driver_reload)
            .unwrap_or(false);
        let mut driver = erdma_driver::DriverConfig::from_flags(&prefer, &installer, force)?;
        let pin = |flag: &str, v: Option<String>| -> anyhow::Result<_> {
            v.map(|h| erdma_driver::fetch::Sha256Pin::parse(&h))
                .transpose()
                .map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
        };
        let trust = &mut driver.installer_trust;
        trust.standard_sha256 = pin(
            "driver-installer-sha256",
            flags
                .driver_installer_sha256
                .or(file.driver_installer_sha256),
        )?;
        trust.gpu_sha256 = pin(
            "gpu-installer-sha256",
            flags.gpu_installer_sha256.or(file.gpu_installer_sha256),
        )?;
        if let Some(url) = flags
            .driver_installer_base_url
            .or(file.driver_installer_base_url)
        {
            trust.base_url = url;
        }
        trust.allow_insecure_http = flags
            .allow_insecure_driver_download
            .or(file.allow_insecure_driver_download)
            .unwrap_or(false);
        let secure = trust.base_url.starts_with("https://");
        let opted_in = trust.allow_insecure_http && trust.base_url.starts_with("http://");
        if !secure && !opted_in {
            anyhow::bail!(
                "--driver-installer-base-url {:?} must be https:// (plain http:// only with --allow-insecure-driver-download)",
                trust.base_url
            );
        }
        if let Some(ca) = flags
            .driver_installer_ca_file
            .or(file.driver_installer_ca_file)
        {
            trust.extra_ca_pem = Some(
                std::fs::read_to_string(&ca)
                    .with_context(|| format!("--driver-installer-ca-file {}", ca.display()))?,
            );
        }
        let nri = match flags.nri.or(file.nri).as_deref() {
            None | Some("auto") => NriMode::Auto,
            Some("on") => NriMode::On,
            Some("off") => NriMode::Off,
            Some(other) => anyhow::bail!("--nri {other:?} must be auto, on or off"),
        };
        let memlock = erdma_model::rdma_limit::Memlock::parse(
            flags
                .nri_memlock
                .or(file.nri_memlock)
                .as_deref()
                .unwrap_or("unlimited"),
        )
        .map_err(|e| anyhow::anyhow!("--nri-memlock: {e}"))?;
        let default_rdma_max = flags
            .nri_rdma_max
            .or(file.nri_rdma_max)
            .filter(|s| !s.trim().is_empty())
            .map(|s| erdma_model::rdma_limit::RdmaLimit::parse(&s))
            .transpose()
            .map_err(|e| anyhow::anyhow!("--nri-rdma-max: {e}"))?;
        let nri_budget = match flags.nri_budget_ms.or(file.nri_budget_ms) {
            None => NRI_BUDGET,
            Some(0) => anyhow::bail!("--nri-budget-ms must be more than 0"),
            Some(ms) => std::time::Duration::from_millis(ms),
        };
        let prefer_driver: DriverMode = driver.mode;
        let local_eri_discovery = flags
            .local_eri_discovery
            .or(file.local_eri_discovery)
            .unwrap_or(false);
        let managed = prefer_driver != DriverMode::None;
        let setup_eri_netdev = flags
            .setup_eri_netdev
            .or(file.setup_eri_netdev)
            .unwrap_or(managed && !local_eri_discovery);
        let setup_smc_pnet = flags
            .setup_smc_pnet
            .or(file.setup_smc_pnet)
            .unwrap_or(managed);
        let from_flags: Vec<String> = flags
            .exposed_local_eris
            .into_iter()
            .flat_map(|s| StringOrList::One(s).items())
            .collect();
        let exposed = if from_flags.is_empty() {
            file.exposed_local_eris
                .map(StringOrList::items)
                .unwrap_or_default()
        } else {
            from_flags
        };
        let filter_cluster_eris = flags
            .filter_cluster_eris
            .or(file.filter_cluster_eris)
            .unwrap_or(false);
        // The original applies the list only with local discovery (its chart's placeholder
        // `i-XXX erdma_0/erdma_1` is harmless in cluster mode); checked either way.
        let exposed = if local_eri_discovery || filter_cluster_eris {
            exposed
        } else {
            EriSelector::from_entries(&exposed).with_context(|| "--exposed-local-eris")?;
            Vec::new()
        };
        let exposed_local_eris =
            EriSelector::from_entries(&exposed).with_context(|| "--exposed-local-eris")?;
        let metrics = flags
            .metrics_addr
            .or(file.metrics_addr)
            .unwrap_or_else(|| "0.0.0.0:9101".into());
        let metrics_addr = if metrics == "off" {
            MetricsAddr::Off
        } else {
            let addr = metrics
                .strip_prefix(':')
                .map(|port| format!("0.0.0.0:{port}"))
                .unwrap_or_else(|| metrics.clone())
                .parse()
                .with_context(|| {
                    format!(
                        "--metrics-addr {metrics:?} is not HOST:PORT (e.g. 0.0.0.0:9101) or off"
                    )
                })?;
            MetricsAddr::On(addr)
        };
        let rdma_drivers: Vec<String> = flags
            .rdma_driver
            .or(file.rdma_driver.map(StringOrList::items))
            .unwrap_or_else(|| vec!["erdma".into()])
            .into_iter()
            .map(|d| normalise_driver(d.trim()))
            .filter(|d| !d.is_empty())
            .collect();
        if rdma_drivers.is_empty() {
            bail!(
                "--rdma-driver is empty; name at least one RDMA driver to serve (erdma, rxe, siw, ...)"
            );
        }
        let log_format = erdma_host::logs::LogFormat::parse(
            &flags.log_format.or(file.log_format).unwrap_or_default(),
        )
        .map_err(|e| anyhow::anyhow!("--log-format: {e}"))?;
        // Checked with RUST_LOG when logs are set up (main), where an invalid one exits 2.
        let log_level = flags
            .log_level
            .or(file.log_level)
            .filter(|l| !l.trim().is_empty());
        let poll_ms = flags
            .poll_interval_ms
            .or(file.poll_interval_ms)
            .unwrap_or(DEFAULT_POLL_MS);
        if !(10..=60_000).contains(&poll_ms) {
            bail!("--poll-interval-ms {poll_ms} is out of range (10..=60000)");
        }
        let jumbo_frame_mtu = flags
            .jumbo_frame_mtu
            .or(file.jumbo_frame_mtu)
            .unwrap_or(8500);
        if let Err(e) = erdma_model::names::check_jumbo_mtu(jumbo_frame_mtu.into()) {
            bail!("--jumbo-frame-mtu: {e}");
        }
        let request_timeout = match flags.request_timeout.or(file.request_timeout) {
            Some(v) => erdma_k8s::client::parse_timeout(&v)
                .map_err(|e| anyhow::anyhow!("--request-timeout: {e}"))?,
            None => Some(erdma_k8s::client::DEFAULT_REQUEST_TIMEOUT),
        };
        let s = Settings {
            sysfs_root: flags
                .sysfs_root
                .or(file.sysfs_root)
                .unwrap_or_else(|| "/sys".into()),
            dev_root: flags
                .dev_root
                .or(file.dev_root)
                .unwrap_or_else(|| "/dev".into()),
            kubelet_dir: flags
                .kubelet_dir
                .or(file.kubelet_dir)
                .unwrap_or_else(|| "/var/lib/kubelet/device-plugins".into()),
            pod_resources_socket: flags.pod_resources_socket.or(file.pod_resources_socket),
            resource_name: flags
                .resource_name
                .or(file.resource_name)
                .unwrap_or_else(|| erdma_deviceplugin::config::DEFAULT_RESOURCE_NAME.into()),
            rdma_drivers,
            slots_per_device: flags
                .slots_per_device
                .or(file.slots_per_device)
                .unwrap_or(erdma_deviceplugin::config::DEFAULT_SLOTS_PER_DEVICE),
            allocate_all_devices: flags
                .allocate_all_devices
                .or(file.allocate_all_devices)
                .unwrap_or(false),
            metrics_addr,
            instance_id: flags
                .instance_id
                .or(file.instance_id)
                .filter(|s| !s.trim().is_empty()),
            prestart_container: flags
                .deviceplugin_prestart_container
                .or(file.deviceplugin_prestart_container)
                .unwrap_or(false),
            local_eri_discovery,
            exposed_local_eris,
            jumbo_frame_mtu,
            cdi_spec_dir: flags.cdi_spec_dir.or(file.cdi_spec_dir),
            poll_interval: Duration::from_millis(poll_ms),
            log_format,
            log_level,
            driver,
            setup_eri_netdev,
            setup_smc_pnet,
            kubeconfig: flags.kubeconfig.or(file.kubeconfig),
            node_name: flags.node_name.filter(|n| !n.trim().is_empty()),
            request_timeout,
            metadata_endpoint: flags
                .metadata_endpoint
                .unwrap_or_else(|| erdma_cloud::imds::DEFAULT_ENDPOINT.into()),
            cri_socket: flags
                .cri_socket
                .or(file.cri_socket)
                .filter(|p| !p.as_os_str().is_empty()),
            smcr_strict: flags.smcr_strict.or(file.smcr_strict).unwrap_or(false),
            smcr_keep_ipv6: flags
                .smcr_keep_ipv6
                .or(file.smcr_keep_ipv6)
                .unwrap_or(false),
            bpf_pin_dir: flags
                .bpf_pin_dir
                .or(file.bpf_pin_dir)
                .unwrap_or_else(|| DEFAULT_BPF_PIN_DIR.into()),
            resource_api: Choice::parse(
                flags
                    .resource_api
                    .or(file.resource_api)
                    .as_deref()
                    .unwrap_or("device-plugin"),
            )
            .map_err(|e| anyhow::anyhow!("--resource-api: {e}"))?,
            kubelet_root_dir: flags
                .kubelet_root_dir
                .or(file.kubelet_root_dir)
                .unwrap_or_else(|| "/var/lib/kubelet".into()),
            rdma_usage: flags.rdma_usage.or(file.rdma_usage).unwrap_or(true),
            usage_remote: flags.usage_remote.or(file.usage_remote).unwrap_or(false),
            nri,
            nri_socket: flags
                .nri_socket
                .or(file.nri_socket)
                .unwrap_or_else(|| erdma_nri::DEFAULT_SOCKET.into()),
            nri_policy: NriPolicy {
                memlock,
                default_rdma_max,
                allow_annotation_raise: flags
                    .nri_allow_annotation_raise
                    .or(file.nri_allow_annotation_raise)
                    .unwrap_or(false),
            },
            nri_budget,
        };
        // The device plugin's own checks, here so that a bad value is a usage error (exit 2)
        // before anything starts, not a task that fails after start-up.
        let mut plugin = erdma_deviceplugin::PluginConfig::new(&s.kubelet_dir);
        plugin.resource_name.clone_from(&s.resource_name);
        plugin.slots_per_device = s.slots_per_device;
        if let Err(e) = plugin.validate() {
            bail!("{e}");
        }
        Ok(s)
    }
}

/// `rdma_rxe` is the module of the `rxe` driver: accept both.
fn normalise_driver(d: &str) -> String {
    match d {
        "rdma_rxe" => "rxe".into(),
        other => other.to_string(),
    }
}

/// `--resource-api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Always the device plugin.
    DevicePlugin,
    /// Always DRA.
    Dra,
    /// From the node label [`NODE_LABEL`] (absent: the device plugin).
    NodeLabel,
}

impl Choice {
    /// Parses the flag value.
    pub fn parse(s: &str) -> Result<Choice, String> {
        match s.trim() {
            "device-plugin" => Ok(Choice::DevicePlugin),
            "dra" => Ok(Choice::Dra),
            "node-label" => Ok(Choice::NodeLabel),
            other => Err(format!("{other:?} is not device-plugin, dra or node-label")),
        }
    }
}

/// The NRI plugin's policy settings.
#[derive(Debug, Clone)]
pub struct NriPolicy {
    /// `RLIMIT_MEMLOCK` for containers holding the resource (`--nri-memlock`).
    pub memlock: Memlock,
    /// `rdma.max` of device-plugin containers (`--nri-rdma-max`): the annotation lowers it.
    pub default_rdma_max: Option<RdmaLimit>,
    /// Whether the annotation may raise `default_rdma_max` (`--nri-allow-annotation-raise`).
    pub allow_annotation_raise: bool,
}

/// Default time one NRI call may take in the agent (the runtime allows 2 s by default);
/// `--nri-budget-ms` changes it.
pub const NRI_BUDGET: std::time::Duration = std::time::Duration::from_millis(800);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Settings> {
        let mut v = vec!["erdma-agent"];
        v.extend_from_slice(args);
        Settings::resolve(Flags::try_parse_from(v)?)
    }

    /// The device plugin's values are usage errors at start (exit 2 in main), not a task that
    /// fails after the agent started (issue 30, item 6).
    #[test]
    fn device_plugin_values_are_refused_at_startup() {
        for (args, words) in [
            (
                &["--slots-per-device", "0"][..],
                "slots per device 0 is out of range",
            ),
            (&["--slots-per-device", "100001"][..], "out of range"),
            (
                &["--resource-name", "bad name"][..],
                "resource name \"bad name\" is not an extended resource name",
            ),
            (
                &["--resource-name", "kubernetes.io/erdma"][..],
                "not an extended resource name",
            ),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(words), "{args:?}: {e}");
        }
        assert!(
            parse(&[
                "--slots-per-device",
                "1",
                "--resource-name",
                "example.com/rdma"
            ])
            .is_ok()
        );
    }

    #[test]
    fn installer_pins_and_https_are_enforced_at_startup() {
        let d = parse(&[]).unwrap().driver.installer_trust;
        assert_eq!(d.base_url, "https://mirrors.cloud.aliyuncs.com/erdma");
        assert_eq!(d.standard_sha256, None, "no built-in pin");
        assert!(!d.allow_insecure_http);
        let hex = "466CE7F2C27B137672429FE48143FD75BD1C98D7278E041F0BF33C00396EC3BE";
        let s = parse(&["--driver-installer-sha256", hex]).unwrap();
        assert_eq!(
            s.driver.installer_trust.standard_sha256.unwrap().as_str(),
            "466ce7f2c27b137672429fe48143fd75bd1c98d7278e041f0bf33c00396ec3be"
        );
        let e = parse(&["--driver-installer-sha256", "abc"]).unwrap_err();
        assert!(e.to_string().contains("--driver-installer-sha256"), "{e}");
        let http = [
            "--driver-installer-base-url",
            "http://mirrors.cloud.aliyuncs.com/erdma",
        ];
        let e = parse(&http).unwrap_err();
        assert!(
            e.to_string().contains("--allow-insecure-driver-download"),
            "{e}"
        );
        let mut opted = http.to_vec();
        opted.push("--allow-insecure-driver-download");
        assert!(
            parse(&opted)
                .unwrap()
                .driver
                .installer_trust
                .allow_insecure_http
        );
    }

    #[test]
    fn usage_is_for_loopback_peers_unless_usage_remote_says_otherwise() {
        assert!(
            !parse(&[]).unwrap().usage_remote,
            "loopback only by default"
        );
        assert!(parse(&["--usage-remote"]).unwrap().usage_remote);
        assert!(!parse(&["--usage-remote=false"]).unwrap().usage_remote);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.yaml");
        std::fs::write(&file, "usage-remote: true\n").unwrap();
        let path = file.to_str().unwrap();
        assert!(parse(&["--config", path]).unwrap().usage_remote);
        assert!(
            !parse(&["--config", path, "--usage-remote=false"])
                .unwrap()
                .usage_remote,
            "the flag wins"
        );
    }

    #[test]
    fn the_request_timeout_comes_from_the_flag_or_the_file_and_defaults_to_70s() {
        assert_eq!(
            parse(&[]).unwrap().request_timeout,
            Some(Duration::from_secs(70))
        );
        let s = parse(&["--request-timeout", "1m30s"]).unwrap();
        assert_eq!(s.request_timeout, Some(Duration::from_secs(90)));
        assert_eq!(
            parse(&["--request-timeout", "0"]).unwrap().request_timeout,
            None,
            "0: no deadline"
        );
        let e = parse(&["--request-timeout", "soon"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--request-timeout") && e.contains("e.g. 30s"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.yaml");
        std::fs::write(&file, "request-timeout: 20s\n").unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(
            parse(&["--config", path]).unwrap().request_timeout,
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            parse(&["--config", path, "--request-timeout", "5s"])
                .unwrap()
                .request_timeout,
            Some(Duration::from_secs(5)),
            "the flag wins"
        );
    }

    #[test]
    fn defaults_match_the_issue() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.sysfs_root, PathBuf::from("/sys"));
        assert_eq!(s.dev_root, PathBuf::from("/dev"));
        assert_eq!(
            s.kubelet_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(s.resource_name, "aliyun/erdma");
        assert_eq!(s.rdma_drivers, vec!["erdma"]);
        assert_eq!(s.slots_per_device, 200);
        assert!(!s.allocate_all_devices);
        assert_eq!(s.driver.mode, DriverMode::Auto);
        assert_eq!(s.jumbo_frame_mtu, 8500);
        assert_eq!(s.poll_interval, Duration::from_secs(10));
        assert!(!s.smcr_strict && !s.smcr_keep_ipv6);
        assert_eq!(s.bpf_pin_dir, PathBuf::from("/sys/fs/bpf/erdma-smc"));
    }

    /// The annotation only lowers `--nri-rdma-max` unless the operator opts in, by flag or file.
    #[test]
    fn annotation_raise_is_off_unless_the_operator_opts_in() {
        assert!(!parse(&[]).unwrap().nri_policy.allow_annotation_raise);
        assert!(
            parse(&["--nri-allow-annotation-raise"])
                .unwrap()
                .nri_policy
                .allow_annotation_raise
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(&cfg, "nri-allow-annotation-raise: true\n").unwrap();
        let s = parse(&["--config", cfg.to_str().unwrap()]).unwrap();
        assert!(s.nri_policy.allow_annotation_raise);
        let s = parse(&[
            "--config",
            cfg.to_str().unwrap(),
            "--nri-allow-annotation-raise=false",
        ])
        .unwrap();
        assert!(!s.nri_policy.allow_annotation_raise, "the flag wins");
    }

    #[test]
    fn nri_budget_defaults_inside_the_runtimes_timeout_and_can_be_raised() {
        assert_eq!(parse(&[]).unwrap().nri_budget, Duration::from_millis(800));
        let s = parse(&["--nri-budget-ms", "8000"]).unwrap();
        assert_eq!(s.nri_budget, Duration::from_millis(8000));
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(&cfg, "nri-budget-ms: 1500\n").unwrap();
        let s = parse(&["--config", cfg.to_str().unwrap()]).unwrap();
        assert_eq!(s.nri_budget, Duration::from_millis(1500));
        let e = parse(&["--nri-budget-ms", "0"]).unwrap_err();
        assert!(e.to_string().contains("--nri-budget-ms"), "{e}");
    }

    #[test]
    fn smcr_flags_and_file_keys() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(
            &cfg,
            "cri-socket: /file/crio.sock\nsmcr-strict: true\nbpf-pin-dir: /sys/fs/bpf/x\n",
        )
        .unwrap();
        let c = cfg.to_str().unwrap();
        let s = parse(&["--config", c]).unwrap();
        assert_eq!(s.cri_socket, Some(PathBuf::from("/file/crio.sock")));
        assert!(s.smcr_strict && !s.smcr_keep_ipv6);
        assert_eq!(s.bpf_pin_dir, PathBuf::from("/sys/fs/bpf/x"));
        let s = parse(&[
            "--config",
            c,
            "--cri-socket",
            "/run/containerd/containerd.sock",
            "--smcr-strict=false",
            "--smcr-keep-ipv6",
        ])
        .unwrap();
        assert_eq!(
            s.cri_socket,
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        assert!(!s.smcr_strict && s.smcr_keep_ipv6);
    }

    #[test]
    fn flags_parse_and_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(
            &cfg,
            "kubelet-dir: /from/file\nslots-per-device: 7\nallocateAllDevices: true\npreferDriver: compat\nexposedLocalERIs:\n  - i-* erdma_0\njumboFrameMTU: 9000\n",
        )
        .unwrap();
        let c = cfg.to_str().unwrap();
        let s = parse(&[
            "--config",
            c,
            "--slots-per-device",
            "3",
            "--rdma-driver",
            "rxe,rdma_rxe,siw",
            "--prefer-driver",
            "none",
        ])
        .unwrap();
        assert_eq!(s.kubelet_dir, PathBuf::from("/from/file"));
        assert_eq!(s.slots_per_device, 3);
        assert!(s.allocate_all_devices);
        assert_eq!(s.driver.mode, DriverMode::None);
        assert_eq!(s.rdma_drivers, vec!["rxe", "rxe", "siw"]);
        assert!(s.exposed_local_eris.selects("i-x", "erdma_0"));
        assert_eq!(s.jumbo_frame_mtu, 9000);
        let s = parse(&["--config", c, "--allocate-all-devices=false"]).unwrap();
        assert!(!s.allocate_all_devices);
        let s = parse(&[
            "--allocate-all-devices",
            "--deviceplugin-prestart-container",
            "--local-eri-discovery",
        ])
        .unwrap();
        assert!(s.allocate_all_devices && s.prestart_container && s.local_eri_discovery);
    }

    #[test]
    fn json_config_and_bad_values_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.json");
        std::fs::write(
            &cfg,
            r#"{"resource-name": "example.com/rdma", "metrics-addr": "off"}"#,
        )
        .unwrap();
        let s = parse(&["--config", cfg.to_str().unwrap()]).unwrap();
        assert_eq!(s.resource_name, "example.com/rdma");
        assert_eq!(s.metrics_addr, MetricsAddr::Off);
        std::fs::write(&cfg, r#"{"slots-per-devices": 3}"#).unwrap();
        let e = format!(
            "{:#}",
            parse(&["--config", cfg.to_str().unwrap()]).unwrap_err()
        );
        assert!(e.contains("slots-per-devices"), "{e}");
        let e = format!("{:#}", parse(&["--prefer-driver", "fake"]).unwrap_err());
        assert!(e.contains("\"fake\""), "{e}");
        let e = format!(
            "{:#}",
            parse(&["--exposed-local-eris", "bogus"]).unwrap_err()
        );
        assert!(e.contains("bogus"), "{e}");
        let e = format!("{:#}", parse(&["--metrics-addr", "nowhere"]).unwrap_err());
        assert!(e.contains("nowhere"), "{e}");
        assert_eq!(
            parse(&["--metrics-addr", ":9999"]).unwrap().metrics_addr,
            MetricsAddr::On("0.0.0.0:9999".parse().unwrap())
        );
    }

    #[test]
    fn log_format_and_level_come_from_flags_or_the_file() {
        use erdma_host::logs::LogFormat;
        let s = parse(&[]).unwrap();
        assert_eq!((s.log_format, s.log_level), (LogFormat::Text, None));
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.yaml");
        std::fs::write(&cfg, "logFormat: json\nlogLevel: debug\n").unwrap();
        let c = cfg.to_str().unwrap();
        let s = parse(&["--config", c]).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.log_level.as_deref(), Some("debug"));
        std::fs::write(&cfg, "log-format: json\nlog-level: warn\n").unwrap();
        let s = parse(&["--config", c]).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.log_level.as_deref(), Some("warn"));
        let s = parse(&[
            "--config",
            c,
            "--log-format=text",
            "--log-level",
            "info,erdma_nri=debug",
        ])
        .unwrap();
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.log_level.as_deref(), Some("info,erdma_nri=debug"));
        // The chart's empty values mean the defaults.
        let s = parse(&["--log-format=", "--log-level="]).unwrap();
        assert_eq!((s.log_format, s.log_level), (LogFormat::Text, None));
        let e = format!("{:#}", parse(&["--log-format", "xml"]).unwrap_err());
        assert!(e.contains("--log-format") && e.contains("\"xml\""), "{e}");
    }

    #[test]
    fn exposed_local_eris_apply_in_local_mode_or_with_the_cluster_filter_only() {
        let list = ["--exposed-local-eris=i-XXX erdma_0/erdma_1"];
        // Cluster mode: the original chart's placeholder must not hide this node's devices.
        let s = parse(&list).unwrap();
        assert!(s.exposed_local_eris.is_empty());
        assert!(s.exposed_local_eris.selects("i-real", "erdma_0"));
        let s = parse(&[list[0], "--local-eri-discovery"]).unwrap();
        assert!(!s.exposed_local_eris.selects("i-real", "erdma_0"));
        assert!(s.exposed_local_eris.selects("i-XXX", "erdma_1"));
        let s = parse(&[list[0], "--filter-cluster-eris"]).unwrap();
        assert!(!s.exposed_local_eris.selects("i-real", "erdma_0"));
        // The original's repeated flag, one entry each.
        let s = parse(&[
            "--local-eri-discovery",
            "--exposed-local-eris=i-a erdma_0",
            "--exposed-local-eris=i-b erdma_1",
        ])
        .unwrap();
        assert!(s.exposed_local_eris.selects("i-a", "erdma_0"));
        assert!(s.exposed_local_eris.selects("i-b", "erdma_1"));
        assert!(!s.exposed_local_eris.selects("i-a", "erdma_1"));
    }
}
