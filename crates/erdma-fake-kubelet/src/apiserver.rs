//! The lab's API server (`erdma-fake-kubelet apiserver`): erdma-k8s's in-memory fake, served
//! over HTTP or HTTPS, set up as a cluster is after `helm install`:
//!
//! - the Node and the DeviceClass the install renders with `dra.enabled`;
//! - every object of the `--objects` files (a rendered chart file `{"objects": [...]}`, a
//!   `List`, a JSON array or YAML documents; `helm test` hooks left out, as `helm install` leaves
//!   them), with what the API server does on a write: a
//!   namespaced object without a namespace goes to `default`, a cluster-scoped one loses its
//!   namespace, a Secret's `stringData` is merged into `data`;
//! - what a cluster's control plane makes by itself: the namespaces `default`, `kube-system`,
//!   `kube-public`, `kube-node-lease` and every namespace an object names (each labelled
//!   `kubernetes.io/metadata.name`, as the API server labels every namespace), a `default`
//!   ServiceAccount in each (the service account controller), and with TLS the `kube-root-ca.crt`
//!   ConfigMap in each (the root CA publisher), holding the CA as `ca.crt`;
//! - with TLS, a CA made at start and a serving certificate for the listen IP, `127.0.0.1`,
//!   `kubernetes`, `kubernetes.default`, `kubernetes.default.svc`,
//!   `kubernetes.default.svc.cluster.local` and the `--tls-san` names; the kubeconfig trusts the
//!   CA;
//! - with a service-account directory, one bearer token per ServiceAccount, written to
//!   `DIR/<namespace>/<name>/token` (and the `default/default` one to `DIR/token`) with the CA
//!   as `DIR/ca.crt`: the API server authenticates a request carrying one as
//!   `system:serviceaccount:<namespace>:<name>` (the lab kubelet projects them into pods, as the
//!   kubelet projects the token it gets from the TokenRequest API). Requests without a token
//!   (the kubeconfig's, the lab kubelet's) are unrestricted; with `enforce_rbac` the tokens'
//!   requests are authorized against the loaded RBAC objects.
//!
//! - the feature gates of a release (`--emulated-version`, default the newest modelled) with
//!   `--feature-gates` on top: with `DRADeviceTaints`, `DRAConsumableCapacity` or
//!   `DRAExtendedResource` off, ResourceSlices and DeviceClasses written through the API lose
//!   those features' fields, as the API server drops them (the install's DeviceClass is made
//!   without `extendedResourceName`; the `--objects` are stored as given).
//!
//! A ServiceAccount created later through the API gets no token (the fake has no TokenRequest).

use crate::error::{FakeKubeletError, Result};
use crate::podspec::manifest;
use erdma_k8s::fake::{FakeApiServer, FakeTls};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// The label the API server puts on every namespace.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The ConfigMap the root CA publisher puts in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// The cluster domain of the API server's service names.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// How to start the lab's API server.
#[derive(Debug, Clone)]
pub struct ApiServerOptions {
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Where to write the kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Node object to create.
    pub node: String,
    /// Serve HTTPS with a CA made at start.
    pub tls: bool,
    /// More names (DNS names or IPs) for the serving certificate.
    pub tls_sans: Vec<String>,
    /// Where to write `ca.crt` and the service accounts' tokens (needs `tls`).
    pub service_account_dir: Option<PathBuf>,
    /// Files of objects to create at start.
    pub objects: Vec<PathBuf>,
    /// Authorize the service accounts' requests against the loaded RBAC objects.
    pub enforce_rbac: bool,
    /// The feature gates that drop `resource.k8s.io` fields on write (`--emulated-version`,
    /// `--feature-gates`; default: the newest release's).
    pub feature_gates: erdma_k8s::fake::FeatureGates,
    /// Where containers' CRI logs are read for `kubectl logs` (the kubelet's pod log root).
    pub pod_log_dir: Option<PathBuf>,
}

/// A service account's token as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The user it authenticates.
    pub user: String,
    /// The token's file.
    pub path: PathBuf,
}

/// A started API server.
#[derive(Debug)]
pub struct Started {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The server (to inspect or change its objects in-process).
    pub api: FakeApiServer,
    /// What was loaded and made, one line each (`loaded ConfigMap kube-system/x from FILE`).
    pub report: Vec<String>,
    /// The tokens written.
    pub tokens: Vec<TokenFile>,
    /// The CA (PEM), with TLS.
    pub ca_pem: Option<String>,
    served: tokio::task::JoinHandle<()>,
}

