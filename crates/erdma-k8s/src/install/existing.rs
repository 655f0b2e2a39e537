//! Another installation that `install` must not run next to: a second device plugin for
//! `aliyun/erdma` on a node makes the kubelet flap the resource (it keeps the plugin that
//! registered last and marks the resource unhealthy whenever either stream ends), and a second
//! controller manages the same ERdmaDevices and ERIs.
//!
//! [`decide_existing`] is the decision, pure over the objects [`list_existing`] reads (so it is
//! tested without a cluster, and the chart's `lookup` can mirror it rule by rule):
//!
//! - **The ACK console add-on** ("ACK eRDMA Controller"): every DaemonSet and Deployment in
//!   namespace [`ACK_ADDON_NAMESPACE`], and every Helm release recorded there (Secrets of type
//!   `helm.sh/release.v1` labelled `owner=helm`; the release is the `name` label; a release whose
//!   records are all `superseded`/`uninstalled` is gone). Exempt only when erdma itself was
//!   installed there: the workload is the one this install renders (same namespace, name and
//!   release) and runs erdma's image, and a Helm release of a release that has such a workload.
//! - **Another agent or controller**, in any other namespace: a DaemonSet whose pod template is
//!   labelled `app.kubernetes.io/name: alibabacloud-erdma-controller` + `tier: agent` (the
//!   original chart's and erdma's), or runs an image whose repository ends in `/erdma/agent` (the
//!   original's) or `/erdma-agent` (erdma's), or runs the original's command
//!   `/usr/local/bin/agent` with one of its flags (`--prefer-driver`, `--allocate-all-devices`,
//!   `--exposed-local-eris`); a Deployment labelled `tier: controller` with that name label, or
//!   running an image ending in `/erdma/controller` or `/erdma-controller`. Exempt: the object
//!   this install renders itself (the same namespace, the same name — `alibabacloud-erdma-agent`,
//!   `alibabacloud-erdma-controller` — and the same release), which is the supported in-place
//!   upgrade of the original's release and a re-run of erdma's own install. The release of an
//!   object is its Helm annotation `meta.helm.sh/release-name`, else its label
//!   `app.kubernetes.io/instance` (object, then pod template).
//! - **terway's eRDMA ENI mode**: ConfigMap `kube-system/eni-config`, key `eni_conf` (JSON) with
//!   `"enable_erdma": true`; terway then registers `aliyun/erdma` itself. A value that is not
//!   JSON, or an `enable_erdma` that is not a boolean, is a warning, not a conflict.
//!
//! Helm's release payloads are not decoded (gzip inside base64): a release elsewhere is found
//! through its workloads, which carry its name, and the chart's templates could not decode them.

use crate::Error;
use crate::install::{AGENT_NAME, APP_NAME, CONTROLLER_NAME};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Namespace of the ACK console add-on "ACK eRDMA Controller".
pub const ACK_ADDON_NAMESPACE: &str = "ack-erdma-controller";
/// Namespace of terway's ConfigMap.
pub const TERWAY_NAMESPACE: &str = "kube-system";
/// terway's ConfigMap.
pub const TERWAY_CONFIGMAP: &str = "eni-config";
/// The key of [`TERWAY_CONFIGMAP`] holding terway's JSON configuration.
pub const TERWAY_ENI_CONF: &str = "eni_conf";
/// The `type` of the Secrets in which Helm 3 records a release.
pub const HELM_RELEASE_SECRET_TYPE: &str = "helm.sh/release.v1";
/// The label selector of Helm's release Secrets.
pub const HELM_RELEASE_SELECTOR: &str = "owner=helm";

const HELM_RELEASE_ANNOTATION: &str = "meta.helm.sh/release-name";
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const ORIGINAL_AGENT_COMMAND: &str = "/usr/local/bin/agent";
const ORIGINAL_AGENT_FLAGS: &[&str] = &[
    "--prefer-driver",
    "--allocate-all-devices",
    "--exposed-local-eris",
];
const ADDON_SURVIVES: &str = "the CRD erdmadevices.network.alibabacloud.com, the ERdmaDevice objects and the ERIs in ECS survive and erdma adopts them";

