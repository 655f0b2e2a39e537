//! `submit pytorch` flags → a validated request → a `PyTorchJob`, with Arena's validation rules,
//! defaults and injected environment (`nccl-and-arena.md` part B).

use crate::erdma;
use crate::pytorchjob::{
    API_VERSION, CONTAINER_NAME, KIND, MASTER, PyTorchJob, PyTorchJobSpec, ReplicaSpec, RunPolicy,
    WORKER,
};
use crate::validate;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, LocalObjectReference,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// Longest job name Arena accepts (`util.ValidateJobName`): pod names get `-worker-N` appended.
pub const MAX_NAME_LEN: usize = 49;
/// The GPU resource, requested through `--gpus`, never through `--device`.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The flags of `submit pytorch`, as the user typed them (strings are validated by
/// [`JobRequest::build`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobRequest {
    /// `--name`.
    pub name: Option<String>,
    /// `-n/--namespace`.
    pub namespace: String,
    /// `--image`.
    pub image: Option<String>,
    /// `--gpus`: GPUs per pod.
    pub gpus: u32,
    /// `--workers`: total pods, the master included.
    pub workers: u32,
    /// `--cpu`.
    pub cpu: Option<String>,
    /// `--memory`.
    pub memory: Option<String>,
    /// `--device <resource>=<quantity>`.
    pub devices: Vec<String>,
    /// `-e/--env KEY=VALUE`.
    pub envs: Vec<String>,
    /// `-a/--annotation k=v`.
    pub annotations: Vec<String>,
    /// `-l/--label k=v`.
    pub labels: Vec<String>,
    /// `--selector k=v`.
    pub selectors: Vec<String>,
    /// `--toleration key[=value][:effect][,operator]` or `all`.
    pub tolerations: Vec<String>,
    /// `--working-dir`.
    pub working_dir: String,
    /// `-d/--data <pvc>:<mount path>`.
    pub data: Vec<String>,
    /// `--shm-size` (Arena: `--share-memory`).
    pub shm_size: String,
    /// `--image-pull-secret`.
    pub image_pull_secrets: Vec<String>,
    /// `--image-pull-policy`.
    pub image_pull_policy: String,
    /// `--clean-task-policy`: `None`, `Running` or `All`.
    pub clean_task_policy: String,
    /// `--shell`.
    pub shell: String,
    /// `--retry`: backoff limit.
    pub retry: u32,
    /// `--running-timeout` (Go duration; `0` = none).
    pub running_timeout: String,
    /// `--ttl-after-finished` (Go duration; `0` = keep forever).
    pub ttl_after_finished: String,
    /// `--nproc-per-node`: `auto`, `cpu`, `gpu` or a number.
    pub nproc_per_node: Option<String>,
    /// `-p/--priority`: PriorityClass name.
    pub priority: Option<String>,
    /// `--erdma`: one `aliyun/erdma`, `IPC_LOCK` and the NCCL settings for eRDMA.
    pub erdma: bool,
    /// `--smcr`: the SMC-R pod annotation.
    pub smcr: bool,
    /// The command after `--`, joined with spaces.
    pub command: Vec<String>,
}

impl Default for JobRequest {
    /// Arena's defaults.
    fn default() -> Self {
        JobRequest {
            name: None,
            namespace: "default".into(),
            image: None,
            gpus: 0,
            workers: 1,
            cpu: None,
            memory: None,
            devices: vec![],
            envs: vec![],
            annotations: vec![],
            labels: vec![],
            selectors: vec![],
            tolerations: vec![],
            working_dir: "/root".into(),
            data: vec![],
            shm_size: "2Gi".into(),
            image_pull_secrets: vec![],
            image_pull_policy: "Always".into(),
            clean_task_policy: "Running".into(),
            shell: "sh".into(),
            retry: 0,
            running_timeout: "0".into(),
            ttl_after_finished: "0".into(),
            nproc_per_node: None,
            priority: None,
            erdma: false,
            smcr: false,
            command: vec![],
        }
    }
}