impl Started {
    /// Waits until the server stopped (after the cancel token given to [`start`] fired).
    pub async fn stopped(self) {
        let _ = self.served.await;
    }
}

fn refused(msg: String) -> FakeKubeletError {
    FakeKubeletError::Refused(msg)
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FakeKubeletError {
    let path = path.to_path_buf();
    move |source| FakeKubeletError::Io { what, path, source }
}

/// The objects of a file's text: a rendered chart file (`{"objects": [...]}`, as
/// `deploy/helm/ci/rendered/*.json`), or what a manifest may hold (a `List`, a JSON array, YAML
/// documents).
pub fn parse_objects(text: &str, origin: &str) -> Result<Vec<Value>> {
    manifest::documents(text, origin)
}

/// `(apiVersion, kind, namespaced)` of the kinds `--objects` loads (those the fake API server
/// serves).
pub const KINDS: &[(&str, &str, bool)] = &[
    ("v1", "Namespace", false),
    ("v1", "Node", false),
    ("v1", "Pod", true),
    ("v1", "Service", true),
    ("v1", "ServiceAccount", true),
    ("v1", "ConfigMap", true),
    ("v1", "Secret", true),
    ("apps/v1", "Deployment", true),
    ("apps/v1", "DaemonSet", true),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", false),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", false),
    ("rbac.authorization.k8s.io/v1", "Role", true),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", true),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        false,
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", false),
    ("coordination.k8s.io/v1", "Lease", true),
    ("policy/v1", "PodDisruptionBudget", true),
    ("resource.k8s.io/v1", "DeviceClass", false),
    ("resource.k8s.io/v1", "ResourceSlice", false),
    ("resource.k8s.io/v1", "ResourceClaim", true),
    ("network.alibabacloud.com/v1", "ERdmaDevice", false),
];

/// `Kind namespace/name` of an object, for messages.
pub fn describe(v: &Value) -> String {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("(no kind)");
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    match v.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// Puts one object into `api` as the API server stores a create (see the module
/// documentation); returns its description.
pub fn put_object(api: &FakeApiServer, object: &Value, origin: &str) -> Result<String> {
    let mut v = object.clone();
    let what = describe(&v);
    let api_version = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some((_, _, namespaced)) = KINDS
        .iter()
        .find(|(a, k, _)| *a == api_version && *k == kind)
        .copied()
    else {
        let known: Vec<String> = KINDS.iter().map(|(a, k, _)| format!("{a} {k}")).collect();
        return Err(refused(format!(
            "{origin}: {what} (apiVersion {api_version:?}, kind {kind:?}) is not a kind the lab API server serves ({}). Fix: drop it from the file, or add the kind to erdma-k8s's fake API server",
            known.join(", ")
        )));
    };
    if v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(refused(format!(
            "{origin}: {what} has no metadata.name. Fix: name the object"
        )));
    }
    let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(refused(format!(
            "{origin}: {what}: metadata is not an object"
        )));
    };
    if namespaced {
        let empty = meta
            .get("namespace")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if empty {
            meta.insert("namespace".into(), Value::String("default".into()));
        }
    } else {
        meta.remove("namespace");
    }
    let what = describe(&v);
    fn typed<K: DeserializeOwned>(v: &Value, origin: &str, what: &str) -> Result<K> {
        serde_json::from_value(v.clone()).map_err(|e| {
            refused(format!(
                "{origin}: {what} does not parse as its kind: {e}. Fix: correct the field the message names"
            ))
        })
    }
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    macro_rules! put {
        ($t:ty) => {
            api.put(&typed::<$t>(&v, origin, &what)?)
        };
    }
    match kind.as_str() {
        "Namespace" => {
            let mut ns: Namespace = typed(&v, origin, &what)?;
            label_namespace(&mut ns);
            api.put(&ns);
        }
        "Node" => put!(Node),
        "Pod" => put!(Pod),
        "Service" => put!(Service),
        "ServiceAccount" => put!(ServiceAccount),
        "ConfigMap" => put!(ConfigMap),
        "Secret" => {
            // The API server merges stringData into data (stringData wins) and drops it.
            let mut s: Secret = typed(&v, origin, &what)?;
            if let Some(strings) = s.string_data.take() {
                let data = s.data.get_or_insert_with(BTreeMap::new);
                for (k, text) in strings {
                    data.insert(k, ByteString(text.into_bytes()));
                }
            }
            api.put(&s);
        }
        "Deployment" => put!(Deployment),
        "DaemonSet" => put!(DaemonSet),
        "ClusterRole" => put!(ClusterRole),
        "ClusterRoleBinding" => put!(ClusterRoleBinding),
        "Role" => put!(Role),
        "RoleBinding" => put!(RoleBinding),
        "MutatingWebhookConfiguration" => put!(MutatingWebhookConfiguration),
        "CustomResourceDefinition" => put!(CustomResourceDefinition),
        "Lease" => put!(Lease),
        "PodDisruptionBudget" => put!(PodDisruptionBudget),
        "DeviceClass" => put!(DeviceClass),
        "ResourceSlice" => put!(ResourceSlice),
        "ResourceClaim" => put!(ResourceClaim),
        _ => put!(erdma_k8s::crd::ERdmaDevice),
    }
    Ok(what)
}

