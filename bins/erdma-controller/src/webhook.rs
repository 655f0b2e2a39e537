//! The SMC-R mutating webhook: `POST /mutate-pod` (and the original's `/mutating`) over HTTPS.
//!
//! A pod gets the `smcr-init` init container when all hold (as the original): some container or
//! init container requests or limits `aliyun/erdma`; the device plugin is enabled; the pod has
//! the `network.alibabacloud.com/erdma-smcr` annotation; injection is enabled. Two deliberate
//! differences: the annotation value must parse as true (`1`, `t`, `true`, … as Go's
//! `strconv.ParseBool`; the original injected even for `"false"`), an unparsable value gets an
//! admission warning instead; and a pod that already has `smcr-init` is left alone (idempotent).
//! The webhook never blocks a pod: every failure answers `allowed: true` without a patch.

use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};
use base64::Engine;
use erdma_k8s::labels::{ANNOTATION_SMCR, RESOURCE_ERDMA};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements, SecurityContext};
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

/// The container injected (as the original: image, `Always`, the command, `aliyun/erdma: 1` in
/// requests and limits so it receives `SMCR_PNET`, privileged).
pub fn init_container(image: &str) -> Container {
    let one = BTreeMap::from([(RESOURCE_ERDMA.to_string(), Quantity("1".into()))]);
    Container {
        name: INIT_CONTAINER.into(),
        image: Some(image.into()),
        image_pull_policy: Some("Always".into()),
        command: Some(vec![INIT_COMMAND.into()]),
        resources: Some(ResourceRequirements {
            requests: Some(one.clone()),
            limits: Some(one),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The decision for one pod: `Ok(Some(patch))` to inject, `Ok(None)` to leave it, `Err(warning)`
/// to leave it with an admission warning.
pub fn decide(pod: &Pod, opts: &InjectOptions) -> Result<Option<Value>, String> {
    if !opts.device_plugin || !opts.inject || !requests_erdma(pod) {
        return Ok(None);
    }
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SMCR))
    else {
        return Ok(None);
    };
    match erdma_model::names::parse_smcr(value) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => return Err(format!("annotation {e}; SMC-R not configured")),
    }
    let spec = pod.spec.as_ref();
    let inits = spec.and_then(|s| s.init_containers.as_ref());
    if inits.is_some_and(|cs| cs.iter().any(|c| c.name == INIT_CONTAINER)) {
        return Ok(None);
    }
    let c = serde_json::to_value(init_container(&opts.image)).map_err(|e| e.to_string())?;
    Ok(Some(match inits {
        Some(_) => json!([{"op": "add", "path": "/spec/initContainers/-", "value": c}]),
        None => json!([{"op": "add", "path": "/spec/initContainers", "value": [c]}]),
    }))
}

/// Answers one AdmissionReview (v1 or v1beta1) body. Always `allowed: true`.
pub fn review(body: &[u8], opts: &InjectOptions) -> Value {
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    let (api_version, uid, object) = match &parsed {
        Ok(v) => (
            v.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("admission.k8s.io/v1")
                .to_string(),
            v.pointer("/request/uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            v.pointer("/request/object").cloned(),
        ),
        Err(_) => ("admission.k8s.io/v1".to_string(), String::new(), None),
    };
    let mut response = json!({"uid": uid, "allowed": true});
    let outcome = match object.map(serde_json::from_value::<Pod>) {
        Some(Ok(pod)) => decide(&pod, opts).map(|p| (pod, p)),
        Some(Err(e)) => Err(format!(
            "erdma webhook: request.object is not a Pod ({e}); not mutated"
        )),
        None => Err("erdma webhook: no request.object; not mutated".to_string()),
    };
    match outcome {
        Ok((pod, Some(patch))) => {
            tracing::info!(pod = ?pod.metadata.name, namespace = ?pod.metadata.namespace, "injecting smcr-init");
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        Ok((_, None)) => {}
        Err(w) => {
            tracing::warn!(uid = %uid, "{w}");
            response["warnings"] = json!([w]);
        }
    }
    json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response})
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
    let bounds = erdma_host::http::Bounds::new("webhook", opts.metrics.connections.clone())
        .with_limits(limits);
    erdma_host::http::serve_with(listener, handshake, router(opts), bounds, cancel).await
}
