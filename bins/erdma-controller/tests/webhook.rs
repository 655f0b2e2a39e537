//! The webhook as a real HTTPS server (rustls, a certificate from `cert::generate`) answering
//! real AdmissionReview JSON; certificate management and leader election against the fake API
//! server. Mocked: only the API server (in memory).

use base64::Engine;
use bytes::Bytes;
use erdma_controller::cert::{
    ANNOTATION_NOT_AFTER, ANNOTATION_PHASE, ANNOTATION_ROTATE, ANNOTATION_SERVING_PREFIX,
    CertManager, PHASE_PROMOTED, PHASE_STAGED, Tick, dns_names, generate, pem_blocks,
};
use erdma_controller::leader::LeaderElector;
use erdma_controller::webhook::{CertSlot, InjectOptions, serve};
use erdma_k8s::fake::FakeApiServer;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Server {
    addr: std::net::SocketAddr,
    slot: Arc<CertSlot>,
    ca: String,
    _cancel: tokio_util::sync::DropGuard,
}

async fn server(opts: InjectOptions) -> Server {
    let names = dns_names(
        "alibabacloud-erdma-controller",
        "kube-system",
        "cluster.local",
    );
    let b = generate(&names, Duration::from_secs(3600)).unwrap();
    let slot = CertSlot::new(&b.cert_pem, &b.key_pem).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(serve(listener, slot.clone(), opts, cancel.clone()));
    Server {
        addr,
        slot,
        ca: b.ca_pem,
        _cancel: cancel.drop_guard(),
    }
}

fn opts() -> InjectOptions {
    InjectOptions {
        device_plugin: true,
        inject: true,
        image: "registry.example/smcr_init:v1".into(),
        metrics: Default::default(),
        events: None,
    }
}

/// POSTs `body` over HTTPS, trusting only `ca`, with SNI = the Service's DNS name.
async fn post(
    addr: std::net::SocketAddr,
    ca: &str,
    path: &str,
    body: &str,
) -> Result<Value, String> {
    let (_, _, bytes) = call(addr, ca, "POST", path, body.as_bytes().to_vec()).await?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// One request over HTTPS, trusting only `ca`, with SNI = the Service's DNS name: the status,
/// the content type and the body.
async fn call(
    addr: std::net::SocketAddr,
    ca: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Option<String>, Bytes), String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // As the API server does: connect to the Service endpoint, verify the Service's DNS name.
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name =
        rustls::pki_types::ServerName::try_from("alibabacloud-erdma-controller.kube-system.svc")
            .unwrap();
    let stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "alibabacloud-erdma-controller.kube-system.svc")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((status, content_type, bytes))
}

fn pod(annotation: Option<&str>, erdma: bool, init: Vec<Value>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "image": "pytorch",
            "resources": if erdma { json!({"limits": {"aliyun/erdma": "1"}, "requests": {"aliyun/erdma": "1"}}) } else { json!({}) }}]}
    });
    if let Some(a) = annotation {
        p["metadata"]["annotations"] = json!({"network.alibabacloud.com/erdma-smcr": a});
    }
    if !init.is_empty() {
        p["spec"]["initContainers"] = Value::Array(init);
    }
    p
}

fn review(api: &str, pod: &Value) -> String {
    json!({"apiVersion": api, "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "admin"},
        "object": pod, "dryRun": false}})
    .to_string()
}

fn patch_of(answer: &Value) -> Option<Value> {
    let p = answer["response"]["patch"].as_str()?;
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    Some(
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(p).unwrap())
            .unwrap(),
    )
}

/// Applies our two patch forms (`add /spec/initContainers` and `.../-`) to a pod.
fn apply(pod: &mut Value, patch: &Value) {
    for op in patch.as_array().unwrap() {
        assert_eq!(op["op"], "add");
        match op["path"].as_str().unwrap() {
            "/spec/initContainers" => pod["spec"]["initContainers"] = op["value"].clone(),
            "/spec/initContainers/-" => pod["spec"]["initContainers"]
                .as_array_mut()
                .unwrap()
                .push(op["value"].clone()),
            p => panic!("unexpected path {p}"),
        }
    }
}

