//! `install::find_existing` against the fake API server: what it reads (every namespace's
//! DaemonSets and Deployments, Helm's release Secrets in the add-on's namespace, terway's
//! ConfigMap) and that a conflict found there is the one `decide_existing` names.

use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::{Existing, find_existing};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

fn daemon_set(ns: &str, name: &str, image: &str, labels: serde_json::Value) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn lists_every_namespace_and_finds_the_addon_another_release_and_terway() {
    let api = FakeApiServer::new();
    // Unrelated objects, and the original's agent under the release being installed (the
    // upgrade path): not conflicts.
    api.put(&daemon_set(
        "kube-system",
        "kube-proxy",
        "registry.k8s.io/kube-proxy:v1.34.0",
        json!({"k8s-app": "kube-proxy"}),
    ));
    let original = json!({
        "app.kubernetes.io/name": "alibabacloud-erdma-controller",
        "app.kubernetes.io/instance": "alibaba-erdma-controller",
        "tier": "agent",
    });
    api.put(&daemon_set(
        "kube-system",
        "alibabacloud-erdma-agent",
        "registry.aliyuncs.com/erdma/agent:latest",
        original.clone(),
    ));
    let client = api.client();
    assert_eq!(
        find_existing(&client, "kube-system", "alibaba-erdma-controller")
            .await
            .unwrap(),
        Existing::default()
    );
    // The same agent seen from another install (another namespace) is a conflict.
    let e = find_existing(&client, "erdma", "alibaba-erdma-controller")
        .await
        .unwrap();
    assert_eq!(e.conflicts.len(), 1, "{e:?}");
    assert_eq!(
        e.conflicts[0].location(),
        "DaemonSet kube-system/alibabacloud-erdma-agent"
    );

    // The console add-on, and terway with eRDMA on.
    api.put(&daemon_set(
        "ack-erdma-controller",
        "ack-erdma-agent",
        "registry-cn-hangzhou-vpc.ack.aliyuncs.com/acs/erdma-agent:v0.3",
        json!({"app": "ack-erdma-agent"}),
    ));
    let release: Secret = serde_json::from_value(json!({
        "metadata": {
            "namespace": "ack-erdma-controller",
            "name": "sh.helm.release.v1.ack-erdma-controller.v1",
            "labels": {"owner": "helm", "name": "ack-erdma-controller", "status": "deployed", "version": "1"},
        },
        "type": "helm.sh/release.v1",
        "data": {"release": "SDRzSUFBQUFBQUFBLw=="},
    }))
    .unwrap();
    api.put(&release);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": "eni-config"},
        "data": {"eni_conf": "{\"version\": \"1\", \"enable_erdma\": true}"},
    }))
    .unwrap();
    api.put(&cm);
    let e = find_existing(&client, "kube-system", "alibaba-erdma-controller")
        .await
        .unwrap();
    let at: Vec<String> = e.conflicts.iter().map(|c| c.location()).collect();
    assert_eq!(
        at,
        [
            "DaemonSet ack-erdma-controller/ack-erdma-agent",
            "Helm release ack-erdma-controller/ack-erdma-controller",
            "ConfigMap kube-system/eni-config eni_conf.enable_erdma=true",
        ]
    );
    // Helm's records are read in the add-on's namespace only, by Helm's label.
    let secret_lists = api.queries_matching("GET", "/secrets");
    assert!(
        secret_lists
            .iter()
            .all(|q| q.get("labelSelector").map(String::as_str) == Some("owner=helm")),
        "{secret_lists:?}"
    );
    assert!(
        api.requests_matching("GET", "/secrets")
            .iter()
            .all(|r| r.contains("/namespaces/ack-erdma-controller/secrets")),
        "{:?}",
        api.requests_matching("GET", "/secrets")
    );
}

#[tokio::test]
async fn a_refused_list_is_an_error_naming_what_was_read() {
    let api = FakeApiServer::new();
    api.fail_once("GET", "/daemonsets", 403);
    let e = find_existing(&api.client(), "kube-system", "alibaba-erdma-controller")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("list DaemonSets in every namespace (looking for another eRDMA installation)"),
        "{e}"
    );
}
