//! The agent's NRI plugin on a cgroup v1 node, against the runtime stand-in over a real socket and
//! a directory laid out like the host's `/sys/fs/cgroup` (v1 `rdma` hierarchy, cgroups made as
//! runc makes them): runc refuses `linux.resources.unified` there ("cannot use unified on cgroup
//! v1"), so no adjustment or Synchronize update may carry it. The limit is written into the
//! container's rdma cgroup at StartContainer (cgroupfs and systemd `cgroups_path` forms), running
//! containers that lack it get it at Synchronize, and a limit that cannot be written leaves the
//! container starting with its memlock, a Warning Event and a metric. A DRA claim's limit comes
//! from the agent's checkpoint, a device-plugin container's from `--nri-rdma-max`, never from the
//! container's environment.

use erdma_agent::cluster::Cluster;
use erdma_agent::metrics::AgentMetrics;
use erdma_agent::nri::{self, AgentNri, NriView, Policy};
use erdma_agent::rdma_max::ClaimRecords;
use erdma_dra::cdi::RdmaLimits;
use erdma_dra::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
use erdma_host::cgroup::{CgroupFs, CgroupLayout, CgroupVersion, RootedCgroupFs};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::rdma_limit::{Memlock, RDMA_MAX_ANNOTATION, RdmaLimit};
use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice};
use erdma_nri::api::{self, Event};
use erdma_nri::fake::Session;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use prometheus_client::registry::Registry;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const V1: CgroupLayout = CgroupLayout {
    version: CgroupVersion::V1,
    rdma_hierarchy: true,
};

/// Two served devices, `erdma_0` and `erdma_1`, with their uverbs nodes.
fn served() -> NodeDevices {
    let mut node = NodeDevices::empty();
    for i in 0..2u32 {
        let mut d = RdmaDevice::named(format!("erdma_{i}"), DeviceKind::Erdma);
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{i}"),
            major: Some(231),
            minor: Some(192 + i),
            present: true,
        });
        node.devices.push(d);
    }
    node
}

struct Node {
    dir: tempfile::TempDir,
    api: FakeApiServer,
    registry: Registry,
    session: Session,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    view: watch::Receiver<Option<NriView>>,
    _served: watch::Sender<NodeDevices>,
}