#[tokio::test]
async fn injects_smcr_init_exactly_once() {
    let s = server(opts()).await;
    let mut p = pod(Some("true"), true, vec![]);
    let a = post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &p),
    )
    .await
    .unwrap();
    assert_eq!(a["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(a["kind"], "AdmissionReview");
    assert_eq!(a["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(a["response"]["allowed"], true);
    let patch = patch_of(&a).expect("patched");
    assert_eq!(patch[0]["path"], "/spec/initContainers");
    apply(&mut p, &patch);
    assert_eq!(
        p["spec"]["initContainers"],
        json!([{
            "name": "smcr-init", "image": "registry.example/smcr_init:v1", "imagePullPolicy": "Always",
            "command": ["/usr/local/bin/smcr_init"], "args": ["verify"],
            "env": [
                {"name": "ERDMA_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "ERDMA_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
            ],
            "resources": {"limits": {"aliyun/erdma": "1"}, "requests": {"aliyun/erdma": "1"}},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            }
        }])
    );
    // The mutated pod comes back (reinvocation, or a controller re-creating it): no second copy.
    let again = post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &p),
    )
    .await
    .unwrap();
    assert_eq!(again["response"]["allowed"], true);
    assert!(patch_of(&again).is_none(), "no double injection");
}

#[tokio::test]
async fn appends_after_existing_init_containers_and_serves_the_original_path() {
    let s = server(opts()).await;
    let mut p = pod(
        Some("True"),
        true,
        vec![json!({"name": "fetch", "image": "busybox"})],
    );
    let a = post(
        s.addr,
        &s.ca,
        "/mutating",
        &review("admission.k8s.io/v1beta1", &p),
    )
    .await
    .unwrap();
    assert_eq!(a["apiVersion"], "admission.k8s.io/v1beta1");
    let patch = patch_of(&a).unwrap();
    assert_eq!(patch[0]["path"], "/spec/initContainers/-");
    apply(&mut p, &patch);
    let names: Vec<&str> = p["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fetch", "smcr-init"]);
}

#[tokio::test]
async fn pods_without_the_annotation_or_the_resource_are_untouched() {
    let s = server(opts()).await;
    let mut init_only = pod(
        Some("true"),
        false,
        vec![json!({"name": "i", "resources": {"limits": {"aliyun/erdma": "1"}}})],
    );
    init_only["metadata"]["name"] = json!("init-only");
    let cases = [
        ("no annotation", pod(None, true, vec![]), false),
        ("no resource", pod(Some("true"), false, vec![]), false),
        ("annotation false", pod(Some("false"), true, vec![]), false),
        ("init container requests it", init_only, true),
    ];
    for (what, p, injected) in cases {
        let a = post(
            s.addr,
            &s.ca,
            "/mutate-pod",
            &review("admission.k8s.io/v1", &p),
        )
        .await
        .unwrap();
        assert_eq!(a["response"]["allowed"], true, "{what}");
        assert_eq!(patch_of(&a).is_some(), injected, "{what}");
    }
    // Disabled by configuration.
    for o in [
        InjectOptions {
            device_plugin: false,
            ..opts()
        },
        InjectOptions {
            inject: false,
            ..opts()
        },
    ] {
        let s = server(o).await;
        let a = post(
            s.addr,
            &s.ca,
            "/mutate-pod",
            &review("admission.k8s.io/v1", &pod(Some("true"), true, vec![])),
        )
        .await
        .unwrap();
        assert!(patch_of(&a).is_none());
    }
}