/// The objects [`decide_existing`] looks at, as [`list_existing`] reads them.
#[derive(Debug, Clone, Default)]
pub struct ExistingObjects {
    /// Every DaemonSet, in every namespace.
    pub daemon_sets: Vec<DaemonSet>,
    /// Every Deployment, in every namespace.
    pub deployments: Vec<Deployment>,
    /// Helm's release Secrets ([`HELM_RELEASE_SELECTOR`]) in [`ACK_ADDON_NAMESPACE`].
    pub addon_helm_releases: Vec<Secret>,
    /// ConfigMap `kube-system/eni-config`, when it exists.
    pub eni_config: Option<ConfigMap>,
}

/// One other installation found, with where it is and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// `DaemonSet`, `Deployment`, `HelmRelease` or `ConfigMap`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name (a Helm release's name for `HelmRelease`).
    pub name: String,
    /// The field that makes it a conflict, when one does (`eni_conf.enable_erdma=true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What it is.
    pub what: String,
    /// How to resolve it.
    pub fix: String,
}

impl Conflict {
    /// Where it is, as a message names it: `DaemonSet ns/name`, `Helm release ns/name`,
    /// `ConfigMap kube-system/eni-config eni_conf.enable_erdma=true`.
    pub fn location(&self) -> String {
        let kind = if self.kind == "HelmRelease" {
            "Helm release"
        } else {
            &self.kind
        };
        let mut s = format!("{kind} {}/{}", self.namespace, self.name);
        if let Some(f) = &self.field {
            s.push(' ');
            s.push_str(f);
        }
        s
    }
}

/// What [`decide_existing`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Existing {
    /// Other installations: `install` refuses while any is left (unless told otherwise).
    pub conflicts: Vec<Conflict>,
    /// Things that could not be decided (a malformed `eni_conf`), each naming the object and the
    /// check to make by hand.
    pub warnings: Vec<String>,
}

/// The workload kinds the decision reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    DaemonSet,
    Deployment,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::DaemonSet => "DaemonSet",
            Kind::Deployment => "Deployment",
        }
    }

    fn kubectl(self) -> &'static str {
        match self {
            Kind::DaemonSet => "daemonset",
            Kind::Deployment => "deployment",
        }
    }

    /// The name `install` gives this kind's erdma workload.
    fn rendered_name(self) -> &'static str {
        match self {
            Kind::DaemonSet => AGENT_NAME,
            Kind::Deployment => CONTROLLER_NAME,
        }
    }

    fn role(self) -> &'static str {
        match self {
            Kind::DaemonSet => "agent",
            Kind::Deployment => "controller",
        }
    }
}

/// A DaemonSet or Deployment, as the decision sees it.
struct Workload<'a> {
    kind: Kind,
    meta: &'a ObjectMeta,
    template: Option<&'a PodTemplateSpec>,
}

fn get<'a>(m: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    m?.get(key).map(String::as_str).filter(|s| !s.is_empty())
}

/// `image` without its tag and digest.
fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(r, _)| r);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

fn ends_with_path(repo: &str, suffix: &str) -> bool {
    repo == suffix || repo.ends_with(&format!("/{suffix}"))
}

impl Workload<'_> {
    fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    fn template_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.template?.metadata.as_ref()?.labels.as_ref()
    }

    /// The Helm release that installed it, or the release its labels name.
    fn release(&self) -> Option<&str> {
        get(self.meta.annotations.as_ref(), HELM_RELEASE_ANNOTATION)
            .or_else(|| get(self.meta.labels.as_ref(), INSTANCE_LABEL))
            .or_else(|| get(self.template_labels(), INSTANCE_LABEL))
    }

    fn helm_managed(&self) -> bool {
        get(self.meta.annotations.as_ref(), HELM_RELEASE_ANNOTATION).is_some()
            || get(self.meta.labels.as_ref(), MANAGED_BY_LABEL)
                .is_some_and(|m| m.eq_ignore_ascii_case("helm"))
    }

    fn containers(&self) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
        self.template
            .and_then(|t| t.spec.as_ref())
            .into_iter()
            .flat_map(|s| s.containers.iter())
    }

    fn repositories(&self) -> impl Iterator<Item = &str> {
        self.containers()
            .filter_map(|c| c.image.as_deref())
            .map(repository)
    }

    /// Runs erdma's own image for its role.
    fn runs_erdma_image(&self) -> bool {
        let own = format!("erdma-{}", self.kind.role());
        self.repositories().any(|r| ends_with_path(r, &own))
    }

    /// An eRDMA agent (DaemonSet) or controller (Deployment), the original's or erdma's.
    fn is_erdma(&self) -> bool {
        let labels = self.template_labels();
        if get(labels, "app.kubernetes.io/name") == Some(APP_NAME)
            && get(labels, "tier") == Some(self.kind.role())
        {
            return true;
        }
        let original = format!("erdma/{}", self.kind.role());
        if self.runs_erdma_image() || self.repositories().any(|r| ends_with_path(r, &original)) {
            return true;
        }
        self.kind == Kind::DaemonSet
            && self.containers().any(|c| {
                let cmd = c.command.as_deref().unwrap_or_default();
                cmd.first().map(String::as_str) == Some(ORIGINAL_AGENT_COMMAND)
                    && cmd[1..]
                        .iter()
                        .chain(c.args.iter().flatten())
                        .any(|a| ORIGINAL_AGENT_FLAGS.iter().any(|f| a.starts_with(f)))
            })
    }

    /// The object the install being applied renders (and so replaces in place).
    fn is_target(&self, namespace: &str, release: &str) -> bool {
        self.namespace() == namespace
            && self.name() == self.kind.rendered_name()
            && self.release() == Some(release)
    }

    fn delete_command(&self) -> String {
        format!(
            "kubectl -n {} delete {} {}",
            self.namespace(),
            self.kind.kubectl(),
            self.name()
        )
    }
}

