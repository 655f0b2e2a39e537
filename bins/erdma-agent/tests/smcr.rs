//! Tests of the SMC-R pre-start hook over real gRPC on Unix sockets: the fake kubelet serves
//! pod-resources from its allocation ledger, a CRI `runtime.v1` server stands in for containerd,
//! Events go to the in-memory Kubernetes API server, and the annotated pod's namespace is a real
//! private network namespace of this kernel.

use erdma_agent::cluster::Cluster;
use erdma_agent::metrics::AgentMetrics;
use erdma_agent::smcr::{self, Decision, HookConfig, PodConfigurator, Smc, SmcrHook};
use erdma_cri::fake::FakeRuntime;
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_deviceplugin::{Metrics, Plugin, PluginConfig, PreStartHook};
use erdma_fake_kubelet::{AllocateOptions, AllocationRecord, FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_k8s::fake::FakeApiServer;
use erdma_kubelet::uds::{self, ClientAuthority};
use erdma_model::{NodeDevices, PnetId};
use erdma_smc::annotation::SMCR_ANNOTATION;
use erdma_smc::configure::PodReport;
use erdma_smc::prestart::{OutcomeKind, PodSandbox, PreStartOutcome};
use erdma_smc::probe::Mechanism;
use k8s_openapi::api::events::v1::Event;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "aliyun/erdma";

/// A ready sandbox of pod `default/<name>`; `netns` `None` = host network.
fn sandbox(
    name: &str,
    netns: Option<&str>,
    ann: &[(&str, &str)],
) -> (cri::PodSandboxStatus, String) {
    let status = cri::PodSandboxStatus {
        id: format!("sb-{name}"),
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: cri::PodSandboxState::SandboxReady as i32,
        created_at: 1,
        network: None,
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(cri::NamespaceOption {
                    network: if netns.is_none() {
                        cri::NamespaceMode::Node as i32
                    } else {
                        cri::NamespaceMode::Pod as i32
                    },
                    ..Default::default()
                }),
            }),
        }),
        labels: BTreeMap::new(),
        annotations: ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        runtime_handler: String::new(),
    };
    let info = match netns {
        Some(n) => format!(
            r#"{{"pid": 0, "runtimeSpec": {{"linux": {{"namespaces": [{{"type": "network", "path": "{n}"}}]}}}}}}"#
        ),
        None => "{}".to_string(),
    };
    (status, info)
}

/// What a hook published: its decisions, and the registry its metrics count in.
struct Seen {
    decisions: watch::Receiver<Vec<Decision>>,
    registry: Registry,
}

impl Seen {
    fn decisions(&self) -> Vec<Decision> {
        self.decisions.borrow().clone()
    }

    fn last(&self) -> Decision {
        self.decisions().pop().expect("a decision was published")
    }

    fn metrics(&self) -> String {
        erdma_agent::metrics::encode(&self.registry)
    }
}

/// Records what the hook asks and answers with the real configurator, or with a scripted
/// outcome (to cover the BPF-policy bookkeeping on a kernel without SMC).
struct Recorder {
    real: Smc,
    scripted: Mutex<Option<PreStartOutcome>>,
    calls: Mutex<Vec<(String, String)>>,
    released: Mutex<Vec<u64>>,
}

impl Recorder {
    fn new(scripted: Option<PreStartOutcome>) -> Arc<Self> {
        let options = erdma_smc::configure::PodOptions {
            host_netns: PathBuf::from("/proc/self/ns/net"),
            ..smcr::pod_options(false)
        };
        Arc::new(Recorder {
            real: Smc::new(options, None),
            scripted: Mutex::new(scripted),
            calls: Mutex::default(),
            released: Mutex::default(),
        })
    }
    fn calls(&self) -> Vec<(String, String)> {
        self.calls.lock().unwrap().clone()
    }
}

