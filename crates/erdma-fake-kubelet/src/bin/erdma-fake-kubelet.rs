//! `erdma-fake-kubelet`: a fake kubelet for device-plugin tests and the lab.

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use erdma_fake_kubelet::podspec::translate::NodeInfo;
use erdma_fake_kubelet::{AllocateOptions, FakeKubelet, FakeKubeletConfig, PID_FILE};
use erdma_kubelet::uds::ClientAuthority;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fake kubelet: serves device-plugin Registration on DIR/kubelet.sock, dials plugins back,
/// consumes ListAndWatch, allocates like kubelet admission, simulates kubelet restarts and serves
/// the pod-resources v1 API; `pod` runs pods on a real container runtime over CRI. State:
/// DIR/fake-kubelet-state.json.
#[derive(Parser)]
#[command(name = "erdma-fake-kubelet", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Authority {
    /// `localhost`, as current kubelets send.
    Localhost,
    /// The plugin socket path, as old kubelets sent.
    SocketPath,
}

impl From<Authority> for ClientAuthority {
    fn from(a: Authority) -> Self {
        match a {
            Authority::Localhost => ClientAuthority::Localhost,
            Authority::SocketPath => ClientAuthority::SocketPath,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    /// JSON.
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run as the kubelet until SIGTERM/SIGINT (exit 0). SIGHUP simulates a kubelet restart:
    /// every socket in DIR is deleted and DIR/kubelet.sock is re-created. Writes DIR/fake-kubelet.pid.
    Run {
        /// Device-plugin directory.
        #[arg(long)]
        dir: PathBuf,
        /// Also serve the pod-resources v1 API on this socket.
        #[arg(long)]
        pod_resources_socket: Option<PathBuf>,
        /// `:authority` used when dialing plugins back.
        #[arg(long, value_enum, default_value = "localhost")]
        authority: Authority,
        /// Write the plugins' resources into the status of Node --node through this API server,
        /// as the kubelet does: capacity (every device) and allocatable (healthy devices) while
        /// a plugin is registered, kept at 0 once it is gone.
        #[arg(long, requires = "node")]
        kubeconfig: Option<PathBuf>,
        /// This node's name in the API server of --kubeconfig.
        #[arg(long, requires = "kubeconfig")]
        node: Option<String>,
        /// Seconds a plugin that went is kept (capacity stays, allocatable 0) before its resource
        /// is written as 0; the kubelet's grace period is 300.
        #[arg(long, default_value_t = 300)]
        plugin_stop_grace: u64,
    },
    /// Allocate COUNT devices of RESOURCE to one container, like kubelet admission: picks free
    /// healthy IDs, calls GetPreferredAllocation (if offered), Allocate and PreStartContainer (if
    /// required), records the allocation and prints the container's allocation as JSON.
    Allocate {
        /// Device-plugin directory of a running `erdma-fake-kubelet run`.
        #[arg(long)]
        dir: PathBuf,
        /// Resource name.
        #[arg(long, default_value = "aliyun/erdma")]
        resource: String,
        /// Number of device IDs.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
        /// Container name.
        #[arg(long, default_value = "c")]
        container: String,
        /// Accepted for compatibility with lab scripts; the plugin's preferred allocation decides.
        #[arg(long)]
        numa_hint: Option<String>,
        /// An init container of the same pod whose devices this container reuses, as the kubelet
        /// does: they are taken first and sent to GetPreferredAllocation as must_include.
        #[arg(long, value_name = "CONTAINER")]
        reuse_from: Option<String>,
        /// `:authority` sent to the plugin.
        #[arg(long, value_enum, default_value = "localhost")]
        authority: Authority,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "json")]
        output: Output,
    },
    /// Release every allocation of a pod.
    Release {
        /// Device-plugin directory.
        #[arg(long)]
        dir: PathBuf,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
    },
    /// Simulate a kubelet restart of the running daemon in DIR: sends it SIGHUP (PID from
    /// DIR/fake-kubelet.pid) and waits until it has re-created DIR/kubelet.sock.
    Restart {
        /// Device-plugin directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Print the state file.
    State {
        /// Device-plugin directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Pods on a real container runtime over CRI, as the kubelet runs them after admission.
    Pod {
        #[command(subcommand)]
        cmd: PodCmd,
    },
    /// The lab's in-memory Kubernetes API server (erdma-k8s's fake) over HTTP, or HTTPS with
    /// --tls, until SIGTERM/SIGINT. Writes a kubeconfig pointing at it once it listens (with
    /// --tls it trusts the CA made at start). Starts with the Node object, the DeviceClass the
    /// erdma install renders with dra.enabled, the --objects, the namespaces (default,
    /// kube-system, kube-public, kube-node-lease and those the objects name) with their default
    /// ServiceAccounts and, with --tls, their kube-root-ca.crt ConfigMaps. Prints to stderr
    /// what it loaded and made.
    Apiserver(ApiserverArgs),
    /// The API server's mutating admission for a pod CREATE, for the lab: the webhooks of the
    /// MutatingWebhookConfigurations in the API server whose rules, namespaceSelector and
    /// objectSelector match the pod are called in order with an admission.k8s.io/v1
    /// AdmissionReview over HTTPS (the server certificate verified against clientConfig.caBundle
    /// for NAME.NAMESPACE.svc), their JSONPatch answers applied, failurePolicy and
    /// timeoutSeconds honoured. Writes the changed Pod as JSON to OUT (which `pod run
    /// --manifest OUT` runs), prints a JSON report (each webhook: called, outcome, changes) and
    /// says on stderr which webhooks were called and what they changed. Exits non-zero when a
    /// webhook denies the pod, or fails with failurePolicy Fail.
    Admit(AdmitArgs),
    /// A minimal DRA allocator for the lab (NOT the scheduler): writes the allocation the
    /// scheduler would write into a ResourceClaim (devices from this node's ResourceSlices,
    /// shareID, consumedCapacity) and prints the claim as JSON.
    Dra {
        #[command(subcommand)]
        cmd: DraCmd,
    },
}

/// `admit`.
#[derive(clap::Args)]
struct AdmitArgs {
    /// Kubeconfig of the API server holding the MutatingWebhookConfigurations.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The pod: a Pod, or the pod template of a DaemonSet, Deployment, StatefulSet or Job (JSON
    /// or YAML, as `pod run --manifest` reads it).
    #[arg(long, value_name = "FILE")]
    manifest: PathBuf,
    /// The object to take when the file holds several, KIND/NAME or NAME.
    #[arg(long, value_name = "KIND/NAME")]
    object: Option<String>,
    /// Where a webhook's Service is reached (repeatable): the lab has no kube-proxy, so each
    /// clientConfig.service of a webhook that is called needs one (the pod's IP and target
    /// port).
    #[arg(long = "endpoint", value_name = "NAMESPACE/NAME=HOST:PORT")]
    endpoints: Vec<String>,
    /// Where to write the admitted Pod (JSON).
    #[arg(short = 'o', long = "output", value_name = "OUT.json")]
    output: PathBuf,
}

/// `apiserver`.
#[derive(clap::Args)]
struct ApiserverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: std::net::SocketAddr,
    /// Where to write the kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The Node object to create.
    #[arg(long)]
    node: String,
    /// Serve HTTPS: a CA and a serving certificate made at start for the listen IP, 127.0.0.1,
    /// kubernetes, kubernetes.default, kubernetes.default.svc,
    /// kubernetes.default.svc.cluster.local and each --tls-san.
    #[arg(long)]
    tls: bool,
    /// Another name or IP for the serving certificate (repeatable), e.g. the address pods
    /// reach the node at.
    #[arg(long = "tls-san", value_name = "NAME", requires = "tls")]
    tls_sans: Vec<String>,
    /// Write DIR/ca.crt (the CA) and a token per ServiceAccount, DIR/<namespace>/<name>/token
    /// (DIR/token: default/default's), which the server authenticates as
    /// system:serviceaccount:<namespace>:<name>; the lab kubelet projects them into pods
    /// (`pod run --service-account-dir`). Needs --tls.
    #[arg(long, value_name = "DIR", requires = "tls")]
    service_account_dir: Option<PathBuf>,
    /// Objects to create at start (repeatable): a rendered chart file ({"objects": [...]}, as
    /// deploy/helm/ci/rendered/*.json), a List, a JSON array or YAML documents.
    #[arg(long = "objects", value_name = "FILE")]
    objects: Vec<PathBuf>,
    /// Authorize the service accounts' requests against the loaded (Cluster)Roles and
    /// (Cluster)RoleBindings (403 when they do not allow it); requests without a token stay
    /// unrestricted.
    #[arg(long, requires = "service_account_dir")]
    enforce_rbac: bool,
    /// The release whose feature gate defaults apply, as kube-apiserver --emulated-version:
    /// 1.34, 1.35 (DRADeviceTaints, DRAConsumableCapacity, DRAExtendedResource off), 1.36 or
    /// 1.37 (on; DRAExtendedResource locked on in 1.37).
    #[arg(long, default_value = "1.37", value_name = "1.MINOR")]
    emulated_version: String,
    /// Feature gates over the release's defaults, as kube-apiserver --feature-gates, e.g.
    /// DRADeviceTaints=false,DRAConsumableCapacity=false: ResourceSlices and DeviceClasses
    /// written then lose the gates' fields, as the API server drops them.
    #[arg(long, default_value = "", value_name = "NAME=BOOL,...")]
    feature_gates: String,
    /// Serve `kubectl logs` from the containers' CRI log files under DIR, as the kubelet lays
    /// them out and serves them (`pod run --log-root`, /var/log/pods by default).
    #[arg(long, value_name = "DIR")]
    pod_log_dir: Option<PathBuf>,
    /// A subnet the pod proxy may connect to besides loopback (repeatable), e.g. the lab's pod
    /// network 10.89.0.0/24: a pod IP outside loopback and these is refused, never dialled.
    #[arg(long = "allow-dial", value_name = "CIDR", value_parser = erdma_k8s::dial_guard::Cidr::parse)]
    allow_dial: Vec<erdma_k8s::dial_guard::Cidr>,
}

#[derive(clap::Args)]
struct ApiTarget {
    /// Kubeconfig of the API server.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node whose ResourceSlices are allocated from.
    #[arg(long)]
    node: String,
}

#[derive(Subcommand)]
enum DraCmd {
    /// Make ResourceClaim CLAIM (one request `rdma` of CLASS, COUNT devices, the capacity
    /// amounts asked), reference it from the pod's container (creating the Pod object when
    /// missing) and allocate it.
    Claim {
        #[command(flatten)]
        api: ApiTarget,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
        /// Container name.
        #[arg(long, default_value = "c")]
        container: String,
        /// Claim name (in the pod's namespace).
        #[arg(long)]
        claim: String,
        /// DeviceClass.
        #[arg(long, default_value = "erdma.alibabacloud.com")]
        class: String,
        /// Devices.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Capacity asked, NAME=AMOUNT (repeatable), e.g. shares=120.
        #[arg(long = "capacity", value_name = "NAME=AMOUNT")]
        capacity: Vec<String>,
        /// Only this device (ResourceSlice device name).
        #[arg(long)]
        device: Option<String>,
        /// Write the allocation without the capacity check, as a scheduler with another view of
        /// the device would (the driver's own guard at prepare then refuses it).
        #[arg(long)]
        overcommit: bool,
        /// Ask through a prioritized list (`firstAvailable`) of one subrequest of this name:
        /// allocated as `rdma/NAME`, the container names the request `rdma`.
        #[arg(long, value_name = "NAME")]
        first_available: Option<String>,
    },
    /// What the scheduler does for a container asking an extended resource served through a
    /// DeviceClass (KEP-5004): the pod's special claim, allocated, and the pod's
    /// status.extendedResourceClaimStatus.
    Extended {
        #[command(flatten)]
        api: ApiTarget,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
        /// Container name.
        #[arg(long, default_value = "c")]
        container: String,
        /// Extended resource.
        #[arg(long, default_value = "aliyun/erdma")]
        resource: String,
        /// Amount.
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
}

/// The kubelet's `--cgroup-driver`.
#[derive(Clone, Copy, ValueEnum)]
enum CgroupDriverArg {
    /// cgroup file system paths (`/kubepods/besteffort/pod<UID>`).
    Cgroupfs,
    /// systemd slices (`/kubepods.slice/.../kubepods-besteffort-pod<UID_>.slice`); the runtime
    /// must use systemd too (containerd's `SystemdCgroup = true`).
    Systemd,
}

impl From<CgroupDriverArg> for erdma_fake_kubelet::podspec::translate::CgroupDriver {
    fn from(d: CgroupDriverArg) -> Self {
        match d {
            CgroupDriverArg::Cgroupfs => Self::Cgroupfs,
            CgroupDriverArg::Systemd => Self::Systemd,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Cdi {
    /// The CRI `CDI_devices` field.
    Field,
    /// A `cdi.k8s.io/...` container annotation.
    Annotation,
}

#[derive(clap::Args)]
struct PodTarget {
    /// Device-plugin directory of a running `erdma-fake-kubelet run` (pod records go to DIR/pods).
    #[arg(long)]
    dir: PathBuf,
    /// The container runtime's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    cri_socket: PathBuf,
}

#[derive(Subcommand)]
enum PodCmd {
    /// In the kubelet's order: (with --count > 0) Allocate through the plugin, RunPodSandbox,
    /// PreStartContainer (when the plugin asks for it), CreateContainer with the Allocate
    /// response's devices, mounts, envs, annotations and CDI names, StartContainer. Prints the
    /// pod record as JSON (sandbox and container ids, IP, network namespace, allocation,
    /// milliseconds per step). With --manifest, the pod is a Pod or the pod template of a
    /// DaemonSet, Deployment, StatefulSet or Job, translated into CRI as the kubelet does
    /// (extended resources in its limits are allocated; hostPath types checked; the images must
    /// be in the runtime; init containers run to completion in order first; probes run until
    /// ready): exits 1 when the container did not become ready within --ready-timeout (the pod
    /// stays recorded).
    Run(Box<RunArgs>),
    /// ExecSync in the pod's container: prints its stdout and stderr and exits with its code.
    Exec {
        #[command(flatten)]
        target: PodTarget,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
        /// Seconds before the runtime stops the command (0: no limit).
        #[arg(long, default_value_t = 0)]
        timeout: u32,
        /// The command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The pod's container state from the runtime (ContainerStatus) with its record, as JSON.
    Status {
        #[command(flatten)]
        target: PodTarget,
        /// Pod as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
    },
    /// StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox, release the devices.
    Delete {
        #[command(flatten)]
        target: PodTarget,
        /// Pod as NAMESPACE/NAME; with --all every recorded pod.
        #[arg(long, required_unless_present = "all")]
        pod: Option<String>,
        /// Every recorded pod.
        #[arg(long)]
        all: bool,
        /// Seconds between the stop signal and the kill.
        #[arg(long, default_value_t = 0)]
        grace: i64,
    },
}

/// Flags that describe the pod themselves, which a manifest replaces.
const MANIFEST_REPLACES: &[&str] = &[
    "container",
    "image",
    "count",
    "annotations",
    "host_network",
    "user",
    "mounts",
    "command",
];

/// `pod run`.
#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    target: PodTarget,
    /// Pod as NAMESPACE/NAME (with --manifest, default: the object's namespace and name).
    #[arg(long, required_unless_present = "manifest")]
    pod: Option<String>,
    /// The pod from a Kubernetes object, JSON or YAML: a Pod, or a DaemonSet, Deployment,
    /// StatefulSet or Job whose spec.template is taken (several documents, as helm template
    /// prints them, are fine: the one workload among them, or --object).
    #[arg(long, value_name = "FILE", conflicts_with_all = MANIFEST_REPLACES)]
    manifest: Option<PathBuf>,
    /// With --manifest: the object to take when the file holds several, KIND/NAME or NAME.
    #[arg(long, value_name = "KIND/NAME", requires = "manifest")]
    object: Option<String>,
    /// With --manifest: the node's name (spec.nodeName; default: the hostname).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// With --manifest: the node's IP (status.hostIP, and the pod IP of a hostNetwork pod).
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    node_ip: std::net::IpAddr,
    /// With --manifest: seconds from StartContainer for the container to become ready (its
    /// startup and readiness probes pass).
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    ready_timeout: u64,
    /// With --manifest: seconds from StartContainer for each init container to exit (with
    /// code 0, else the pod fails naming it, its exit code and the tail of its log).
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    init_timeout: u64,
    /// The node's cgroup driver, as the kubelet's flag of that name: the form of the pod's
    /// cgroup parent (it must match the runtime's).
    #[arg(
        long,
        value_enum,
        env = "ERDMA_FAKE_KUBELET_CGROUP_DRIVER",
        default_value = "cgroupfs"
    )]
    cgroup_driver: CgroupDriverArg,
    /// With --manifest: the API server (`apiserver --tls`) as pods reach it, HOST:PORT. The
    /// pod goes through the ServiceAccount admission (its service account must exist; the
    /// token volume is added unless automountServiceAccountToken is false), its configMap,
    /// secret, projected and downwardAPI volumes are written as the kubelet's atomic writer
    /// does (read-only mounts), configMapKeyRef/secretKeyRef/envFrom are read, and every
    /// container gets KUBERNETES_SERVICE_HOST/PORT, KUBERNETES_PORT... (and, with
    /// enableServiceLinks, the namespace's services). The lab kubelet reads over
    /// https://HOST:PORT trusting DIR/ca.crt. Needs --service-account-dir.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires_all = ["manifest", "service_account_dir"]
    )]
    api_server: Option<String>,
    /// With --api-server: the directory `apiserver --service-account-dir` wrote (ca.crt, and
    /// the token each pod's service account gets, <namespace>/<name>/token).
    #[arg(long, value_name = "DIR", requires = "api_server")]
    service_account_dir: Option<PathBuf>,
    /// Container name.
    #[arg(long, default_value = "c")]
    container: String,
    /// Image (already in the runtime).
    #[arg(long, default_value = "lab.local/rdma-tools:1")]
    image: String,
    /// Resource name.
    #[arg(long, default_value = "aliyun/erdma")]
    resource: String,
    /// Device IDs to allocate; 0: a pod without the resource.
    #[arg(long, default_value_t = 0)]
    count: usize,
    /// How CDI device names reach the runtime.
    #[arg(long, value_enum, default_value = "field")]
    cdi: Cdi,
    /// Pod annotation KEY=VALUE (repeatable).
    #[arg(long = "annotation", value_name = "KEY=VALUE")]
    annotations: Vec<String>,
    /// Use the node's network namespace.
    #[arg(long)]
    host_network: bool,
    /// `:authority` sent to the plugin.
    #[arg(long, value_enum, default_value = "localhost")]
    authority: Authority,
    /// Where pod log directories are made.
    #[arg(long, default_value = "/var/log/pods")]
    log_root: PathBuf,
    /// DRA: read the Pod object from this API server and prepare the container's
    /// ResourceClaims (resources.claims, status.extendedResourceClaimStatus) through their
    /// drivers; their CDI device IDs go to CreateContainer. With --manifest (and --api-server):
    /// the lab kubelet's own client of the API server, instead of https://HOST:PORT trusting
    /// the service-account directory's ca.crt.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubelet's root directory (DRA drivers register in its plugins_registry).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_root_dir: PathBuf,
    /// The kubelet release whose DRA registration is played: 1.34, 1.35, 1.36 or 1.37 (they
    /// differ in the health service they pick from GetInfo's supported_versions).
    #[arg(long, default_value_t = erdma_fake_kubelet::dra::KubeletVersion::NEWEST, value_parser = parse_kubelet_version)]
    kubelet_version: erdma_fake_kubelet::dra::KubeletVersion,
    /// Run the container as this UID (the CRI's run_as_user; default: the image's user).
    #[arg(long, value_name = "UID")]
    user: Option<i64>,
    /// A host path mounted read-only into the container, HOST:CONTAINER (a hostPath volume;
    /// repeatable).
    #[arg(long = "mount", value_name = "HOST:CONTAINER")]
    mounts: Vec<String>,
    /// The container's command (default: the image's).
    #[arg(last = true)]
    command: Vec<String>,
}

fn parse_kubelet_version(s: &str) -> Result<erdma_fake_kubelet::dra::KubeletVersion, String> {
    s.parse()
}

fn valid_pod(pod: &str) -> anyhow::Result<()> {
    match pod.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(()),
        _ => bail!("--pod {pod:?} must be NAMESPACE/NAME, e.g. default/nccl-0"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Run {
            dir,
            pod_resources_socket,
            authority,
            kubeconfig,
            node,
            plugin_stop_grace,
        } => {
            let node_status = match (kubeconfig, node) {
                (Some(kubeconfig), Some(node)) => {
                    Some(erdma_fake_kubelet::node_status::NodeStatusConfig {
                        client: kube_client(&kubeconfig).await?,
                        node,
                        stop_grace: Duration::from_secs(plugin_stop_grace),
                        update_every: erdma_fake_kubelet::node_status::UPDATE_EVERY,
                    })
                }
                _ => None,
            };
            run(dir, pod_resources_socket, authority.into(), node_status).await
        }
        Cmd::Allocate {
            dir,
            resource,
            count,
            pod,
            container,
            numa_hint: _,
            reuse_from,
            authority,
            output: Output::Json,
        } => {
            valid_pod(&pod)?;
            let opts = AllocateOptions {
                resource,
                count,
                pod,
                container,
                authority: authority.into(),
            };
            let out =
                erdma_fake_kubelet::allocate_reusing(&dir, &opts, reuse_from.as_deref()).await?;
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Cmd::Release { dir, pod } => {
            valid_pod(&pod)?;
            let n = erdma_fake_kubelet::release(&dir, &pod).await?;
            println!(
                "{}",
                serde_json::json!({"pod": pod, "released_containers": n})
            );
            Ok(())
        }
        Cmd::Restart { dir } => restart(&dir).await,
        Cmd::State { dir } => {
            let s = erdma_fake_kubelet::state::read_state(&dir)?;
            println!("{}", serde_json::to_string_pretty(&s)?);
            Ok(())
        }
        Cmd::Pod { cmd } => pod(cmd).await,
        Cmd::Apiserver(a) => apiserver(a).await,
        Cmd::Admit(a) => admit(a).await,
        Cmd::Dra { cmd } => dra(cmd).await,
    }
}

async fn kube_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read kubeconfig {}", kubeconfig.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    Ok(kube::Client::try_from(cfg)?)
}

async fn admit(a: AdmitArgs) -> anyhow::Result<()> {
    use erdma_fake_kubelet::admission::{Endpoints, admit_from};
    use erdma_fake_kubelet::podspec::manifest;
    let endpoints = Endpoints::parse(&a.endpoints).map_err(anyhow::Error::msg)?;
    let m = manifest::load(&a.manifest, a.object.as_deref())?;
    let client = kube_client(&a.kubeconfig).await?;
    let out = admit_from(&client, &m, &endpoints).await?;
    let mut pod = serde_json::to_value(&out.pod)?;
    if let Some(o) = pod.as_object_mut() {
        o.insert("apiVersion".into(), "v1".into());
        o.insert("kind".into(), "Pod".into());
    }
    let tmp = a.output.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&pod)? + "\n")
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.output).with_context(|| format!("write {}", a.output.display()))?;
    let name = format!(
        "{}/{}",
        out.pod.metadata.namespace.as_deref().unwrap_or(""),
        out.pod.metadata.name.as_deref().unwrap_or("")
    );
    for w in &out.webhooks {
        let changes = if w.changes.is_empty() {
            String::new()
        } else {
            format!("; changed: {}", w.changes.join(", "))
        };
        let at = if w.url.is_empty() {
            String::new()
        } else {
            format!(" at {}", w.url)
        };
        eprintln!(
            "admit: {name}: webhook {} ({}){at}: {}{changes}",
            w.webhook, w.configuration, w.outcome
        );
        for warning in &w.warnings {
            eprintln!("admit: {name}: warning from {}: {warning}", w.webhook);
        }
    }
    if out.webhooks.is_empty() {
        eprintln!("admit: {name}: no mutating webhook is configured");
    }
    for n in &out.notes {
        eprintln!("admit: note: {n}");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "pod": name,
            "output": a.output,
            "webhooks": out.webhooks,
            "notes": out.notes,
        }))?
    );
    Ok(())
}