fn workloads(o: &ExistingObjects) -> Vec<Workload<'_>> {
    let ds = o.daemon_sets.iter().map(|d| Workload {
        kind: Kind::DaemonSet,
        meta: &d.metadata,
        template: d.spec.as_ref().map(|s| &s.template),
    });
    let dep = o.deployments.iter().map(|d| Workload {
        kind: Kind::Deployment,
        meta: &d.metadata,
        template: d.spec.as_ref().map(|s| &s.template),
    });
    ds.chain(dep).collect()
}

/// The releases Helm records in `secrets` that are installed (a record not `superseded` or
/// `uninstalled`), by name.
fn helm_releases(secrets: &[Secret]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for s in secrets {
        if s.type_
            .as_deref()
            .is_some_and(|t| t != HELM_RELEASE_SECRET_TYPE)
        {
            continue;
        }
        let labels = s.metadata.labels.as_ref();
        if get(labels, "owner") != Some("helm") {
            continue;
        }
        let name = get(labels, "name").map(str::to_string).or_else(|| {
            let n = s.metadata.name.as_deref()?;
            let rest = n.strip_prefix("sh.helm.release.v1.")?;
            Some(rest.rsplit_once(".v").map_or(rest, |(r, _)| r).to_string())
        });
        let Some(name) = name else { continue };
        if !matches!(get(labels, "status"), Some("superseded" | "uninstalled")) {
            out.insert(name);
        }
    }
    out
}

fn addon_fix(release: &str) -> String {
    format!(
        "uninstall the ACK eRDMA Controller component in the ACK console (Operations > Add-ons), or `helm -n {ACK_ADDON_NAMESPACE} uninstall {release}`; {ADDON_SURVIVES}; then install erdma again"
    )
}

fn other_release_fix(w: &Workload<'_>) -> String {
    let ns = w.namespace();
    let uninstall = match w.release() {
        Some(r) if w.helm_managed() => format!("uninstall it (`helm -n {ns} uninstall {r}`)"),
        Some(r) if get(w.meta.labels.as_ref(), MANAGED_BY_LABEL) == Some("erdmactl") => {
            format!("uninstall it (`erdmactl uninstall -n {ns} --release {r}`)")
        }
        _ => format!("delete it (`{}`)", w.delete_command()),
    };
    match w.release() {
        Some(r) if w.name() == w.kind.rendered_name() => format!(
            "{uninstall}, or upgrade it in place instead: install erdma with its release name and namespace (`erdmactl install -n {ns} --release {r}`, or `helm upgrade {r} deploy/helm -n {ns}`)"
        ),
        _ => uninstall,
    }
}

fn describe(w: &Workload<'_>) -> String {
    let whose = if w.runs_erdma_image() {
        "erdma's"
    } else {
        "the original alibabacloud-erdma-controller's"
    };
    let release = match w.release() {
        Some(r) => format!("release {r} in namespace {}", w.namespace()),
        None => format!("namespace {}, no release label", w.namespace()),
    };
    let why = match w.kind {
        Kind::DaemonSet => {
            "a second device plugin for aliyun/erdma on the same nodes makes the kubelet flap the resource"
        }
        Kind::Deployment => "a second controller manages the same ERdmaDevices and ERIs",
    };
    format!(
        "another eRDMA installation: {whose} {} ({release}); {why}",
        w.kind.role()
    )
}