/// Why a flag set was refused. Messages follow Arena's wording where Arena has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A required flag is missing.
    #[error("{flag} must be set{hint}")]
    Missing {
        /// The flag.
        flag: &'static str,
        /// Extra guidance, starting with `: ` or empty.
        hint: String,
    },
    /// No command after `--`.
    #[error(
        "not found command args: put the training command after `--`, e.g. `erdmactl submit pytorch --name pt --image IMG -- python train.py`"
    )]
    NoCommand,
    /// `--device` value with the wrong shape or name.
    #[error("invalid device '{value}', {reason}")]
    Device {
        /// The value as typed.
        value: String,
        /// What is wrong and how to write it.
        reason: String,
    },
    /// Any other invalid value.
    #[error("invalid {flag} '{value}': {reason}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// The value as typed.
        value: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> FlagError {
    FlagError::Invalid {
        flag,
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn key_value<'a>(
    flag: &'static str,
    value: &'a str,
    example: &str,
) -> Result<(&'a str, &'a str), FlagError> {
    value
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| invalid(flag, value, format!("expected key=value, e.g. {example}")))
}

/// Parses one `--device` value as Arena's `ValidateDevices` does.
pub fn parse_device(value: &str) -> Result<(String, String), FlagError> {
    let err = |reason: String| FlagError::Device {
        value: value.to_string(),
        reason,
    };
    let (name, qty) = value
        .split_once('=')
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| err("refer to amd.com/gpu=1 (for eRDMA: aliyun/erdma=1)".into()))?;
    validate::qualified_name(name)
        .map_err(|e| err(format!("'{name}' is not a valid resource name: {e}")))?;
    if name == GPU_RESOURCE {
        return Err(err("please use '--gpus N' instead".into()));
    }
    validate::resource_quantity(qty).map_err(|e| err(format!("{e}; refer to {name}=1")))?;
    Ok((name.to_string(), qty.to_string()))
}

/// Parses one `--toleration`: `all`, or `key[=value][:effect][,operator]`.
pub fn parse_toleration(value: &str) -> Result<Toleration, FlagError> {
    if value == "all" {
        return Ok(Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        });
    }
    let (main, operator) = match value.split_once(',') {
        Some((m, op)) => (m, Some(op)),
        None => (value, None),
    };
    let (kv, effect) = match main.split_once(':') {
        Some((kv, e)) => (kv, Some(e)),
        None => (main, None),
    };
    let (key, val) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(invalid(
            "--toleration",
            value,
            "the key is empty; use key=value:effect[,operator] or all",
        ));
    }
    validate::qualified_name(key)
        .map_err(|e| invalid("--toleration", value, format!("key '{key}': {e}")))?;
    if let Some(e) = effect
        && !matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
    {
        return Err(invalid(
            "--toleration",
            value,
            format!("unknown effect '{e}': use NoSchedule, PreferNoSchedule or NoExecute"),
        ));
    }
    let operator = match operator {
        Some(op @ ("Equal" | "Exists")) => op.to_string(),
        Some(op) => {
            return Err(invalid(
                "--toleration",
                value,
                format!("unknown operator '{op}': use Equal or Exists"),
            ));
        }
        None if val.is_some() => "Equal".into(),
        None => "Exists".into(),
    };
    if operator == "Exists" && val.is_some_and(|v| !v.is_empty()) {
        return Err(invalid(
            "--toleration",
            value,
            "operator Exists takes no value; drop '=value' or use Equal",
        ));
    }
    Ok(Toleration {
        key: Some(key.to_string()),
        value: val.filter(|_| operator == "Equal").map(str::to_string),
        effect: effect.map(str::to_string),
        operator: Some(operator),
        toleration_seconds: None,
    })
}

/// The validated flags: everything [`build`] needs, in typed form.
#[derive(Debug, Clone, PartialEq)]
struct Valid {
    name: String,
    image: String,
    command: String,
    devices: BTreeMap<String, String>,
    envs: Vec<(String, String)>,
    annotations: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    selectors: BTreeMap<String, String>,
    tolerations: Vec<Toleration>,
    data: Vec<(String, String)>,
    run_policy: RunPolicy,
    ipc_lock: bool,
}

