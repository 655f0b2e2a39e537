//! `erdmactl install`: renders (`--dry-run -o yaml|json`) or server-side-applies the erdma
//! manifests, the same objects as the Helm chart in `deploy/helm` (`erdma_k8s::install`; a test
//! compares both for the chart's CI matrix); `erdmactl uninstall` deletes exactly those objects.
//! This module only maps flags and a values file (the chart's `values.yaml` format) onto `Values`.

use crate::submit::{KubeArgs, kube_client, runtime};
use anyhow::Context;
use erdma_k8s::install::{
    Cluster, Deleted, Existing, Values, apply, delete, find_existing, render_json_for,
    render_yaml_for,
};
use k8s_openapi::api::core::v1::Toleration;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `erdmactl install` (each overrides the values file).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Values file, YAML or JSON, in the chart's `values.yaml` format.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub values: Option<PathBuf>,
    /// Print the manifests instead of applying them.
    #[arg(long)]
    pub dry_run: bool,
    /// Output format of `--dry-run`, and of a refusal (json: an object with a `conflicts` array).
    #[arg(short = 'o', long, default_value = "yaml", value_parser = ["yaml", "json"])]
    pub output: String,
    /// Experts only: install even where another eRDMA installation is found (the ACK console
    /// add-on, another release's agent or controller, terway with enable_erdma), with a warning
    /// for each (the values file's allowExistingInstallation: true does the same). Two device plugins for aliyun/erdma on a node make the kubelet flap the resource.
    #[arg(long)]
    pub allow_existing: bool,
    /// Namespace of the controller and the agent [default: kube-system].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Release name: names the ConfigMap, Secret, RBAC and ServiceAccounts, as a Helm release
    /// would [default: alibaba-erdma-controller, the original chart's].
    #[arg(long, value_name = "NAME")]
    pub release: Option<String>,
    /// agent.preferDriver: default, compat or ofed (empty: auto).
    #[arg(long, value_name = "MODE")]
    pub prefer_driver: Option<String>,
    /// agent.allocateAllDevices.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allocate_all_devices: Option<bool>,
    /// agent.jumboFrameMTU.
    #[arg(long, value_name = "MTU")]
    pub jumbo_frame_mtu: Option<u32>,
    /// agent.exposedLocalERIs, comma-separated `<instance-id|i-*> <ibdev>[/<ibdev>...]` entries
    /// (applied with local discovery, or with --filter-cluster-eris).
    #[arg(long, value_name = "LIST")]
    pub exposed_local_eris: Option<String>,
    /// agent.filterClusterERIs: apply exposedLocalERIs in cluster mode too.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub filter_cluster_eris: Option<bool>,
    /// agent.driverInstaller.version: the driver installer version (the agent's flag name).
    #[arg(long, value_name = "VERSION")]
    pub erdma_installer_version: Option<String>,
    /// agent.driverInstaller.sha256: SHA-256 of the installer tarball (the agent's flag name).
    #[arg(long, value_name = "HEX")]
    pub driver_installer_sha256: Option<String>,
    /// agent.driverInstaller.gpuSha256: SHA-256 of env_setup.sh (the agent's flag name).
    #[arg(long, value_name = "HEX")]
    pub gpu_installer_sha256: Option<String>,
    /// agent.driverInstaller.baseURL: where the installers are downloaded from (https://).
    #[arg(long, value_name = "URL")]
    pub driver_installer_base_url: Option<String>,
    /// agent.driverInstaller.allowInsecureDownload: accept an http:// base URL.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_insecure_driver_download: Option<bool>,
    /// config.localERIDiscovery (no cloud credentials needed).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub local_eri_discovery: Option<bool>,
    /// config.enableWebhook.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_webhook: Option<bool>,
    /// config.enableInitContainerInject.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_init_container_inject: Option<bool>,
    /// config.smcInitImage.
    #[arg(long, value_name = "IMAGE")]
    pub smc_init_image: Option<String>,
    /// config.region (empty: from the metadata service).
    #[arg(long)]
    pub region: Option<String>,
    /// credentials.type: access_key, oidc_role_arn, ecs_ram_role, ram_role_sts.
    #[arg(long, value_name = "TYPE")]
    pub credentials_type: Option<String>,
    /// credentials.accessKeyID.
    #[arg(long, env = "ERDMA_ACCESS_KEY_ID", value_name = "ID")]
    pub access_key_id: Option<String>,
    /// credentials.accessKeySecret (prefer the environment variable over the command line).
    #[arg(
        long,
        env = "ERDMA_ACCESS_KEY_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub access_key_secret: Option<String>,
    /// RRSA: the RAM role name (annotates the controller ServiceAccount).
    #[arg(long, value_name = "ROLE")]
    pub rrsa_role_name: Option<String>,
    /// nodeSelector entry `key=value` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub node_selector: Vec<String>,
    /// Toleration `key[=value]:effect` or `exists` (repeatable; replaces the default "tolerate all").
    #[arg(long, value_name = "TOLERATION")]
    pub toleration: Vec<String>,
    /// controller.image as `repository:tag`.
    #[arg(long, value_name = "IMAGE")]
    pub controller_image: Option<String>,
    /// agent.image as `repository:tag`.
    #[arg(long, value_name = "IMAGE")]
    pub agent_image: Option<String>,
    /// controller.replicaCount.
    #[arg(long)]
    pub replicas: Option<i32>,
    /// Kubernetes API access.
    #[command(flatten)]
    pub kube: KubeArgs,
}