/// `--emulated-version` and `--feature-gates` of `apiserver`.
fn feature_gates(version: &str, gates: &str) -> anyhow::Result<erdma_k8s::fake::FeatureGates> {
    use erdma_k8s::fake::FeatureGates;
    let v = version.trim().trim_start_matches('v');
    let release = v
        .strip_prefix("1.")
        .and_then(|m| m.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .and_then(FeatureGates::release)
        .with_context(|| {
            format!(
                "--emulated-version {version:?} is not one of {}",
                FeatureGates::RELEASES.map(|r| format!("1.{r}")).join(", ")
            )
        })?;
    release
        .with(gates)
        .map_err(|e| anyhow::anyhow!("--feature-gates: {e}"))
}

async fn apiserver(a: ApiserverArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let opts = erdma_fake_kubelet::apiserver::ApiServerOptions {
        listen: a.listen,
        kubeconfig: a.kubeconfig,
        node: a.node,
        tls: a.tls,
        tls_sans: a.tls_sans,
        service_account_dir: a.service_account_dir,
        objects: a.objects,
        enforce_rbac: a.enforce_rbac,
        feature_gates: feature_gates(&a.emulated_version, &a.feature_gates)?,
        pod_log_dir: a.pod_log_dir,
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let started = erdma_fake_kubelet::apiserver::start(&opts, cancel.clone()).await?;
    for cidr in a.allow_dial {
        started.api.allow_dial(cidr);
        eprintln!("apiserver: the pod proxy may dial {cidr}");
    }
    for line in &started.report {
        eprintln!("apiserver: {line}");
    }
    tracing::info!(addr = %started.addr, kubeconfig = %opts.kubeconfig.display(), "fake API server serving");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    cancel.cancel();
    started.stopped().await;
    Ok(())
}

fn parse_capacity(list: &[String]) -> anyhow::Result<BTreeMap<String, u64>> {
    list.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                Ok((k.to_string(), erdma_fake_kubelet::allocator::quantity(v)?))
            }
            _ => bail!("--capacity {a:?} must be NAME=AMOUNT, e.g. shares=120"),
        })
        .collect()
}