fn terway(o: &ExistingObjects, found: &mut Existing) {
    let Some(cm) = &o.eni_config else { return };
    let Some(raw) = cm.data.as_ref().and_then(|d| d.get(TERWAY_ENI_CONF)) else {
        return;
    };
    let at = format!("ConfigMap {TERWAY_NAMESPACE}/{TERWAY_CONFIGMAP} {TERWAY_ENI_CONF}");
    let conf: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            found.warnings.push(format!(
                "{at} is not JSON ({e}): cannot tell whether terway serves aliyun/erdma; check that it has no \"enable_erdma\": true (`kubectl -n {TERWAY_NAMESPACE} get configmap {TERWAY_CONFIGMAP} -o yaml`)"
            ));
            return;
        }
    };
    let Some(conf) = conf.as_object() else {
        found.warnings.push(format!(
            "{at} is JSON but not an object: cannot tell whether terway serves aliyun/erdma; check that it has no \"enable_erdma\": true"
        ));
        return;
    };
    match conf.get("enable_erdma") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            let mut terway: Vec<&str> = o
                .daemon_sets
                .iter()
                .filter(|d| d.metadata.namespace.as_deref() == Some(TERWAY_NAMESPACE))
                .filter_map(|d| d.metadata.name.as_deref())
                .filter(|n| n.starts_with("terway"))
                .collect();
            if terway.is_empty() {
                terway.push("terway-eniip");
            }
            let restart = terway
                .iter()
                .map(|n| format!("`kubectl -n {TERWAY_NAMESPACE} rollout restart daemonset {n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            found.conflicts.push(Conflict {
                kind: "ConfigMap".into(),
                namespace: TERWAY_NAMESPACE.into(),
                name: TERWAY_CONFIGMAP.into(),
                field: Some(format!("{TERWAY_ENI_CONF}.enable_erdma=true")),
                what: "terway's eRDMA ENI mode is on: terway's own device plugin serves aliyun/erdma on its nodes".into(),
                fix: format!(
                    "set \"enable_erdma\": false in {TERWAY_ENI_CONF} of ConfigMap {TERWAY_NAMESPACE}/{TERWAY_CONFIGMAP} and restart terway ({restart})"
                ),
            });
        }
        Some(other) => found.warnings.push(format!(
            "{at}: enable_erdma is {other}, not a boolean: terway may or may not serve aliyun/erdma; set it to true or false"
        )),
    }
}

/// Decides which of `objects` are another installation next to the install of `release` into
/// `namespace` (the rules are in the module documentation). Pure: no I/O.
pub fn decide_existing(namespace: &str, release: &str, objects: &ExistingObjects) -> Existing {
    let mut found = Existing::default();
    let all = workloads(objects);
    // Releases erdma itself installed in the add-on's namespace (exempt when re-run).
    let erdma_in_addon: BTreeSet<&str> = all
        .iter()
        .filter(|w| w.namespace() == ACK_ADDON_NAMESPACE)
        .filter(|w| w.is_target(namespace, release) && w.runs_erdma_image())
        .filter_map(|w| w.release())
        .collect();
    let addon_releases = helm_releases(&objects.addon_helm_releases);
    for w in &all {
        if w.namespace() == ACK_ADDON_NAMESPACE {
            if w.is_target(namespace, release) && w.runs_erdma_image() {
                continue;
            }
            let helm = w
                .release()
                .filter(|r| w.helm_managed() || addon_releases.contains(*r))
                .or_else(|| addon_releases.iter().next().map(String::as_str))
                .unwrap_or(ACK_ADDON_NAMESPACE);
            found.conflicts.push(Conflict {
                kind: w.kind.as_str().into(),
                namespace: w.namespace().into(),
                name: w.name().into(),
                field: None,
                what: format!(
                    "the ACK console add-on \"ACK eRDMA Controller\" (its {})",
                    if w.is_erdma() {
                        w.kind.role()
                    } else {
                        "workload"
                    }
                ),
                fix: addon_fix(helm),
            });
            continue;
        }
        if !w.is_erdma() || w.is_target(namespace, release) {
            continue;
        }
        found.conflicts.push(Conflict {
            kind: w.kind.as_str().into(),
            namespace: w.namespace().into(),
            name: w.name().into(),
            field: None,
            what: describe(w),
            fix: other_release_fix(w),
        });
    }
    for r in &addon_releases {
        if namespace == ACK_ADDON_NAMESPACE && r == release && erdma_in_addon.contains(r.as_str()) {
            continue;
        }
        found.conflicts.push(Conflict {
            kind: "HelmRelease".into(),
            namespace: ACK_ADDON_NAMESPACE.into(),
            name: r.clone(),
            field: None,
            what: "the ACK console add-on \"ACK eRDMA Controller\" (its Helm release)".into(),
            fix: addon_fix(r),
        });
    }
    terway(objects, &mut found);
    found
}

