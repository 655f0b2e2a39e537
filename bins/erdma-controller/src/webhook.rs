//! The SMC-R mutating webhook: `POST /mutate-pod` (and the original's `/mutating`) over HTTPS.
//!
//! A pod gets the `smcr-init` init container when all hold (as the original): some container or
//! init container requests or limits `aliyun/erdma`; the device plugin is enabled; the pod has
//! the `network.alibabacloud.com/erdma-smcr` annotation; injection is enabled. Deliberate
//! differences: the annotation value must parse as true (`1`, `t`, `true`, … as Go's
//! `strconv.ParseBool`; the original injected even for `"false"`), an unparsable value gets an
//! admission warning instead; a pod that already has `smcr-init` is left alone (idempotent); a
//! `hostNetwork` pod is left alone with an admission warning and a Warning Event (SMC-R would
//! change the node's own network namespace); and the injected container is unprivileged: the
//! agent configures the pod's namespace at PreStartContainer (or NRI sandbox creation) before
//! the init container starts, and `smcr_init verify` only reads and reports what it finds, so
//! the pod passes Pod Security `restricted`. The webhook never blocks a pod: every failure
//! answers `allowed: true` without a patch.

use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};
use base64::Engine;
use erdma_k8s::labels::{ANNOTATION_SMCR, RESOURCE_ERDMA};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, ObjectFieldSelector, ObjectReference, Pod,
    ResourceRequirements, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Name of the injected init container.
pub const INIT_CONTAINER: &str = "smcr-init";
/// Command of the injected init container.
pub const INIT_COMMAND: &str = "/usr/local/bin/smcr_init";
/// Arguments of the injected init container: check and report, change nothing.
pub const INIT_ARGS: &[&str] = &["verify"];
/// User the injected init container runs as (the images' non-root user).
pub const INIT_USER: i64 = 65532;
/// Environment variable carrying the pod's IP (downward API `status.podIP`).
pub const ENV_POD_IP: &str = "ERDMA_POD_IP";
/// Environment variable carrying the node's IP (downward API `status.hostIP`).
pub const ENV_HOST_IP: &str = "ERDMA_HOST_IP";
/// Reason of the Event for a `hostNetwork` pod left alone.
pub const REASON_HOST_NETWORK: &str = "SmcrSkippedHostNetwork";
/// Largest AdmissionReview accepted.
pub const MAX_BODY: usize = 4 << 20;

/// What to inject.
#[derive(Debug, Clone)]
pub struct InjectOptions {
    /// `enableDevicePlugin`.
    pub device_plugin: bool,
    /// `enableInitContainerInject`.
    pub inject: bool,
    /// The `smcr-init` image.
    pub image: String,
    /// Counters (reviews, injections).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where Events on skipped pods go; `None`: logged only.
    pub events: Option<erdma_k8s::events::Events>,
}

fn requests_erdma(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.resources.as_ref().is_some_and(|r| {
                r.requests
                    .as_ref()
                    .is_some_and(|m| m.contains_key(RESOURCE_ERDMA))
                    || r.limits
                        .as_ref()
                        .is_some_and(|m| m.contains_key(RESOURCE_ERDMA))
            })
        })
}

