//! The lab's admission step (`erdma-fake-kubelet admit`) against webhook servers started here:
//! HTTPS with their own CA (rcgen), certificates for the service DNS name, answers written as a
//! webhook writes them. The chart's MutatingWebhookConfiguration is the one the webhook is
//! called for; expectations are the API server's rules, written out.

use erdma_fake_kubelet::admission::{Endpoints, admit_from};
use erdma_fake_kubelet::podspec::manifest;
use erdma_k8s::fake::FakeApiServer;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a test webhook saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    host: String,
    body: Value,
}

/// A webhook server over TLS with a CA of its own and a certificate for `names`.
struct Webhook {
    addr: std::net::SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Answer = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

async fn webhook(names: &[&str], answer: Answer) -> Webhook {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key)).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf_cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let log = log.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        let answer = answer.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let host = req
                                .headers()
                                .get("host")
                                .and_then(|h| h.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let out = answer(&body);
                            log.lock().unwrap().push(Seen { path, host, body });
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(out.to_string())))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Webhook {
        addr,
        ca_pem: ca_cert.pem(),
        seen,
        task,
    }
}

fn b64(v: &Value) -> Value {
    serde_json::to_value(ByteString(v.to_string().into_bytes())).unwrap()
}

/// An answer allowing the request with `patch` (none when null), echoing the uid.
fn allow_with(patch: Value) -> Answer {
    Arc::new(move |req: &Value| {
        let mut response = json!({"uid": req["request"]["uid"], "allowed": true});
        if !patch.is_null() {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = b64(&patch);
        }
        json!({"apiVersion": req["apiVersion"], "kind": "AdmissionReview", "response": response})
    })
}

const SVC_NAME: &str = "alibabacloud-erdma-controller.kube-system.svc";
const EP_KEY: &str = "kube-system/alibabacloud-erdma-controller";

