//! The fake API server served over HTTP (`FakeApiServer::serve_http`) and HTTPS (`serve_https`) to a kube client built
//! from the kubeconfig `erdma_k8s::fake::kubeconfig` writes, as a process other than the test
//! would use it (the agent benchmark does).

use erdma_k8s::fake::{FakeApiServer, FakeTls, kubeconfig, kubeconfig_tls};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

async fn client_for(api: &FakeApiServer, cancel: &CancellationToken) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
    let path = std::env::temp_dir().join(format!(
        "erdma-k8s-fake-http-{}.kubeconfig",
        std::process::id()
    ));
    kubeconfig(&path, addr).expect("write kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
    let _ = std::fs::remove_file(&path);
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_http_reads_and_patches_what_the_server_holds() {
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let cancel = CancellationToken::new();
    let client = client_for(&api, &cancel).await;
    let nodes: Api<Node> = Api::all(client);
    let n = nodes.get("n1").await.expect("GET over HTTP");
    assert_eq!(n.metadata.name.as_deref(), Some("n1"));
    let patch = serde_json::json!({"metadata": {"labels": {"a": "b"}}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("PATCH over HTTP");
    let stored: Node = api.get(None, "n1").expect("stored node");
    assert_eq!(
        stored
            .metadata
            .labels
            .unwrap_or_default()
            .get("a")
            .map(String::as_str),
        Some("b")
    );
    assert_eq!(api.requests_matching("PATCH", "/api/v1/nodes/n1").len(), 1);
    assert!(
        nodes.get("n2").await.is_err(),
        "a node the server does not hold"
    );
    cancel.cancel();
}

async fn client_from(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_https_trusts_the_kubeconfig_ca_and_only_it() {
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = FakeTls::generate().expect("TLS material");
    tokio::spawn(
        api.clone()
            .serve_https(listener, tls.clone(), cancel.clone()),
    );
    let dir = tempfile::tempdir().expect("temp dir");

    let trusted = dir.path().join("trusted.kubeconfig");
    kubeconfig_tls(&trusted, addr, &tls).expect("write kubeconfig");
    let text = std::fs::read_to_string(&trusted).expect("kubeconfig");
    assert!(text.contains(&format!("server: https://{addr}")), "{text}");
    let nodes: Api<Node> = Api::all(client_from(&trusted).await);
    let n = nodes.get("n1").await.expect("GET over HTTPS");
    assert_eq!(n.metadata.name.as_deref(), Some("n1"));
    assert_eq!(api.requests_matching("GET", "/api/v1/nodes/n1").len(), 1);

    // Another run's CA: the server's certificate does not chain to it, so nothing is sent.
    let other = FakeTls::generate().expect("other TLS material");
    assert_ne!(other.ca_pem(), tls.ca_pem());
    let untrusted = dir.path().join("untrusted.kubeconfig");
    kubeconfig_tls(&untrusted, addr, &other).expect("write kubeconfig");
    let nodes: Api<Node> = Api::all(client_from(&untrusted).await);
    assert!(
        nodes.get("n1").await.is_err(),
        "a server the CA did not sign"
    );
    assert_eq!(api.requests_matching("GET", "/api/v1/nodes/n1").len(), 1);
    cancel.cancel();
}