impl PodConfigurator for Recorder {
    fn prestart(&self, pod: &PodSandbox, pnetid: Option<&PnetId>) -> PreStartOutcome {
        // Only a call with a PNET ID can configure anything.
        if let Some(p) = pnetid {
            self.calls
                .lock()
                .unwrap()
                .push((pod.pod.clone(), p.as_str().to_string()));
        }
        match self.scripted.lock().unwrap().clone() {
            Some(o) => o,
            None => self.real.prestart(pod, pnetid),
        }
    }
    fn release_pod(&self, cookie: u64) -> Result<bool, String> {
        self.released.lock().unwrap().push(cookie);
        Ok(true)
    }
    fn policy_namespaces(&self) -> Option<usize> {
        None
    }
}

/// The `erdma-iwarp` fixture's devices with PNET IDs set (erdma_0 → ERDMA0, erdma_1 → ERDMA1).
fn served() -> (NodeTree, NodeDevices) {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let mut raw = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs(BTreeMap::new())),
    })
    .scan();
    for d in &mut raw.devices {
        let id = format!("ERDMA{}", d.name.trim_start_matches("erdma_"));
        d.pnet_id = Some(PnetId::parse(&id).unwrap());
    }
    (tree, raw)
}

/// A private network namespace held by a thread until the returned sender is dropped.
fn private_netns() -> (String, std::sync::mpsc::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let r = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET);
        let path = r.ok().map(|_| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { nix::libc::gettid() };
            format!("/proc/self/task/{tid}/ns/net")
        });
        tx.send(path).unwrap();
        let _ = stop_rx.recv();
    });
    let path = rx
        .recv()
        .unwrap()
        .expect("unshare(CLONE_NEWNET): these tests need CAP_SYS_ADMIN, as the lab and CI have");
    (path, stop_tx)
}

struct World {
    dir: tempfile::TempDir,
    kubelet: FakeKubelet,
    podres: PathBuf,
    cri: PathBuf,
    served: watch::Sender<NodeDevices>,
    stop: CancellationToken,
    _tree: NodeTree,
}

impl World {
    async fn start(
        ledger: &[(&str, &[&str])],
        sandboxes: Vec<(cri::PodSandboxStatus, String)>,
    ) -> World {
        let dir = tempfile::tempdir().unwrap();
        let podres = dir.path().join("pod-resources.sock");
        let mut cfg = FakeKubeletConfig::new(dir.path());
        cfg.pod_resources_socket = Some(podres.clone());
        let kubelet = FakeKubelet::start(cfg).await.unwrap();
        let records: Vec<AllocationRecord> = ledger
            .iter()
            .map(|(pod, ids)| AllocationRecord {
                pod: pod.to_string(),
                container: "app".into(),
                resource: RESOURCE.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
            })
            .collect();
        erdma_fake_kubelet::state::write_ledger(dir.path(), &records).unwrap();
        let cri = dir.path().join("containerd.sock");
        let stop = CancellationToken::new();
        let l = uds::bind(&cri).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(FakeRuntime(sandboxes)))
                .serve_with_incoming_shutdown(uds::incoming(l), stop.clone().cancelled_owned()),
        );
        let (tree, devices) = served();
        let (served, _) = watch::channel(devices);
        World {
            dir,
            kubelet,
            podres,
            cri,
            served,
            stop,
            _tree: tree,
        }
    }

    /// Who holds which device, as the agent owns it (device plugin and DRA claims): an owner
    /// with its refresher running until the world stops.
    fn holders(&self) -> Arc<erdma_kubelet::podresources::HolderCache> {
        erdma_kubelet::podresources::Holders::start(
            erdma_kubelet::podresources::PodResourcesClient::new(&self.podres),
            erdma_kubelet::podresources::Held::both(RESOURCE, erdma_model::names::DRA_DRIVER),
            self.stop.clone(),
        )
    }

    fn config(&self, strict: bool) -> HookConfig {
        HookConfig {
            resource: RESOURCE.into(),
            holders: self.holders(),
            cri_socket: Some(self.cri.clone()),
            host_root: self.dir.path().to_path_buf(),
            proc_root: PathBuf::from("/proc"),
            strict,
        }
    }

    fn hook(
        &self,
        cfg: HookConfig,
        smc: Arc<Recorder>,
        cluster: Option<Cluster>,
    ) -> (Arc<SmcrHook>, Seen) {
        let mut registry = Registry::default();
        let metrics = Arc::new(AgentMetrics::register(&mut registry));
        let hook = SmcrHook::new(cfg, smc, self.served.subscribe(), cluster, metrics);
        let decisions = hook.decisions();
        (
            Arc::new(hook),
            Seen {
                decisions,
                registry,
            },
        )
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.kubelet.shutdown().await;
    }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn cluster(api: &FakeApiServer) -> Cluster {
    Cluster::new(api.client(), "n1")
}