async fn dra(cmd: DraCmd) -> anyhow::Result<()> {
    use erdma_fake_kubelet::allocator::{Allocator, ClaimRequest};
    let claim = match cmd {
        DraCmd::Claim {
            api,
            pod,
            container,
            claim,
            class,
            count,
            capacity,
            device,
            overcommit,
            first_available,
        } => {
            valid_pod(&pod)?;
            let a = Allocator::new(kube_client(&api.kubeconfig).await?, api.node);
            a.claim(&ClaimRequest {
                pod,
                container,
                claim,
                class,
                count,
                capacity: parse_capacity(&capacity)?,
                device,
                overcommit,
                first_available,
            })
            .await?
        }
        DraCmd::Extended {
            api,
            pod,
            container,
            resource,
            count,
        } => {
            valid_pod(&pod)?;
            let a = Allocator::new(kube_client(&api.kubeconfig).await?, api.node);
            a.extended(&pod, &container, &resource, count).await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&claim)?);
    Ok(())
}

async fn cri_client(t: &PodTarget) -> anyhow::Result<erdma_cri::CriClient> {
    Ok(erdma_cri::CriClient::connect(&t.cri_socket, Path::new("/proc")).await?)
}

fn parse_annotations(list: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    list.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--annotation {a:?} must be KEY=VALUE"),
        })
        .collect()
}