fn downward(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container injected: the image, `Always` (as the original), `smcr_init verify`,
/// `aliyun/erdma: 1` in requests and limits (so the agent's PreStartContainer runs for it before
/// it starts, and it receives `SMCR_PNET`), the pod's and the node's IP from the downward API
/// (equal only on the host network, which it refuses), and a security context that Pod Security
/// `restricted` admits: non-root, no privilege escalation, every capability dropped, read-only
/// root, the runtime's default seccomp profile. Never privileged.
pub fn init_container(image: &str) -> Container {
    let one = BTreeMap::from([(RESOURCE_ERDMA.to_string(), Quantity("1".into()))]);
    Container {
        name: INIT_CONTAINER.into(),
        image: Some(image.into()),
        image_pull_policy: Some("Always".into()),
        command: Some(vec![INIT_COMMAND.into()]),
        args: Some(INIT_ARGS.iter().map(|a| a.to_string()).collect()),
        env: Some(vec![
            downward(ENV_POD_IP, "status.podIP"),
            downward(ENV_HOST_IP, "status.hostIP"),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(one.clone()),
            limits: Some(one),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(INIT_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the webhook does with one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing to do.
    Leave,
    /// Apply this JSON patch.
    Inject(Value),
    /// Leave the pod, with this admission warning.
    Warn(String),
    /// A `hostNetwork` pod asking for SMC-R: left alone, with this warning and a Warning Event.
    HostNetwork(String),
}

/// The decision for one pod (pure).
pub fn decide(pod: &Pod, opts: &InjectOptions) -> Verdict {
    if !opts.device_plugin || !opts.inject || !requests_erdma(pod) {
        return Verdict::Leave;
    }
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SMCR))
    else {
        return Verdict::Leave;
    };
    match erdma_model::names::parse_smcr(value) {
        Ok(true) => {}
        Ok(false) => return Verdict::Leave,
        Err(e) => return Verdict::Warn(format!("annotation {e}; SMC-R not configured")),
    }
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network) == Some(true) {
        return Verdict::HostNetwork(format!(
            "pod {} uses hostNetwork: SMC-R is not configured for it (it would change the node's own network namespace) and smcr-init is not injected. Fix: remove hostNetwork, or remove the {ANNOTATION_SMCR} annotation",
            pod_name(pod)
        ));
    }
    let inits = spec.and_then(|s| s.init_containers.as_ref());
    if inits.is_some_and(|cs| cs.iter().any(|c| c.name == INIT_CONTAINER)) {
        return Verdict::Leave;
    }
    let c = match serde_json::to_value(init_container(&opts.image)) {
        Ok(c) => c,
        Err(e) => return Verdict::Warn(format!("erdma webhook: {e}; not mutated")),
    };
    Verdict::Inject(match inits {
        Some(_) => json!([{"op": "add", "path": "/spec/initContainers/-", "value": c}]),
        None => json!([{"op": "add", "path": "/spec/initContainers", "value": [c]}]),
    })
}

/// `namespace/name`, or `namespace/generateName*` for a pod not named yet.
fn pod_name(pod: &Pod) -> String {
    let m = &pod.metadata;
    let ns = m.namespace.as_deref().unwrap_or("default");
    match (&m.name, &m.generate_name) {
        (Some(n), _) => format!("{ns}/{n}"),
        (None, Some(g)) => format!("{ns}/{g}*"),
        (None, None) => format!("{ns}/(unnamed)"),
    }
}

/// The reference an Event about `pod` names (`generateName` when the pod has no name yet: the
/// API server names it after admission).
fn pod_reference(pod: &Pod, namespace: Option<&str>) -> ObjectReference {
    let m = &pod.metadata;
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: m
            .namespace
            .clone()
            .or_else(|| namespace.map(str::to_string))
            .or_else(|| Some("default".into())),
        name: m.name.clone().or_else(|| m.generate_name.clone()),
        ..Default::default()
    }
}

/// Answers one AdmissionReview (v1 or v1beta1) body. Always `allowed: true`. A `hostNetwork` pod
/// left alone also gets a Warning Event (sent in the background when `opts.events` is set).
pub fn review(body: &[u8], opts: &InjectOptions) -> Value {
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    let (api_version, uid, namespace, object) = match &parsed {
        Ok(v) => (
            v.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("admission.k8s.io/v1")
                .to_string(),
            v.pointer("/request/uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            v.pointer("/request/namespace")
                .and_then(Value::as_str)
                .map(str::to_string),
            v.pointer("/request/object").cloned(),
        ),
        Err(_) => ("admission.k8s.io/v1".to_string(), String::new(), None, None),
    };
    let mut response = json!({"uid": uid, "allowed": true});
    let (pod, verdict) = match object.map(serde_json::from_value::<Pod>) {
        Some(Ok(pod)) => {
            let v = decide(&pod, opts);
            (Some(pod), v)
        }
        Some(Err(e)) => (
            None,
            Verdict::Warn(format!(
                "erdma webhook: request.object is not a Pod ({e}); not mutated"
            )),
        ),
        None => (
            None,
            Verdict::Warn("erdma webhook: no request.object; not mutated".to_string()),
        ),
    };
    match verdict {
        Verdict::Inject(patch) => {
            if let Some(pod) = &pod {
                tracing::info!(pod = ?pod.metadata.name, namespace = ?pod.metadata.namespace, "injecting smcr-init");
            }
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        Verdict::Leave => {}
        Verdict::Warn(w) => {
            tracing::warn!(uid = %uid, "{w}");
            response["warnings"] = json!([w]);
        }
        Verdict::HostNetwork(w) => {
            tracing::warn!(uid = %uid, reason = REASON_HOST_NETWORK, "{w}");
            if let (Some(pod), Some(events)) = (&pod, &opts.events) {
                host_network_event(
                    events.clone(),
                    pod_reference(pod, namespace.as_deref()),
                    w.clone(),
                );
            }
            response["warnings"] = json!([w]);
        }
    }
    json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})
}

/// Sends the Warning Event for a `hostNetwork` pod without holding up the admission answer; the
/// task ends with the API call (the client's own timeout bounds it).
fn host_network_event(events: erdma_k8s::events::Events, regarding: ObjectReference, note: String) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        if let Err(e) = events
            .publish_once(&regarding, true, REASON_HOST_NETWORK, "Admit", &note)
            .await
        {
            tracing::warn!(error = %e, "the {REASON_HOST_NETWORK} Event was not written");
        }
    });
}