/// Waits until `pod` has at least `want` Events (a hang guard for a loaded CI machine, not a
/// latency target).
async fn events_for(api: &FakeApiServer, pod: &str, want: usize) -> Vec<Event> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let evs: Vec<Event> = api
            .list::<Event>(Some("default"))
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
            .collect();
        if evs.len() >= want {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let have = api
        .list::<Event>(Some("default"))
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .map(|e| e.reason.unwrap_or_default())
        .collect::<Vec<_>>();
    panic!(
        "pod {pod}: {} Event(s) in 30 s, want {want}: {have:?}",
        have.len()
    );
}

/// An annotated pod: the configurator gets the pod's namespace and the PNET ID of the granted
/// device (erdma_1, not erdma_0); on this kernel the outcome is a real one ("SMC unsupported"
/// without the smc module), reported as an Event on the pod and a metric; the container starts.
/// Strict mode fails it with the same message.
#[tokio::test]
async fn annotated_pod_is_configured_with_the_granted_devices_pnet_id() {
    let (netns, hold) = private_netns();
    let w = World::start(
        &[("default/web", &["erdma_1/3", "erdma_1/4"])],
        vec![sandbox("web", Some(&netns), &[(SMCR_ANNOTATION, "true")])],
    )
    .await;
    let api = FakeApiServer::new();
    let rec = Recorder::new(None);
    let (hook, state) = w.hook(w.config(false), rec.clone(), Some(cluster(&api)));
    hook.pre_start(&ids(&["erdma_1/4"]))
        .await
        .expect("the container starts");
    assert_eq!(
        rec.calls(),
        vec![("default/web".to_string(), "ERDMA1".to_string())]
    );
    let d = state.last();
    assert_eq!(d.pod.as_deref(), Some("default/web"));
    assert!(!d.failed_container);
    let smc_loaded = Path::new("/sys/module/smc").exists();
    if !smc_loaded {
        assert_eq!(d.outcome, OutcomeKind::Unsupported, "{d:?}");
        let m = d.message.clone().unwrap();
        assert!(m.starts_with("SMC unsupported: "), "{m}");
        let ev = events_for(&api, "web", 1).await;
        let e = &ev[0];
        assert_eq!(e.reason.as_deref(), Some("SmcrUnsupported"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.note.as_deref(), Some(m.as_str()));
        let r = e.regarding.as_ref().unwrap();
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.uid.as_deref(), Some("uid-web"));
        let text = state.metrics();
        assert!(
            text.contains("erdma_smc_pod_configurations_total{outcome=\"unsupported\"} 1"),
            "{text}"
        );
        // Strict: the same pod fails to start, with the reason.
        let (strict, _) = w.hook(w.config(true), Recorder::new(None), None);
        let e = strict.pre_start(&ids(&["erdma_1/3"])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().starts_with("SMC unsupported: "), "{e:?}");
    } else {
        // A kernel with SMC: the pod was configured, or failed with a reason (the lab covers
        // the details); never "unsupported".
        assert!(
            matches!(d.outcome, OutcomeKind::Configured | OutcomeKind::Failed),
            "{d:?}"
        );
    }
    drop(hold);
    w.shutdown().await;
}