fn split_image(s: &str) -> anyhow::Result<(String, String)> {
    match s.rsplit_once(':') {
        Some((repo, tag)) if !repo.is_empty() && !tag.is_empty() && !tag.contains('/') => {
            Ok((repo.into(), tag.into()))
        }
        _ => anyhow::bail!("image {s:?} is not repository:tag"),
    }
}

fn toleration(s: &str) -> anyhow::Result<Toleration> {
    if s == "exists" {
        return Ok(Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        });
    }
    let (kv, effect) = s
        .rsplit_once(':')
        .map(|(a, b)| (a, Some(b)))
        .unwrap_or((s, None));
    if let Some(e) = effect
        && !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&e)
    {
        anyhow::bail!(
            "toleration {s:?}: effect {e:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        );
    }
    let (key, value) = kv
        .split_once('=')
        .map(|(k, v)| (k, Some(v)))
        .unwrap_or((kv, None));
    if key.is_empty() {
        anyhow::bail!("toleration {s:?} has no key; use key[=value]:effect or exists");
    }
    Ok(Toleration {
        key: Some(key.into()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
        ..Default::default()
    })
}

/// The largest values file read (the chart's whole values.yaml is under 20 KiB).
const MAX_VALUES_FILE: u64 = 4 << 20;

/// A values file, at most [`MAX_VALUES_FILE`] bytes (`-f /dev/zero` is refused, not read forever).
fn read_values_file(p: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_VALUES_FILE + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", p.display()))?;
    if buf.len() as u64 > MAX_VALUES_FILE {
        anyhow::bail!(
            "{}: larger than {} MiB; a values file is the chart's values.yaml format (a few KiB)",
            p.display(),
            MAX_VALUES_FILE >> 20
        );
    }
    String::from_utf8(buf).with_context(|| format!("{}: not UTF-8 text", p.display()))
}

/// The values from the file and the flags.
pub fn values(a: &Args) -> anyhow::Result<Values> {
    let mut v: Values = match &a.values {
        Some(p) => {
            let raw = read_values_file(p)?;
            Values::from_values_file(&raw).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => Values::default(),
    };
    if let Some(x) = &a.namespace {
        v.namespace = x.clone();
    }
    if let Some(x) = &a.release {
        v.name = x.clone();
    }
    if let Some(x) = &a.prefer_driver {
        v.agent.prefer_driver = x.clone();
    }
    if let Some(x) = a.allocate_all_devices {
        v.agent.allocate_all_devices = x;
    }
    if let Some(x) = a.jumbo_frame_mtu {
        v.agent.jumbo_frame_mtu = x;
    }
    if let Some(x) = &a.exposed_local_eris {
        v.agent.exposed_local_eris = x
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
    }
    if let Some(x) = a.filter_cluster_eris {
        v.agent.filter_cluster_eris = x;
    }
    let di = &mut v.agent.driver_installer;
    for (flag, value) in [
        (&a.erdma_installer_version, &mut di.version),
        (&a.driver_installer_sha256, &mut di.sha256),
        (&a.gpu_installer_sha256, &mut di.gpu_sha256),
        (&a.driver_installer_base_url, &mut di.base_url),
    ] {
        if let Some(x) = flag {
            value.clone_from(x);
        }
    }
    if let Some(x) = a.allow_insecure_driver_download {
        di.allow_insecure_download = x;
    }
    if let Some(x) = a.local_eri_discovery {
        v.config.local_eri_discovery = x;
    }
    if let Some(x) = a.enable_webhook {
        v.config.enable_webhook = x;
    }
    if let Some(x) = a.enable_init_container_inject {
        v.config.enable_init_container_inject = x;
    }
    if let Some(x) = &a.smc_init_image {
        v.config.smc_init_image = x.clone();
    }
    if let Some(x) = &a.region {
        v.config.region = x.clone();
    }
    if let Some(x) = &a.credentials_type {
        v.credentials.kind = x.clone();
    }
    if let Some(x) = &a.access_key_id {
        v.credentials.access_key_id = x.clone();
    }
    if let Some(x) = &a.access_key_secret {
        v.credentials.access_key_secret = x.clone();
    }
    if let Some(x) = &a.rrsa_role_name {
        v.service_account
            .annotations
            .insert(erdma_k8s::labels::ANNOTATION_RRSA_ROLE.into(), x.clone());
    }
    for kv in &a.node_selector {
        let (k, val) = kv
            .split_once('=')
            .with_context(|| format!("--node-selector {kv:?} is not key=value"))?;
        v.node_selector.insert(k.into(), val.into());
    }
    if !a.toleration.is_empty() {
        v.tolerations = a
            .toleration
            .iter()
            .map(|t| toleration(t))
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(x) = &a.controller_image {
        (v.controller.image.repository, v.controller.image.tag) = split_image(x)?;
    }
    if let Some(x) = &a.agent_image {
        (v.agent.image.repository, v.agent.image.tag) = split_image(x)?;
    }
    if let Some(x) = a.replicas {
        v.controller.replica_count = x;
    }
    if a.allow_existing {
        v.allow_existing_installation = true;
    }
    Ok(v)
}

/// Runs `erdmactl install`.
pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let v = values(a)?;
    v.validate()?;
    for (component, image) in [
        ("agent", &v.agent.image),
        ("controller", &v.controller.image),
    ] {
        if image.is_original_default(component) {
            crate::output::warn(&format!(
                "erdmactl: note: {component}.image is the original chart's default Go image ({}:latest); erdma's {component} image runs instead. Drop {component}.image from the values file.",
                image.repository
            ));
        }
    }
    if v.runs_controller() && v.config.is_original_smc_init_image() {
        crate::output::warn(&format!(
            "erdmactl: note: config.smcInitImage {} is the original chart's smcr_init image; erdma's {} runs instead. Drop config.smcInitImage from the values file.",
            v.config.smc_init_image,
            v.config.smc_init_image_ref()
        ));
    }
    let warnings = v.warnings();
    for w in &warnings {
        crate::output::warn(&format!("erdmactl: warning: {w}"));
    }
    if !a.dry_run && !warnings.is_empty() {
        anyhow::bail!(
            "not applying an install that cannot work (see the warnings); set the missing values, or render it anyway with --dry-run"
        );
    }
    let rt = runtime()?;
    if a.dry_run {
        // Checked, and rendered for its version and APIs, when a cluster is reachable; offline
        // (no kubeconfig) it renders as `helm template` does.
        let (found, cluster) = rt.block_on(dry_run_check(a, &v))?;
        if let Some(found) = found
            && let Some(refused) = judge(a, &v, &found)
        {
            return Ok(refused);
        }
        let out = if a.output == "json" {
            render_json_for(&v, &cluster)?
        } else {
            render_yaml_for(&v, &cluster)?
        };
        crate::output::emit(&out)?;
        if !out.ends_with('\n') {
            crate::output::emit("\n")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    rt.block_on(async {
        let client = kube_client(&a.kube).await?;
        match find_existing(&client, &v.namespace, &v.name).await {
            Ok(found) => {
                if let Some(refused) = judge(a, &v, &found) {
                    return Ok(refused);
                }
            }
            Err(e) if v.allow_existing_installation => crate::output::warn(&format!(
                "erdmactl: warning: --allow-existing: did not check for another eRDMA installation: {e}"
            )),
            Err(e) => anyhow::bail!(
                "cannot check for another eRDMA installation: {e}; nothing was applied (--allow-existing applies without the check)"
            ),
        }
        for applied in apply(&client, &v).await? {
            crate::output::emitln(&format!("applied {applied}"))?;
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

/// How long `--dry-run` waits for the cluster before rendering without the check.
const DRY_RUN_CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// `--dry-run`'s check: what was found (`None` without a cluster: nothing configured, or
/// unreachable: a note says so), and the cluster to render for ([`Cluster::offline`] without
/// one); an explicit `--kubeconfig`/`--context` that cannot be loaded is an error.
async fn dry_run_check(a: &Args, v: &Values) -> anyhow::Result<(Option<Existing>, Cluster)> {
    let explicit = a.kube.kubeconfig.is_some() || a.kube.context.is_some();
    let client = match kube_client(&a.kube).await {
        Ok(c) => c,
        Err(e) if explicit => return Err(e),
        Err(_) => return Ok((None, Cluster::offline())),
    };
    let note = |why: String| {
        crate::output::warn(&format!(
            "erdmactl: note: rendered without checking the cluster for another eRDMA installation ({why})"
        ))
    };
    let offline = Cluster::offline();
    let cluster = match tokio::time::timeout(DRY_RUN_CHECK_TIMEOUT, Cluster::discover(&client))
        .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            note(format!(
                "its version and APIs could not be read: {e}; rendered as helm template does, for Kubernetes {}.{} with no optional API",
                offline.version.0, offline.version.1
            ));
            return Ok((None, offline));
        }
        Err(_) => {
            note(format!(
                "no answer within {}s",
                DRY_RUN_CHECK_TIMEOUT.as_secs()
            ));
            return Ok((None, offline));
        }
    };
    match tokio::time::timeout(
        DRY_RUN_CHECK_TIMEOUT,
        find_existing(&client, &v.namespace, &v.name),
    )
    .await
    {
        Ok(Ok(found)) => Ok((Some(found), cluster)),
        Ok(Err(e)) => {
            note(e.to_string());
            Ok((None, cluster))
        }
        Err(_) => {
            note(format!(
                "no answer within {}s",
                DRY_RUN_CHECK_TIMEOUT.as_secs()
            ));
            Ok((None, cluster))
        }
    }
}

/// Prints what was found; `Some(exit status)` when the install is refused.
fn judge(a: &Args, v: &Values, found: &Existing) -> Option<ExitCode> {
    for w in &found.warnings {
        crate::output::warn(&format!("erdmactl: warning: {w}"));
    }
    if found.conflicts.is_empty() {
        return None;
    }
    if v.allow_existing_installation {
        for c in &found.conflicts {
            crate::output::warn(&format!(
                "erdmactl: warning: --allow-existing: installing next to {}: {} (fix: {})",
                c.location(),
                c.what,
                c.fix
            ));
        }
        return None;
    }
    let mut msg = format!(
        "erdmactl: another eRDMA installation is in the cluster; not installing release {} into namespace {} next to it (two device plugins for aliyun/erdma on one node make the kubelet flap the resource). Found:\n",
        v.name, v.namespace
    );
    for c in &found.conflicts {
        msg.push_str(&format!(
            "  - {}: {}\n    fix: {}\n",
            c.location(),
            c.what,
            c.fix
        ));
    }
    msg.push_str("Resolve each, then run install again (`erdmactl doctor --node NODE` verifies a node afterwards). Nothing was applied. --allow-existing installs anyway (experts only).");
    crate::output::warn(&msg);
    if a.output == "json" {
        let refusal = serde_json::json!({
            "refused": true,
            "release": v.name,
            "namespace": v.namespace,
            "conflicts": found.conflicts,
            "warnings": found.warnings,
        });
        match serde_json::to_string_pretty(&refusal) {
            // The refusal exits 2 whether or not its JSON could be written.
            Ok(s) => drop(crate::output::emitln(&s)),
            Err(e) => crate::output::warn(&format!("erdmactl: cannot serialise the refusal: {e}")),
        }
    }
    Some(ExitCode::from(crate::exit::USAGE))
}

/// Flags of `erdmactl uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// The values file `install` used (objects depend on it: controller, webhook, STS role).
    #[arg(short = 'f', long, value_name = "FILE")]
    pub values: Option<PathBuf>,
    /// Namespace `install` used [default: kube-system].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Release name `install` used [default: alibaba-erdma-controller].
    #[arg(long, value_name = "NAME")]
    pub release: Option<String>,
    /// Also delete the ERdmaDevice CRD, and with it every ERdmaDevice.
    #[arg(long)]
    pub include_crd: bool,
    /// Print what would be deleted instead of deleting.
    #[arg(long)]
    pub dry_run: bool,
    /// Kubernetes API access.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Runs `erdmactl uninstall`: deletes exactly what `install` (with the same values) created.
pub fn uninstall(a: &UninstallArgs) -> anyhow::Result<ExitCode> {
    let mut v = values(&Args {
        values: a.values.clone(),
        namespace: a.namespace.clone(),
        release: a.release.clone(),
        ..Args::empty()
    })?;
    if a.values.is_none() {
        // Without the install's values, also delete what optional values would have added.
        v.config.enable_webhook = true;
        v.credentials.kind = "ram_role_sts".into();
    }
    if a.dry_run {
        for obj in erdma_k8s::install::render(&v)?.iter().rev() {
            let id = format!(
                "{}/{}",
                obj["kind"].as_str().unwrap_or_default(),
                obj["metadata"]["name"].as_str().unwrap_or_default()
            );
            let kept = obj["kind"] == "Namespace"
                || (obj["kind"] == "CustomResourceDefinition" && !a.include_crd);
            crate::output::emitln(&format!("{} {id}", if kept { "keep" } else { "delete" }))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let rt = runtime()?;
    rt.block_on(async {
        let client = kube_client(&a.kube).await?;
        for d in delete(&client, &v, a.include_crd).await? {
            match d {
                Deleted::Deleted(x) => crate::output::emitln(&format!("deleted {x}"))?,
                Deleted::Absent(x) => crate::output::emitln(&format!("absent {x}"))?,
                Deleted::Kept(x) => {
                    crate::output::emitln(&format!("kept {x} (--include-crd deletes the CRD)"))?
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

impl Args {
    fn empty() -> Self {
        Args {
            values: None,
            dry_run: false,
            output: "yaml".into(),
            namespace: None,
            release: None,
            prefer_driver: None,
            allocate_all_devices: None,
            jumbo_frame_mtu: None,
            exposed_local_eris: None,
            filter_cluster_eris: None,
            erdma_installer_version: None,
            driver_installer_sha256: None,
            gpu_installer_sha256: None,
            driver_installer_base_url: None,
            allow_insecure_driver_download: None,
            local_eri_discovery: None,
            enable_webhook: None,
            enable_init_container_inject: None,
            smc_init_image: None,
            region: None,
            credentials_type: None,
            access_key_id: None,
            access_key_secret: None,
            rrsa_role_name: None,
            node_selector: Vec::new(),
            toleration: Vec::new(),
            controller_image: None,
            agent_image: None,
            replicas: None,
            allow_existing: false,
            kube: KubeArgs::default(),
        }
    }
}

/// `erdmactl install`'s flags that set agent settings, checked against
/// `erdma_model::settings::AGENT_SETTINGS`: each install flag of the table exists and sets the
/// chart value the table names, and every other install flag is one of the installation's own.
#[cfg(test)]
mod settings_checks {
    use super::*;
    use clap::{Args as _, Command, FromArgMatches};
    use erdma_model::settings::AGENT_SETTINGS;
    use std::collections::BTreeSet;

    /// Install flags that set no agent setting: the installation's own (where, which images,
    /// the controller, credentials, placement).
    const THE_INSTALLS_OWN: &[&str] = &[
        "values",
        "dry-run",
        "output",
        "allow-existing",
        "namespace",
        "release",
        "enable-init-container-inject",
        "enable-webhook",
        "smc-init-image",
        "region",
        "credentials-type",
        "access-key-id",
        "access-key-secret",
        "rrsa-role-name",
        "node-selector",
        "toleration",
        "controller-image",
        "agent-image",
        "replicas",
    ];

    fn command() -> Command {
        Args::augment_args(Command::new("install"))
    }

    fn longs(cmd: &Command) -> BTreeSet<String> {
        cmd.get_arguments()
            .filter_map(|a| a.get_long())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_install_flags_of_agent_settings_are_the_tables() {
        let install = longs(&command());
        let kube = longs(&KubeArgs::augment_args(Command::new("kube")));
        let table: BTreeSet<String> = AGENT_SETTINGS
            .iter()
            .filter_map(|s| s.install)
            .map(str::to_string)
            .collect();
        let absent: Vec<_> = table.difference(&install).collect();
        assert!(
            absent.is_empty(),
            "in AGENT_SETTINGS, not in install: {absent:?}"
        );
        let unknown: Vec<_> = install
            .iter()
            .filter(|l| {
                !table.contains(*l) && !kube.contains(*l) && !THE_INSTALLS_OWN.contains(&l.as_str())
            })
            .collect();
        assert!(
            unknown.is_empty(),
            "install flags neither in AGENT_SETTINGS nor the installation's own: {unknown:?}"
        );
    }

    #[test]
    fn each_install_flag_sets_the_chart_value_of_its_setting() {
        for s in AGENT_SETTINGS {
            let Some(flag) = s.install else { continue };
            let path = s.chart_path().expect("an install flag sets a chart value");
            let default = s.chart_default().unwrap_or_default();
            let cmd = command();
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("--{flag}"));
            let is_bool = arg
                .get_value_names()
                .is_some_and(|n| n.iter().any(|n| n.as_str() == "BOOL"));
            let given = if is_bool {
                (default != "true").to_string()
            } else if default.parse::<u64>().is_ok() {
                "9000".to_string()
            } else {
                "probe-value".to_string()
            };
            let m = command()
                .try_get_matches_from(["install", &format!("--{flag}={given}")])
                .unwrap_or_else(|e| panic!("--{flag}={given}: {e}"));
            let args = Args::from_arg_matches(&m).unwrap();
            let rendered = serde_json::to_value(values(&args).unwrap()).unwrap();
            let got = path
                .split('.')
                .try_fold(&rendered, |v, k| v.get(k))
                .unwrap_or_else(|| panic!("--{flag}: rendered values have no {path}"));
            let got = match got {
                serde_json::Value::String(x) => x.clone(),
                serde_json::Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().unwrap_or_default().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            assert_eq!(got, given, "--{flag}={given} sets {path}");
        }
    }
}