fn label_namespace(ns: &mut Namespace) {
    let name = ns.metadata.name.clone().unwrap_or_default();
    ns.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(NAMESPACE_NAME_LABEL.into(), name);
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        ..Default::default()
    }
}

/// 16 random bytes from the kernel, as hex.
fn random_hex() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(io(
            "read random bytes for a token",
            Path::new("/dev/urandom"),
        ))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The serving certificate's names: the listen IP (unless it is unspecified), `127.0.0.1`, the
/// `kubernetes` service's names, then `extra`; each once.
pub fn serving_names(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    names.push("127.0.0.1".into());
    for n in [
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        format!("kubernetes.default.svc.{CLUSTER_DOMAIN}"),
    ] {
        names.push(n);
    }
    names.extend(extra.iter().cloned());
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

fn write_private(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io("write", &tmp))?;
    f.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("write", path))
}

fn make_dir(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(io("create the directory", path))
}

/// Starts the lab's API server (see the module documentation) and serves it until `cancel`.
/// The kubeconfig is written once the listener is bound, so a reader of the file finds the
/// server answering.
pub async fn start(opts: &ApiServerOptions, cancel: CancellationToken) -> Result<Started> {
    if opts.service_account_dir.is_some() && !opts.tls {
        return Err(refused(
            "--service-account-dir needs --tls: in-cluster clients reach the API server over HTTPS with the CA in ca.crt. Fix: add --tls".into(),
        ));
    }
    if opts.enforce_rbac && opts.service_account_dir.is_none() {
        return Err(refused(
            "--enforce-rbac authorizes the service accounts' tokens: it needs --service-account-dir (and --tls). Fix: add them".into(),
        ));
    }
    let api = FakeApiServer::new();
    api.set_feature_gates(opts.feature_gates.clone());
    let mut report = Vec::new();
    if let Some(dir) = &opts.pod_log_dir {
        api.serve_pod_logs_from(dir);
        report.push(format!("serving container logs from {}", dir.display()));
    }
    api.put(&k8s_openapi::api::core::v1::Node {
        metadata: meta(&opts.node, None),
        ..Default::default()
    });
    let mut values = erdma_k8s::install::Values::default();
    values.dra.enabled = true;
    let mut class = erdma_k8s::install::dra_device_class(&values);
    let g = &opts.feature_gates;
    if !g.dra_extended_resource {
        // As the API server stores the install's create with the gate off.
        class.spec.extended_resource_name = None;
    }
    api.put(&class);
    report.push(format!(
        "made Node {} and the install's DeviceClass{}",
        opts.node,
        if g.dra_extended_resource {
            ""
        } else {
            " (without extendedResourceName: DRAExtendedResource is off)"
        }
    ));
    report.push(format!(
        "feature gates (as 1.{}): DRAConsumableCapacity={}, DRADeviceTaints={}, DRAExtendedResource={}",
        g.release, g.dra_consumable_capacity, g.dra_device_taints, g.dra_extended_resource
    ));

    let mut loaded: Vec<Value> = Vec::new();
    for file in &opts.objects {
        let text = std::fs::read_to_string(file).map_err(io("read the objects file", file))?;
        let origin = file.display().to_string();
        let objects = parse_objects(&text, &origin)?;
        // `helm install` creates no `helm test` hooks (only `helm test` does).
        let (hooks, objects): (Vec<Value>, Vec<Value>) = objects
            .into_iter()
            .partition(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test");
        if !hooks.is_empty() {
            report.push(format!(
                "left out {} helm test hooks of {origin} (helm install does not create them)",
                hooks.len()
            ));
        }
        if objects.is_empty() {
            return Err(refused(format!(
                "{origin} holds no objects. Fix: pass a rendered chart file ({{\"objects\": [...]}}) or Kubernetes manifests"
            )));
        }
        let mut names = Vec::new();
        for o in &objects {
            names.push(put_object(&api, o, &origin)?);
        }
        report.push(format!(
            "loaded {} objects from {origin}: {}",
            names.len(),
            names.join(", ")
        ));
        loaded.extend(objects);
    }

    // What the control plane makes: namespaces, their default service accounts.
    let mut namespaces: BTreeSet<String> =
        SYSTEM_NAMESPACES.iter().map(|s| s.to_string()).collect();
    for o in &loaded {
        if let Some(ns) = o.pointer("/metadata/namespace").and_then(Value::as_str)
            && !ns.is_empty()
        {
            namespaces.insert(ns.to_string());
        }
        if o.get("kind").and_then(Value::as_str) == Some("Namespace")
            && let Some(n) = o.pointer("/metadata/name").and_then(Value::as_str)
        {
            namespaces.insert(n.to_string());
        }
    }
    // Secrets and ConfigMaps of namespaced kinds loaded without a namespace went to default.
    let mut made = Vec::new();
    for ns in &namespaces {
        if api.get::<Namespace>(None, ns).is_none() {
            let mut n = Namespace {
                metadata: meta(ns, None),
                ..Default::default()
            };
            label_namespace(&mut n);
            api.put(&n);
            made.push(format!("Namespace {ns}"));
        }
    }
    let mut accounts: BTreeSet<(String, String)> = BTreeSet::new();
    for ns in &namespaces {
        for sa in api.list::<ServiceAccount>(Some(ns)) {
            if let Some(name) = sa.metadata.name {
                accounts.insert((ns.clone(), name));
            }
        }
        if !accounts.contains(&(ns.clone(), "default".to_string())) {
            api.put(&ServiceAccount {
                metadata: meta("default", Some(ns)),
                ..Default::default()
            });
            accounts.insert((ns.clone(), "default".to_string()));
            made.push(format!("ServiceAccount {ns}/default"));
        }
    }

    let tls = if opts.tls {
        let names = serving_names(opts.listen, &opts.tls_sans);
        let tls = FakeTls::generate_for(&names).map_err(refused)?;
        report.push(format!(
            "made a CA and a serving certificate for {}",
            names.join(", ")
        ));
        for ns in &namespaces {
            if api.get::<ConfigMap>(Some(ns), ROOT_CA_CONFIG_MAP).is_none() {
                api.put(&ConfigMap {
                    metadata: meta(ROOT_CA_CONFIG_MAP, Some(ns)),
                    data: Some(BTreeMap::from([(
                        "ca.crt".to_string(),
                        tls.ca_pem().to_string(),
                    )])),
                    ..Default::default()
                });
                made.push(format!("ConfigMap {ns}/{ROOT_CA_CONFIG_MAP}"));
            }
        }
        Some(tls)
    } else {
        None
    };
    if !made.is_empty() {
        report.push(format!(
            "made (as the control plane does): {}",
            made.join(", ")
        ));
    }

    let mut tokens = Vec::new();
    if let (Some(dir), Some(tls)) = (&opts.service_account_dir, &tls) {
        make_dir(dir)?;
        write_private(&dir.join("ca.crt"), tls.ca_pem(), 0o644)?;
        for (ns, name) in &accounts {
            let token = format!("erdma-lab.{}", random_hex()?);
            let user = erdma_k8s::rbac::service_account_user(ns, name);
            let sa_dir = dir.join(ns).join(name);
            make_dir(&sa_dir)?;
            let path = sa_dir.join("token");
            write_private(&path, &token, 0o600)?;
            if ns == "default" && name == "default" {
                write_private(&dir.join("token"), &token, 0o600)?;
            }
            api.accept_token(&token, &user);
            tokens.push(TokenFile {
                namespace: ns.clone(),
                name: name.clone(),
                user,
                path,
            });
        }
        report.push(format!(
            "wrote {}/ca.crt and a token for each of {} service accounts ({}/<namespace>/<name>/token; {}/token is default/default's)",
            dir.display(),
            tokens.len(),
            dir.display(),
            dir.display()
        ));
    }
    if opts.enforce_rbac {
        let authz = erdma_k8s::rbac::Authorizer::from_manifests(&loaded)
            .map_err(|e| refused(format!("the loaded RBAC objects: {e}")))?;
        api.enforce(authz);
        report.push(
            "service accounts' requests are authorized against the loaded RBAC objects".into(),
        );
    }

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| refused(format!("listen on {}: {e}", opts.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| refused(format!("listen on {}: {e}", opts.listen)))?;
    let served = match &tls {
        Some(t) => tokio::spawn(api.clone().serve_https(listener, t.clone(), cancel.clone())),
        None => tokio::spawn(api.clone().serve_http(listener, cancel.clone())),
    };
    // A client cannot connect to an unspecified address: the kubeconfig names the loopback.
    let reach = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    let tmp = opts.kubeconfig.with_extension("tmp");
    match &tls {
        Some(t) => erdma_k8s::fake::kubeconfig_tls(&tmp, reach, t),
        None => erdma_k8s::fake::kubeconfig(&tmp, reach),
    }
    .map_err(io("write the kubeconfig", &tmp))?;
    std::fs::rename(&tmp, &opts.kubeconfig)
        .map_err(io("write the kubeconfig", &opts.kubeconfig))?;
    report.push(format!(
        "serving {}://{reach} (kubeconfig {})",
        if tls.is_some() { "https" } else { "http" },
        opts.kubeconfig.display()
    ));
    Ok(Started {
        addr,
        api,
        report,
        tokens,
        ca_pem: tls.map(|t| t.ca_pem().to_string()),
        served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_names_cover_the_kubernetes_service() {
        let listen: SocketAddr = "10.77.0.1:6443".parse().unwrap();
        assert_eq!(
            serving_names(listen, &["10.89.0.1".into(), "127.0.0.1".into()]),
            [
                "10.77.0.1",
                "127.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "10.89.0.1"
            ]
        );
        let any: SocketAddr = "0.0.0.0:6443".parse().unwrap();
        assert_eq!(serving_names(any, &[])[0], "127.0.0.1");
    }

    #[test]
    fn objects_files_of_each_form() {
        let cm = r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}"#;
        let rendered = format!(r#"{{"notes": "x", "values": {{}}, "objects": [{cm}, {cm}]}}"#);
        assert_eq!(parse_objects(&rendered, "r.json").unwrap().len(), 2);
        assert_eq!(
            parse_objects(&format!("[{cm}]"), "l.json").unwrap().len(),
            1
        );
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n";
        let docs = parse_objects(yaml, "y.yaml").unwrap();
        assert_eq!(
            docs.iter().map(describe).collect::<Vec<_>>(),
            ["ConfigMap a", "Secret s"]
        );
    }

    #[test]
    fn objects_are_stored_as_the_api_server_stores_a_create() {
        let api = FakeApiServer::new();
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "override", "c": "plain"}});
        assert_eq!(
            put_object(&api, &secret, "f").unwrap(),
            "Secret default/creds"
        );
        let s: k8s_openapi::api::core::v1::Secret = api.get(Some("default"), "creds").unwrap();
        let data = s.data.unwrap();
        assert_eq!(data["a"].0, b"x");
        assert_eq!(data["b"].0, b"override", "stringData wins");
        assert_eq!(data["c"].0, b"plain");
        assert!(s.string_data.is_none());

        let crb = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": "b", "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"}});
        assert_eq!(put_object(&api, &crb, "f").unwrap(), "ClusterRoleBinding b");

        let e = put_object(
            &api,
            &serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x"}}),
            "chart.json",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("chart.json: NetworkPolicy x/p")
                && e.contains("\"networking.k8s.io/v1\"")
                && e.contains("v1 ConfigMap")
                && e.contains("Fix:"),
            "{e}"
        );
        let e = put_object(
            &api,
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("has no metadata.name"), "{e}");
        let e = put_object(
            &api,
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": 1}}),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ConfigMap default/c does not parse"), "{e}");
    }
}