/// Pods without the annotation, with `false`, with an invalid value, and host-network pods are
/// never configured; only the invalid value is reported (as a Warning Event).
#[tokio::test]
async fn unannotated_invalid_and_host_network_pods_are_left_alone() {
    let (netns, hold) = private_netns();
    let w = World::start(
        &[
            ("default/plain", &["erdma_0/1"]),
            ("default/off", &["erdma_0/2"]),
            ("default/typo", &["erdma_0/3"]),
            ("default/hostnet", &["erdma_0/4"]),
        ],
        vec![
            sandbox("plain", Some(&netns), &[]),
            sandbox("off", Some(&netns), &[(SMCR_ANNOTATION, "false")]),
            sandbox("typo", Some(&netns), &[(SMCR_ANNOTATION, "yes")]),
            sandbox("hostnet", None, &[(SMCR_ANNOTATION, "true")]),
        ],
    )
    .await;
    let api = FakeApiServer::new();
    let rec = Recorder::new(None);
    // Strict: none of these may fail the container.
    let (hook, state) = w.hook(w.config(true), rec.clone(), Some(cluster(&api)));
    for id in ["erdma_0/1", "erdma_0/2", "erdma_0/3", "erdma_0/4"] {
        hook.pre_start(&ids(&[id])).await.expect("starts");
    }
    let outcomes: Vec<(Option<String>, OutcomeKind)> = state
        .decisions()
        .into_iter()
        .map(|d| (d.pod, d.outcome))
        .collect();
    let want = [
        ("default/plain", OutcomeKind::NotRequested),
        ("default/off", OutcomeKind::NotRequested),
        ("default/typo", OutcomeKind::InvalidAnnotation),
        ("default/hostnet", OutcomeKind::HostNetwork),
    ];
    assert_eq!(
        outcomes,
        want.iter()
            .map(|(p, o)| (Some(p.to_string()), *o))
            .collect::<Vec<_>>()
    );
    let ev = events_for(&api, "typo", 1).await;
    assert_eq!(ev[0].reason.as_deref(), Some("SmcrInvalidAnnotation"));
    assert!(ev[0].note.as_deref().unwrap().contains("\"yes\""));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        api.list::<Event>(Some("default")).len(),
        1,
        "only the invalid annotation is an Event"
    );
    assert!(hook.tracked().is_empty());
    drop(hold);
    w.shutdown().await;
}

/// An annotated pod whose device has no PNET ID: nothing is configured, the pod gets a
/// Warning Event naming the devices, and only strict mode fails the container.
#[tokio::test]
async fn annotated_pod_without_a_pnet_id_is_reported() {
    let (netns, hold) = private_netns();
    let w = World::start(
        &[("default/web", &["erdma_0/1"])],
        vec![sandbox("web", Some(&netns), &[(SMCR_ANNOTATION, "true")])],
    )
    .await;
    w.served.send_modify(|s| {
        for d in &mut s.devices {
            d.pnet_id = None;
        }
    });
    let api = FakeApiServer::new();
    let rec = Recorder::new(None);
    let (hook, state) = w.hook(w.config(false), rec.clone(), Some(cluster(&api)));
    hook.pre_start(&ids(&["erdma_0/1"])).await.expect("starts");
    assert!(rec.calls().is_empty());
    let d = state.last();
    assert_eq!(d.outcome, OutcomeKind::Failed);
    let ev = events_for(&api, "web", 1).await;
    assert_eq!(ev[0].reason.as_deref(), Some("SmcrFailed"));
    let note = ev[0].note.clone().unwrap();
    assert!(
        note.contains("PNET ID") && note.contains("erdma_0/1"),
        "{note}"
    );
    let (strict, _) = w.hook(w.config(true), rec, None);
    let e = strict.pre_start(&ids(&["erdma_0/1"])).await.unwrap_err();
    assert!(e.message().contains("PNET ID"), "{e:?}");
    drop(hold);
    w.shutdown().await;
}