async fn pod(cmd: PodCmd) -> anyhow::Result<()> {
    use erdma_fake_kubelet::pods;
    match cmd {
        PodCmd::Run(args) if args.manifest.is_some() => run_manifest(*args).await,
        PodCmd::Run(args) => {
            let RunArgs {
                target,
                pod,
                manifest: _,
                object: _,
                node_name: _,
                node_ip: _,
                ready_timeout: _,
                init_timeout: _,
                cgroup_driver,
                api_server: _,
                service_account_dir: _,
                container,
                image,
                resource,
                count,
                cdi,
                annotations,
                host_network,
                authority,
                log_root,
                kubeconfig,
                kubelet_root_dir,
                kubelet_version,
                user,
                mounts,
                command,
            } = *args;
            let pod = pod.context("name the pod with --pod NAMESPACE/NAME")?;
            valid_pod(&pod)?;
            let dra = match &kubeconfig {
                Some(k) => Some(erdma_fake_kubelet::claims::DraAccess {
                    client: kube_client(k).await?,
                    registry: kubelet_root_dir.join("plugins_registry"),
                    kubelet_version,
                }),
                None => None,
            };
            let mounts = mounts
                .iter()
                .map(|m| match m.split_once(':') {
                    Some((h, c)) if h.starts_with('/') && c.starts_with('/') => {
                        Ok(erdma_fake_kubelet::client::MountOut {
                            host_path: h.to_string(),
                            container_path: c.to_string(),
                            read_only: true,
                        })
                    }
                    _ => bail!("--mount {m:?} must be HOST:CONTAINER, both absolute paths"),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let spec = pods::PodSpec {
                pod,
                container,
                image,
                command,
                resource: (count > 0).then_some((resource, count)),
                cdi: match cdi {
                    Cdi::Field => pods::CdiForm::Field,
                    Cdi::Annotation => pods::CdiForm::Annotation,
                },
                annotations: parse_annotations(&annotations)?,
                host_network,
                authority: authority.into(),
                log_root,
                dra,
                run_as_user: user,
                mounts,
                cgroup_driver: cgroup_driver.into(),
            };
            let mut cri = cri_client(&target).await?;
            let record = pods::run_pod(&target.dir, &mut cri, &spec).await?;
            println!("{}", serde_json::to_string_pretty(&record)?);
            Ok(())
        }
        PodCmd::Exec {
            target,
            pod,
            timeout,
            command,
        } => {
            valid_pod(&pod)?;
            let record = pods::read_record(&target.dir, &pod)?;
            let mut cri = cri_client(&target).await?;
            let out = cri
                .exec_sync(&record.container_id, command, timeout)
                .await?;
            use std::io::Write;
            std::io::stdout().write_all(&out.stdout)?;
            std::io::stdout().flush()?;
            std::io::stderr().write_all(&out.stderr)?;
            std::io::stderr().flush()?;
            std::process::exit(out.exit_code);
        }
        PodCmd::Status { target, pod } => {
            valid_pod(&pod)?;
            let record = pods::read_record(&target.dir, &pod)?;
            let mut cri = cri_client(&target).await?;
            let st = cri.container_status(&record.container_id).await?;
            let state = erdma_cri::runtime::v1::ContainerState::try_from(st.state)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_else(|_| format!("unknown state {}", st.state));
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "pod": record.pod,
                    "container_id": record.container_id,
                    "state": state,
                    "started_at": st.started_at,
                    "exit_code": st.exit_code,
                    "record": record,
                }))?
            );
            Ok(())
        }
        PodCmd::Delete {
            target,
            pod,
            all,
            grace,
        } => {
            let list = match (pod, all) {
                (_, true) => pods::recorded_pods(&target.dir)?,
                (Some(p), false) => {
                    valid_pod(&p)?;
                    vec![p]
                }
                (None, false) => bail!("name --pod NAMESPACE/NAME or --all"),
            };
            let mut cri = cri_client(&target).await?;
            let mut deleted = Vec::new();
            for p in list {
                pods::delete_pod(&target.dir, &mut cri, &p, grace).await?;
                deleted.push(p);
            }
            println!("{}", serde_json::json!({ "deleted": deleted }));
            Ok(())
        }
    }
}