/// Issue 45 item 1: a `hostNetwork` pod asking for SMC-R shares the node's network namespace, so
/// an init container there would change the node. The webhook leaves it as it is, says why in an
/// admission warning, and writes a Warning Event in the pod's namespace.
#[tokio::test]
async fn host_network_pods_are_left_alone_with_a_warning_and_an_event() {
    let api = FakeApiServer::new();
    let events = erdma_k8s::events::Events::new(api.client(), "erdma-controller", "replica-a");
    let s = server(InjectOptions {
        events: Some(events),
        ..opts()
    })
    .await;
    let mut p = pod(Some("true"), true, vec![]);
    p["spec"]["hostNetwork"] = json!(true);
    let a = post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &p),
    )
    .await
    .unwrap();
    assert_eq!(a["response"]["allowed"], true);
    assert!(patch_of(&a).is_none(), "hostNetwork pod mutated: {a}");
    let warning = a["response"]["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.contains("ml/trainer")
            && warning.contains("hostNetwork")
            && warning.contains("Fix"),
        "{warning}"
    );
    // The Event is written in the background: wait for it (no time limit, the test runner's).
    let event = loop {
        let evs: Vec<k8s_openapi::api::events::v1::Event> = api.list(Some("ml"));
        if let Some(e) = evs.into_iter().next() {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("SmcrSkippedHostNetwork"));
    let regarding = event.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.name.as_deref(), Some("trainer"));
    assert!(event.note.unwrap().contains("hostNetwork"));
    // hostNetwork: false is an ordinary pod.
    p["spec"]["hostNetwork"] = json!(false);
    let a = post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &p),
    )
    .await
    .unwrap();
    assert!(patch_of(&a).is_some());
}

/// Issue 45 item 1: whatever the pod, the injected container is never privileged and adds no
/// capability: it passes Pod Security `restricted` (non-root, no escalation, every capability
/// dropped, RuntimeDefault seccomp) and only checks what the agent configured (`verify`).
#[test]
fn the_injected_container_is_never_privileged() {
    let c = serde_json::to_value(erdma_controller::webhook::init_container("img")).unwrap();
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], json!(true), "{c}");
    assert!(sc["capabilities"].get("add").is_none(), "{c}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false));
    assert_eq!(sc["runAsNonRoot"], json!(true));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["args"], json!(["verify"]));
}

#[tokio::test]
async fn bad_input_never_blocks_pod_creation() {
    let s = server(opts()).await;
    let a = post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review(
            "admission.k8s.io/v1",
            &pod(Some("yes please"), true, vec![]),
        ),
    )
    .await
    .unwrap();
    assert_eq!(a["response"]["allowed"], true);
    assert!(patch_of(&a).is_none());
    assert!(
        a["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not a boolean")
    );
    for body in [
        "{not json",
        "{}",
        r#"{"request": {"uid": "u1", "object": {"spec": 5}}}"#,
    ] {
        let a = post(s.addr, &s.ca, "/mutate-pod", body).await.unwrap();
        assert_eq!(a["response"]["allowed"], true, "{body}");
        assert!(a["response"].get("patch").is_none());
    }
}

#[tokio::test]
async fn rotated_certificates_are_served_without_restart() {
    let s = server(opts()).await;
    let body = review("admission.k8s.io/v1", &pod(None, true, vec![]));
    post(s.addr, &s.ca, "/mutate-pod", &body)
        .await
        .expect("old CA trusted");
    let names = dns_names(
        "alibabacloud-erdma-controller",
        "kube-system",
        "cluster.local",
    );
    let fresh = generate(&names, Duration::from_secs(3600)).unwrap();
    s.slot.replace(&fresh.cert_pem, &fresh.key_pem).unwrap();
    post(s.addr, &fresh.ca_pem, "/mutate-pod", &body)
        .await
        .expect("new CA trusted");
    assert!(
        post(s.addr, &s.ca, "/mutate-pod", &body).await.is_err(),
        "old CA no longer matches"
    );
}

const SECRET: &str = "alibabacloud-erdma-controller-webhook-tls";
const MWC: &str = "alibabacloud-erdma-controller";

fn webhook_config(api: &FakeApiServer) {
    api.put(&MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(MWC.into()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "erdma.network.alibabacloud.com".into(),
            client_config: WebhookClientConfig::default(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            ..Default::default()
        }]),
    });
}