/// No CRI socket (the lab VM) or a pod the kubelet does not list: the container starts and the
/// reason is logged and counted; `--smcr-strict` fails it with the reason.
#[tokio::test]
async fn unavailable_runtime_or_unknown_pod_is_reported_and_fails_only_when_strict() {
    let w = World::start(&[("default/web", &["erdma_0/1"])], vec![]).await;
    let missing = w.dir.path().join("no-such/containerd.sock");
    let mut cfg = w.config(false);
    cfg.cri_socket = Some(missing.clone());
    let rec = Recorder::new(None);
    let (hook, state) = w.hook(cfg.clone(), rec.clone(), None);
    hook.pre_start(&ids(&["erdma_0/1"])).await.expect("starts");
    let d = state.last();
    assert_eq!(d.outcome, OutcomeKind::LookupFailed);
    let m = d.message.unwrap();
    assert!(
        m.contains("container runtime unavailable") && m.contains(missing.to_str().unwrap()),
        "{m}"
    );
    assert!(
        state
            .metrics()
            .contains("erdma_agent_smcr_lookup_failures_total 1")
    );
    // Auto-detection under a host root without any runtime socket: the same, naming the paths.
    let mut auto = cfg.clone();
    auto.cri_socket = None;
    let (hook, state) = w.hook(auto, rec.clone(), None);
    hook.pre_start(&ids(&["erdma_0/1"])).await.expect("starts");
    let m = state.last().message.unwrap();
    assert!(m.contains("run/containerd/containerd.sock"), "{m}");
    // The runtime is there, the kubelet does not list the devices: pod not found.
    let (hook, state) = w.hook(w.config(false), rec.clone(), None);
    hook.pre_start(&ids(&["erdma_1/9"])).await.expect("starts");
    let m = state.last().message.unwrap();
    assert!(
        m.contains("pod not found") && m.contains("erdma_1/9"),
        "{m}"
    );
    // Strict.
    cfg.strict = true;
    let (hook, _) = w.hook(cfg, rec.clone(), None);
    let e = hook.pre_start(&ids(&["erdma_0/1"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("container runtime unavailable"),
        "{e:?}"
    );
    assert!(rec.calls().is_empty(), "nothing configured without the pod");
    w.shutdown().await;
}

/// A pod put into the BPF policy leaves it when the kubelet stops listing it; a recreated
/// sandbox (new namespace cookie) releases the old cookie at once.
#[tokio::test]
async fn deleted_pods_leave_the_bpf_policy() {
    let (netns, hold) = private_netns();
    let w = World::start(
        &[
            ("default/web", &["erdma_0/1"]),
            ("default/db", &["erdma_1/1"]),
        ],
        vec![
            sandbox("web", Some(&netns), &[(SMCR_ANNOTATION, "true")]),
            sandbox("db", Some(&netns), &[(SMCR_ANNOTATION, "true")]),
        ],
    )
    .await;
    let configured = |cookie| PreStartOutcome::Configured {
        report: PodReport {
            netns: netns.clone(),
            skipped: None,
            capabilities: None,
            mechanism: Some(Mechanism::BpfPolicy),
            netns_cookie: Some(cookie),
            steps: Vec::new(),
            unsupported: None,
        },
    };
    let rec = Recorder::new(Some(configured(77)));
    let api = FakeApiServer::new();
    let (hook, state) = w.hook(w.config(false), rec.clone(), Some(cluster(&api)));
    hook.pre_start(&ids(&["erdma_0/1"])).await.unwrap();
    hook.pre_start(&ids(&["erdma_1/1"])).await.unwrap();
    assert_eq!(
        hook.tracked(),
        [
            ("default/db".to_string(), 77),
            ("default/web".to_string(), 77)
        ]
        .into_iter()
        .collect()
    );
    let ev = events_for(&api, "web", 1).await;
    assert_eq!(ev[0].reason.as_deref(), Some("SmcrEnabled"));
    assert_eq!(ev[0].type_.as_deref(), Some("Normal"));
    assert!(
        state
            .metrics()
            .contains("erdma_smc_pod_configurations_total{outcome=\"configured\"} 2")
    );
    // Everyone still there: nothing released.
    assert!(hook.reap_once().await.unwrap().is_empty());
    // web is deleted.
    erdma_fake_kubelet::release(w.dir.path(), "default/web")
        .await
        .unwrap();
    assert_eq!(hook.reap_once().await.unwrap(), vec!["default/web"]);
    assert_eq!(*rec.released.lock().unwrap(), vec![77]);
    assert_eq!(hook.tracked().len(), 1);
    // db's sandbox is recreated: a new cookie replaces (and releases) the old one; the same
    // cookie again (a second container) changes nothing.
    *rec.scripted.lock().unwrap() = Some(configured(78));
    hook.pre_start(&ids(&["erdma_1/1"])).await.unwrap();
    hook.pre_start(&ids(&["erdma_1/1"])).await.unwrap();
    assert_eq!(*rec.released.lock().unwrap(), vec![77, 77]);
    assert_eq!(
        hook.tracked(),
        [("default/db".to_string(), 78)].into_iter().collect()
    );
    // An unreachable kubelet releases nothing: it stopped, its socket and the kept connection
    // went with it.
    let World {
        kubelet, stop, dir, ..
    } = w;
    kubelet.shutdown().await;
    let e = hook.reap_once().await.unwrap_err();
    assert!(e.contains("pod-resources"), "{e}");
    assert_eq!(hook.tracked().len(), 1);
    drop(hold);
    stop.cancel();
    drop(dir);
}

/// The lab's allocation-modes path: the plugin asks for PreStartContainer, the fake kubelet
/// calls it during admission, there is no container runtime: the allocation succeeds.
#[tokio::test]
async fn prestart_through_the_plugin_without_a_runtime_succeeds() {
    let w = World::start(&[], vec![]).await;
    let mut cfg = w.config(false);
    cfg.cri_socket = None;
    let rec = Recorder::new(None);
    let (hook, state) = w.hook(cfg, rec, None);
    let mut pcfg = PluginConfig::new(w.dir.path());
    pcfg.pre_start_required = true;
    pcfg.slots_per_device = 3;
    let cancel = CancellationToken::new();
    let plugin = tokio::spawn(
        Plugin::new(pcfg, w.served.subscribe(), Arc::new(Metrics::new()))
            .with_pre_start(hook)
            .run(cancel.clone()),
    );
    w.kubelet
        .wait_for(Duration::from_secs(5), |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.updates > 0)
        })
        .await
        .expect("registered");
    let out = w
        .kubelet
        .allocate(&AllocateOptions {
            resource: RESOURCE.into(),
            count: 1,
            pod: "lab/p1".into(),
            container: "c".into(),
            authority: ClientAuthority::Localhost,
        })
        .await
        .expect("allocation with PreStartContainer");
    assert!(out.pre_start_called);
    let d = state.last();
    assert_eq!(d.outcome, OutcomeKind::LookupFailed);
    assert!(!d.failed_container);
    cancel.cancel();
    let _ = plugin.await;
    w.shutdown().await;
}