/// The chart's MutatingWebhookConfiguration (local-webhook.json) with `ca` as its caBundle
/// (the controller writes it in a cluster) and `edit` applied.
fn chart_config(ca: &str, edit: impl Fn(&mut Value)) -> MutatingWebhookConfiguration {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/ci/rendered/local-webhook.json");
    let chart: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut cfg = chart["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap()
        .clone();
    cfg["webhooks"][0]["clientConfig"]["caBundle"] =
        serde_json::to_value(ByteString(ca.as_bytes().to_vec())).unwrap();
    edit(&mut cfg);
    serde_json::from_value(cfg).unwrap()
}

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: pod-s
  namespace: lab
  labels: {app: demo}
  annotations: {network.alibabacloud.com/erdma-smcr: "true"}
spec:
  containers:
    - name: app
      image: lab.local/rdma-tools:1
      resources: {limits: {aliyun/erdma: "1"}}
"#;

fn endpoints(addr: std::net::SocketAddr) -> Endpoints {
    Endpoints::parse(&[format!("{EP_KEY}={addr}")]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_webhook_is_called_and_its_patch_applied() {
    let patch = json!([
        {"op": "add", "path": "/spec/initContainers", "value": [
            {"name": "smcr-init", "image": "ghcr.io/erdma/smcr-init:0.1.0", "command": ["/usr/local/bin/smcr_init"]}
        ]},
        {"op": "add", "path": "/metadata/labels/injected", "value": "yes"}
    ]);
    let hook = webhook(&[SVC_NAME], allow_with(patch)).await;
    let api = FakeApiServer::new();
    api.put(&chart_config(&hook.ca_pem, |_| {}));
    // Another configuration (sorted first) for Deployments only: not called (it has no
    // --endpoint, so a call would fail the test).
    api.put(&serde_json::from_value::<MutatingWebhookConfiguration>(json!({
        "metadata": {"name": "a-deployments"},
        "webhooks": [{
            "name": "deployments.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"namespace": "other", "name": "absent"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]
        }]
    })).unwrap());
    // One whose objectSelector the pod does not match, and one whose namespaceSelector it
    // does (the lab namespace is not in the API server: its name label counts).
    api.put(&serde_json::from_value::<MutatingWebhookConfiguration>(json!({
        "metadata": {"name": "c-selectors"},
        "webhooks": [
            {
                "name": "by-object.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"service": {"namespace": "other", "name": "absent"}},
                "objectSelector": {"matchLabels": {"app": "other"}},
                "rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]
            },
            {
                "name": "by-namespace.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"service": {"namespace": "other", "name": "absent"}},
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["lab"]}]},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
            }
        ]
    })).unwrap());
    let m = manifest::parse(POD, "pod.yaml", None).unwrap();
    let out = admit_from(&api.client(), &m, &endpoints(hook.addr))
        .await
        .unwrap();
    let summary: Vec<(String, bool, String)> = out
        .webhooks
        .iter()
        .map(|w| (w.webhook.clone(), w.called, w.outcome.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "deployments.example.com".to_string(),
                false,
                "not called: no rule matches CREATE of v1 pods".to_string()
            ),
            (
                "alibabacloud-erdma-controller.mutating.k8s.io".into(),
                true,
                "allowed, patched".into()
            ),
            (
                "by-object.example.com".into(),
                false,
                "not called: objectSelector does not match the pod's labels".into()
            ),
            (
                "by-namespace.example.com".into(),
                false,
                "not called: namespaceSelector does not match the namespace's labels".into()
            ),
        ]
    );
    let called = &out.webhooks[1];
    assert_eq!(called.configuration, "alibabacloud-erdma-controller");
    assert_eq!(
        called.changes,
        ["add /spec/initContainers", "add /metadata/labels/injected"]
    );
    assert_eq!(
        called.url,
        format!("https://{SVC_NAME}:443/mutating via {}", hook.addr)
    );
    let spec = out.pod.spec.as_ref().unwrap();
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        (init.name.as_str(), init.image.as_deref()),
        ("smcr-init", Some("ghcr.io/erdma/smcr-init:0.1.0"))
    );
    assert_eq!(spec.containers[0].name, "app", "the rest is kept");
    assert_eq!(out.pod.metadata.labels.as_ref().unwrap()["injected"], "yes");
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("Namespace lab is not in the API server")),
        "{:?}",
        out.notes
    );

    // The request as the API server sends it.
    let seen = hook.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.path, "/mutating");
    assert_eq!(s.host, format!("{SVC_NAME}:443"));
    let r = &s.body["request"];
    assert_eq!(
        s.body["apiVersion"], "admission.k8s.io/v1",
        "the chart's first version"
    );
    assert_eq!(s.body["kind"], "AdmissionReview");
    assert_eq!(r["uid"].as_str().unwrap().len(), 36);
    assert_eq!(
        r["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(
        r["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(r["operation"], "CREATE");
    assert_eq!(
        (r["namespace"].as_str(), r["name"].as_str()),
        (Some("lab"), Some("pod-s"))
    );
    assert_eq!(r["dryRun"], false);
    assert_eq!(r["userInfo"]["username"], "kubernetes-admin");
    assert_eq!(r["object"]["kind"], "Pod");
    assert_eq!(r["object"]["apiVersion"], "v1");
    assert_eq!(
        r["object"]["metadata"]["annotations"]["network.alibabacloud.com/erdma-smcr"],
        "true"
    );
    assert!(r["object"]["spec"].get("initContainers").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_fails_follows_its_failure_policy() {
    let m = manifest::parse(POD, "pod.yaml", None).unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let ca = webhook(&[SVC_NAME], allow_with(Value::Null))
        .await
        .ca_pem
        .clone();
    let run = |policy: &'static str, timeout: i64, ca: String, addr: std::net::SocketAddr| {
        let m = m.clone();
        async move {
            let api = FakeApiServer::new();
            api.put(&chart_config(&ca, |c| {
                c["webhooks"][0]["failurePolicy"] = json!(policy);
                c["webhooks"][0]["timeoutSeconds"] = json!(timeout);
            }));
            admit_from(&api.client(), &m, &endpoints(addr)).await
        }
    };
    // The server is down. Ignore: the pod goes on unchanged, noted.
    let out = run("Ignore", 10, ca.clone(), closed).await.unwrap();
    assert_eq!(out.pod, m.pod);
    let w = &out.webhooks[0];
    assert!(w.called);
    assert!(
        w.outcome.starts_with("failed (failurePolicy Ignore: the pod goes on): failed to call webhook: Post \"https://alibabacloud-erdma-controller.kube-system.svc:443/mutating\" (at 127.0.0.1:")
            && w.outcome.contains("dial tcp"),
        "{}",
        w.outcome
    );
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("failed and was ignored"))
    );
    // Fail: the pod is refused, naming the webhook.
    let e = run("Fail", 10, ca.clone(), closed)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Internal error occurred: failed calling webhook \"alibabacloud-erdma-controller.mutating.k8s.io\" (MutatingWebhookConfiguration alibabacloud-erdma-controller, failurePolicy Fail)")
            && e.contains("dial tcp")
            && e.contains("Fix:"),
        "{e}"
    );

    // A server whose certificate is for another name: not verified, so nothing is sent.
    let other = webhook(&["other.kube-system.svc"], allow_with(Value::Null)).await;
    let e = run("Fail", 10, other.ca_pem.clone(), other.addr)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("is not verified for {SVC_NAME} by the caBundle")),
        "{e}"
    );
    assert!(other.seen.lock().unwrap().is_empty());
    // A server trusted by another CA: the same.
    let good = webhook(&[SVC_NAME], allow_with(Value::Null)).await;
    let e = run("Fail", 10, other.ca_pem.clone(), good.addr)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not verified"), "{e}");

    // A server that accepts and never answers: timeoutSeconds.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            kept.push(c);
        }
    });
    let t = Instant::now();
    let out = run("Ignore", 1, ca.clone(), silent_addr).await.unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        out.webhooks[0]
            .outcome
            .contains("context deadline exceeded (timeoutSeconds 1)"),
        "{}",
        out.webhooks[0].outcome
    );
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_broken_answers_and_bad_patches() {
    let m = manifest::parse(POD, "pod.yaml", None).unwrap();
    let run = |policy: &'static str, answer: Answer| {
        let m = m.clone();
        async move {
            let hook = webhook(&[SVC_NAME], answer).await;
            let api = FakeApiServer::new();
            api.put(&chart_config(&hook.ca_pem, |c| {
                c["webhooks"][0]["failurePolicy"] = json!(policy);
            }));
            admit_from(&api.client(), &m, &endpoints(hook.addr)).await
        }
    };
    // A denial refuses the pod whatever the failure policy.
    let deny: Answer = Arc::new(|req: &Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": req["request"]["uid"], "allowed": false,
                "status": {"code": 403, "message": "pods need an owner label"}}})
    });
    let e = run("Ignore", deny).await.unwrap_err().to_string();
    assert!(
        e.contains("admission webhook \"alibabacloud-erdma-controller.mutating.k8s.io\" denied the request: pods need an owner label"),
        "{e}"
    );
    // An answer for another request: a failed call.
    let wrong_uid: Answer = Arc::new(|_req: &Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "not-the-request", "allowed": true}})
    });
    let e = run("Fail", wrong_uid.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("received invalid webhook response: expected response.uid=")
            && e.contains("got \"not-the-request\""),
        "{e}"
    );
    let out = run("Ignore", wrong_uid).await.unwrap();
    assert_eq!(out.pod, m.pod);
    // A patch without its type (v1 requires patchType).
    let untyped: Answer = Arc::new(|req: &Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": req["request"]["uid"], "allowed": true, "patch": b64(&json!([]))}})
    });
    let e = run("Fail", untyped).await.unwrap_err().to_string();
    assert!(
        e.contains("response.patch but not response.patchType"),
        "{e}"
    );
    // A patch that does not apply refuses the pod even with Ignore.
    let bad = allow_with(json!([{"op": "remove", "path": "/spec/nope"}]));
    let e = run("Ignore", bad).await.unwrap_err().to_string();
    assert!(
        e.contains("its patch does not apply: JSON patch operation 0 (remove \"/spec/nope\")"),
        "{e}"
    );
    // A patch that leaves no Pod.
    let broken = allow_with(json!([{"op": "replace", "path": "/spec/containers", "value": 7}]));
    let e = run("Ignore", broken).await.unwrap_err().to_string();
    assert!(e.contains("the patched object is no Pod"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_the_admitted_pod_and_says_what_changed() {
    let d = tempfile::tempdir().unwrap();
    let patch = json!([{"op": "add", "path": "/spec/initContainers", "value": [{"name": "smcr-init", "image": "i"}]}]);
    let hook = webhook(&[SVC_NAME], allow_with(patch)).await;
    let api = FakeApiServer::new();
    api.put(&chart_config(&hook.ca_pem, |_| {}));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
    let kc = d.path().join("kc");
    erdma_k8s::fake::kubeconfig(&kc, addr).unwrap();
    let pod = d.path().join("pod.yaml");
    std::fs::write(&pod, POD).unwrap();
    let out_file = d.path().join("pod.admitted.json");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_erdma-fake-kubelet"));
    c.arg("admit")
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--manifest")
        .arg(&pod)
        .args(["--endpoint", &format!("{EP_KEY}={}", hook.addr)])
        .arg("-o")
        .arg(&out_file);
    let out = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("admit: lab/pod-s: webhook alibabacloud-erdma-controller.mutating.k8s.io (alibabacloud-erdma-controller) at https://alibabacloud-erdma-controller.kube-system.svc:443/mutating via ")
            && err.contains(": allowed, patched; changed: add /spec/initContainers"),
        "{err}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["webhooks"][0]["called"], true);
    let admitted: Value =
        serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(
        (admitted["apiVersion"].as_str(), admitted["kind"].as_str()),
        (Some("v1"), Some("Pod"))
    );
    assert_eq!(admitted["spec"]["initContainers"][0]["name"], "smcr-init");
    // `pod run --manifest` reads what it wrote.
    let m = manifest::load(&out_file, None).unwrap();
    assert_eq!(m.kind, "Pod");
    assert_eq!(
        m.pod.spec.unwrap().init_containers.unwrap()[0].name,
        "smcr-init"
    );
    // A webhook whose Service has no --endpoint: named, with the fix.
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_erdma-fake-kubelet"));
    c.arg("admit")
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--manifest")
        .arg(&pod)
        .arg("-o")
        .arg(d.path().join("x.json"));
    let out = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("clientConfig.service kube-system/alibabacloud-erdma-controller port 443")
            && err.contains("--endpoint kube-system/alibabacloud-erdma-controller=HOST:PORT"),
        "{err}"
    );
    cancel.cancel();
}
