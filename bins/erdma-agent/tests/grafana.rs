//! The Grafana dashboard `deploy/grafana/erdma-rdma-usage.json`: valid JSON, and every metric its
//! queries name is one the agent's usage collector writes (from a fake kernel answer that has
//! every kind of object, counter and owner).

mod usage_fixture;

use erdma_agent::usage::UsageCollector;
use std::collections::BTreeSet;
use usage_fixture::one_pod_usage;

const KERNEL: &str = "
device erdma_0 1
qp erdma_0 1 RTS kernel:ib_core
qp erdma_0 17 RTS 100
mr erdma_0 4096 100
cq erdma_0 100
pd erdma_0 100
qp erdma_0 18 RTS 7
mr erdma_0 4096 7
counter erdma_0 1 tx_bytes_cnt 1
counter erdma_0 1 rx_bytes_cnt 1
counter erdma_0 1 tx_packets_cnt 1
counter erdma_0 1 rx_packets_cnt 1
counter erdma_0 1 tx_bps_limit_drop_cnt 1
device erdma_1 1
qp erdma_1 30 RTS 100
";

/// The sample names of the agent's usage metrics, from a fake node with a pod on erdma_0 (shared with a
/// host process) and alone on erdma_1.
async fn exposed() -> BTreeSet<String> {
    let (u, _proc) = one_pod_usage(KERNEL, None);
    assert!(u.current().await.available);
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(UsageCollector(u)));
    erdma_agent::metrics::encode(&r)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The `erdma_…` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("erdma_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[tokio::test]
async fn the_dashboard_parses_and_names_only_metrics_the_agent_writes() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/grafana/erdma-rdma-usage.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exposed = exposed().await;
    let mut exprs: Vec<String> = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    let mut named = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(
            !names.is_empty() || !e.contains('('),
            "{e}: names no erdma metric"
        );
        named.extend(names);
    }
    let unknown: Vec<_> = named.iter().filter(|n| !exposed.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard names metrics the agent does not write: {unknown:?}\nwritten: {exposed:?}"
    );
    // The panels the dashboard promises.
    for m in [
        "erdma_pod_qps",
        "erdma_pod_mr_bytes",
        "erdma_device_tx_bytes_total",
        "erdma_device_rx_bytes_total",
        "erdma_device_errors_total",
    ] {
        assert!(named.contains(m), "the dashboard has no panel on {m}");
    }
}
