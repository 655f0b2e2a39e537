//! Tests of the wiring with the libraries' fakes: the fake driver host and pod-resource usage,
//! the in-memory Kubernetes API server, the metadata-service emulator, a fixture node tree, the
//! fake kubelet and (as root) throw-away network namespaces.

use erdma_agent::cluster::Cluster;
use erdma_agent::devices::{self, Inputs, PublisherInputs, ServedView};
use erdma_agent::health::{Exposition, HealthSources};
use erdma_agent::metrics::AgentMetrics;
use erdma_agent::source::{self, ClusterEris, ClusterSourceConfig, EriSource};
use erdma_agent::{driver, hostsetup};
use erdma_cloud::imds::ImdsClient;
use erdma_cloud::imds_emulator::MetadataEmulator;
use erdma_deviceplugin::{Metrics, Plugin, PluginConfig};
use erdma_driver::fake::{FakeHost, FakeState, FakeUsage};
use erdma_driver::{DriverConfig, DriverStatus, Holder, StatusCode};
use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::{DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec};
use erdma_model::{DeviceSelection, DriverMode, EriSelector, NodeDevices};
use erdma_netdev::RouteNetlink;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "aliyun/erdma";
/// MACs of the `erdma-iwarp` fixture: erdma_0 on eth1, erdma_1 on eth2.
const MAC0: &str = "00:16:3e:0a:1b:2c";
const MAC1: &str = "00:16:3e:0a:1b:2d";

fn fixture() -> (NodeTree, NodeDevices) {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs(BTreeMap::new())),
    });
    let raw = inv.scan();
    assert_eq!(raw.devices.len(), 2, "fixture devices");
    (tree, raw)
}