fn kube_err(what: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        what: format!("{what} (looking for another eRDMA installation)"),
        source,
    }
}

/// Reads what [`decide_existing`] needs: DaemonSets and Deployments of every namespace, Helm's
/// release Secrets in [`ACK_ADDON_NAMESPACE`], and ConfigMap `kube-system/eni-config`.
pub async fn list_existing(client: &kube::Client) -> Result<ExistingObjects, Error> {
    use kube::api::{Api, ListParams};
    let all = ListParams::default();
    let (daemon_sets, deployments, secrets, eni_config) = futures::try_join!(
        async {
            Api::<DaemonSet>::all(client.clone())
                .list(&all)
                .await
                .map_err(kube_err("list DaemonSets in every namespace"))
        },
        async {
            Api::<Deployment>::all(client.clone())
                .list(&all)
                .await
                .map_err(kube_err("list Deployments in every namespace"))
        },
        async {
            Api::<Secret>::namespaced(client.clone(), ACK_ADDON_NAMESPACE)
                .list(&ListParams::default().labels(HELM_RELEASE_SELECTOR))
                .await
                .map_err(kube_err(
                    "list the Helm release Secrets in namespace ack-erdma-controller",
                ))
        },
        async {
            Api::<ConfigMap>::namespaced(client.clone(), TERWAY_NAMESPACE)
                .get_opt(TERWAY_CONFIGMAP)
                .await
                .map_err(kube_err("get ConfigMap kube-system/eni-config"))
        },
    )?;
    Ok(ExistingObjects {
        daemon_sets: daemon_sets.items,
        deployments: deployments.items,
        addon_helm_releases: secrets.items,
        eni_config,
    })
}

