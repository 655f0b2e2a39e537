//! The API server's mutating admission webhooks for a pod CREATE, for the lab
//! (`erdma-fake-kubelet admit`), as `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook`
//! calls them:
//!
//! - the MutatingWebhookConfigurations in name order, their webhooks in order;
//! - a webhook is called when its `namespaceSelector` matches the namespace's labels (a
//!   Namespace the API server lacks counts with the one label every namespace has,
//!   `kubernetes.io/metadata.name`), its `objectSelector` the pod's labels, and one of its rules
//!   the request (operation `CREATE`, group `""`, version `v1`, resource `pods` without a
//!   subresource, namespaced scope; `*` wildcards), and its `matchConditions` hold (CEL, in the
//!   forms [`condition_holds`] models: a webhook with any other expression is refused, naming
//!   it);
//! - the call: an `admission.k8s.io/v1` (or, if the webhook takes only that, `v1beta1`)
//!   AdmissionReview over HTTPS to `clientConfig.url`, or to `clientConfig.service` (port 443
//!   and path `/` by default) at the address `--endpoint NAMESPACE/NAME=HOST:PORT` gives it (the
//!   lab has no kube-proxy), the server's certificate verified against `clientConfig.caBundle`
//!   for the name `NAME.NAMESPACE.svc` (the URL's host for a URL), within `timeoutSeconds`
//!   (default 10);
//! - the answer: its uid must be the request's, a patch must be a `JSONPatch`
//!   ([`crate::json_patch`]), applied to the pod, which must stay a Pod; `allowed: false`
//!   rejects the pod whatever the failure policy;
//! - `failurePolicy` (default `Fail`) decides what a failed call does (an unreachable server,
//!   a TLS failure, a timeout, an answer that is not an AdmissionReview for the request):
//!   `Fail` refuses the pod naming the webhook, `Ignore` goes on with a note. A patch that does
//!   not apply refuses the pod either way, as in the API server.
//!
//! Then Pod Security admission at the `baseline` level ([`crate::pod_security`]) for a namespace
//! labelled `pod-security.kubernetes.io/enforce`: a pod that breaks it is refused.
//!
//! Not modelled, with a note: `reinvocationPolicy: IfNeeded` (each webhook is called once), the
//! built-in admission plugins that run before the webhooks (ServiceAccount, defaulting: `pod
//! run --api-server` applies the ServiceAccount admission).

use crate::error::{FakeKubeletError, Result};
use crate::json_patch;
use crate::pod_security;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// The label every namespace carries (set by the API server).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The request being admitted: a pod CREATE.
#[derive(Debug, Clone)]
pub struct PodCreate {
    /// The pod as created (name, namespace, labels, annotations, spec).
    pub pod: Pod,
    /// The labels of the pod's namespace.
    pub namespace_labels: BTreeMap<String, String>,
    /// Who creates it (`userInfo.username`).
    pub user: String,
}

/// One webhook considered for the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookReport {
    /// The MutatingWebhookConfiguration.
    pub configuration: String,
    /// The webhook's name.
    pub webhook: String,
    /// Whether it was called.
    pub called: bool,
    /// Where (`https://alibabacloud-erdma-controller.kube-system.svc:443/mutating via
    /// 10.89.0.3:9443`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// `not called: ...`, `allowed`, `allowed, patched`, `failed (ignored): ...`.
    pub outcome: String,
    /// The patch's operations, `add /spec/initContainers`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The webhook's admission warnings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What admission made of the pod.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The pod after every patch.
    pub pod: Pod,
    /// Each webhook, in the order considered.
    pub webhooks: Vec<WebhookReport>,
    /// What the lab's admission does differently.
    pub notes: Vec<String>,
}

/// Where webhooks are reached.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    /// `namespace/name` of a Service to `HOST:PORT`.
    pub services: BTreeMap<String, String>,
}

impl Endpoints {
    /// Parses `--endpoint NAMESPACE/NAME=HOST:PORT` flags.
    pub fn parse(flags: &[String]) -> std::result::Result<Endpoints, String> {
        let mut services = BTreeMap::new();
        for f in flags {
            let bad = || {
                format!(
                    "--endpoint {f:?} must be NAMESPACE/NAME=HOST:PORT, e.g. kube-system/alibabacloud-erdma-controller=10.89.0.3:9443"
                )
            };
            let (svc, addr) = f.split_once('=').ok_or_else(bad)?;
            let (ns, name) = svc.split_once('/').ok_or_else(bad)?;
            if ns.is_empty() || name.is_empty() || name.contains('/') {
                return Err(bad());
            }
            crate::pod_api::parse_host_port(addr).map_err(|_| bad())?;
            services.insert(svc.to_string(), addr.to_string());
        }
        Ok(Endpoints { services })
    }
}