fn names(n: &NodeDevices) -> Vec<&str> {
    n.devices.iter().map(|d| d.name.as_str()).collect()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn fast(mode: DriverMode) -> DriverConfig {
    DriverConfig {
        mode,
        resync: Duration::from_millis(50),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(40),
        ..DriverConfig::default()
    }
}

#[test]
fn compose_gates_on_driver_source_and_allow_list() {
    let (_tree, raw) = fixture();
    let sel = DeviceSelection::default();
    let ready = DriverStatus::unmanaged();
    let (served, excluded) = devices::compose(&Inputs {
        raw: &raw,
        selection: &sel,
        driver: &DriverStatus::starting(DriverMode::Default),
        source: &EriSource::Local,
    });
    assert!(served.devices.is_empty());
    assert_eq!(excluded.len(), 2);
    assert!(excluded[0].reason.starts_with("driver not ready: "));
    let (served, excluded) = devices::compose(&Inputs {
        raw: &raw,
        selection: &sel,
        driver: &ready,
        source: &EriSource::Waiting("no ERdmaDevice yet".into()),
    });
    assert!(served.devices.is_empty());
    assert_eq!(excluded[1].reason, "no ERdmaDevice yet");
    let cr = EriSource::Cluster(ClusterEris {
        object: "n1".into(),
        matched: [("erdma_1".to_string(), false)].into_iter().collect(),
        ..ClusterEris::default()
    });
    let (served, excluded) = devices::compose(&Inputs {
        raw: &raw,
        selection: &sel,
        driver: &ready,
        source: &cr,
    });
    assert_eq!(names(&served), ["erdma_1"]);
    assert_eq!(excluded[0].reason, "not an ERI of ERdmaDevice n1");
    // Allow-list without the instance ID: only i-* entries apply.
    let mut sel = DeviceSelection {
        eris: EriSelector::parse("i-abc erdma_1, i-* erdma_0").unwrap(),
        ..DeviceSelection::default()
    };
    let inputs = |sel: &DeviceSelection| {
        devices::compose(&Inputs {
            raw: &raw,
            selection: sel,
            driver: &ready,
            source: &EriSource::Local,
        })
        .0
    };
    assert_eq!(names(&inputs(&sel)), ["erdma_0"]);
    // Known: the instance's own entry wins over i-*.
    sel.instance_id = Some("i-abc".into());
    assert_eq!(names(&inputs(&sel)), ["erdma_1"]);
}

/// The device plugin advertises nothing while the (fake) driver fails to load, then the served
/// devices once it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_advertises_nothing_until_the_fake_driver_is_ready() {
    let (_tree, raw) = fixture();
    let mut st = FakeState::default();
    st.failing.insert("modprobe erdma compat_mode=N".into());
    let host = Arc::new(FakeHost::new(st));
    let cancel = CancellationToken::new();
    let (driver_rx, _keep, task) = driver::start(
        Arc::clone(&host),
        FakeUsage::idle(),
        fast(DriverMode::Default),
        cancel.clone(),
    );
    let task = task.expect("a reconciler runs for mode default");
    let (view_tx, view_rx) = watch::channel(ServedView::default());
    let (_raw_tx, raw_rx) = watch::channel(raw);
    let (_src_tx, src_rx) = watch::channel(EriSource::Local);
    let (_id_tx, id_rx) = watch::channel(None);
    let (served_tx, served_rx) = watch::channel(NodeDevices::empty());
    tokio::spawn(devices::publish(
        PublisherInputs {
            raw: raw_rx,
            driver: driver_rx.clone(),
            source: src_rx,
            instance_id: id_rx,
        },
        DeviceSelection::default(),
        served_tx,
        view_tx,
        cancel.clone(),
    ));
    let dir = tempfile::Builder::new()
        .prefix("wt")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let mut cfg = PluginConfig::new(dir.path());
    cfg.slots_per_device = 3;
    let plugin =
        tokio::spawn(Plugin::new(cfg, served_rx, Arc::new(Metrics::new())).run(cancel.clone()));
    let rx = driver_rx.clone();
    until("the failed driver load", || {
        rx.borrow().code == StatusCode::Failed
    })
    .await;
    let s = kubelet
        .wait_for(Duration::from_secs(5), |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.updates > 0)
        })
        .await
        .expect("registered");
    assert!(
        s.resources[RESOURCE].devices.is_empty(),
        "nothing advertised before the driver is ready"
    );
    assert!(view_rx.borrow().served.is_empty());
    host.with_state(|s| s.failing.clear());
    let s = kubelet
        .wait_for(Duration::from_secs(5), |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 6)
        })
        .await
        .expect("devices advertised once the driver is ready");
    assert!(s.resources[RESOURCE].devices[0].id.starts_with("erdma_0/"));
    assert!(driver_rx.borrow().ready);
    assert!(
        host.actions()
            .iter()
            .any(|a| a == "modprobe erdma compat_mode=N"),
        "{:?}",
        host.actions()
    );
    cancel.cancel();
    task.await.unwrap();
    plugin.await.unwrap().unwrap();
    kubelet.shutdown().await;
}

#[tokio::test]
async fn prefer_driver_none_is_ready_at_once_and_touches_nothing() {
    let host = Arc::new(FakeHost::new(FakeState::default()));
    let usage = Arc::new(FakeUsage::idle());
    let (rx, keep, task) = driver::start(
        Arc::clone(&host),
        Arc::clone(&usage),
        fast(DriverMode::None),
        CancellationToken::new(),
    );
    assert!(task.is_none() && keep.is_some());
    assert!(rx.borrow().ready);
    assert_eq!(rx.borrow().code, StatusCode::Unmanaged);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(host.actions().is_empty());
    assert_eq!(usage.calls(), 0);
}

