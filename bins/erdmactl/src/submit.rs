//! `erdmactl submit pytorch`: Arena-compatible PyTorchJob submission (flags, validation, output).

use crate::output::{self, Format};
use anyhow::Context;
use erdma_training::{JobRequest, PyTorchJob};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `erdmactl submit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to submit.
    #[command(subcommand)]
    pub kind: Kind,
}

/// Job kinds `submit` knows.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Submit PyTorchJob as training job (flags and output as `arena submit pytorch`).
    #[command(alias = "pytorchjob", after_help = crate::exit::SUBMIT)]
    Pytorch(Box<PytorchArgs>),
}

/// How to reach the Kubernetes API (the user's kubeconfig).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// How long to wait for each answer of the API server (kubectl's flag: 30s, 1m, 0 for no
    /// limit); an API server that accepts the connection and never answers ends the command
    /// with exit 2 naming it, instead of a silent hang. A request unanswered after a second is
    /// reported on stderr ("waiting for the API server at …"), again at 2, 4, 8 … s.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = request_timeout)]
    pub request_timeout: std::time::Duration,
}

fn request_timeout(s: &str) -> Result<std::time::Duration, String> {
    erdma_training::validate::duration_seconds(s).map(std::time::Duration::from_secs)
}

impl Default for KubeArgs {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            request_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// Flags of `erdmactl submit pytorch` (Arena's names and defaults), then the command after `--`.
#[derive(Debug, clap::Args)]
pub struct PytorchArgs {
    /// Job name: DNS-1123 label, at most 49 characters.
    #[arg(long)]
    pub name: Option<String>,
    /// Namespace (default: the kubeconfig context's namespace, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Container image (needs the RDMA user-space libraries for eRDMA).
    #[arg(long)]
    pub image: Option<String>,
    /// GPUs per pod (`nvidia.com/gpu`).
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Total number of pods, the master included.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// CPU request and limit per pod (a quantity: 4, 500m).
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory request and limit per pod (a quantity: 16Gi).
    #[arg(long)]
    pub memory: Option<String>,
    /// Extended resource per pod, `<resource>=<quantity>` (repeatable), e.g. aliyun/erdma=1.
    #[arg(long = "device", value_name = "RESOURCE=QTY")]
    pub devices: Vec<String>,
    /// Environment variable `KEY=VALUE` (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub envs: Vec<String>,
    /// Annotation `key=value` on the job and its pods (repeatable).
    #[arg(short = 'a', long = "annotation", value_name = "KEY=VALUE")]
    pub annotations: Vec<String>,
    /// Label `key=value` on the job and its pods (repeatable).
    #[arg(short = 'l', long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// nodeSelector `key=value` (repeatable).
    #[arg(long = "selector", value_name = "KEY=VALUE")]
    pub selectors: Vec<String>,
    /// Toleration `key[=value][:effect][,operator]`, or `all` (repeatable).
    #[arg(long = "toleration", value_name = "TOLERATION")]
    pub tolerations: Vec<String>,
    /// Working directory in the container.
    #[arg(long, alias = "workingDir", default_value = "/root")]
    pub working_dir: String,
    /// PVC mount `<pvc>:<mount path>` (repeatable).
    #[arg(short = 'd', long = "data", value_name = "PVC:PATH")]
    pub data: Vec<String>,
    /// Size of /dev/shm (memory-backed emptyDir).
    #[arg(long, alias = "share-memory", default_value = "2Gi")]
    pub shm_size: String,
    /// Image pull Secret name (repeatable).
    #[arg(long = "image-pull-secret", value_name = "NAME")]
    pub image_pull_secrets: Vec<String>,
    /// Image pull policy: Always, IfNotPresent or Never.
    #[arg(long, default_value = "Always")]
    pub image_pull_policy: String,
    /// Which pods to delete when the job ends: None, Running or All.
    #[arg(long, default_value = "Running")]
    pub clean_task_policy: String,
    /// Shell that runs the command (`<shell> -c "<command>"`).
    #[arg(long, default_value = "sh")]
    pub shell: String,
    /// Retries before the job is failed (backoffLimit).
    #[arg(long, default_value_t = 0)]
    pub retry: u32,
    /// Deadline for the running job (Go duration, e.g. 2h; 0 = none).
    #[arg(long, default_value = "0")]
    pub running_timeout: String,
    /// Delete the finished job after this long (Go duration; 0 = keep).
    #[arg(long, default_value = "0")]
    pub ttl_after_finished: String,
    /// Processes per pod for torchrun: auto, cpu, gpu or N (env PET_NPROC_PER_NODE).
    #[arg(long)]
    pub nproc_per_node: Option<String>,
    /// PriorityClass name.
    #[arg(short = 'p', long)]
    pub priority: Option<String>,
    /// eRDMA shortcut: aliyun/erdma=1, IPC_LOCK and the recommended NCCL env (docs/training.md).
    #[arg(long)]
    pub erdma: bool,
    /// Ask for SMC-R (annotation network.alibabacloud.com/erdma-smcr=true on the pods).
    #[arg(long)]
    pub smcr: bool,
    /// Print the job instead of creating it.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format of the job (default with --dry-run: yaml).
    #[arg(short = 'o', long = "output", value_parser = ["yaml", "json"])]
    pub output: Option<String>,
    /// Kubernetes API access.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The training command: after `--`, or as Arena takes it, the first positional argument and
    /// everything after it (e.g. `"torchrun train.py"`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

impl PytorchArgs {
    /// The flags as a [`JobRequest`] in `namespace`.
    pub fn request(&self, namespace: String) -> JobRequest {
        JobRequest {
            name: self.name.clone(),
            namespace,
            image: self.image.clone(),
            gpus: self.gpus,
            workers: self.workers,
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            devices: self.devices.clone(),
            envs: self.envs.clone(),
            annotations: self.annotations.clone(),
            labels: self.labels.clone(),
            selectors: self.selectors.clone(),
            tolerations: self.tolerations.clone(),
            working_dir: self.working_dir.clone(),
            data: self.data.clone(),
            shm_size: self.shm_size.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            clean_task_policy: self.clean_task_policy.clone(),
            shell: self.shell.clone(),
            retry: self.retry,
            running_timeout: self.running_timeout.clone(),
            ttl_after_finished: self.ttl_after_finished.clone(),
            nproc_per_node: self.nproc_per_node.clone(),
            priority: self.priority.clone(),
            erdma: self.erdma,
            smcr: self.smcr,
            command: self.command.clone(),
        }
    }
}

/// A Kubernetes client from the user's kubeconfig (explicit file, context, or the usual inference).
pub async fn kube_client(kube: &KubeArgs) -> anyhow::Result<kube::Client> {
    kube_client_with_retry(kube, true).await
}

/// [`kube_client`], with kube's retries of 429/503/504 answers on or off: off for requests
/// through the API server's pod proxy, where a 503 is the proxied server's own answer (an agent
/// that cannot read usage), not an API server asking to be retried.
pub async fn kube_client_with_retry(kube: &KubeArgs, retry: bool) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: kube.context.clone(),
        ..Default::default()
    };
    let config = match (&kube.kubeconfig, &kube.context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        (None, Some(ctx)) => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("kubeconfig context {ctx}"))?,
        (None, None) => kube::Config::infer().await.context(
            "no Kubernetes configuration found: set KUBECONFIG, pass --kubeconfig, or use --dry-run",
        )?,
    };
    let mut config = config;
    config.default_retry = retry;
    let request_timeout = (!kube.request_timeout.is_zero()).then_some(kube.request_timeout);
    if let Some(t) = request_timeout {
        config.connect_timeout = Some(t.min(std::time::Duration::from_secs(10)));
    }
    let options = erdma_k8s::client::ClientOptions {
        request_timeout,
        progress: Some(erdma_k8s::client::Progress::new(
            erdma_k8s::client::PROGRESS_AFTER,
            |w: &erdma_k8s::client::Waiting<'_>| crate::output::warn(&progress_line(w)),
        )),
    };
    erdma_k8s::client::build(config, &options).context("building the Kubernetes client")
}

/// The stderr line for an API request still unanswered (after 1, 2, 4 … s; stdout is left to
/// the command's output).
pub fn progress_line(w: &erdma_k8s::client::Waiting<'_>) -> String {
    format!(
        "erdmactl: waiting for the API server at {}: {} ({} s)…",
        w.server,
        w.action,
        w.elapsed.as_secs()
    )
}

/// A current-thread tokio runtime for one command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn info(start: Instant, msg: &str) {
    crate::output::warn(&format!("INFO[{:04}] {msg}", start.elapsed().as_secs()));
}

fn print_job(job: &PyTorchJob, format: &str) -> anyhow::Result<()> {
    let f = if format == "json" {
        Format::Json
    } else {
        Format::Yaml
    };
    crate::output::emit(&output::render(job, f)?)?;
    Ok(())
}

/// Runs `erdmactl submit …`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.kind {
        Kind::Pytorch(a) => pytorch(a),
    }
}

fn pytorch(a: &PytorchArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    if a.dry_run {
        let ns = a.namespace.clone().unwrap_or_else(|| "default".into());
        let job = a.request(ns).build()?;
        print_job(&job, a.output.as_deref().unwrap_or("yaml"))?;
        return Ok(ExitCode::SUCCESS);
    }
    // Validate before touching the network, so flag errors never depend on a cluster.
    a.request(a.namespace.clone().unwrap_or_else(|| "default".into()))
        .build()?;
    let rt = runtime()?;
    rt.block_on(async {
        let client = kube_client(&a.kube).await?;
        let ns = a
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let job = a.request(ns.clone()).build()?;
        let created = erdma_training::create(client, &job, false).await?;
        let name = job.metadata.name.clone().unwrap_or_default();
        match a.output.as_deref() {
            Some(f) => print_job(&created.job, f)?,
            None => crate::output::emitln(&format!("pytorchjob.kubeflow.org/{name} created"))?,
        }
        info(
            start,
            &format!("The Job {name} has been submitted successfully"),
        );
        info(
            start,
            &format!("You can run `kubectl get pytorchjob {name} -n {ns}` to check the job status"),
        );
        info(
            start,
            &format!(
                "You can run `kubectl logs -f {name}-master-0 -n {ns}` to follow the training, and \
                 `erdmactl doctor --pod {name}-master-0 -n {ns}` if it stays Pending"
            ),
        );
        Ok(ExitCode::SUCCESS)
    })
}