/// The certificate the server presents; replaced in place on rotation.
#[derive(Debug)]
pub struct CertSlot(RwLock<(Arc<rustls::sign::CertifiedKey>, String)>);

impl CertSlot {
    /// A slot holding `cert_pem`/`key_pem`.
    pub fn new(cert_pem: &str, key_pem: &str) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self(RwLock::new((
            certified_key(cert_pem, key_pem)?,
            cert_pem.to_string(),
        )))))
    }
    /// Replaces the certificate (rotation); new handshakes use it at once.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
        let k = certified_key(cert_pem, key_pem)?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = (k, cert_pem.to_string());
        Ok(())
    }
    /// The certificate (PEM) new handshakes present.
    pub fn cert_pem(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> anyhow::Result<Arc<rustls::sign::CertifiedKey>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("webhook certificate PEM: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("webhook key PEM: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow::anyhow!("webhook key: {e}"))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(certs, signing)))
}

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).0.clone())
    }
}

/// One AdmissionReview over HTTP: the body (at most [`MAX_BODY`]; beyond, or unreadable, it
/// counts as empty and is answered with a warning) answered as JSON, and counted.
async fn mutate(body: axum::body::Body, opts: &InjectOptions) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable AdmissionReview");
            Default::default()
        }
    };
    let answer = review(&body, opts);
    opts.metrics.reviews.inc();
    if answer["response"].get("patch").is_some() {
        opts.metrics.injected.inc();
    }
    ([(CONTENT_TYPE, "application/json")], answer.to_string()).into_response()
}

/// `POST /mutate-pod` and `POST /mutating` (the original's path), `GET /healthz` and `GET /readyz`
/// (`ok`); any other method or path is `404 not found`.
fn router(opts: InjectOptions) -> axum::Router {
    let opts = Arc::new(opts);
    let not_found = || async { (StatusCode::NOT_FOUND, "not found") };
    let mutate = post(move |body: axum::body::Body| {
        let opts = opts.clone();
        async move { mutate(body, &opts).await }
    })
    .fallback(not_found);
    let ok = get(|| async { "ok" }).fallback(not_found);
    axum::Router::new()
        .route("/mutate-pod", mutate.clone())
        .route("/mutating", mutate)
        .route("/healthz", ok.clone())
        .route("/readyz", ok)
        .fallback(not_found)
}

/// Serves the webhook over TLS on `listener` until `cancel` fires: new handshakes present the
/// certificate `certs` holds at that moment (rotation swaps it in place).
pub async fn serve(
    listener: TcpListener,
    certs: Arc<CertSlot>,
    opts: InjectOptions,
    cancel: CancellationToken,
) {
    let mut cfg = match rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    {
        Ok(b) => b.with_no_client_auth().with_cert_resolver(certs),
        Err(e) => {
            tracing::error!(error = %e, "TLS configuration failed; webhook not served");
            return;
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    // The handshake's time, the connection cap and the request bounds are the shared ones
    // (`erdma_host::http::bounds`); an AdmissionReview body may be up to `MAX_BODY`.
    let handshake = move |tcp, _peer| acceptor.accept(tcp);
    let limits = erdma_host::http::Limits {
        max_body: MAX_BODY,
        ..Default::default()
    };
    let serving = opts.metrics.clone();
    let bounds =
        erdma_host::http::Bounds::new("webhook", serving.connections.clone()).with_limits(limits);
    serving.webhook_serving.set(1);
    erdma_host::http::serve_with(listener, handshake, router(opts), bounds, cancel).await;
    serving.webhook_serving.set(0);
}