/// A reload refused because a pod holds the devices shows in /healthz, the metrics, the node
/// labels, the node condition and a Warning Event on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_reload_shows_in_healthz_metrics_and_on_the_node() {
    let mut st = FakeState::default();
    st.loaded.insert("erdma".into());
    st.compat = true;
    let host = Arc::new(FakeHost::new(st));
    let usage = FakeUsage::held_by(vec![Holder::of_ids(
        "default",
        "trainer",
        "main",
        vec!["erdma_0/1".into()],
    )]);
    let api = FakeApiServer::new();
    api.put(&k8s_openapi::api::core::v1::Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let cluster = Cluster::new(api.client(), "n1");
    let cancel = CancellationToken::new();
    let (rx, _keep, task) = driver::start(
        Arc::clone(&host),
        usage,
        fast(DriverMode::Default),
        cancel.clone(),
    );
    let (plugin_metrics, metrics, registry) = registry();
    let started_up = erdma_agent::tasks::StartedUp::default();
    let observer = tokio::spawn(driver::observe(
        rx.clone(),
        metrics,
        Some(cluster),
        started_up.clone(),
        cancel.clone(),
    ));
    until("the refused change", || rx.borrow().pending.is_some()).await;
    // The node is written only once the start is over (the kubelet has the devices).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        api.requests_matching("PATCH", "/nodes/").is_empty(),
        "node written before the start was over"
    );
    started_up.set();
    let api2 = api.clone();
    until("node labels", || {
        api2.get::<k8s_openapi::api::core::v1::Node>(None, "n1")
            .and_then(|n| n.metadata.labels)
            .is_some_and(|l| {
                l.get("erdma.alibabacloud.com/driver-pending-mode")
                    .is_some_and(|v| v == "default")
            })
    })
    .await;
    let node = api
        .get::<k8s_openapi::api::core::v1::Node>(None, "n1")
        .unwrap();
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["erdma.alibabacloud.com/driver-mode"], "compat");
    assert_eq!(labels["erdma.alibabacloud.com/driver-ready"], "true");
    let cond = node.status.unwrap().conditions.unwrap();
    assert_eq!(cond[0].type_, "ERdmaDriverReady");
    assert_eq!(cond[0].reason.as_deref(), Some("ModeChangePending"));
    // The Event is written after the labels and the condition: wait for it too.
    let api3 = api.clone();
    until("the pending-change Event", move || {
        api3.list::<k8s_openapi::api::events::v1::Event>(Some("default"))
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("DriverModeChangePending")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("n1")
            })
    })
    .await;
    assert!(!host.actions().iter().any(|a| a.starts_with("rmmod")));

    // Over HTTP, as a probe or Prometheus sees it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(erdma_agent::health::serve_on(
        listener,
        Exposition {
            registry: registry.clone(),
            plugin: plugin_metrics,
            health: HealthSources {
                driver: rx.clone(),
                ..HealthSources::fixed(DriverStatus::unmanaged())
            },
            usage: None,
        },
        cancel.clone(),
    ));
    let healthz: serde_json::Value =
        serde_json::from_str(body(&http_get(port, "/healthz").await)).unwrap();
    assert_eq!(healthz["ok"], true);
    assert_eq!(healthz["driver"]["code"], "ModeChangePending");
    assert_eq!(healthz["driver"]["pending"]["to"], "default");
    assert_eq!(healthz["driver"]["pending"]["holders"][0]["pod"], "trainer");
    let m = http_get(port, "/metrics").await;
    assert!(m.contains("erdma_agent_driver_pending_change 1"), "{m}");
    assert!(
        m.contains("erdma_agent_driver_reload_refusals_total 1"),
        "{m}"
    );
    assert!(m.contains("erdma_agent_driver_ready 1"), "{m}");
    assert!(
        m.contains("erdma_deviceplugin_kubelet_restarts_total 0"),
        "{m}"
    );
    assert_eq!(m.matches("# EOF").count(), 1, "{m}");
    // Later passes refuse again, but the same pending change counts once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        erdma_agent::metrics::encode(&registry)
            .contains("erdma_agent_driver_reload_refusals_total 1")
    );
    cancel.cancel();
    task.unwrap().await.unwrap();
    observer.await.unwrap();
}

async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

fn erdma_device(node: &str, devices: Vec<DeviceInfo>, ready: bool) -> ERdmaDevice {
    let mut o = ERdmaDevice::new(
        node,
        ERdmaDeviceSpec {
            devices: devices.clone(),
            jumbo_frame: true,
        },
    );
    o.metadata.labels = Some(erdma_k8s::labels::erdma_device_labels(node, "i-abc"));
    o.status = Some(erdma_k8s::ERdmaDeviceStatus {
        devices: devices
            .iter()
            .map(|d| {
                DeviceStatus::new(
                    d.id.clone(),
                    if ready {
                        DeviceState::Ready
                    } else {
                        DeviceState::Pending
                    },
                    "",
                )
            })
            .collect(),
    });
    o
}