impl JobRequest {
    fn validate(&self) -> Result<Valid, FlagError> {
        let name = self
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(FlagError::Missing {
                flag: "--name",
                hint: ": give the job a name, e.g. --name pt-erdma".into(),
            })?;
        validate::dns1123_label(name, MAX_NAME_LEN)
            .map_err(|e| invalid("--name", name, format!("the job name {e}")))?;
        validate::dns1123_label(&self.namespace, 63)
            .map_err(|e| invalid("--namespace", &self.namespace, format!("a namespace {e}")))?;
        let image = self.image.as_deref().filter(|i| !i.trim().is_empty()).ok_or(FlagError::Missing {
            flag: "--image",
            hint: ": the training image, with the RDMA user-space libraries for eRDMA (see examples/pytorch-mnist/Dockerfile)"
                .into(),
        })?;
        if image.chars().any(char::is_whitespace) {
            return Err(invalid(
                "--image",
                image,
                "an image reference has no whitespace",
            ));
        }
        let command = self.command.join(" ");
        if command.trim().is_empty() {
            return Err(FlagError::NoCommand);
        }
        if self.workers == 0 {
            return Err(invalid(
                "--workers",
                "0",
                "the total number of pods (the master included) must be at least 1",
            ));
        }
        if self.shell.trim().is_empty() {
            return Err(invalid(
                "--shell",
                &self.shell,
                "give a shell such as sh or bash",
            ));
        }
        for (flag, value) in [("--cpu", &self.cpu), ("--memory", &self.memory)] {
            if let Some(v) = value {
                validate::resource_quantity(v).map_err(|e| invalid(flag, v, e))?;
            }
        }
        validate::resource_quantity(&self.shm_size)
            .map_err(|e| invalid("--shm-size", &self.shm_size, e))?;

        let mut devices = BTreeMap::new();
        for d in &self.devices {
            let (k, v) = parse_device(d)?;
            devices.insert(k, v);
        }
        if self.erdma {
            devices
                .entry(erdma::RESOURCE.to_string())
                .or_insert_with(|| "1".into());
        }
        if self.smcr && !devices.contains_key(erdma::RESOURCE) {
            return Err(invalid(
                "--smcr",
                "true",
                "SMC-R needs an eRDMA device in the pod: add --erdma or --device aliyun/erdma=1",
            ));
        }

        let mut envs: Vec<(String, String)> = Vec::new();
        let mut push_env = |k: &str, v: &str| {
            if !envs.iter().any(|(e, _)| e == k) {
                envs.push((k.to_string(), v.to_string()));
            }
        };
        for e in &self.envs {
            let (k, v) = key_value("--env", e, "NCCL_DEBUG=INFO")?;
            validate::env_name(k).map_err(|r| invalid("--env", e, r))?;
            push_env(k, v);
        }
        if self.erdma {
            for s in erdma::nccl_settings(self.gpus) {
                push_env(s.name, s.value);
            }
        }
        push_env("workers", &self.workers.to_string());
        push_env("gpus", &self.gpus.to_string());
        if self.gpus == 0 {
            push_env("NVIDIA_VISIBLE_DEVICES", "void");
        }
        if let Some(n) = &self.nproc_per_node {
            if !(matches!(n.as_str(), "auto" | "cpu" | "gpu")
                || n.parse::<u32>().is_ok_and(|v| v > 0))
            {
                return Err(invalid(
                    "--nproc-per-node",
                    n,
                    "use auto, cpu, gpu or a positive number",
                ));
            }
            push_env("PET_NPROC_PER_NODE", n);
        }

        let mut annotations = BTreeMap::new();
        for a in &self.annotations {
            let (k, v) = key_value(
                "--annotation",
                a,
                "network.alibabacloud.com/erdma-smcr=true",
            )?;
            validate::qualified_name(k)
                .map_err(|r| invalid("--annotation", a, format!("key '{k}': {r}")))?;
            annotations.insert(k.to_string(), v.to_string());
        }
        if let Some(v) = annotations.get(erdma::SMCR_ANNOTATION) {
            let on = erdma_model::names::parse_smcr(v).map_err(|e| {
                invalid(
                    "--annotation",
                    &format!("{}={v}", erdma::SMCR_ANNOTATION),
                    format!("{e} (the agent and the webhook leave SMC-R off for other values)"),
                )
            })?;
            if self.smcr && !on {
                return Err(invalid(
                    "--smcr",
                    &format!("{}={v}", erdma::SMCR_ANNOTATION),
                    "--smcr asks for SMC-R but --annotation turns it off; drop one of them",
                ));
            }
        }
        if self.smcr {
            annotations.insert(erdma::SMCR_ANNOTATION.to_string(), "true".into());
        }
        let mut labels = BTreeMap::new();
        for l in &self.labels {
            let (k, v) = key_value("--label", l, "team=nlp")?;
            validate::qualified_name(k)
                .map_err(|r| invalid("--label", l, format!("key '{k}': {r}")))?;
            validate::label_value(v).map_err(|r| invalid("--label", l, r))?;
            labels.insert(k.to_string(), v.to_string());
        }
        let mut selectors = BTreeMap::new();
        for s in &self.selectors {
            let (k, v) = key_value("--selector", s, "aliyun.accelerator/erdma=true")?;
            validate::qualified_name(k)
                .map_err(|r| invalid("--selector", s, format!("key '{k}': {r}")))?;
            validate::label_value(v).map_err(|r| invalid("--selector", s, r))?;
            selectors.insert(k.to_string(), v.to_string());
        }
        let tolerations = self
            .tolerations
            .iter()
            .map(|t| parse_toleration(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut data = Vec::new();
        for d in &self.data {
            let (pvc, path) = d
                .split_once(':')
                .filter(|(p, m)| !p.is_empty() && !m.is_empty())
                .ok_or_else(|| {
                    invalid(
                        "--data",
                        d,
                        "expected <pvc name>:<mount path>, e.g. training-data:/data",
                    )
                })?;
            validate::dns1123_subdomain(pvc)
                .map_err(|r| invalid("--data", d, format!("PVC name {r}")))?;
            if !path.starts_with('/') {
                return Err(invalid(
                    "--data",
                    d,
                    "the mount path must be absolute, e.g. training-data:/data",
                ));
            }
            data.push((pvc.to_string(), path.to_string()));
        }
        for s in &self.image_pull_secrets {
            validate::dns1123_subdomain(s)
                .map_err(|r| invalid("--image-pull-secret", s, format!("a Secret name {r}")))?;
        }
        if !matches!(
            self.image_pull_policy.as_str(),
            "Always" | "IfNotPresent" | "Never"
        ) {
            return Err(invalid(
                "--image-pull-policy",
                &self.image_pull_policy,
                "use Always, IfNotPresent or Never",
            ));
        }
        if !matches!(self.clean_task_policy.as_str(), "None" | "Running" | "All") {
            return Err(invalid(
                "--clean-task-policy",
                &self.clean_task_policy,
                "use None, Running or All",
            ));
        }
        if let Some(p) = &self.priority {
            validate::dns1123_subdomain(p)
                .map_err(|r| invalid("--priority", p, format!("a PriorityClass name {r}")))?;
        }
        let deadline = validate::duration_seconds(&self.running_timeout)
            .map_err(|e| invalid("--running-timeout", &self.running_timeout, e))?;
        let ttl = validate::duration_seconds(&self.ttl_after_finished)
            .map_err(|e| invalid("--ttl-after-finished", &self.ttl_after_finished, e))?;
        let ttl = i32::try_from(ttl)
            .map_err(|_| invalid("--ttl-after-finished", &self.ttl_after_finished, "too long"))?;
        let deadline = i64::try_from(deadline)
            .map_err(|_| invalid("--running-timeout", &self.running_timeout, "too long"))?;
        let retry = i32::try_from(self.retry)
            .map_err(|_| invalid("--retry", &self.retry.to_string(), "too large"))?;
        let run_policy = RunPolicy {
            clean_pod_policy: Some(self.clean_task_policy.clone()),
            ttl_seconds_after_finished: (ttl > 0).then_some(ttl),
            active_deadline_seconds: (deadline > 0).then_some(deadline),
            backoff_limit: (retry > 0).then_some(retry),
        };
        Ok(Valid {
            name: name.to_string(),
            image: image.to_string(),
            command,
            devices,
            envs,
            annotations,
            labels,
            selectors,
            tolerations,
            data,
            run_policy,
            ipc_lock: self.erdma,
        })
    }

    /// Validates the flags and builds the `PyTorchJob`: one Master, `workers - 1` Workers,
    /// container `pytorch`, Arena's labels, annotations and injected env.
    pub fn build(&self) -> Result<PyTorchJob, FlagError> {
        let v = self.validate()?;
        let mut job_labels = BTreeMap::from([
            ("app".to_string(), "pytorchjob".to_string()),
            ("release".to_string(), v.name.clone()),
            ("createdBy".to_string(), "PyTorchJob".to_string()),
            ("heritage".to_string(), "erdmactl".to_string()),
        ]);
        job_labels.extend(v.labels.clone());
        let mut job_annotations = v.annotations.clone();
        job_annotations.insert(
            "requestGPUsOfJobOwner".into(),
            (u64::from(self.workers) * u64::from(self.gpus)).to_string(),
        );

        let mut specs = BTreeMap::new();
        let master_pod = format!("{}-master-0", v.name);
        let mut master_labels = job_labels.clone();
        master_labels.insert("master-pod-name".into(), master_pod);
        specs.insert(
            MASTER.to_string(),
            self.replica(&v, 1, "Never", master_labels),
        );
        if self.workers > 1 {
            let n = i32::try_from(self.workers - 1)
                .map_err(|_| invalid("--workers", &self.workers.to_string(), "too large"))?;
            specs.insert(
                WORKER.to_string(),
                self.replica(&v, n, "OnFailure", job_labels.clone()),
            );
        }
        Ok(PyTorchJob {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            metadata: ObjectMeta {
                name: Some(v.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(job_labels),
                annotations: Some(job_annotations),
                ..Default::default()
            },
            spec: PyTorchJobSpec {
                run_policy: v.run_policy.clone(),
                pytorch_replica_specs: specs,
            },
            status: None,
        })
    }

    fn replica(
        &self,
        v: &Valid,
        replicas: i32,
        restart: &str,
        labels: BTreeMap<String, String>,
    ) -> ReplicaSpec {
        let q = |s: &str| Quantity(s.to_string());
        let mut requests: BTreeMap<String, Quantity> = BTreeMap::new();
        let mut limits: BTreeMap<String, Quantity> = BTreeMap::new();
        for (k, val) in &v.devices {
            requests.insert(k.clone(), q(val));
            limits.insert(k.clone(), q(val));
        }
        for (k, val) in [("cpu", &self.cpu), ("memory", &self.memory)] {
            if let Some(val) = val {
                requests.insert(k.into(), q(val));
                limits.insert(k.into(), q(val));
            }
        }
        if self.gpus > 0 {
            limits.insert(GPU_RESOURCE.into(), q(&self.gpus.to_string()));
        }
        let mut mounts = vec![VolumeMount {
            name: "dshm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        }];
        let mut volumes = vec![Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(q(&self.shm_size)),
            }),
            ..Default::default()
        }];
        for (i, (pvc, path)) in v.data.iter().enumerate() {
            let name = format!("data-{i}");
            mounts.push(VolumeMount {
                name: name.clone(),
                mount_path: path.clone(),
                ..Default::default()
            });
            volumes.push(Volume {
                name,
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc.clone(),
                    read_only: None,
                }),
                ..Default::default()
            });
        }
        let container = Container {
            name: CONTAINER_NAME.into(),
            image: Some(v.image.clone()),
            image_pull_policy: Some(self.image_pull_policy.clone()),
            working_dir: Some(self.working_dir.clone()),
            command: Some(vec![self.shell.clone(), "-c".into(), v.command.clone()]),
            env: Some(
                v.envs
                    .iter()
                    .map(|(k, val)| EnvVar {
                        name: k.clone(),
                        value: Some(val.clone()),
                        value_from: None,
                    })
                    .collect(),
            ),
            resources: Some(ResourceRequirements {
                requests: (!requests.is_empty()).then_some(requests),
                limits: (!limits.is_empty()).then_some(limits),
                ..Default::default()
            }),
            security_context: v.ipc_lock.then(|| SecurityContext {
                capabilities: Some(Capabilities {
                    add: Some(vec![erdma::IPC_LOCK.into()]),
                    drop: None,
                }),
                ..Default::default()
            }),
            volume_mounts: Some(mounts),
            ..Default::default()
        };
        let non_empty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
        ReplicaSpec {
            replicas,
            restart_policy: restart.into(),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: non_empty(&v.annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    node_selector: non_empty(&v.selectors),
                    tolerations: (!v.tolerations.is_empty()).then(|| v.tolerations.clone()),
                    image_pull_secrets: (!self.image_pull_secrets.is_empty()).then(|| {
                        self.image_pull_secrets
                            .iter()
                            .map(|s| LocalObjectReference { name: s.clone() })
                            .collect()
                    }),
                    priority_class_name: self.priority.clone(),
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
        }
    }
}