impl Node {
    /// The agent's plugin on a node whose cgroup root is `<dir>/cgroup`, laid out as `layout`,
    /// with its DRA checkpoint at `<dir>/checkpoint.json` (see [`Node::prepared`]), connected and
    /// configured (each test synchronizes).
    async fn start(layout: CgroupLayout) -> Node {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("cgroup/rdma")).unwrap();
        let cgroups: Arc<dyn CgroupFs> = Arc::new(RootedCgroupFs::with_layout(
            dir.path().join("cgroup"),
            layout,
        ));
        let (served_tx, served_rx) = watch::channel(served());
        let (view_tx, view) = watch::channel(Some(NriView::default().with_layout(layout)));
        let mut registry = Registry::default();
        let metrics = Arc::new(AgentMetrics::register(&mut registry));
        let api = FakeApiServer::new();
        let handler = Arc::new(AgentNri {
            policy: Policy {
                memlock: Memlock::Unlimited,
                default_rdma_max: Some(RdmaLimit::parse("hca_handle=8").unwrap()),
                allow_annotation_raise: false,
            },
            // No pod-resources answer: the device nodes the runtime put in decide.
            holders: erdma_kubelet::podresources::HolderCache::new(
                erdma_kubelet::podresources::PodResourcesClient::new(
                    &dir.path().join("podres.sock"),
                ),
                erdma_kubelet::podresources::Held::both(
                    "aliyun/erdma",
                    erdma_model::names::DRA_DRIVER,
                ),
            ),
            claims: ClaimRecords::at(dir.path().join("checkpoint.json")),
            proc_root: PathBuf::from("/proc"),
            served: served_rx,
            smcr: None,
            cluster: Some(Cluster::new(api.client(), "n1")),
            metrics,
            view: view_tx,
            cgroups,
        });
        let sock = dir.path().join("nri.sock");
        let runtime = erdma_nri::fake::FakeRuntime::bind(&sock).unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(nri::run(
            erdma_nri::plugin::PluginConfig {
                socket: sock,
                name: "erdma".into(),
                idx: "10".into(),
                events: nri::events(layout.version),
                budget: nri::BUDGET,
                observer: None,
            },
            handler,
            cancel.clone(),
        ));
        let mut session = runtime.accept().await.unwrap();
        session.registration().await.unwrap();
        let mask = session.configure().await.unwrap();
        assert!(
            api::subscribed(mask, Event::StartContainer),
            "StartContainer is where a v1 node's limit is written"
        );
        Node {
            dir,
            api,
            registry,
            session,
            cancel,
            task,
            view,
            _served: served_tx,
        }
    }

    /// Makes the container cgroup `rel` of the rdma hierarchy as runc does (its `rdma.max` as
    /// the kernel shows a fresh cgroup's), returning its `rdma.max` path.
    fn runc_created(&self, rel: &str) -> PathBuf {
        let dir = self.dir.path().join("cgroup/rdma").join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rdma.max");
        std::fs::write(
            &file,
            "erdma_0 hca_handle=max hca_object=max\nerdma_1 hca_handle=max hca_object=max\n",
        )
        .unwrap();
        file
    }

    /// Writes the agent's DRA checkpoint: claim `uid` (`namespace/name`) prepared on `erdma_0`
    /// with `hca_handle` handles and 8000 objects, as NodePrepareResources records it.
    fn prepared(&self, uid: &str, namespace: &str, name: &str, hca_handle: u64) {
        let mut cp = Checkpoint::load(&self.dir.path().join("checkpoint.json")).unwrap();
        cp.version = erdma_dra::checkpoint::VERSION;
        cp.claims.insert(
            uid.into(),
            PreparedClaim {
                namespace: namespace.into(),
                name: name.into(),
                devices: vec![PreparedDevice {
                    request: "rdma".into(),
                    pool: "n1".into(),
                    device: "erdma-0".into(),
                    ibdev: "erdma_0".into(),
                    cdi_ids: vec![format!("erdma.alibabacloud.com/claim={uid}-erdma_0")],
                    share_id: None,
                    shares: 10,
                    limits: RdmaLimits {
                        hca_handle,
                        hca_object: 8000,
                    },
                    admin: false,
                }],
                cdi_spec: self.dir.path().join(format!("claim_{uid}.json")),
            },
        );
        cp.save(&self.dir.path().join("checkpoint.json")).unwrap();
    }

    fn metric(&self, line_prefix: &str) -> Option<String> {
        let text = erdma_agent::metrics::encode(&self.registry);
        text.lines()
            .find_map(|l| l.strip_prefix(line_prefix).map(str::to_string))
    }

    async fn stop(self) {
        drop(self.session);
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

fn pod(name: &str, uid: &str, annotations: &[(&str, &str)]) -> api::PodSandbox {
    api::PodSandbox {
        id: format!("sb-{name}"),
        name: name.into(),
        uid: uid.into(),
        namespace: "default".into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Container `name` of `pod` with the uverbs node of `erdma_<device>` and `env`, in cgroup
/// `cgroups_path`.
fn container(
    pod: &api::PodSandbox,
    name: &str,
    device: u32,
    env: &[&str],
    cgroups_path: &str,
) -> api::Container {
    api::Container {
        id: format!("ctr-{name}"),
        pod_sandbox_id: pod.id.clone(),
        name: name.into(),
        env: env.iter().map(|s| s.to_string()).collect(),
        linux: Some(api::LinuxContainer {
            devices: vec![api::LinuxDevice {
                path: format!("/dev/infiniband/uverbs{device}"),
                r#type: "c".into(),
                major: 231,
                minor: 192 + i64::from(device),
                ..Default::default()
            }],
            cgroups_path: cgroups_path.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn unified_keys(adjust: &api::ContainerAdjustment) -> Vec<String> {
    adjust
        .linux
        .iter()
        .flat_map(|l| &l.resources)
        .flat_map(|r| r.unified.keys().cloned())
        .collect()
}

fn has_memlock(adjust: &api::ContainerAdjustment) -> bool {
    adjust
        .rlimits
        .iter()
        .any(|r| r.r#type == "RLIMIT_MEMLOCK" && r.hard == u64::MAX && r.soft == u64::MAX)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Waits for the Events of `pod` with `reason` (a hang guard for a loaded CI machine, not a
/// latency target).
async fn events_with(api: &FakeApiServer, pod: &str, reason: &str) -> Vec<K8sEvent> {
    for _ in 0..3000 {
        let evs: Vec<K8sEvent> = api
            .list::<K8sEvent>(Some("default"))
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect();
        if !evs.is_empty() {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {reason} Event on pod {pod}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cgroup_v1_rdma_max_is_written_into_the_containers_rdma_cgroup_not_the_adjustment() {
    let node = Node::start(V1).await;
    node.session.synchronize(vec![], vec![]).await.unwrap();
    let view = node.view.borrow().clone().unwrap();
    assert_eq!(
        (view.cgroup_version.as_str(), view.rdma_max_route.as_str()),
        ("v1", "rdma-cgroup")
    );

    // Device plugin, the install default, cgroupfs driver.
    let web = pod("web", "0a1b-22", &[]);
    let dp = container(
        &web,
        "app",
        0,
        &["PATH=/bin"],
        "/kubepods/besteffort/pod0a1b-22/ctr-app",
    );
    let a = node
        .session
        .create_container(&web, &dp)
        .await
        .unwrap()
        .adjust
        .unwrap_or_default();
    assert_eq!(
        unified_keys(&a),
        Vec::<String>::new(),
        "runc refuses unified on v1"
    );
    assert!(has_memlock(&a), "memlock on v1 as on v2: {a:?}");
    let file = node.runc_created("kubepods/besteffort/pod0a1b-22/ctr-app");
    assert!(
        node.session
            .state_change(Event::StartContainer, &web, Some(&dp))
            .await
            .unwrap()
    );
    assert_eq!(read(&file), "erdma_0 hca_handle=8");

    // A pod annotation, systemd driver.
    let annotated = pod(
        "anno",
        "9f-31",
        &[(RDMA_MAX_ANNOTATION, "hca_handle=2 hca_object=500")],
    );
    let sd = container(
        &annotated,
        "trainer",
        1,
        &[],
        "kubepods-burstable-pod9f_31.slice:cri-containerd:ctr-trainer",
    );
    let a = node
        .session
        .create_container(&annotated, &sd)
        .await
        .unwrap()
        .adjust
        .unwrap_or_default();
    assert_eq!(unified_keys(&a), Vec::<String>::new());
    let file = node.runc_created(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9f_31.slice/cri-containerd-ctr-trainer.scope",
    );
    node.session
        .state_change(Event::StartContainer, &annotated, Some(&sd))
        .await
        .unwrap();
    assert_eq!(read(&file), "erdma_1 hca_handle=2 hca_object=500");

    // A DRA container: its claim's consumed capacity, from the agent's checkpoint (this
    // kubelet gives no answer: the claims prepared in the pod's namespace on its device), not
    // from the environment the container carries.
    node.prepared("uid-77", "team-a", "claim-77", 4);
    let mut dra_pod = pod("dra", "77", &[]);
    dra_pod.namespace = "team-a".into();
    let dra = container(
        &dra_pod,
        "worker",
        0,
        &["ERDMA_RDMA_MAX=erdma_0 hca_handle=max hca_object=max"],
        "/kubepods/pod77/ctr-worker",
    );
    let a = node
        .session
        .create_container(&dra_pod, &dra)
        .await
        .unwrap()
        .adjust
        .unwrap_or_default();
    assert_eq!(unified_keys(&a), Vec::<String>::new());
    assert!(has_memlock(&a));
    let file = node.runc_created("kubepods/pod77/ctr-worker");
    node.session
        .state_change(Event::StartContainer, &dra_pod, Some(&dra))
        .await
        .unwrap();
    assert_eq!(read(&file), "erdma_0 hca_handle=4 hca_object=8000");
    assert_eq!(
        node.metric(r#"erdma_agent_rdma_limits_written_total{hook="StartContainer"} "#)
            .as_deref(),
        Some("3")
    );
    assert_eq!(
        node.metric("erdma_agent_rdma_max_env_ignored_total ")
            .as_deref(),
        Some("1"),
        "the container's own ERDMA_RDMA_MAX is counted, not applied"
    );
    node.stop().await;
}

/// A container cannot lift its limit on v1 by its own spec: a device-plugin container that sets
/// `ERDMA_RDMA_MAX=<dev> hca_handle=max ...` gets `--nri-rdma-max`, and one that names a claim it
/// does not hold gets that claim's nothing; a claim prepared after the agent started (the
/// checkpoint changed) is its container's limit at StartContainer and at Synchronize.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cgroup_v1_limits_come_from_the_records_never_the_containers_env() {
    let node = Node::start(V1).await;
    // Claims prepared in team-b on erdma_0; this kubelet names no claim, so the smallest in the
    // namespace on the container's device applies. A running container that lacks its limit
    // (and names the big claim in its env) gets the small one at Synchronize.
    node.prepared("uid-small", "team-b", "small", 3);
    node.prepared("uid-big", "team-b", "big", 500);
    let mut p = pod("train", "6", &[]);
    p.namespace = "team-b".into();
    let mut running = container(
        &p,
        "worker",
        0,
        &["ERDMA_RDMA_MAX_UID_BIG=erdma_0 hca_handle=500 hca_object=8000"],
        "/kubepods/pod6/ctr-worker",
    );
    running.state = api::ContainerState::ContainerRunning as i32;
    let file = node.runc_created("kubepods/pod6/ctr-worker");
    node.session
        .synchronize(vec![p.clone()], vec![running])
        .await
        .unwrap();
    assert_eq!(read(&file), "erdma_0 hca_handle=3 hca_object=8000");

    // A device-plugin pod (no claim in its namespace) whose container forges the hand-off and
    // whose annotation asks for more: the operator's limit.
    let web = pod("web", "5", &[(RDMA_MAX_ANNOTATION, "hca_handle=max")]);
    let forged = container(
        &web,
        "app",
        0,
        &[
            "ERDMA_RDMA_MAX=erdma_0 hca_handle=max hca_object=max",
            "ERDMA_RDMA_MAX_UID_OTHER=erdma_0 hca_handle=500 hca_object=8000",
        ],
        "/kubepods/pod5/ctr-app",
    );
    node.session.create_container(&web, &forged).await.unwrap();
    let file = node.runc_created("kubepods/pod5/ctr-app");
    node.session
        .state_change(Event::StartContainer, &web, Some(&forged))
        .await
        .unwrap();
    assert_eq!(
        read(&file),
        "erdma_0 hca_handle=8",
        "the operator's limit: neither the env nor the annotation lifts it"
    );
    let ev = events_with(&node.api, "web", "ErdmaRdmaMaxCapped").await;
    assert!(
        ev[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("--nri-allow-annotation-raise"),
        "{:?}",
        ev[0].note
    );
    node.stop().await;
}

/// At Synchronize (the agent restarted while containers ran), a running container whose rdma
/// cgroup lacks its limit gets it written; one that has it is left alone; no update carries
/// `unified`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cgroup_v1_synchronize_writes_missing_limits_without_unified_updates() {
    let node = Node::start(V1).await;
    let p = pod("web", "1", &[]);
    let running = |name: &str, device: u32| {
        let mut c = container(&p, name, device, &[], &format!("/kubepods/pod1/ctr-{name}"));
        c.state = api::ContainerState::ContainerRunning as i32;
        c
    };
    let (bare, done) = (running("bare", 0), running("done", 1));
    let mut created = container(&p, "later", 0, &[], "/kubepods/pod1/ctr-later");
    created.state = api::ContainerState::ContainerCreated as i32;
    let bare_file = node.runc_created("kubepods/pod1/ctr-bare");
    let done_file = node.runc_created("kubepods/pod1/ctr-done");
    std::fs::write(
        &done_file,
        "erdma_0 hca_handle=max hca_object=max\nerdma_1 hca_handle=8 hca_object=max\n",
    )
    .unwrap();
    // The agent (re)connects while these run: the runtime synchronizes them.
    let synced = node
        .session
        .synchronize(vec![p.clone()], vec![bare, done, created])
        .await
        .unwrap();
    let unified: Vec<&String> = synced
        .update
        .iter()
        .flat_map(|u| &u.linux)
        .flat_map(|l| &l.resources)
        .flat_map(|r| r.unified.keys())
        .collect();
    assert!(
        unified.is_empty(),
        "runc refuses unified on v1: {unified:?}"
    );
    assert_eq!(read(&bare_file), "erdma_0 hca_handle=8");
    assert_eq!(
        read(&done_file),
        "erdma_0 hca_handle=max hca_object=max\nerdma_1 hca_handle=8 hca_object=max\n",
        "a cgroup that has its limit is not written"
    );
    assert!(
        !node
            .dir
            .path()
            .join("cgroup/rdma/kubepods/pod1/ctr-later")
            .exists(),
        "a container not started yet is left to its StartContainer"
    );
    assert_eq!(
        node.metric(r#"erdma_agent_rdma_limits_written_total{hook="Synchronize"} "#)
            .as_deref(),
        Some("1")
    );
    node.stop().await;
}

/// A limit that cannot be written (the container's cgroup is not there, the rdma hierarchy is
/// not mounted) never fails the container: it starts with its memlock, and the pod gets a Warning
/// naming the node's cgroup version, the container and the fix; the metric counts the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_cannot_be_written_warns_and_the_container_keeps_its_memlock() {
    let node = Node::start(V1).await;
    node.session.synchronize(vec![], vec![]).await.unwrap();
    let p = pod("web", "2", &[]);
    let c = container(&p, "app", 0, &[], "/kubepods/pod2/ctr-app");
    let a = node
        .session
        .create_container(&p, &c)
        .await
        .unwrap()
        .adjust
        .unwrap_or_default();
    assert!(has_memlock(&a));
    // runc made no rdma cgroup for it: the write fails.
    node.session
        .state_change(Event::StartContainer, &p, Some(&c))
        .await
        .expect("the container starts");
    let ev = events_with(&node.api, "web", "ErdmaRdmaLimitNotApplied").await;
    let msg = ev[0].note.clone().unwrap_or_default();
    assert_eq!(ev[0].type_.as_deref(), Some("Warning"));
    for part in [
        "container app of pod default/web",
        "cgroup v1",
        "erdma_0 hca_handle=8",
        "kubepods/pod2/ctr-app/rdma.max",
        "memlock",
    ] {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }
    assert_eq!(
        node.metric(r#"erdma_agent_rdma_limit_skipped_total{reason="write_failed"} "#)
            .as_deref(),
        Some("1")
    );
    // A cgroups_path that would leave the hierarchy is refused, not followed.
    let escape = container(&p, "esc", 0, &[], "/kubepods/../../etc");
    node.session
        .state_change(Event::StartContainer, &p, Some(&escape))
        .await
        .unwrap();
    assert_eq!(
        node.metric(r#"erdma_agent_rdma_limit_skipped_total{reason="bad_cgroups_path"} "#)
            .as_deref(),
        Some("1")
    );
    node.stop().await;

    // No rdma hierarchy on the node: memlock, no unified, a Warning with the fix.
    let node = Node::start(CgroupLayout {
        version: CgroupVersion::Hybrid,
        rdma_hierarchy: false,
    })
    .await;
    node.session.synchronize(vec![], vec![]).await.unwrap();
    assert_eq!(
        node.view
            .borrow()
            .as_ref()
            .map(|v| v.rdma_max_route.clone()),
        Some("none".into())
    );
    let a = node
        .session
        .create_container(&p, &c)
        .await
        .unwrap()
        .adjust
        .unwrap_or_default();
    assert!(has_memlock(&a));
    assert_eq!(unified_keys(&a), Vec::<String>::new());
    node.session
        .state_change(Event::StartContainer, &p, Some(&c))
        .await
        .unwrap();
    let ev = events_with(&node.api, "web", "ErdmaRdmaLimitNotApplied").await;
    let msg = ev[0].note.clone().unwrap_or_default();
    assert!(msg.contains("cgroup hybrid"), "{msg}");
    assert!(msg.contains("not mounted at /sys/fs/cgroup/rdma"), "{msg}");
    assert_eq!(
        node.metric(r#"erdma_agent_rdma_limit_skipped_total{reason="no_rdma_hierarchy"} "#)
            .as_deref(),
        Some("1")
    );
    node.stop().await;
}

/// On cgroup v2 nothing changes: `rdma.max` rides in the adjustment and StartContainer is not
/// subscribed.
#[test]
fn on_cgroup_v2_the_subscription_is_unchanged() {
    assert_eq!(nri::events(CgroupVersion::V2), nri::EVENTS);
    assert!(!nri::events(CgroupVersion::V2).contains(&Event::StartContainer));
    assert!(nri::events(CgroupVersion::V1).contains(&Event::StartContainer));
    assert!(nri::events(CgroupVersion::Hybrid).contains(&Event::StartContainer));
}
