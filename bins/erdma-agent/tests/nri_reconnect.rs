//! The agent's NRI plugin after the runtime was away: it connects when the runtime's socket is
//! created again, not at the end of its back-off (which doubles to 30 s while the runtime is
//! down; in the lab a containerd restart took 14 s to be noticed).

use erdma_agent::metrics::AgentMetrics;
use erdma_agent::nri::{self, AgentNri, NriView, Policy};
use erdma_model::NodeDevices;
use erdma_model::rdma_limit::Memlock;
use prometheus_client::registry::Registry;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_plugin_connects_when_the_runtime_socket_appears_not_when_its_back_off_ends() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_served_tx, served) = watch::channel(NodeDevices::empty());
    let (view_tx, mut view) = watch::channel(Some(NriView::default()));
    let mut registry = Registry::default();
    let metrics = Arc::new(AgentMetrics::register(&mut registry));
    let handler = Arc::new(AgentNri {
        policy: Policy {
            memlock: Memlock::Unlimited,
            default_rdma_max: None,
            allow_annotation_raise: false,
        },
        holders: erdma_kubelet::podresources::HolderCache::new(
            erdma_kubelet::podresources::PodResourcesClient::new(&dir.path().join("podres.sock")),
            erdma_kubelet::podresources::Held::both("aliyun/erdma", erdma_model::names::DRA_DRIVER),
        ),
        claims: erdma_agent::rdma_max::ClaimRecords::none(),
        proc_root: PathBuf::from("/proc"),
        served,
        smcr: None,
        cluster: None,
        metrics: metrics.clone(),
        view: view_tx,
        cgroups: Arc::new(erdma_host::fake::FixedCgroupFs::new(
            erdma_host::CgroupLayout {
                version: erdma_host::CgroupVersion::V2,
                rdma_hierarchy: false,
            },
        )),
    });
    let sock = dir.path().join("nri.sock");
    let cancel = CancellationToken::new();
    let task = tokio::spawn(nri::run(
        erdma_nri::plugin::PluginConfig {
            socket: sock.clone(),
            name: "erdma".into(),
            idx: "10".into(),
            events: nri::EVENTS.to_vec(),
            budget: nri::BUDGET,
            // As the agent wires it: its metrics observe hooks and sessions.
            observer: Some(metrics as Arc<dyn erdma_nri::plugin::HookObserver>),
        },
        handler,
        cancel.clone(),
    ));
    // No runtime for 16 s: attempts at about 0, 0.5, 1.5, 3.5, 7.5 and 15.5 s; the back-off's
    // next wait is then 16 s (the one after 30 s).
    let down = Instant::now();
    let mut failures = 0;
    while down.elapsed() < Duration::from_secs(16) {
        if tokio::time::timeout(Duration::from_millis(200), view.changed())
            .await
            .is_ok_and(|r| r.is_ok())
            && view
                .borrow()
                .as_ref()
                .is_some_and(|v| v.last_error.is_some())
        {
            failures += 1;
        }
    }
    assert!(
        failures >= 4,
        "the plugin kept trying while the runtime was away ({failures} failures seen)"
    );
    let runtime = erdma_nri::fake::FakeRuntime::bind(&sock).expect("runtime socket");
    let appeared = Instant::now();
    // The back-off alone would connect about 15 s from now; the socket's creation within a few.
    let session = tokio::time::timeout(Duration::from_secs(8), runtime.accept())
        .await
        .expect(
            "the plugin did not connect within 8 s of the socket's creation (its back-off decided)",
        )
        .expect("accept");
    let mut session = session;
    let reg = session.registration().await.expect("registration");
    assert_eq!(reg.plugin_name, "erdma");
    eprintln!(
        "connected {:?} after the socket appeared",
        appeared.elapsed()
    );
    session.configure().await.expect("Configure");
    // The failed attempts are on /metrics, by how they ended, and the runtime's call by hook.
    let text = erdma_agent::metrics::encode(&registry);
    let configured = r#"erdma_nri_hook_duration_seconds_count{hook="Configure",outcome="ok"} 1"#;
    assert!(
        text.lines().any(|l| l == configured),
        "{configured} in:\n{text}"
    );
    let connect_errors = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"erdma_nri_sessions_total{end="connect_error"} "#))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no connect_error sessions in:\n{text}"));
    assert!(connect_errors >= 4, "{connect_errors} in:\n{text}");
    cancel.cancel();
    task.await.expect("the plugin task ends on cancel");
}