fn manager(api: &FakeApiServer, identity: &str) -> CertManager {
    // The install creates the Secret empty (the controller may not create Secrets).
    if api.get::<Secret>(Some("kube-system"), SECRET).is_none() {
        api.put(&Secret {
            metadata: ObjectMeta {
                name: Some(SECRET.into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            ..Default::default()
        });
    }
    CertManager::new(
        api.client(),
        "kube-system",
        SECRET,
        MWC,
        dns_names(
            "alibabacloud-erdma-controller",
            "kube-system",
            "cluster.local",
        ),
        identity,
    )
}

/// The `caBundle` as the API server would read it now.
fn ca_bundle(api: &FakeApiServer) -> String {
    let mwc: MutatingWebhookConfiguration = api.get(None, MWC).unwrap();
    mwc.webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8(b.0.clone()).unwrap())
        .unwrap_or_default()
}

fn secret_phase(api: &FakeApiServer) -> Option<String> {
    let s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    s.metadata
        .annotations
        .unwrap()
        .get(ANNOTATION_PHASE)
        .cloned()
}

/// Makes the Secret's certificate due for rotation (expired long ago).
fn expire_certificate(api: &FakeApiServer) {
    let mut s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    s.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_NOT_AFTER.into(), "1000".into());
    api.put(&s);
}

/// One replica: its own manager, certificate slot and TLS listener.
struct Replica {
    mgr: CertManager,
    slot: Arc<CertSlot>,
    addr: std::net::SocketAddr,
    _cancel: tokio_util::sync::DropGuard,
}

async fn replica(api: &FakeApiServer, identity: &str) -> Replica {
    let mgr = manager(api, identity);
    let b = mgr.current().await.unwrap();
    let slot = CertSlot::new(&b.cert_pem, &b.key_pem).unwrap();
    mgr.tick(&slot).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(serve(listener, slot.clone(), opts(), cancel.clone()));
    Replica {
        mgr,
        slot,
        addr,
        _cancel: cancel.drop_guard(),
    }
}

/// An admission call as the API server makes it: trusting exactly the current `caBundle`.
async fn admit(api: &FakeApiServer, addr: std::net::SocketAddr) -> Result<Value, String> {
    let bundle = ca_bundle(api);
    post(
        addr,
        &bundle,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &pod(None, false, vec![])),
    )
    .await
}

#[tokio::test]
async fn first_tick_fills_the_installed_secret_and_patches_the_ca_bundle() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let r = replica(&api, "controller-0").await;
    let secret: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    // The install's type is kept (a Secret's type cannot change).
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let ca = String::from_utf8(secret.data.unwrap()["ca.crt"].0.clone()).unwrap();
    assert_eq!(pem_blocks(&ca_bundle(&api)), pem_blocks(&ca));
    let again = r.mgr.tick(&r.slot).await.unwrap();
    assert_eq!(again, Tick::default(), "valid and patched: nothing to do");
    assert!(admit(&api, r.addr).await.is_ok());
}

/// The controller may not create Secrets (issue 45): without the installed one it creates
/// nothing and says what to do.
#[tokio::test]
async fn a_missing_secret_is_not_created_and_the_error_names_the_fix() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let mgr = CertManager::new(
        api.client(),
        "kube-system",
        SECRET,
        MWC,
        dns_names(
            "alibabacloud-erdma-controller",
            "kube-system",
            "cluster.local",
        ),
        "controller-0",
    );
    let err = mgr.current().await.unwrap_err().to_string();
    assert!(
        err.contains(SECRET) && err.contains("does not exist") && err.contains("install again"),
        "{err}"
    );
    assert!(api.get::<Secret>(Some("kube-system"), SECRET).is_none());
    assert!(api.requests_matching("POST", "/secrets").is_empty());
}