/// Whether `rule` matches a namespaced pod CREATE (`rules.Matcher`).
pub fn rule_matches(rule: &RuleWithOperations) -> bool {
    let any = |items: &Option<Vec<String>>, want: &str| {
        items.iter().flatten().any(|i| i == "*" || i == want)
    };
    let scope = match rule.scope.as_deref() {
        None | Some("*") | Some("Namespaced") => true,
        Some(_) => false,
    };
    let resource = rule.resources.iter().flatten().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r.as_str(), ""));
        (res == "*" || res == "pods") && (sub == "*" || sub.is_empty())
    });
    scope
        && any(&rule.operations, "CREATE")
        && any(&rule.api_groups, "")
        && any(&rule.api_versions, "v1")
        && resource
}

/// Whether `selector` matches `labels` (`metav1.LabelSelectorAsSelector`: `matchLabels` and
/// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`, all must hold; an empty
/// selector matches everything).
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> std::result::Result<bool, String> {
    let Some(s) = selector else {
        return Ok(true);
    };
    for (k, v) in s.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default();
        let have = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "operator {} on {:?} needs values",
                    e.operator, e.key
                ));
            }
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => have.is_none_or(|h| !values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => {
                return Err(format!(
                    "operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                ));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A random (version 4) UUID, the request's uid.
fn uuid() -> String {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b = n.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The AdmissionReview the API server sends for `req` (version `version`, uid `uid`).
pub fn review(req: &PodCreate, version: &str, uid: &str) -> Value {
    let mut object = serde_json::to_value(&req.pod).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut object {
        o.insert("apiVersion".into(), json!("v1"));
        o.insert("kind".into(), json!("Pod"));
    }
    let meta = &req.pod.metadata;
    json!({
        "apiVersion": format!("admission.k8s.io/{version}"),
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta.name.clone().unwrap_or_default(),
            "namespace": meta.namespace.clone().unwrap_or_default(),
            "operation": "CREATE",
            "userInfo": {"username": req.user},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

/// Why a call failed (the failure policy decides), or why the pod is refused regardless.
enum CallError {
    /// `ErrCallingWebhook`: the failure policy applies.
    Calling(String),
    /// The webhook denied the pod, or its patch broke it: refused.
    Refused(String),
}

/// Where and how a webhook is reached.
struct Target {
    /// Shown in reports (the URL, and the address it was reached at).
    url: String,
    /// The URL the API server posts to.
    post: String,
    /// TCP address to connect to.
    connect: String,
    /// TLS server name.
    server_name: String,
    /// `Host` header.
    host: String,
    /// Request path.
    path: String,
    /// The lab named the address (`--endpoint`); a `clientConfig.url` from the objects is
    /// dialled only when it is loopback.
    named_by_lab: bool,
}

fn target(w: &MutatingWebhook, endpoints: &Endpoints) -> Result<Target, String> {
    let cc = &w.client_config;
    if let Some(s) = &cc.service {
        let port = s.port.unwrap_or(443);
        let path = s
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let dns = format!("{}.{}.svc", s.name, s.namespace);
        let key = format!("{}/{}", s.namespace, s.name);
        let connect = endpoints.services.get(&key).cloned().ok_or_else(|| {
            format!(
                "clientConfig.service {key} port {port}: the lab has no kube-proxy or service network. Fix: give its address with --endpoint {key}=HOST:PORT (the pod's IP and target port)"
            )
        })?;
        return Ok(Target {
            url: format!("https://{dns}:{port}{path} via {connect}"),
            post: format!("https://{dns}:{port}{path}"),
            connect,
            server_name: dns.clone(),
            host: format!("{dns}:{port}"),
            path,
            named_by_lab: true,
        });
    }
    if let Some(u) = &cc.url {
        let rest = u.strip_prefix("https://").ok_or_else(|| {
            format!("clientConfig.url {u:?} must be an https:// URL (as the API server validates)")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let (host, connect) = match crate::pod_api::parse_host_port(authority) {
            Ok((h, _)) => (h, authority.to_string()),
            Err(_) => (
                authority.trim_matches(['[', ']']).to_string(),
                format!("{authority}:443"),
            ),
        };
        return Ok(Target {
            url: u.clone(),
            post: u.clone(),
            connect,
            server_name: host,
            host: authority.to_string(),
            path,
            named_by_lab: false,
        });
    }
    Err("clientConfig has neither service nor url".into())
}

fn tls_config(ca_bundle: &[u8]) -> std::result::Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    if ca_bundle.is_empty() {
        return Err(
            "clientConfig.caBundle is empty (the API server would trust only its system roots, which a lab webhook's certificate does not chain to)".into(),
        );
    }
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for c in CertificateDer::pem_slice_iter(ca_bundle) {
        let c = c.map_err(|e| format!("clientConfig.caBundle is not PEM certificates: {e}"))?;
        roots.add(c).map_err(|e| {
            format!("clientConfig.caBundle holds a certificate rustls refuses: {e}")
        })?;
        n += 1;
    }
    if n == 0 {
        return Err("clientConfig.caBundle holds no PEM certificate".into());
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(cfg)
}

/// POSTs `body` to the webhook and returns the answer's JSON.
async fn post(t: &Target, ca_bundle: &[u8], body: &Value) -> std::result::Result<Value, String> {
    if !t.named_by_lab {
        let (host, port) = crate::pod_api::parse_host_port(&t.connect)?;
        erdma_k8s::dial_guard::DialGuard::loopback_only()
            .resolve(&host, port, &format!("the webhook {}", t.url))
            .await?;
    }
    let mut cfg = tls_config(ca_bundle)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(t.server_name.clone())
        .map_err(|e| format!("{:?} is no TLS server name: {e}", t.server_name))?;
    let tcp = tokio::net::TcpStream::connect(&t.connect)
        .await
        .map_err(|e| format!("dial tcp {}: {e}", t.connect))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            format!(
                "tls: the server at {} is not verified for {} by the caBundle: {e}",
                t.connect, t.server_name
            )
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::post(&t.path)
        .header(hyper::header::HOST, &t.host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await;
    let out = async {
        let resp = resp.map_err(|e| format!("POST: {e}"))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "the webhook answered HTTP {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            ));
        }
        serde_json::from_slice::<Value>(&bytes).map_err(|e| format!("the answer is not JSON: {e}"))
    }
    .await;
    driver.abort();
    out
}

/// The outcome of one call.
struct Answer {
    patch: Option<Vec<json_patch::Operation>>,
    warnings: Vec<String>,
}

/// Checks an AdmissionReview answer as `VerifyAdmissionResponse` does.
fn verify(
    version: &str,
    uid: &str,
    answer: &Value,
    webhook: &str,
) -> std::result::Result<Answer, CallError> {
    let want = format!("admission.k8s.io/{version}");
    let (av, kind) = (
        answer
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(""),
        answer.get("kind").and_then(Value::as_str).unwrap_or(""),
    );
    if version == "v1" && (av != want || kind != "AdmissionReview") {
        return Err(CallError::Calling(format!(
            "received invalid webhook response: expected webhook response of {want}, Kind=AdmissionReview, got {av}, Kind={kind}"
        )));
    }
    let Some(r) = answer.get("response").filter(|r| r.is_object()) else {
        return Err(CallError::Calling(
            "received invalid webhook response: webhook response was absent".into(),
        ));
    };
    let got_uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
    if version == "v1" && got_uid != uid {
        return Err(CallError::Calling(format!(
            "received invalid webhook response: expected response.uid={uid:?}, got {got_uid:?}"
        )));
    }
    let warnings: Vec<String> = r
        .get("warnings")
        .and_then(Value::as_array)
        .map(|w| {
            w.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if r.get("allowed").and_then(Value::as_bool) != Some(true) {
        let msg = r
            .pointer("/status/message")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty());
        return Err(CallError::Refused(match msg {
            Some(m) => format!("admission webhook {webhook:?} denied the request: {m}"),
            None => format!("admission webhook {webhook:?} denied the request without explanation"),
        }));
    }
    let patch = match r.get("patch").filter(|p| !p.is_null()) {
        None => None,
        Some(p) => {
            let bytes: k8s_openapi::ByteString = serde_json::from_value(p.clone()).map_err(|e| {
                CallError::Calling(format!(
                    "received undecodable patch in webhook response: response.patch is not base64: {e}"
                ))
            })?;
            if bytes.0.is_empty() {
                None
            } else {
                let patch_type = r.get("patchType").and_then(Value::as_str);
                match (version, patch_type) {
                    (_, Some("JSONPatch")) | ("v1beta1", None) => {}
                    (_, None) => {
                        return Err(CallError::Calling(
                            "received invalid webhook response: webhook returned response.patch but not response.patchType".into(),
                        ));
                    }
                    (_, Some(other)) => {
                        return Err(CallError::Calling(format!(
                            "unsupported patch type {other:?}"
                        )));
                    }
                }
                let v: Value = serde_json::from_slice(&bytes.0).map_err(|e| {
                    CallError::Calling(format!(
                        "received undecodable patch in webhook response: {e}"
                    ))
                })?;
                let ops = json_patch::parse(&v).map_err(|e| {
                    CallError::Calling(format!(
                        "received undecodable patch in webhook response: {e}"
                    ))
                })?;
                Some(ops)
            }
        }
    };
    Ok(Answer { patch, warnings })
}

/// Calls one webhook for `req`.
async fn call(
    w: &MutatingWebhook,
    req: &PodCreate,
    endpoints: &Endpoints,
) -> std::result::Result<(String, Answer), (String, CallError)> {
    let t = target(w, endpoints).map_err(|e| (String::new(), CallError::Refused(e)))?;
    let url = t.url.clone();
    let versions = &w.admission_review_versions;
    let Some(version) = versions
        .iter()
        .find(|v| *v == "v1" || *v == "v1beta1")
        .cloned()
    else {
        return Err((
            url,
            CallError::Calling(format!(
                "webhook does not accept known AdmissionReview versions (admissionReviewVersions {versions:?}; the API server speaks v1, v1beta1)"
            )),
        ));
    };
    let uid = uuid();
    let body = review(req, &version, &uid);
    let timeout = Duration::from_secs(u64::try_from(w.timeout_seconds.unwrap_or(10)).unwrap_or(10));
    let ca = w
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default();
    let answer = match tokio::time::timeout(timeout, post(&t, &ca, &body)).await {
        Err(_) => {
            return Err((
                url,
                CallError::Calling(format!(
                    "failed to call webhook: Post \"{}\" (at {}): context deadline exceeded (timeoutSeconds {})",
                    t.post,
                    t.connect,
                    timeout.as_secs()
                )),
            ));
        }
        Ok(Err(e)) => {
            return Err((
                url,
                CallError::Calling(format!(
                    "failed to call webhook: Post \"{}\" (at {}): {e}",
                    t.post, t.connect
                )),
            ));
        }
        Ok(Ok(a)) => a,
    };
    verify(&version, &uid, &answer, &w.name)
        .map(|a| (url.clone(), a))
        .map_err(|e| (url, e))
}

/// Runs the mutating webhooks of `configs` for `req` (see the module documentation).
pub async fn admit(
    configs: &[MutatingWebhookConfiguration],
    req: &PodCreate,
    endpoints: &Endpoints,
) -> Result<Admitted> {
    let mut configs: Vec<&MutatingWebhookConfiguration> = configs.iter().collect();
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut req = req.clone();
    let mut reports = Vec::new();
    let mut notes = vec![
        "built-in admission (ServiceAccount, defaulting) is not applied here; pod run --api-server applies the ServiceAccount admission".to_string(),
    ];
    let who = format!(
        "pod {}/{}",
        req.pod.metadata.namespace.as_deref().unwrap_or(""),
        req.pod.metadata.name.as_deref().unwrap_or("")
    );
    let pod_labels = req.pod.metadata.labels.clone().unwrap_or_default();
    for cfg in configs {
        let cname = cfg.metadata.name.clone().unwrap_or_default();
        for w in cfg.webhooks.iter().flatten() {
            let mut rep = WebhookReport {
                configuration: cname.clone(),
                webhook: w.name.clone(),
                called: false,
                url: String::new(),
                outcome: String::new(),
                changes: Vec::new(),
                warnings: Vec::new(),
            };
            let what = format!(
                "webhook {:?} (MutatingWebhookConfiguration {cname})",
                w.name
            );
            let selector_error = |field: &str, e: String| {
                FakeKubeletError::Refused(format!(
                    "{who}: {what}: {field}: {e} (the API server answers an internal error). Fix: correct the selector"
                ))
            };
            let ns_ok = selector_matches(w.namespace_selector.as_ref(), &req.namespace_labels)
                .map_err(|e| selector_error("namespaceSelector", e))?;
            let obj_ok = selector_matches(w.object_selector.as_ref(), &pod_labels)
                .map_err(|e| selector_error("objectSelector", e))?;
            let rules_ok = w.rules.iter().flatten().any(rule_matches);
            if !(ns_ok && obj_ok && rules_ok) {
                rep.outcome = format!(
                    "not called: {}",
                    if !rules_ok {
                        "no rule matches CREATE of v1 pods"
                    } else if !ns_ok {
                        "namespaceSelector does not match the namespace's labels"
                    } else {
                        "objectSelector does not match the pod's labels"
                    }
                );
                reports.push(rep);
                continue;
            }
            let mut unmet = None;
            for c in w.match_conditions.iter().flatten() {
                let holds = condition_holds(&c.expression, &req.pod).map_err(|e| {
                    FakeKubeletError::Refused(format!(
                        "{who}: {what}: matchCondition {:?}: {e}. Fix: use a form the lab models, or call the webhook by hand",
                        c.name
                    ))
                })?;
                if !holds {
                    unmet = Some(c.name.clone());
                    break;
                }
            }
            if let Some(name) = unmet {
                rep.outcome = format!("not called: matchCondition {name:?} is false");
                reports.push(rep);
                continue;
            }
            if w.reinvocation_policy.as_deref() == Some("IfNeeded") {
                notes.push(format!(
                    "{what}: reinvocationPolicy IfNeeded is not honoured (each webhook is called once)"
                ));
            }
            let fail_open = w.failure_policy.as_deref() == Some("Ignore");
            rep.called = true;
            match call(w, &req, endpoints).await {
                Ok((url, answer)) => {
                    rep.url = url;
                    rep.warnings = answer.warnings;
                    match answer.patch {
                        None => rep.outcome = "allowed".into(),
                        Some(ops) => {
                            let mut v = serde_json::to_value(&req.pod)
                                .map_err(|e| FakeKubeletError::Refused(format!("{who}: {e}")))?;
                            json_patch::apply(&mut v, &ops).map_err(|e| {
                                FakeKubeletError::Refused(format!(
                                    "{who}: {what}: its patch does not apply: {e} (the API server answers an internal error, whatever the failure policy). Fix: the webhook"
                                ))
                            })?;
                            req.pod = serde_json::from_value(v).map_err(|e| {
                                FakeKubeletError::Refused(format!(
                                    "{who}: {what}: the patched object is no Pod: {e}. Fix: the webhook"
                                ))
                            })?;
                            rep.changes = ops
                                .iter()
                                .map(|o| format!("{} {}", o.name(), o.path()))
                                .collect();
                            rep.outcome = "allowed, patched".into();
                        }
                    }
                }
                Err((url, CallError::Refused(e))) => {
                    return Err(FakeKubeletError::Refused(format!(
                        "{who}: {what}{}: {e}",
                        if url.is_empty() {
                            String::new()
                        } else {
                            format!(" at {url}")
                        }
                    )));
                }
                Err((url, CallError::Calling(e))) => {
                    rep.url = url.clone();
                    if fail_open {
                        rep.outcome =
                            format!("failed (failurePolicy Ignore: the pod goes on): {e}");
                        notes.push(format!(
                            "{what} failed and was ignored (failurePolicy Ignore): {e}"
                        ));
                    } else {
                        return Err(FakeKubeletError::Refused(format!(
                            "{who}: Internal error occurred: failed calling webhook {:?} (MutatingWebhookConfiguration {cname}, failurePolicy Fail): {e}. Fix: make the webhook answer, or set failurePolicy Ignore",
                            w.name
                        )));
                    }
                }
            }
            reports.push(rep);
        }
    }
    if let Some(level) = pod_security::enforced(&req.namespace_labels) {
        let failed = pod_security::violations(&req.pod);
        if !failed.is_empty() {
            return Err(FakeKubeletError::Refused(format!(
                "{who} is forbidden: violates PodSecurity \"baseline:latest\": {}. Fix: change the pod, or the namespace's {} label",
                failed.join(", "),
                pod_security::ENFORCE_LABEL
            )));
        }
        if level == "restricted" {
            notes.push(
                "Pod Security restricted: only the baseline checks are modelled by the lab"
                    .to_string(),
            );
        }
    }
    Ok(Admitted {
        pod: req.pod,
        webhooks: reports,
        notes,
    })
}

/// Evaluates a webhook's `matchCondition` for the pod, in the forms the lab models: a
/// conjunction (`&&`) of `has(object.metadata.annotations)` (or `labels`) and
/// `'KEY' in object.metadata.annotations` (or `labels`). Any other CEL is an error naming it, so
/// that an expression the lab cannot judge never passes silently.
pub fn condition_holds(expression: &str, pod: &Pod) -> std::result::Result<bool, String> {
    let maps = |field: &str| match field {
        "annotations" => Some(pod.metadata.annotations.as_ref()),
        "labels" => Some(pod.metadata.labels.as_ref()),
        _ => None,
    };
    let unmodelled = |term: &str| {
        format!("the CEL term {term:?} of {expression:?} is not modelled by the lab's admission")
    };
    // Each term: Ok(value), or Err(a CEL evaluation error). A term the lab cannot read at all
    // fails the whole call at once.
    let mut terms = Vec::new();
    for term in expression.split("&&").map(str::trim) {
        let value = if let Some(field) = term
            .strip_prefix("has(object.metadata.")
            .and_then(|t| t.strip_suffix(')'))
        {
            Ok(maps(field)
                .ok_or_else(|| unmodelled(term))?
                .is_some_and(|m| !m.is_empty()))
        } else if let Some((key, field)) = term.split_once(" in object.metadata.") {
            let key = key.trim();
            let quoted = key.len() >= 2
                && ((key.starts_with('\'') && key.ends_with('\''))
                    || (key.starts_with('"') && key.ends_with('"')));
            if !quoted {
                return Err(unmodelled(term));
            }
            let key = &key[1..key.len() - 1];
            match maps(field.trim()).ok_or_else(|| unmodelled(term))? {
                Some(m) => Ok(m.contains_key(key)),
                None => Err(format!(
                    "{term:?} of {expression:?} reads a map the pod does not have (a CEL error: the API server applies the failure policy); guard it with has()"
                )),
            }
        } else {
            return Err(unmodelled(term));
        };
        terms.push(value);
    }
    // CEL's && is false when any side is false, even when another side is an error.
    if terms.iter().any(|t| t == &Ok(false)) {
        return Ok(false);
    }
    terms
        .into_iter()
        .try_fold(true, |all, t| t.map(|v| all && v))
}

/// Who creates a workload's pods (`userInfo.username` of the request): its controller's
/// service account, or for a bare Pod the administrator of the kubeconfig.
pub fn creator(kind: &str) -> String {
    let controller = match kind {
        "Deployment" => "replicaset-controller",
        "DaemonSet" => "daemon-set-controller",
        "StatefulSet" => "statefulset-controller",
        "Job" => "job-controller",
        _ => return "kubernetes-admin".into(),
    };
    format!("system:serviceaccount:kube-system:{controller}")
}

/// [`admit`] with what the API server at `client` holds: its MutatingWebhookConfigurations and
/// the pod's Namespace (labels; one it lacks counts with `kubernetes.io/metadata.name` only,
/// noted).
pub async fn admit_from(
    client: &kube::Client,
    m: &crate::podspec::manifest::ManifestPod,
    endpoints: &Endpoints,
) -> Result<Admitted> {
    use k8s_openapi::api::core::v1::Namespace;
    let ns = m
        .pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let fail = |what: &str| {
        let what = what.to_string();
        move |e: kube::Error| {
            FakeKubeletError::Refused(format!(
                "{what}: {e}. Fix: check --kubeconfig names the lab API server and it serves"
            ))
        }
    };
    let configs = kube::Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(fail("list the MutatingWebhookConfigurations"))?
        .items;
    let namespace = kube::Api::<Namespace>::all(client.clone())
        .get_opt(&ns)
        .await
        .map_err(fail(&format!("read Namespace {ns}")))?;
    let mut note = None;
    let mut labels = match namespace {
        Some(n) => n.metadata.labels.unwrap_or_default(),
        None => {
            note = Some(format!(
                "Namespace {ns} is not in the API server: its labels are taken as the one every namespace has ({NAMESPACE_NAME_LABEL}={ns})"
            ));
            BTreeMap::new()
        }
    };
    labels.insert(NAMESPACE_NAME_LABEL.into(), ns.clone());
    let req = PodCreate {
        pod: m.pod.clone(),
        namespace_labels: labels,
        user: creator(&m.kind),
    };
    let mut out = admit(&configs, &req, endpoints).await?;
    if m.kind != "Pod" {
        out.notes.push(format!(
            "the pod of {} is sent with the workload's name {:?} (its controller would send generateName and a generated name)",
            m.source,
            m.pod.metadata.name.as_deref().unwrap_or("")
        ));
    }
    out.notes.extend(note);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn rule(
        ops: &[&str],
        groups: &[&str],
        versions: &[&str],
        res: &[&str],
        scope: Option<&str>,
    ) -> RuleWithOperations {
        let v = |x: &[&str]| Some(x.iter().map(|s| s.to_string()).collect());
        RuleWithOperations {
            operations: v(ops),
            api_groups: v(groups),
            api_versions: v(versions),
            resources: v(res),
            scope: scope.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn a_webhook_url_outside_loopback_is_refused_without_a_dial() {
        let w = MutatingWebhook {
            client_config: k8s_openapi::api::admissionregistration::v1::WebhookClientConfig {
                url: Some("https://192.0.2.7:8443/mutate".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = target(&w, &Endpoints::default()).expect("a url target");
        let e = post(&t, b"", &serde_json::json!({}))
            .await
            .expect_err("refused");
        assert!(
            e.starts_with(
                "refusing to dial 192.0.2.7:8443 (not loopback or a lab address): the webhook https://192.0.2.7:8443/mutate"
            ),
            "{e}"
        );
    }

    #[test]
    fn rules_as_the_api_servers_matcher_reads_them() {
        assert!(rule_matches(&rule(
            &["CREATE"],
            &[""],
            &["v1"],
            &["pods"],
            Some("Namespaced")
        )));
        assert!(rule_matches(&rule(&["*"], &["*"], &["*"], &["*"], None)));
        assert!(rule_matches(&rule(
            &["CREATE", "UPDATE"],
            &[""],
            &["v1"],
            &["*/*"],
            Some("*")
        )));
        assert!(
            !rule_matches(&rule(&["UPDATE"], &[""], &["v1"], &["pods"], None)),
            "operation"
        );
        assert!(
            !rule_matches(&rule(&["CREATE"], &["apps"], &["v1"], &["pods"], None)),
            "group"
        );
        assert!(
            !rule_matches(&rule(&["CREATE"], &[""], &["v1beta1"], &["pods"], None)),
            "version"
        );
        assert!(!rule_matches(&rule(
            &["CREATE"],
            &[""],
            &["v1"],
            &["deployments"],
            None
        )));
        assert!(
            !rule_matches(&rule(&["CREATE"], &[""], &["v1"], &["pods/exec"], None)),
            "a subresource only"
        );
        assert!(
            !rule_matches(&rule(
                &["CREATE"],
                &[""],
                &["v1"],
                &["pods"],
                Some("Cluster")
            )),
            "scope"
        );
        assert!(!rule_matches(&rule(&[], &[""], &["v1"], &["pods"], None)));
    }

    #[test]
    fn label_selectors() {
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "front".to_string()),
        ]);
        let req = |k: &str, op: &str, vals: &[&str]| LabelSelectorRequirement {
            key: k.into(),
            operator: op.into(),
            values: (!vals.is_empty()).then(|| vals.iter().map(|s| s.to_string()).collect()),
        };
        let sel = |ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: (!ml.is_empty()).then(|| {
                ml.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            match_expressions: (!me.is_empty()).then_some(me),
        };
        assert_eq!(selector_matches(None, &labels), Ok(true));
        assert_eq!(
            selector_matches(Some(&sel(&[], vec![])), &labels),
            Ok(true),
            "empty: all"
        );
        assert_eq!(
            selector_matches(Some(&sel(&[("app", "web")], vec![])), &labels),
            Ok(true)
        );
        assert_eq!(
            selector_matches(Some(&sel(&[("app", "db")], vec![])), &labels),
            Ok(false)
        );
        let m = |e| selector_matches(Some(&sel(&[], vec![e])), &labels);
        assert_eq!(m(req("tier", "In", &["front", "back"])), Ok(true));
        assert_eq!(m(req("tier", "In", &["back"])), Ok(false));
        assert_eq!(m(req("tier", "NotIn", &["back"])), Ok(true));
        assert_eq!(
            m(req("missing", "NotIn", &["x"])),
            Ok(true),
            "NotIn holds for an absent key"
        );
        assert_eq!(m(req("app", "Exists", &[])), Ok(true));
        assert_eq!(m(req("app", "DoesNotExist", &[])), Ok(false));
        assert!(m(req("app", "Gt", &["1"])).is_err());
        assert!(m(req("app", "In", &[])).is_err());
    }

    #[test]
    fn endpoints_and_uids() {
        let e = Endpoints::parse(&["kube-system/ctl=10.89.0.3:9443".to_string()]).unwrap();
        assert_eq!(e.services["kube-system/ctl"], "10.89.0.3:9443");
        assert!(Endpoints::parse(&["ctl=10.89.0.3:9443".to_string()]).is_err());
        assert!(Endpoints::parse(&["a/b=10.89.0.3".to_string()]).is_err());
        let u = uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4", "version 4: {u}");
        assert_ne!(uuid(), u);
    }

    fn smcr_pod(annotations: Option<Value>) -> Pod {
        let mut p = json!({"metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "app", "image": "a"}]}});
        if let Some(a) = annotations {
            p["metadata"]["annotations"] = a;
        }
        serde_json::from_value(p).unwrap()
    }

    /// The chart's condition: only pods carrying the SMC-R annotation are sent.
    #[test]
    fn match_conditions_in_the_modelled_forms() {
        let chart = "has(object.metadata.annotations) && 'network.alibabacloud.com/erdma-smcr' in object.metadata.annotations";
        let with = smcr_pod(Some(json!({"network.alibabacloud.com/erdma-smcr": "true"})));
        let other = smcr_pod(Some(json!({"team": "a"})));
        let none = smcr_pod(None);
        assert_eq!(condition_holds(chart, &with), Ok(true));
        assert_eq!(condition_holds(chart, &other), Ok(false));
        assert_eq!(condition_holds(chart, &none), Ok(false));
        // Without the has() guard CEL fails on a pod without annotations: refused, not guessed.
        let unguarded = "'network.alibabacloud.com/erdma-smcr' in object.metadata.annotations";
        assert!(
            condition_holds(unguarded, &none)
                .unwrap_err()
                .contains("has()")
        );
        assert_eq!(condition_holds(unguarded, &with), Ok(true));
        for unknown in [
            "object.spec.hostNetwork == false",
            "has(object.spec.hostNetwork)",
            "request.userInfo.username != 'x'",
        ] {
            let e = condition_holds(unknown, &with).unwrap_err();
            assert!(e.contains("not modelled"), "{unknown}: {e}");
        }
    }

    fn one_webhook(conditions: Option<Value>) -> MutatingWebhookConfiguration {
        let mut w = json!({"name": "erdma.example", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]});
        if let Some(c) = conditions {
            w["matchConditions"] = c;
        }
        serde_json::from_value(json!({"metadata": {"name": "erdma"}, "webhooks": [w]})).unwrap()
    }

    fn create(pod: Pod, labels: &[(&str, &str)]) -> PodCreate {
        PodCreate {
            pod,
            namespace_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            user: "kubernetes-admin".into(),
        }
    }

    /// A webhook whose condition is false is not called (its unreachable URL would refuse the
    /// pod under failurePolicy Fail).
    #[tokio::test]
    async fn a_webhook_whose_condition_is_false_is_not_called() {
        let cfg = one_webhook(Some(json!([{"name": "smcr", "expression":
            "has(object.metadata.annotations) && 'network.alibabacloud.com/erdma-smcr' in object.metadata.annotations"}])));
        let out = admit(
            std::slice::from_ref(&cfg),
            &create(smcr_pod(None), &[]),
            &Endpoints::default(),
        )
        .await
        .unwrap();
        assert!(!out.webhooks[0].called);
        assert!(
            out.webhooks[0]
                .outcome
                .contains("matchCondition \"smcr\" is false")
        );
        let asked = smcr_pod(Some(json!({"network.alibabacloud.com/erdma-smcr": "true"})));
        let refused = admit(&[cfg], &create(asked, &[]), &Endpoints::default()).await;
        assert!(refused.is_err(), "called, and failed closed");
    }

    /// Pod Security baseline runs after the webhooks: a privileged container is refused in a
    /// baseline namespace, accepted elsewhere.
    #[tokio::test]
    async fn pod_security_baseline_refuses_a_privileged_container() {
        let mut v = serde_json::to_value(smcr_pod(None)).unwrap();
        v["spec"]["initContainers"] =
            json!([{"name": "smcr-init", "image": "s", "securityContext": {"privileged": true}}]);
        let pod: Pod = serde_json::from_value(v).unwrap();
        let baseline = [(pod_security::ENFORCE_LABEL, "baseline")];
        let e = admit(&[], &create(pod.clone(), &baseline), &Endpoints::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("violates PodSecurity \"baseline:latest\"") && e.contains("\"smcr-init\""),
            "{e}"
        );
        admit(&[], &create(pod, &[]), &Endpoints::default())
            .await
            .expect("no level enforced");
    }
}