/// The node the lab kubelet stands for: its hostname (lowercased, as the kubelet names its
/// node), and its CPUs and memory (`/proc/meminfo`) for the downward API and the OOM score.
fn this_node(
    name: Option<String>,
    ip: std::net::IpAddr,
    cgroup_driver: CgroupDriverArg,
) -> anyhow::Result<NodeInfo> {
    let name = match name {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("read the hostname (or pass --node-name)")?
            .trim()
            .to_lowercase(),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
    let kib: i64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("/proc/meminfo has no MemTotal")?;
    Ok(NodeInfo {
        name,
        ip: ip.to_string(),
        cpu_millis: i64::try_from(cpus).unwrap_or(1).saturating_mul(1000),
        memory_bytes: kib.saturating_mul(1024),
        cgroup_driver: cgroup_driver.into(),
    })
}

/// `pod run --manifest`.
async fn run_manifest(args: RunArgs) -> anyhow::Result<()> {
    use erdma_fake_kubelet::manifest_pod::{ManifestRun, run_manifest_pod};
    use erdma_fake_kubelet::podspec::{manifest, translate::PodPlan};
    if args.kubeconfig.is_some() && args.api_server.is_none() {
        bail!(
            "--kubeconfig with --manifest is the lab kubelet's client of the API server of --api-server: pass --api-server HOST:PORT and --service-account-dir DIR too (DRA claims are read without --manifest)"
        );
    }
    let file = args.manifest.context("--manifest FILE")?;
    let mut m = manifest::load(&file, args.object.as_deref())?;
    if let Some(p) = &args.pod {
        valid_pod(p)?;
        if let Some((ns, name)) = p.split_once('/') {
            m.pod.metadata.namespace = Some(ns.to_string());
            m.pod.metadata.name = Some(name.to_string());
        }
    }
    let node = this_node(args.node_name, args.node_ip, args.cgroup_driver)?;
    let uid = match m.pod.metadata.uid.clone().filter(|u| !u.is_empty()) {
        Some(u) => u,
        None => erdma_fake_kubelet::pods::new_uid(&format!(
            "{}/{}",
            m.pod.metadata.namespace.as_deref().unwrap_or("default"),
            m.pod.metadata.name.as_deref().unwrap_or("pod")
        )),
    };
    let plan = match (&args.api_server, &args.service_account_dir) {
        (Some(a), Some(dir)) => {
            use erdma_fake_kubelet::pod_api;
            let (host, port) =
                pod_api::parse_host_port(a).map_err(|e| anyhow::anyhow!("--api-server {e}"))?;
            let client = match &args.kubeconfig {
                Some(k) => kube_client(k).await?,
                None => pod_api::client(&host, port, dir).await?,
            };
            let access = pod_api::ApiAccess {
                client,
                host,
                port,
                service_account_dir: dir.clone(),
            };
            let objects = pod_api::prepare(&mut m, &access).await?;
            PodPlan::with_api(m, &node, uid, &objects)?
        }
        _ => PodPlan::new(m, &node, uid)?,
    };
    let run = ManifestRun {
        plan,
        cdi: match args.cdi {
            Cdi::Field => erdma_fake_kubelet::pods::CdiForm::Field,
            Cdi::Annotation => erdma_fake_kubelet::pods::CdiForm::Annotation,
        },
        authority: args.authority.into(),
        log_root: args.log_root,
        ready_timeout: Duration::from_secs(args.ready_timeout),
        init_timeout: Duration::from_secs(args.init_timeout),
    };
    let mut cri = cri_client(&args.target).await?;
    let record = run_manifest_pod(&args.target.dir, &mut cri, &run).await?;
    println!("{}", serde_json::to_string_pretty(&record)?);
    if record.ready != Some(true) {
        eprintln!(
            "pod {} did not become ready within {} s: {}. It stays recorded: inspect it with `pod status`, remove it with `pod delete`",
            record.pod,
            args.ready_timeout,
            record.not_ready_reason.as_deref().unwrap_or("unknown")
        );
        std::process::exit(1);
    }
    Ok(())
}

async fn run(
    dir: PathBuf,
    pod_resources_socket: Option<PathBuf>,
    authority: ClientAuthority,
    node_status: Option<erdma_fake_kubelet::node_status::NodeStatusConfig>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let cfg = FakeKubeletConfig {
        dir: dir.clone(),
        pod_resources_socket,
        dial_authority: authority,
    };
    let mut kubelet = FakeKubelet::start(cfg).await?;
    if let Some(ns) = node_status {
        tracing::info!(node = %ns.node, "writing device-plugin resources into the node's status");
        kubelet.report_node_status(ns);
    }
    let pid_file = dir.join(PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .with_context(|| format!("write {}", pid_file.display()))?;
    tracing::info!(dir = %dir.display(), "fake kubelet serving");
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                tracing::info!("SIGHUP: simulating a kubelet restart");
                if let Err(e) = kubelet.restart().await {
                    tracing::error!("restart failed: {e}");
                }
            }
        }
    }
    kubelet.shutdown().await;
    let _ = std::fs::remove_file(&pid_file);
    Ok(())
}

async fn restart(dir: &Path) -> anyhow::Result<()> {
    let pid_file = dir.join(PID_FILE);
    let text = std::fs::read_to_string(&pid_file).with_context(|| {
        format!(
            "read {} (is `erdma-fake-kubelet run --dir {}` running?)",
            pid_file.display(),
            dir.display()
        )
    })?;
    let pid: i32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} does not hold a PID: {text:?}", pid_file.display()))?;
    let before = erdma_fake_kubelet::state::read_state(dir)
        .map(|s| s.kubelet_restarts)
        .unwrap_or(0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .with_context(|| format!("signal fake kubelet PID {pid}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = erdma_fake_kubelet::state::read_state(dir)
            .map(|s| s.kubelet_restarts)
            .unwrap_or(0);
        if now > before && erdma_kubelet::uds::is_socket(&dir.join("kubelet.sock")) {
            println!("{}", serde_json::json!({"kubelet_restarts": now}));
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("fake kubelet PID {pid} did not restart within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