#[tokio::test]
async fn old_ca_stays_trusted_until_every_replica_serves_the_new_certificate() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let a = replica(&api, "controller-0").await;
    let b = replica(&api, "controller-1").await;
    let old_ca = pem_blocks(&ca_bundle(&api));
    assert_eq!(old_ca.len(), 1);
    let old_cert = b.slot.cert_pem();

    // Near expiry: replica a drives the rotation; replica b does not tick yet.
    expire_certificate(&api);
    let t = a.mgr.tick(&a.slot).await.unwrap();
    assert_eq!(t.advanced, Some(PHASE_STAGED));
    assert_eq!(
        a.slot.cert_pem(),
        old_cert,
        "staged: still the old certificate"
    );
    let t = a.mgr.tick(&a.slot).await.unwrap();
    assert!(
        t.bundle_extended,
        "the new CA is added before anything serves it"
    );
    assert_eq!(t.advanced, Some(PHASE_PROMOTED));
    assert_eq!(pem_blocks(&ca_bundle(&api)).len(), 2);
    let t = a.mgr.tick(&a.slot).await.unwrap();
    assert!(t.reloaded);
    assert_ne!(a.slot.cert_pem(), old_cert);
    // b still serves the old certificate: a keeps ticking, the old CA stays.
    for _ in 0..3 {
        let t = a.mgr.tick(&a.slot).await.unwrap();
        assert_eq!(
            t.advanced, None,
            "b has not acknowledged the new certificate"
        );
    }
    let bundle = pem_blocks(&ca_bundle(&api));
    assert_eq!(bundle.len(), 2);
    assert!(bundle.contains(&old_ca[0]));
    assert_eq!(b.slot.cert_pem(), old_cert);
    assert!(
        admit(&api, a.addr).await.is_ok(),
        "a: new certificate, new CA trusted"
    );
    assert!(
        admit(&api, b.addr).await.is_ok(),
        "b: old certificate, old CA still trusted"
    );
    assert_eq!(secret_phase(&api).as_deref(), Some(PHASE_PROMOTED));

    // b reloads and acknowledges; the next tick (either replica) releases and drops the old CA.
    let t = b.mgr.tick(&b.slot).await.unwrap();
    assert!(t.reloaded);
    assert_eq!(t.advanced, Some("stable"));
    assert!(t.bundle_pruned);
    let bundle = pem_blocks(&ca_bundle(&api));
    assert_eq!(bundle.len(), 1);
    assert_ne!(bundle, old_ca);
    assert_eq!(secret_phase(&api), None);
    assert!(admit(&api, a.addr).await.is_ok());
    assert!(admit(&api, b.addr).await.is_ok());
    let s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    let data = s.data.unwrap();
    for k in [
        "previous-ca.crt",
        "next-ca.crt",
        "next-tls.crt",
        "next-tls.key",
    ] {
        assert!(!data.contains_key(k), "{k} left behind");
    }
}

/// Adds the serving acknowledgement of a replica that is `gone` to the Secret, and a rotation
/// request when `rotate`.
fn stale_ack(api: &FakeApiServer, gone: &str, rotate: bool) {
    let mut s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    let ann = s.metadata.annotations.as_mut().unwrap();
    ann.insert(
        format!("{ANNOTATION_SERVING_PREFIX}{gone}"),
        "00ff 1000".into(),
    );
    if rotate {
        ann.insert(ANNOTATION_ROTATE.into(), "now".into());
    }
    api.put(&s);
}

#[tokio::test]
async fn a_gone_replicas_stale_acknowledgement_does_not_block_the_rotation() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let a = replica(&api, "controller-0").await;
    // A replica that died long ago, serving some other certificate.
    stale_ack(&api, "controller-old", true);
    let mut phases = Vec::new();
    for _ in 0..4 {
        if let Some(p) = a.mgr.tick(&a.slot).await.unwrap().advanced {
            phases.push(p);
        }
    }
    assert_eq!(phases, [PHASE_STAGED, PHASE_PROMOTED, "stable"]);
    let s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    let ann = s.metadata.annotations.unwrap();
    assert!(
        !ann.contains_key(&format!("{ANNOTATION_SERVING_PREFIX}controller-old")),
        "stale acknowledgement removed"
    );
    assert!(!ann.contains_key(ANNOTATION_ROTATE), "request consumed");
}

#[tokio::test]
async fn stale_acknowledgements_do_not_pile_up_between_rotations() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let a = replica(&api, "controller-0").await;
    stale_ack(&api, "controller-gone", false);
    let t = a.mgr.tick(&a.slot).await.unwrap();
    assert_eq!(t.advanced, None, "no rotation needed");
    let s: Secret = api.get(Some("kube-system"), SECRET).unwrap();
    let acks: Vec<String> = s
        .metadata
        .annotations
        .unwrap()
        .into_keys()
        .filter(|k| k.starts_with(ANNOTATION_SERVING_PREFIX))
        .collect();
    assert_eq!(acks, [format!("{ANNOTATION_SERVING_PREFIX}controller-0")]);
}