fn eri(id: &str, mac: &str, primary: bool) -> DeviceInfo {
    DeviceInfo {
        instance_id: "i-abc".into(),
        mac: mac.into(),
        is_primary_eni: primary,
        id: id.into(),
        network_card_index: 0,
        queue_pair: 0,
    }
}

/// With an ERdmaDevice, only its ERIs found locally are served; an ERI without a local device
/// is reported in the object's status, and cleared when it appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erdmadevice_path_serves_only_matched_devices_and_reports_missing() {
    let (_tree, raw) = fixture();
    let api = FakeApiServer::new();
    let cluster = Cluster::new(api.client(), "n1");
    // Not Ready yet: nothing is served.
    api.put(&erdma_device(
        "n1",
        vec![
            eri("eni-0", MAC0, false),
            eri("eni-9", "00:16:3e:99:99:99", false),
        ],
        false,
    ));
    let cancel = CancellationToken::new();
    let (raw_tx, raw_rx) = watch::channel(raw.clone());
    let (src_tx, src_rx) = watch::channel(EriSource::Waiting("starting".into()));
    tokio::spawn(source::follow_cluster(
        Some(cluster),
        ClusterSourceConfig {
            node_name: Some("n1".into()),
            kubeconfig: None,
            request_timeout: Some(Duration::from_secs(70)),
            report_retry: Duration::from_millis(30),
            retry: Duration::from_millis(30),
            report_after: started_up(),
        },
        raw_rx.clone(),
        src_tx,
        cancel.clone(),
    ));
    let (_drv_tx, drv_rx) = watch::channel(DriverStatus::unmanaged());
    let (_id_tx, id_rx) = watch::channel(None);
    let (served_tx, mut served_rx) = watch::channel(NodeDevices::empty());
    tokio::spawn(devices::publish(
        PublisherInputs {
            raw: raw_rx,
            driver: drv_rx,
            source: src_rx.clone(),
            instance_id: id_rx,
        },
        DeviceSelection::default(),
        served_tx,
        watch::channel(ServedView::default()).0,
        cancel.clone(),
    ));
    // Waits for the state (generous deadline for a loaded CI machine) instead of sleeping a
    // fixed time and hoping the task ran.
    let t = std::time::Instant::now();
    while !matches!(&*src_rx.borrow(), EriSource::Waiting(w) if w.contains("Ready ERdmaDevice of node n1"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still {:?}",
            &*src_rx.borrow()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(served_rx.borrow().devices.is_empty());

    api.put(&erdma_device(
        "n1",
        vec![
            eri("eni-0", MAC0, false),
            eri("eni-9", "00:16:3e:99:99:99", false),
        ],
        true,
    ));
    tokio::time::timeout(
        Duration::from_secs(5),
        served_rx.wait_for(|s| !s.devices.is_empty()),
    )
    .await
    .expect("served after the ERdmaDevice is Ready")
    .unwrap();
    assert_eq!(names(&served_rx.borrow()), ["erdma_0"]);
    match &*src_rx.borrow() {
        EriSource::Cluster(c) => {
            assert!(c.jumbo_frame);
            assert_eq!(c.missing.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    let api2 = api.clone();
    let failed_eni9 = move || {
        api2.get::<ERdmaDevice>(None, "n1")
            .and_then(|o| o.status)
            .is_some_and(|s| {
                s.devices.iter().any(|d| {
                    d.id == "eni-9"
                        && d.state() == Some(DeviceState::Failed)
                        && d.message.starts_with(erdma_k8s::agent::AGENT_PREFIX)
                })
            })
    };
    let f = failed_eni9.clone();
    until("the missing ERI reported", f).await;

    // The controller swaps eni-9 for erdma_1's ERI: both served, the problem is cleared.
    api.put(&erdma_device(
        "n1",
        vec![eri("eni-0", MAC0, false), eri("eni-1", MAC1, true)],
        true,
    ));
    tokio::time::timeout(
        Duration::from_secs(5),
        served_rx.wait_for(|s| s.devices.len() == 2),
    )
    .await
    .expect("both served")
    .unwrap();
    let f = failed_eni9.clone();
    until("the problem cleared", move || !f()).await;
    match &*src_rx.borrow() {
        EriSource::Cluster(c) => assert_eq!(c.matched.get("erdma_1"), Some(&true)),
        other => panic!("{other:?}"),
    }
    // A device that disappears locally is reported again.
    let mut less = raw.clone();
    less.devices.retain(|d| d.name != "erdma_1");
    raw_tx.send(less).unwrap();
    let api3 = api.clone();
    until("the vanished ERI reported", move || {
        api3.get::<ERdmaDevice>(None, "n1")
            .and_then(|o| o.status)
            .is_some_and(|s| {
                s.devices
                    .iter()
                    .any(|d| d.id == "eni-1" && d.state() == Some(DeviceState::Failed))
            })
    })
    .await;
    assert!(src_rx.borrow().describe().contains("1 missing"));
    cancel.cancel();
}

#[tokio::test]
async fn without_a_cluster_the_error_names_the_fix_and_nothing_is_served() {
    let (_tree, raw) = fixture();
    let cancel = CancellationToken::new();
    let (_raw_tx, raw_rx) = watch::channel(raw);
    let (src_tx, mut src_rx) = watch::channel(EriSource::Waiting("starting".into()));
    let t = tokio::spawn(source::follow_cluster(
        None,
        ClusterSourceConfig {
            node_name: None,
            kubeconfig: None,
            request_timeout: Some(Duration::from_secs(70)),
            report_retry: Duration::from_millis(30),
            retry: Duration::from_millis(30),
            report_after: started_up(),
        },
        raw_rx,
        src_tx,
        cancel.clone(),
    ));
    src_rx
        .wait_for(|s| matches!(s, EriSource::Waiting(w) if w.contains("--local-eri-discovery")))
        .await
        .unwrap();
    let v = HealthSources {
        eri_source: src_rx.clone(),
        ..HealthSources::fixed(DriverStatus::unmanaged())
    }
    .view();
    assert!(!v.eri_source_ready);
    assert!(v.eri_source.contains("NODE_NAME"), "{}", v.eri_source);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!t.is_finished(), "keeps retrying");
    cancel.cancel();
    t.await.unwrap();
}

#[tokio::test]
async fn instance_id_is_retried_until_the_metadata_service_answers() {
    let emu = MetadataEmulator::start().await.unwrap();
    let md = ImdsClient::new(&emu.endpoint())
        .unwrap()
        .with_backoff(Duration::from_millis(2));
    let (tx, mut rx) = watch::channel(None);
    let (err_tx, err_rx) = watch::channel(None);
    let cancel = CancellationToken::new();
    let t = tokio::spawn(source::fetch_instance_id(
        md,
        tx,
        err_tx,
        Duration::from_millis(20),
        cancel.clone(),
    ));
    let errors = err_rx.clone();
    until("the first failure", move || errors.borrow().is_some()).await;
    assert!(rx.borrow().is_none());
    assert!(
        err_rx
            .borrow()
            .as_deref()
            .is_some_and(|e| e.contains("serving only i-* entries"))
    );
    emu.set(source::INSTANCE_ID_PATH, "i-bp1abc");
    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|id| id.is_some()))
        .await
        .expect("instance ID once the service answers")
        .unwrap();
    assert_eq!(rx.borrow().as_deref(), Some("i-bp1abc"));
    assert!(err_rx.borrow().is_none());
    t.await.unwrap();
}

#[test]
fn eri_netdevs_and_smc_ports_of_the_served_devices() {
    let (_tree, raw) = fixture();
    let netdevs = hostsetup::eri_netdevs(&raw, &EriSource::Local);
    let ifs: Vec<(&str, bool, bool)> = netdevs
        .iter()
        .map(|e| (e.ifname.as_str(), e.primary, e.jumbo_frame))
        .collect();
    assert_eq!(ifs, [("eth1", false, false), ("eth2", false, false)]);
    let cr = EriSource::Cluster(ClusterEris {
        object: "n1".into(),
        matched: [
            ("erdma_0".to_string(), true),
            ("erdma_1".to_string(), false),
        ]
        .into_iter()
        .collect(),
        missing: vec![],
        jumbo_frame: true,
    });
    let ifs: Vec<(String, bool, bool)> = hostsetup::eri_netdevs(&raw, &cr)
        .into_iter()
        .map(|e| (e.ifname, e.primary, e.jumbo_frame))
        .collect();
    assert_eq!(
        ifs,
        [("eth1".into(), true, true), ("eth2".into(), false, true)]
    );
    let ports = hostsetup::smc_ports(&raw);
    let ports: Vec<(String, String, u8)> = ports
        .into_iter()
        .map(|(p, d, n)| (p.as_str().to_string(), d, n))
        .collect();
    assert_eq!(
        ports,
        [
            ("00163E0A1B2C".into(), "erdma_0".into(), 1),
            ("00163E0A1B2D".into(), "erdma_1".into(), 1)
        ]
    );
}

/// A named network namespace (deleted on drop) holding `eth0` (primary, 10.0.0.5/24) and `eth1`
/// (the ERI, down), like a node; fails the test when namespaces cannot be created (needs root).
struct Netns(String);

impl Netns {
    fn node() -> Netns {
        let name = format!("erdma-ag-{}", std::process::id());
        let added = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .output();
        match added {
            Ok(o) if o.status.success() => {}
            other => panic!(
                "needs root and iproute2 to create network namespace {name}; run with --ignored \
                 as root (scripts/test.sh does on CI): {other:?}"
            ),
        }
        let ns = Netns(name);
        for args in [
            "link set lo up",
            "link add eth0 address 00:16:3e:00:00:01 type veth peer name p0",
            "link add eth1 address 00:16:3e:00:00:02 type veth peer name p1",
            "link set p0 up",
            "link set p1 up",
            "link set eth0 up",
            "addr add 10.0.0.5/24 dev eth0",
            "route add default via 10.0.0.253 dev eth0 metric 100",
        ] {
            ns.ip(args);
        }
        ns
    }

    fn ip(&self, args: &str) -> String {
        let out = std::process::Command::new("ip")
            .args(["-n", &self.0])
            .args(args.split_whitespace())
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

/// Served devices on `eth0` (primary) and `eth1`, plus one whose MAC the metadata service does
/// not know: `eth1` is set up with the jumbo MTU, `eth0` is untouched, the unknown one is an
/// error in /healthz and the failure gauge, retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (ip netns, veth); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
async fn netdev_setup_in_a_network_namespace() {
    let ns = Netns::node();
    let primary_before = ns.ip("-j addr show dev eth0");
    let emu = MetadataEmulator::start().await.unwrap();
    emu.add_eni(
        "00:16:3e:00:00:02".parse().unwrap(),
        "10.0.0.9",
        "10.0.0.0/24",
        "10.0.0.253",
    );
    let md = ImdsClient::new(&emu.endpoint())
        .unwrap()
        .with_backoff(Duration::from_millis(2));
    let (_tree, raw) = fixture();
    let mut served = raw.clone();
    let set = |i: usize, ifname: &str, mac: &str| {
        let mut d = raw.devices[i % 2].clone();
        d.name = format!("erdma_{i}");
        let n = d.netdev.as_mut().unwrap();
        n.name = ifname.into();
        n.mac = Some(mac.parse().unwrap());
        d
    };
    served.devices = vec![
        set(0, "eth0", "00:16:3e:00:00:01"),
        set(1, "eth1", "00:16:3e:00:00:02"),
        set(2, "eth7", "00:16:3e:00:00:07"),
    ];
    let (_served_tx, served_rx) = watch::channel(served);
    let (_src_tx, src_rx) = watch::channel(EriSource::Cluster(ClusterEris {
        object: "n1".into(),
        matched: ["erdma_0", "erdma_1", "erdma_2"]
            .into_iter()
            .map(|n| (n.to_string(), false))
            .collect(),
        missing: vec![],
        jumbo_frame: true,
    }));
    let (_plugin_metrics, metrics, registry) = registry();
    let (report_tx, report_rx) = watch::channel(Default::default());
    let cancel = CancellationToken::new();
    let path = std::path::PathBuf::from(format!("/run/netns/{}", ns.0));
    let t = tokio::spawn(hostsetup::run_netdev(
        move || RouteNetlink::connect_in_netns(&path),
        md,
        served_rx,
        src_rx,
        8500,
        hostsetup::NetdevReport {
            failures: metrics.netdev_setup_failures.clone(),
            report: report_tx,
        },
        cancel.clone(),
    ));
    let reported = report_rx.clone();
    until("netdev setup reported", move || {
        reported.borrow().len() == 3
    })
    .await;
    let netdev = report_rx.borrow().clone();
    assert_eq!(netdev["eth0"], "primary (untouched)");
    assert_eq!(netdev["eth1"], "ok");
    assert!(netdev["eth7"].contains("no such ENI"), "{}", netdev["eth7"]);
    assert!(
        erdma_agent::metrics::encode(&registry).contains("erdma_agent_eri_netdev_setup_failures 1")
    );
    let eth1 = ns.ip("-j addr show dev eth1");
    assert!(
        eth1.contains("\"mtu\":8500") && eth1.contains("10.0.0.9"),
        "{eth1}"
    );
    assert_eq!(
        ns.ip("-j addr show dev eth0"),
        primary_before,
        "primary untouched"
    );
    cancel.cancel();
    t.await.unwrap();
}

fn node_condition(api: &FakeApiServer, ty: &str) -> Option<(String, String, String)> {
    api.get::<k8s_openapi::api::core::v1::Node>(None, "n1")?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == ty)
        .map(|c| {
            (
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        })
}

/// Terway registers `aliyun/erdma` on the same fake kubelet: the agent reports it (node condition,
/// Warning Event, `/healthz`, metric) with the fix, keeps its hands off the registration while
/// terway runs, and registers again once terway has gone and left the kubelet pointing at it.
/// Every look after the first is woken by a socket event or follows up the kubelet's list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_plugin_for_aliyun_erdma_is_reported_not_fought_and_replaced_after_it_goes() {
    use erdma_deviceplugin::coexistence::Observer;
    use erdma_fake_kubelet::OtherPlugin;
    use k8s_openapi::api::events::v1::Event;
    const COND: &str = "ERdmaDevicePluginConflict";
    const TERWAY: &str = "1700000000-erdma-eni.sock";

    let (_tree, raw) = fixture();
    let dir = tempfile::Builder::new()
        .prefix("co")
        .tempdir_in("/tmp")
        .unwrap();
    let pr = dir.path().join("pod-resources.sock");
    let mut kcfg = FakeKubeletConfig::new(dir.path());
    kcfg.pod_resources_socket = Some(pr.clone());
    let kubelet = FakeKubelet::start(kcfg).await.unwrap();
    let api = FakeApiServer::new();
    api.put(&k8s_openapi::api::core::v1::Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let cluster = Cluster::new(api.client(), "n1");
    let cancel = CancellationToken::new();
    let (plugin_metrics, metrics, registry) = registry();
    let (conflict_tx, conflict_rx) = watch::channel(None);
    let (_served_tx, served_rx) = watch::channel(raw);
    let mut cfg = PluginConfig::new(dir.path());
    cfg.slots_per_device = 3;
    cfg.pod_resources_socket = Some(pr);
    let own = cfg.socket_name();
    let observer = Observer::new(&cfg);
    let plugin = Plugin::new(cfg, served_rx.clone(), plugin_metrics);
    let watcher = tokio::spawn(erdma_agent::coexistence::run(
        erdma_agent::coexistence::Config {
            observer,
            reclaimer: plugin.reclaimer(),
            // Nothing periodic: terway's socket coming and going wakes the look, and the second
            // look at the kubelet's list follows on the recheck period.
            every: Duration::from_secs(3600),
            recheck: Duration::from_millis(50),
        },
        served_rx,
        Some(cluster),
        metrics,
        conflict_tx,
        cancel.clone(),
    ));
    let plugin = tokio::spawn(plugin.run(cancel.clone()));
    let mine = |s: &erdma_fake_kubelet::StateFile| {
        s.resources
            .get(RESOURCE)
            .is_some_and(|r| r.endpoint == own && r.healthy_ids().count() == 6)
    };
    kubelet
        .wait_for(Duration::from_secs(10), mine)
        .await
        .expect("erdma registered");
    let api2 = api.clone();
    until("the condition False", || {
        node_condition(&api2, COND).is_some_and(|(st, _, _)| st == "False")
    })
    .await;

    // Terway's eRDMA ENI plugin registers the same resource.
    let terway =
        OtherPlugin::start(dir.path(), TERWAY, vec!["eni-0".into(), "eni-1".into()]).unwrap();
    terway
        .register(RESOURCE)
        .await
        .expect("the kubelet accepts it");
    until("the condition True", || {
        node_condition(&api2, COND).is_some_and(|(st, _, _)| st == "True")
    })
    .await;
    let (_, reason, message) = node_condition(&api, COND).unwrap();
    assert_eq!(reason, "AnotherDevicePlugin");
    assert!(
        message.contains("terway's eRDMA ENI device plugin"),
        "{message}"
    );
    assert!(message.contains(TERWAY), "{message}");
    assert!(message.contains("\"enable_erdma\": false"), "{message}");
    // The Event is posted beside the condition, not before it: wait for it too.
    let api3 = api.clone();
    until("the ERdmaDevicePluginConflict Warning Event", || {
        api3.list::<Event>(Some("default")).iter().any(|e| {
            e.reason.as_deref() == Some("ERdmaDevicePluginConflict")
                && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    // The kubelet's device list now comes from terway: seen on the second look, which proves the
    // agent kept observing meanwhile.
    let conflict = conflict_rx.clone();
    until("the kubelet's foreign devices in /healthz", || {
        conflict.borrow().as_ref().is_some_and(|v| {
            v.evidence
                .iter()
                .any(|e| matches!(e, erdma_model::coexistence::Evidence::KubeletDevices { .. }))
        })
    })
    .await;
    let s = kubelet.state();
    assert_eq!(s.registrations, 2, "erdma did not register again: {s:?}");
    assert_eq!(s.resources[RESOURCE].endpoint, TERWAY);
    assert!(
        erdma_agent::metrics::encode(&registry).contains("erdma_agent_device_plugin_conflict 1")
    );
    let view = conflict_rx.borrow().clone().unwrap();
    assert!(view.conflict && view.fix.is_some_and(|f| f.contains("excluded=true")));

    // Terway is switched off: the kubelet marks the resource unhealthy; erdma registers again.
    terway.stop().await;
    let s = kubelet
        .wait_for(Duration::from_secs(10), mine)
        .await
        .expect("erdma serves the resource again");
    assert_eq!(s.registrations, 3);
    until("the condition False again", || {
        node_condition(&api2, COND).is_some_and(|(st, _, _)| st == "False")
    })
    .await;
    let api4 = api.clone();
    until("the ERdmaDevicePluginConflictResolved Normal Event", || {
        api4.list::<Event>(Some("default")).iter().any(|e| {
            e.reason.as_deref() == Some("ERdmaDevicePluginConflictResolved")
                && e.type_.as_deref() == Some("Normal")
        })
    })
    .await;
    let view = conflict_rx.borrow().clone().unwrap();
    assert!(!view.conflict);
    assert_eq!(view.reclaims, 1);
    cancel.cancel();
    watcher.await.unwrap();
    plugin.await.unwrap().unwrap();
    kubelet.shutdown().await;
}

/// The device plugin's and the agent's metrics in one registry, as the agent builds them.
fn registry() -> (Arc<Metrics>, Arc<AgentMetrics>, Arc<Registry>) {
    let mut registry = Registry::default();
    let plugin = Arc::new(Metrics::register(&mut registry));
    let agent = Arc::new(AgentMetrics::register(&mut registry));
    (plugin, agent, Arc::new(registry))
}

/// A start whose urgent part is over: reports go out at once.
fn started_up() -> erdma_agent::tasks::StartedUp {
    let s = erdma_agent::tasks::StartedUp::default();
    s.set();
    s
}