#[test]
fn pnet_comes_from_the_first_granted_device_that_has_one() {
    let (_t, mut served) = served();
    assert_eq!(
        smcr::pnet_of(&served, &ids(&["bogus", "erdma_1/0", "erdma_0/0"]))
            .map(|p| p.as_str().to_string()),
        Some("ERDMA1".into())
    );
    served.devices[1].pnet_id = None;
    assert_eq!(
        smcr::pnet_of(&served, &ids(&["erdma_1/0", "erdma_0/0"])).map(|p| p.as_str().to_string()),
        Some("ERDMA0".into())
    );
    assert_eq!(smcr::pnet_of(&served, &ids(&["erdma_1/0"])), None);
}

/// The NRI path against the runtime stand-in over a real socket: registration and subscription,
/// SMC-R at sandbox creation with the PNET ID of the pod's device (found through pod-resources,
/// before any container exists), memlock and `rdma.max` at container creation, a bad annotation
/// reported on the pod with nothing applied, and strict mode failing the sandbox on a kernel
/// without SMC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nri_configures_smcr_at_sandbox_creation_and_limits_containers() {
    use erdma_agent::nri::{self, AgentNri, NriView, Policy};
    use erdma_model::rdma_limit::{Memlock, RDMA_MAX_ANNOTATION, RdmaLimit};
    use erdma_nri::api::{self, Event};
    let (netns, hold) = private_netns();
    let w = World::start(&[("default/nripod", &["erdma_1/7"])], vec![]).await;
    let api_server = FakeApiServer::new();
    let rec = Recorder::new(None);
    let (hook, _seen) = w.hook(w.config(false), rec.clone(), Some(cluster(&api_server)));
    let (nri_tx, nri_rx) = watch::channel(Some(NriView::default()));
    let metrics = Arc::new(AgentMetrics::register(&mut Registry::default()));
    let handler = Arc::new(AgentNri {
        policy: Policy {
            memlock: Memlock::Unlimited,
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=8").unwrap()),
            allow_annotation_raise: false,
        },
        holders: w.holders(),
        claims: erdma_agent::rdma_max::ClaimRecords::none(),
        proc_root: PathBuf::from("/proc"),
        served: w.served.subscribe(),
        smcr: Some(hook),
        cluster: Some(cluster(&api_server)),
        metrics: metrics.clone(),
        view: nri_tx,
        cgroups: Arc::new(erdma_host::fake::FixedCgroupFs::new(
            erdma_host::CgroupLayout {
                version: erdma_host::CgroupVersion::V2,
                rdma_hierarchy: false,
            },
        )),
    });
    let sock = w.dir.path().join("nri.sock");
    let runtime = erdma_nri::fake::FakeRuntime::bind(&sock).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(nri::run(
        erdma_nri::plugin::PluginConfig {
            socket: sock.clone(),
            name: "erdma".into(),
            idx: "10".into(),
            events: nri::EVENTS.to_vec(),
            budget: nri::BUDGET,
            observer: None,
        },
        handler,
        cancel.clone(),
    ));
    let mut s = runtime.accept().await.unwrap();
    let reg = s.registration().await.unwrap();
    assert_eq!(reg.plugin_idx, "10");
    let mask = s.configure().await.unwrap();
    for e in [
        Event::RunPodSandbox,
        Event::RemovePodSandbox,
        Event::CreateContainer,
    ] {
        assert!(api::subscribed(mask, e), "{e:?}");
    }
    s.synchronize(vec![], vec![]).await.unwrap();
    assert!(nri_rx.borrow().as_ref().is_some_and(|n| n.connected));

    let pod = |name: &str, ann: &[(&str, &str)]| api::PodSandbox {
        id: format!("sb-{name}"),
        name: name.into(),
        uid: format!("uid-{name}"),
        namespace: "default".into(),
        annotations: ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        linux: Some(api::LinuxPodSandbox {
            namespaces: vec![api::LinuxNamespace {
                r#type: "network".into(),
                path: netns.clone(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let annotated = pod("nripod", &[(SMCR_ANNOTATION, "true")]);
    s.state_change(Event::RunPodSandbox, &annotated, None)
        .await
        .expect("non-strict: the sandbox starts");
    assert_eq!(
        rec.calls(),
        vec![("default/nripod".to_string(), "ERDMA1".to_string())],
        "configured before any container, with the PNET ID of the pod's device"
    );
    // A pod without aliyun/erdma, annotated or not, is not touched.
    s.state_change(
        Event::RunPodSandbox,
        &pod("other", &[(SMCR_ANNOTATION, "true")]),
        None,
    )
    .await
    .unwrap();
    assert_eq!(rec.calls().len(), 1);

    let container = |env: &str| api::Container {
        name: "app".into(),
        env: vec![env.to_string()],
        ..Default::default()
    };
    // The kubelet lists container app of the pod with a slot of erdma_1.
    let r = s
        .create_container(&annotated, &container("PATH=/bin"))
        .await
        .unwrap();
    let a = r.adjust.unwrap();
    assert_eq!(a.rlimits[0].r#type, "RLIMIT_MEMLOCK");
    assert_eq!(a.rlimits[0].hard, u64::MAX);
    assert_eq!(
        a.linux.unwrap().resources.unwrap().unified["rdma.max"],
        "erdma_1 hca_handle=8",
        "the install default without the annotation"
    );
    let bad = pod("nripod", &[(RDMA_MAX_ANNOTATION, "hca_handle=-1")]);
    let a = s
        .create_container(&bad, &container("PATH=/bin"))
        .await
        .unwrap()
        .adjust
        .unwrap();
    assert_eq!(
        a.linux.unwrap().resources.unwrap().unified["rdma.max"],
        "erdma_1 hca_handle=8",
        "a bad annotation keeps the install default rather than dropping it"
    );
    // Two Events on the pod: the SMC-R outcome at sandbox creation and the invalid annotation.
    let ev = events_for(&api_server, "nripod", 2).await;
    assert!(
        ev.iter()
            .any(|e| e.reason.as_deref() == Some("ErdmaRdmaMaxInvalid")
                && e.type_.as_deref() == Some("Warning")),
        "{ev:?}"
    );
    // A container of the same pod that the kubelet does not list, naming the pod's device in
    // its own ERDMA_DEVICES: nothing (the variable is the container's word, not the kubelet's).
    let mut forged = container("ERDMA_DEVICES=erdma_1");
    forged.name = "sidecar".into();
    let plain = s.create_container(&annotated, &forged).await.unwrap();
    assert_eq!(
        plain.adjust.unwrap_or_default(),
        api::ContainerAdjustment::default()
    );
    s.state_change(Event::RemovePodSandbox, &annotated, None)
        .await
        .unwrap();

    // Strict on a kernel without SMC: the sandbox fails with the reason.
    if !Path::new("/sys/module/smc").exists() {
        let (strict, _) = w.hook(w.config(true), Recorder::new(None), None);
        let handler = AgentNri {
            policy: Policy {
                memlock: Memlock::Off,
                default_rdma_max: None,
                allow_annotation_raise: false,
            },
            holders: w.holders(),
            claims: erdma_agent::rdma_max::ClaimRecords::none(),
            proc_root: PathBuf::from("/proc"),
            served: w.served.subscribe(),
            smcr: Some(strict),
            cluster: None,
            metrics,
            view: watch::channel(None).0,
            cgroups: Arc::new(erdma_host::fake::FixedCgroupFs::new(
                erdma_host::CgroupLayout {
                    version: erdma_host::CgroupVersion::V2,
                    rdma_hierarchy: false,
                },
            )),
        };
        use erdma_nri::plugin::Handler;
        let e = handler
            .state_change(Event::RunPodSandbox, Some(annotated.clone()), None)
            .await
            .unwrap_err();
        assert!(e.starts_with("SMC unsupported: "), "{e}");
    }
    drop(s);
    cancel.cancel();
    task.await.unwrap();
    drop(hold);
    w.shutdown().await;
}
