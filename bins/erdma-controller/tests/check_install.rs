//! `erdma-controller --check-install NAMESPACE` (what the chart's `helm test` pod runs), as a
//! process against the in-memory API server over HTTP: the JSON verdict and the exit status.

use erdma_k8s::fake::{FakeApiServer, kubeconfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn agent(ready: i32) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("alibabacloud-erdma-agent".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        status: Some(DaemonSetStatus {
            desired_number_scheduled: 2,
            number_ready: ready,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn check(api: &FakeApiServer) -> (i32, Value) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    kubeconfig(&kc, addr).unwrap();
    let _dir = dir;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_erdma-controller"))
            .args(["--check-install", "kube-system"])
            .env("KUBECONFIG", &kc)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    cancel.cancel();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_install_passes_and_an_unready_agent_or_unpublished_ca_fails() {
    let api = FakeApiServer::new();
    api.put(&agent(1));
    let (code, report) = check(&api).await;
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        report["checks"][0]["detail"]
            .as_str()
            .unwrap()
            .split(';')
            .next(),
        Some("1 of 2 agents ready")
    );

    api.put(&agent(2));
    let mut hook = MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("alibabacloud-erdma-controller".into()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "alibabacloud-erdma-controller.mutating.k8s.io".into(),
            client_config: WebhookClientConfig::default(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            ..Default::default()
        }]),
    };
    api.put(&hook);
    let (code, report) = check(&api).await;
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["checks"][1]["name"], "webhook");
    assert_eq!(report["checks"][1]["ok"], false);

    hook.webhooks.as_mut().unwrap()[0].client_config.ca_bundle = Some(ByteString(b"CA".to_vec()));
    api.put(&hook);
    let (code, report) = check(&api).await;
    assert_eq!((code, &report["ok"]), (0, &Value::Bool(true)), "{report}");
    assert_eq!(report["namespace"], "kube-system");
}
