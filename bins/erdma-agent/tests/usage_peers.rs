//! Who may read the per-pod RDMA usage: `/usage` and the per-pod families of `/metrics` name
//! every RDMA pod of the node, so by default only loopback peers (processes on the node, and
//! `kubectl port-forward` to the agent's host-network pod) get them; any other peer gets 403
//! from `/usage` and `/metrics` without pod names. `--usage-remote` serves them to everyone.

use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use erdma_agent::health::{Exposition, HealthSources, router, serve_on};
use erdma_agent::usage::{NodeUsageCollector, UsageService};
use erdma_deviceplugin::Metrics;
use erdma_driver::DriverStatus;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use usage_fixture::one_pod_usage;

mod usage_fixture;

/// One pod, ml/trainer-0, with a QP on erdma_0.
const KERNEL: &str = "
device erdma_0 1
qp erdma_0 17 RTS 100
mr erdma_0 4096 100
counter erdma_0 1 tx_bytes_cnt 1
";

struct Node {
    usage: Arc<UsageService>,
    exposition: Exposition,
    _proc: tempfile::TempDir,
}

fn node() -> Node {
    let (usage, proc_root) = one_pod_usage(KERNEL, Some("n1".into()));
    // As the agent registers it: only the families that name no pod.
    let mut registry = Registry::default();
    registry.register_collector(Box::new(NodeUsageCollector(usage.clone())));
    let exposition = Exposition {
        registry: Arc::new(registry),
        plugin: Arc::new(Metrics::new()),
        health: HealthSources::fixed(DriverStatus::unmanaged()),
        usage: Some(usage.clone()),
    };
    Node {
        usage,
        exposition,
        _proc: proc_root,
    }
}

/// GET `path` of the agent's routes as a request from `peer` (`None`: no address known).
async fn get_from(node: &Node, path: &str, peer: Option<SocketAddr>) -> (StatusCode, String) {
    let mut req = Request::get(path).body(axum::body::Body::empty()).unwrap();
    if let Some(p) = peer {
        req.extensions_mut().insert(ConnectInfo(p));
    }
    let res = router(node.exposition.clone()).oneshot(req).await.unwrap();
    let code = res.status();
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// A documentation address (RFC 5737): never dialled, only named as a request's peer.
fn remote() -> SocketAddr {
    "192.0.2.7:40000".parse().unwrap()
}

#[tokio::test]
async fn a_remote_peer_gets_403_from_usage_and_metrics_without_pod_names() {
    let n = node();
    let (code, body) = get_from(&n, "/usage", Some(remote())).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("this request came from 192.0.2.7"), "{body}");
    assert!(body.contains("kubectl port-forward"), "{body}");
    assert!(body.contains("--usage-remote=true"), "{body}");
    assert!(!body.contains("trainer-0"), "{body}");

    let (code, metrics) = get_from(&n, "/metrics", Some(remote())).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        metrics.contains("erdma_device_holders{device=\"erdma_0\"} 1\n"),
        "the per-device families stay: {metrics}"
    );
    assert!(!metrics.contains("trainer-0"), "{metrics}");
    assert!(!metrics.contains("erdma_pod_"), "{metrics}");
    assert!(!metrics.contains("erdma_device_traffic_pod"), "{metrics}");

    // A request whose peer is unknown is not trusted either.
    let (code, body) = get_from(&n, "/usage", None).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("came from an unknown address"), "{body}");
}

#[tokio::test]
async fn loopback_peers_get_the_usage_and_the_per_pod_metrics() {
    let n = node();
    for peer in ["[::1]:40000", "[::ffff:127.0.0.1]:40000", "127.0.0.2:40000"] {
        let (code, body) = get_from(&n, "/usage", Some(peer.parse().unwrap())).await;
        assert_eq!(code, StatusCode::OK, "{peer}: {body}");
        assert!(body.contains("\"name\":\"trainer-0\""), "{peer}: {body}");
    }

    // Over a real connection from 127.0.0.1, as `kubectl port-forward` to the agent's
    // host-network pod makes (the runtime dials localhost in the node's namespace).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(serve_on(listener, n.exposition.clone(), cancel.clone()));
    let fetch = |path: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let usage = fetch("/usage").await;
    assert!(usage.starts_with("HTTP/1.1 200"), "{usage}");
    assert!(usage.contains("\"name\":\"trainer-0\""), "{usage}");
    let metrics = fetch("/metrics").await;
    assert!(
        metrics.contains(
            "erdma_pod_qps{namespace=\"ml\",pod=\"trainer-0\",device=\"erdma_0\",state=\"RTS\"} 1\n"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("erdma_device_holders{device=\"erdma_0\"} 1\n"),
        "{metrics}"
    );
    assert_eq!(metrics.matches("# EOF").count(), 1, "{metrics}");
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
    cancel.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn usage_remote_serves_every_peer() {
    let n = node();
    n.usage.serve_remote_readers(true);
    let (code, body) = get_from(&n, "/usage", Some(remote())).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(body.contains("\"name\":\"trainer-0\""), "{body}");
    let (_, metrics) = get_from(&n, "/metrics", Some(remote())).await;
    assert!(metrics.contains("pod=\"trainer-0\""), "{metrics}");
}