/// [`list_existing`], then [`decide_existing`] for the install of `release` into `namespace`.
pub async fn find_existing(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) -> Result<Existing, Error> {
    Ok(decide_existing(
        namespace,
        release,
        &list_existing(client).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NS: &str = "kube-system";
    const REL: &str = "alibaba-erdma-controller";
    const GO_AGENT: &str = "registry-vpc.cn-beijing.aliyuncs.com/erdma/agent:v0.2.1";
    const GO_CONTROLLER: &str = "registry.aliyuncs.com/erdma/controller:latest";

    /// The original chart's agent DaemonSet of `release` in `ns` (its labels, image and command).
    fn original_agent(ns: &str, name: &str, release: &str) -> DaemonSet {
        workload_json(ns, name, release, "agent", GO_AGENT, true)
    }

    fn workload_json<K: serde::de::DeserializeOwned>(
        ns: &str,
        name: &str,
        release: &str,
        tier: &str,
        image: &str,
        helm: bool,
    ) -> K {
        let labels = json!({
            "app.kubernetes.io/name": "alibabacloud-erdma-controller",
            "app.kubernetes.io/instance": release,
            "tier": tier,
        });
        let mut meta_labels = labels.clone();
        let mut annotations = json!({});
        if helm {
            meta_labels["app.kubernetes.io/managed-by"] = json!("Helm");
            annotations = json!({
                "meta.helm.sh/release-name": release,
                "meta.helm.sh/release-namespace": ns,
            });
        } else {
            meta_labels["app.kubernetes.io/managed-by"] = json!("erdmactl");
        }
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": meta_labels, "annotations": annotations},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{
                        "name": "alibabacloud-erdma-controller",
                        "image": image,
                        "command": ["/usr/local/bin/agent"],
                        "args": ["--prefer-driver=", "--allocate-all-devices=false"],
                    }]},
                },
            },
        }))
        .expect("a DaemonSet or Deployment")
    }

    /// erdma's own agent DaemonSet (`erdmactl install`) of `release` in `ns`.
    fn erdma_agent(ns: &str, release: &str) -> DaemonSet {
        workload_json(
            ns,
            AGENT_NAME,
            release,
            "agent",
            "ghcr.io/erdma/erdma-agent:0.1.0",
            false,
        )
    }

    /// A DaemonSet with no eRDMA labels running `image` with `command`.
    fn plain_ds(ns: &str, name: &str, image: &str, command: &[&str]) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": image, "command": command}]},
                },
            },
        }))
        .unwrap()
    }

    fn helm_secret(ns: &str, release: &str, revision: u32, status: &str) -> Secret {
        serde_json::from_value(json!({
            "metadata": {
                "namespace": ns,
                "name": format!("sh.helm.release.v1.{release}.v{revision}"),
                "labels": {"owner": "helm", "name": release, "status": status, "version": revision.to_string()},
            },
            "type": "helm.sh/release.v1",
            "data": {"release": "SDRzSUFBQUFBQUFBLw=="},
        }))
        .unwrap()
    }

    fn eni_config(eni_conf: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("kube-system".into()),
                name: Some("eni-config".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("eni_conf".to_string(), eni_conf.into())])),
            ..Default::default()
        }
    }

    fn locations(e: &Existing) -> Vec<String> {
        e.conflicts.iter().map(Conflict::location).collect()
    }

    /// The console add-on's objects: DaemonSet and Deployment under names of its own, and its
    /// Helm release (two revisions).
    fn console_addon() -> ExistingObjects {
        ExistingObjects {
            daemon_sets: vec![original_agent(
                ACK_ADDON_NAMESPACE,
                "ack-erdma-agent",
                "ack-erdma-controller",
            )],
            deployments: vec![workload_json(
                ACK_ADDON_NAMESPACE,
                "ack-erdma-controller",
                "ack-erdma-controller",
                "controller",
                GO_CONTROLLER,
                true,
            )],
            addon_helm_releases: vec![
                helm_secret(ACK_ADDON_NAMESPACE, "ack-erdma-controller", 1, "superseded"),
                helm_secret(ACK_ADDON_NAMESPACE, "ack-erdma-controller", 2, "deployed"),
            ],
            eni_config: None,
        }
    }

    #[test]
    fn the_console_addon_is_a_conflict_with_its_fix() {
        let e = decide_existing(NS, REL, &console_addon());
        assert_eq!(
            locations(&e),
            [
                "DaemonSet ack-erdma-controller/ack-erdma-agent",
                "Deployment ack-erdma-controller/ack-erdma-controller",
                "Helm release ack-erdma-controller/ack-erdma-controller",
            ]
        );
        for c in &e.conflicts {
            assert!(c.what.contains("ACK console add-on"), "{c:?}");
            assert!(
                c.fix.contains("ACK console (Operations > Add-ons)")
                    && c.fix
                        .contains("`helm -n ack-erdma-controller uninstall ack-erdma-controller`")
                    && c.fix.contains("erdmadevices.network.alibabacloud.com")
                    && c.fix.contains("ERIs in ECS survive"),
                "{c:?}"
            );
        }
        assert!(e.warnings.is_empty());
        // Even installing into the add-on's namespace under its release name is refused: the
        // add-on manager owns those objects.
        let e = decide_existing(
            ACK_ADDON_NAMESPACE,
            "ack-erdma-controller",
            &console_addon(),
        );
        assert_eq!(e.conflicts.len(), 3, "{e:?}");
    }

    #[test]
    fn anything_in_the_addon_namespace_counts_and_a_gone_release_does_not() {
        let objects = ExistingObjects {
            daemon_sets: vec![plain_ds(ACK_ADDON_NAMESPACE, "x", "busybox", &["sleep"])],
            addon_helm_releases: vec![
                helm_secret(ACK_ADDON_NAMESPACE, "old", 1, "superseded"),
                helm_secret(ACK_ADDON_NAMESPACE, "old", 2, "uninstalled"),
            ],
            ..Default::default()
        };
        let e = decide_existing(NS, REL, &objects);
        assert_eq!(locations(&e), ["DaemonSet ack-erdma-controller/x"]);
        assert!(e.conflicts[0].what.contains("its workload"), "{e:?}");
        // No release to name: the add-on's default.
        assert!(
            e.conflicts[0]
                .fix
                .contains("helm -n ack-erdma-controller uninstall ack-erdma-controller"),
            "{e:?}"
        );
    }

    #[test]
    fn erdma_installed_into_the_addon_namespace_may_run_again() {
        let objects = ExistingObjects {
            daemon_sets: vec![erdma_agent(ACK_ADDON_NAMESPACE, "mine")],
            addon_helm_releases: vec![helm_secret(ACK_ADDON_NAMESPACE, "mine", 1, "deployed")],
            ..Default::default()
        };
        assert_eq!(
            decide_existing(ACK_ADDON_NAMESPACE, "mine", &objects),
            Existing::default()
        );
        // Another release there is still a conflict.
        let e = decide_existing(ACK_ADDON_NAMESPACE, "other", &objects);
        assert_eq!(
            locations(&e),
            [
                "DaemonSet ack-erdma-controller/alibabacloud-erdma-agent",
                "Helm release ack-erdma-controller/mine"
            ]
        );
    }

    #[test]
    fn the_original_in_kube_system_under_the_same_release_is_the_upgrade_path() {
        let objects = ExistingObjects {
            daemon_sets: vec![original_agent(NS, AGENT_NAME, REL)],
            deployments: vec![workload_json(
                NS,
                CONTROLLER_NAME,
                REL,
                "controller",
                GO_CONTROLLER,
                true,
            )],
            ..Default::default()
        };
        assert_eq!(decide_existing(NS, REL, &objects), Existing::default());
        // Re-running erdma's own install, too.
        let objects = ExistingObjects {
            daemon_sets: vec![erdma_agent(NS, REL)],
            ..Default::default()
        };
        assert_eq!(decide_existing(NS, REL, &objects), Existing::default());
    }

    #[test]
    fn the_original_in_another_namespace_is_a_conflict() {
        let objects = ExistingObjects {
            daemon_sets: vec![original_agent("erdma-system", AGENT_NAME, "erdma")],
            ..Default::default()
        };
        let e = decide_existing(NS, REL, &objects);
        assert_eq!(
            locations(&e),
            ["DaemonSet erdma-system/alibabacloud-erdma-agent"]
        );
        let c = &e.conflicts[0];
        assert!(
            c.what
                .contains("the original alibabacloud-erdma-controller's agent")
                && c.what.contains("release erdma in namespace erdma-system")
                && c.what.contains("aliyun/erdma"),
            "{c:?}"
        );
        assert!(
            c.fix.contains("`helm -n erdma-system uninstall erdma`")
                && c.fix
                    .contains("`erdmactl install -n erdma-system --release erdma`"),
            "{c:?}"
        );
    }

    #[test]
    fn the_original_under_another_name_or_without_labels_is_found_by_image_or_command() {
        let mut renamed = plain_ds(
            "default",
            "rdma-agent",
            "my.registry/erdma/agent@sha256:ab",
            &[],
        );
        // By image repository (tag or digest stripped).
        let e = decide_existing(
            NS,
            REL,
            &ExistingObjects {
                daemon_sets: vec![renamed.clone()],
                ..Default::default()
            },
        );
        assert_eq!(locations(&e), ["DaemonSet default/rdma-agent"]);
        // No release: only deleting it helps (install would not replace it).
        assert_eq!(
            e.conflicts[0].fix,
            "delete it (`kubectl -n default delete daemonset rdma-agent`)"
        );
        // By command and flags.
        renamed = plain_ds(
            "default",
            "rdma-agent",
            "mirror.local/agent:1",
            &["/usr/local/bin/agent", "--prefer-driver=compat"],
        );
        let e = decide_existing(
            NS,
            REL,
            &ExistingObjects {
                daemon_sets: vec![renamed],
                ..Default::default()
            },
        );
        assert_eq!(locations(&e), ["DaemonSet default/rdma-agent"]);
    }

    #[test]
    fn erdmas_own_other_release_is_a_conflict() {
        // Same namespace, another release: its RBAC, ConfigMap and Secret would stay.
        let objects = ExistingObjects {
            daemon_sets: vec![erdma_agent(NS, "erdma")],
            ..Default::default()
        };
        let e = decide_existing(NS, REL, &objects);
        assert_eq!(
            locations(&e),
            ["DaemonSet kube-system/alibabacloud-erdma-agent"]
        );
        let c = &e.conflicts[0];
        assert!(c.what.contains("erdma's agent (release erdma"), "{c:?}");
        assert!(
            c.fix
                .contains("`erdmactl uninstall -n kube-system --release erdma`")
                && c.fix
                    .contains("`erdmactl install -n kube-system --release erdma`"),
            "{c:?}"
        );
        // Another namespace, same release name.
        let objects = ExistingObjects {
            daemon_sets: vec![erdma_agent("erdma", REL)],
            deployments: vec![workload_json(
                "erdma",
                CONTROLLER_NAME,
                REL,
                "controller",
                "registry.example/erdma/erdma-controller:0.1.0",
                false,
            )],
            ..Default::default()
        };
        let e = decide_existing(NS, REL, &objects);
        assert_eq!(
            locations(&e),
            [
                "DaemonSet erdma/alibabacloud-erdma-agent",
                "Deployment erdma/alibabacloud-erdma-controller"
            ]
        );
        assert!(e.conflicts[1].what.contains("erdma's controller"), "{e:?}");
        assert!(e.conflicts[1].what.contains("ERdmaDevices"), "{e:?}");
    }

    #[test]
    fn terway_with_erdma_on_is_a_conflict_off_is_not_and_malformed_warns() {
        let with = |conf: &str| {
            decide_existing(
                NS,
                REL,
                &ExistingObjects {
                    daemon_sets: vec![plain_ds(NS, "terway-eniip", "terway:v1", &[])],
                    eni_config: Some(eni_config(conf)),
                    ..Default::default()
                },
            )
        };
        let e = with(r#"{"version": "1", "enable_erdma": true, "max_pool_size": 5}"#);
        assert_eq!(
            locations(&e),
            ["ConfigMap kube-system/eni-config eni_conf.enable_erdma=true"]
        );
        assert!(
            e.conflicts[0].fix.contains("\"enable_erdma\": false")
                && e.conflicts[0]
                    .fix
                    .contains("`kubectl -n kube-system rollout restart daemonset terway-eniip`"),
            "{e:?}"
        );
        for off in [
            r#"{"enable_erdma": false}"#,
            r#"{"version": "1"}"#,
            r#"{"enable_erdma": null}"#,
        ] {
            assert_eq!(with(off), Existing::default(), "{off}");
        }
        for (bad, says) in [
            (r#"{"enable_erdma": tru"#, "is not JSON"),
            (r#"["enable_erdma"]"#, "not an object"),
            (r#"{"enable_erdma": "true"}"#, "not a boolean"),
        ] {
            let e = with(bad);
            assert!(e.conflicts.is_empty(), "{bad}: {e:?}");
            assert_eq!(e.warnings.len(), 1, "{bad}: {e:?}");
            assert!(
                e.warnings[0].contains("ConfigMap kube-system/eni-config eni_conf")
                    && e.warnings[0].contains(says),
                "{bad}: {e:?}"
            );
        }
        // A ConfigMap without eni_conf: terway's defaults (no eRDMA).
        let mut cm = eni_config("");
        cm.data = Some(BTreeMap::new());
        let e = decide_existing(
            NS,
            REL,
            &ExistingObjects {
                eni_config: Some(cm),
                ..Default::default()
            },
        );
        assert_eq!(e, Existing::default());
    }

    #[test]
    fn nothing_else_installed_is_ok() {
        assert_eq!(
            decide_existing(NS, REL, &ExistingObjects::default()),
            Existing::default()
        );
        // Unrelated DaemonSets, one even running a binary called agent (without the original's
        // flags), and Helm releases elsewhere are not eRDMA installations.
        let objects = ExistingObjects {
            daemon_sets: vec![
                plain_ds(NS, "kube-proxy", "registry.k8s.io/kube-proxy:v1.34.0", &[]),
                plain_ds(
                    "monitoring",
                    "node-agent",
                    "vendor/agent:1",
                    &["/usr/local/bin/agent", "--verbose"],
                ),
                plain_ds(NS, "csi-plugin", "registry.example/acs/csi-plugin:v1", &[]),
            ],
            ..Default::default()
        };
        assert_eq!(decide_existing(NS, REL, &objects), Existing::default());
    }

    #[test]
    fn the_json_shape_names_kind_namespace_name_what_and_fix() {
        let e = decide_existing(
            NS,
            REL,
            &ExistingObjects {
                eni_config: Some(eni_config(r#"{"enable_erdma": true}"#)),
                ..console_addon()
            },
        );
        let v = serde_json::to_value(&e).unwrap();
        let first = &v["conflicts"][0];
        assert_eq!(first["kind"], "DaemonSet");
        assert_eq!(first["namespace"], "ack-erdma-controller");
        assert_eq!(first["name"], "ack-erdma-agent");
        assert!(first.get("field").is_none());
        assert!(first["what"].is_string() && first["fix"].is_string());
        assert_eq!(v["conflicts"][2]["kind"], "HelmRelease");
        assert_eq!(v["conflicts"][3]["field"], "eni_conf.enable_erdma=true");
        assert_eq!(v["warnings"], json!([]));
    }
}