/// Two replicas tick at different paces while a client keeps making admission calls to both,
/// each time trusting exactly the `caBundle` in the configuration at that moment. Three
/// rotations; not one call may fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotation_with_two_replicas_never_fails_an_admission_call() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let replicas = [
        replica(&api, "controller-0").await,
        replica(&api, "controller-1").await,
    ];
    let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
    let stop = CancellationToken::new();
    let mut tickers = Vec::new();
    // Paced by the client's progress, not by the clock: replica 0 ticks after every 5 calls,
    // replica 1 after every 30, so every phase of every rotation sees admission calls.
    let calls_made = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (r, pace) in replicas.iter().zip([5u64, 30]) {
        let (mgr, slot, stop) = (r.mgr.clone(), r.slot.clone(), stop.clone());
        let calls_made = calls_made.clone();
        tickers.push(tokio::spawn(async move {
            let mut phases = Vec::new();
            while !stop.is_cancelled() {
                match mgr.tick(&slot).await {
                    Ok(t) => phases.extend(t.advanced),
                    Err(e) => panic!("{}: tick failed: {e}", mgr.identity),
                }
                let from = calls_made.load(std::sync::atomic::Ordering::SeqCst);
                while calls_made.load(std::sync::atomic::Ordering::SeqCst) < from + pace
                    && !stop.is_cancelled()
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            phases
        }));
    }
    // The client: one admission call after another, alternating replicas, each trusting the
    // caBundle read just before it.
    let client = {
        let (api, stop, calls_made) = (api.clone(), stop.clone(), calls_made.clone());
        tokio::spawn(async move {
            let (mut calls, mut failures, mut max_cas) = (0u64, Vec::new(), 0);
            while !stop.is_cancelled() {
                for addr in &addrs {
                    calls += 1;
                    calls_made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    max_cas = max_cas.max(pem_blocks(&ca_bundle(&api)).len());
                    match admit(&api, *addr).await {
                        Ok(v) => assert_eq!(v["response"]["allowed"], true),
                        Err(e) => failures.push(format!("call {calls} to {addr}: {e}")),
                    }
                }
            }
            (calls, failures, max_cas)
        })
    };
    let mut cas_seen = std::collections::BTreeSet::from([pem_blocks(&ca_bundle(&api)).remove(0)]);
    let mut rotations = 0;
    while rotations < 3 {
        if secret_phase(&api).is_none() {
            let cas = pem_blocks(&ca_bundle(&api));
            if cas.len() == 1 {
                if cas_seen.insert(cas[0].clone()) {
                    rotations += 1;
                }
                if rotations < 3 {
                    replicas[0].mgr.request_rotation().await.unwrap();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let (calls, failures, max_cas) = client.await.unwrap();
    let mut phases = Vec::new();
    for t in tickers {
        phases.extend(t.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} of {calls} admission calls failed: {failures:?}",
        failures.len()
    );
    assert_eq!(
        max_cas, 2,
        "the bundle held the old and the new CA during rotations"
    );
    assert_eq!(
        phases.iter().filter(|p| **p == "stable").count(),
        3,
        "{phases:?}"
    );
    let final_ca = pem_blocks(&ca_bundle(&api));
    assert_eq!(final_ca.len(), 1);
    for r in &replicas {
        assert!(admit(&api, r.addr).await.is_ok());
    }
    eprintln!("{calls} admission calls over 3 rotations, none failed");
}

#[tokio::test]
async fn leader_election_hands_over_after_the_lease_expires() {
    let api = FakeApiServer::new();
    let mk = |id: &str| {
        let mut e = LeaderElector::new(api.client(), "kube-system", id);
        e.lease_duration = Duration::from_secs(1);
        e
    };
    let (a, b) = (mk("pod-a"), mk("pod-b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "held by a");
    assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "expired: b takes over"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap());
    let lease: k8s_openapi::api::coordination::v1::Lease = api
        .get(Some("kube-system"), "26dc1c71.alibabacloud.com")
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("pod-b"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test]
async fn reviews_and_injections_are_counted_and_served_on_metrics() {
    let metrics = Arc::new(erdma_controller::metrics::Metrics::default());
    let s = server(InjectOptions {
        metrics: metrics.clone(),
        ..opts()
    })
    .await;
    post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &pod(Some("true"), true, vec![])),
    )
    .await
    .unwrap();
    post(
        s.addr,
        &s.ca,
        "/mutate-pod",
        &review("admission.k8s.io/v1", &pod(None, true, vec![])),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(erdma_controller::metrics::serve(
        listener,
        metrics,
        cancel.clone(),
    ));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(
            hyper::Request::get("/metrics")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(text.contains("erdma_webhook_reviews_total 2"), "{text}");
    assert!(text.contains("erdma_webhook_injections_total 1"), "{text}");
    assert!(text.contains("erdma_controller_leader 0"), "{text}");
    assert!(
        text.contains("erdma_controller_reconciles_total{controller=\"node\",result=\"ok\"} 0"),
        "{text}"
    );
    cancel.cancel();
}

/// The webhook's paths and answers, as before the port to axum: both review paths take POST
/// only, `GET /healthz` and `GET /readyz` answer `ok`, everything else `404 not found`; a body
/// over the limit is answered (allowed, with a warning), never refused.
#[tokio::test]
async fn the_webhooks_paths_and_answers() {
    let s = server(opts()).await;
    let body = review("admission.k8s.io/v1", &pod(Some("true"), true, vec![]));
    for path in ["/mutate-pod", "/mutating"] {
        let (status, ctype, bytes) = call(s.addr, &s.ca, "POST", path, body.clone().into())
            .await
            .unwrap();
        assert_eq!(
            (status, ctype.as_deref()),
            (200, Some("application/json")),
            "{path}"
        );
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(patch_of(&answer).is_some(), "{path}: {answer}");
    }
    for path in ["/healthz", "/readyz"] {
        let (status, _, bytes) = call(s.addr, &s.ca, "GET", path, vec![]).await.unwrap();
        assert_eq!((status, &bytes[..]), (200, &b"ok"[..]), "{path}");
    }
    for (method, path) in [
        ("GET", "/mutate-pod"),
        ("PUT", "/mutating"),
        ("POST", "/healthz"),
        ("GET", "/metrics"),
        ("POST", "/"),
    ] {
        let (status, _, bytes) = call(s.addr, &s.ca, method, path, vec![]).await.unwrap();
        assert_eq!(
            (status, &bytes[..]),
            (404, &b"not found"[..]),
            "{method} {path}"
        );
    }
    let huge = vec![b' '; erdma_controller::webhook::MAX_BODY + 1];
    let (status, _, bytes) = call(s.addr, &s.ca, "POST", "/mutate-pod", huge)
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"]["warnings"].is_array(), "{answer}");
}

/// The webhook stops with the shutdown, though the API server keeps its connection open and a
/// client stalls in its TLS handshake.
#[tokio::test]
async fn the_webhook_stops_with_open_connections() {
    let names = dns_names(
        "alibabacloud-erdma-controller",
        "kube-system",
        "cluster.local",
    );
    let b = generate(&names, Duration::from_secs(3600)).unwrap();
    let slot = CertSlot::new(&b.cert_pem, &b.key_pem).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let served = tokio::spawn(serve(listener, slot, opts(), cancel.clone()));
    // A kept-alive connection (the client's connection task holds it open) and a stalled one.
    let body = review("admission.k8s.io/v1", &pod(None, true, vec![]));
    post(addr, &b.ca_pem, "/mutate-pod", &body).await.unwrap();
    let _stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(4), served)
        .await
        .expect("the webhook stops within the controller's shutdown grace")
        .unwrap();
}

/// The metrics server's paths and answers: `/healthz`, `/readyz` `ok`, `/metrics` the
/// OpenMetrics text with its content type, elsewhere `404 not found`.
#[tokio::test]
async fn the_metrics_servers_paths_and_answers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let served = tokio::spawn(erdma_controller::metrics::serve(
        listener,
        Default::default(),
        cancel.clone(),
    ));
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    for path in ["/healthz", "/readyz"] {
        let a = get(path).await;
        assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
        assert!(a.ends_with("\r\n\r\nok"), "{a}");
    }
    let a = get("/metrics").await;
    assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
    assert!(
        a.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"),
        "{a}"
    );
    assert!(a.contains("erdma_controller_leader 0\n"), "{a}");
    assert!(a.ends_with("# EOF\n"), "{a}");
    let a = get("/nope").await;
    assert!(a.starts_with("HTTP/1.1 404 Not Found\r\n"), "{a}");
    assert!(a.ends_with("\r\n\r\nnot found"), "{a}");
    cancel.cancel();
    served.await.unwrap();
}

/// Issue 45 item 6: a replica that must serve the webhook is not ready (the Service sends it no
/// admission call) until its webhook port serves; liveness is unaffected.
#[tokio::test]
async fn readiness_waits_for_the_webhook_port() {
    let metrics = Arc::new(erdma_controller::metrics::Metrics::default());
    metrics
        .webhook_required
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    tokio::spawn(erdma_controller::metrics::serve(
        listener,
        metrics.clone(),
        cancel.clone(),
    ));
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let a = get("/readyz").await;
    assert!(a.starts_with("HTTP/1.1 503 "), "{a}");
    assert!(a.contains("webhook port does not serve yet"), "{a}");
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200 OK\r\n"));
    let s = server(InjectOptions {
        metrics: metrics.clone(),
        ..opts()
    })
    .await;
    // The webhook answers, and from then on the replica is ready.
    let body = review("admission.k8s.io/v1", &pod(None, true, vec![]));
    post(s.addr, &s.ca, "/mutate-pod", &body).await.unwrap();
    let a = get("/readyz").await;
    assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
    assert!(get("/metrics").await.contains("erdma_webhook_serving 1\n"));
}

/// An upgrade from the original: its Go controller patched its own CA into the entry's
/// `caBundle`, and its pods keep serving with that CA while the Deployment rolls. erdma adds its
/// CA beside it and never prunes a CA it did not issue, so an old pod's TLS keeps verifying
/// (with `failurePolicy: Fail`, a dropped CA would refuse every pod routed to an old pod); erdma's
/// own retired CA is still pruned after a rotation.
#[tokio::test]
async fn the_original_controllers_ca_stays_trusted_through_ticks_and_rotations() {
    let api = FakeApiServer::new();
    webhook_config(&api);
    let go = generate(
        &dns_names(
            "alibabacloud-erdma-controller",
            "kube-system",
            "cluster.local",
        ),
        Duration::from_secs(3600),
    )
    .unwrap();
    let mut mwc: MutatingWebhookConfiguration = api.get(None, MWC).unwrap();
    mwc.webhooks.as_mut().unwrap()[0].client_config.ca_bundle =
        Some(k8s_openapi::ByteString(go.ca_pem.clone().into_bytes()));
    api.put(&mwc);
    let go_ca = pem_blocks(&go.ca_pem);

    let a = replica(&api, "controller-0").await;
    let bundle = pem_blocks(&ca_bundle(&api));
    assert_eq!(bundle.len(), 2, "erdma's CA added beside the original's");
    assert!(bundle.contains(&go_ca[0]));
    let first_erdma_ca: Vec<String> = bundle.iter().filter(|c| **c != go_ca[0]).cloned().collect();
    for _ in 0..3 {
        a.mgr.tick(&a.slot).await.unwrap();
    }
    assert!(
        pem_blocks(&ca_bundle(&api)).contains(&go_ca[0]),
        "kept while ticking"
    );

    // A full rotation: erdma's first CA goes, the original's stays.
    expire_certificate(&api);
    for _ in 0..6 {
        a.mgr.tick(&a.slot).await.unwrap();
    }
    assert_eq!(secret_phase(&api), None, "the rotation finished");
    let bundle = pem_blocks(&ca_bundle(&api));
    assert!(
        bundle.contains(&go_ca[0]),
        "the original's CA is never pruned: {}",
        bundle.len()
    );
    assert!(
        !bundle.contains(&first_erdma_ca[0]),
        "erdma's retired CA is pruned"
    );
    assert_eq!(bundle.len(), 2);
    assert!(admit(&api, a.addr).await.is_ok());
}
