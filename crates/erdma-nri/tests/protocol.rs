//! The plugin runner against the runtime stand-in over a real Unix socket: registration, the
//! subscription mask, Synchronize (whole and split), events (over StateChange and over their own
//! RPCs), adjustments, the runtime's timeouts in milliseconds, the time budget, the hook observer
//! and session end.

use erdma_nri::api::{self, Event};
use erdma_nri::fake::{FakeRuntime, Mode, Session};
use erdma_nri::plugin::{
    self, Handler, Hook, HookObserver, NriError, Outcome, PluginConfig, SessionEnd,
};
use erdma_nri::ttrpc::{BoxFuture, RpcError, code};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
    /// Every pod and container ID each Synchronize handed over.
    synced: Mutex<Vec<Vec<String>>>,
}

impl Handler for Recorder {
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(format!(
                "sync {} pods {} containers",
                pods.len(),
                containers.len()
            ));
            self.synced.lock().unwrap().push(
                pods.iter()
                    .map(|p| p.id.clone())
                    .chain(containers.iter().map(|c| c.id.clone()))
                    .collect(),
            );
            containers
                .iter()
                .filter(|c| c.name == "update-me")
                .map(|c| api::ContainerUpdate {
                    container_id: c.id.clone(),
                    ..Default::default()
                })
                .collect()
        })
    }

    fn state_change(
        &self,
        event: Event,
        pod: Option<api::PodSandbox>,
        _container: Option<api::Container>,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let pod = pod.unwrap_or_default();
            self.seen
                .lock()
                .unwrap()
                .push(format!("{event:?} {}/{}", pod.namespace, pod.name));
            if pod.name == "refuse" {
                return Err("pod refuse asked for SMC-R and it cannot be configured".into());
            }
            Ok(())
        })
    }

    fn create_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> BoxFuture<'_, Result<api::ContainerAdjustment, String>> {
        Box::pin(async move {
            if c.name == "slow" {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if c.name == "takes-100ms" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if c.name == "takes-1200ms" {
                tokio::time::sleep(Duration::from_millis(1200)).await;
            }
            let devices: Vec<String> = c
                .linux
                .unwrap_or_default()
                .devices
                .into_iter()
                .map(|d| d.path)
                .collect();
            self.seen
                .lock()
                .unwrap()
                .push(format!("create {}/{} {devices:?}", pod.name, c.name));
            let mut adjust = api::ContainerAdjustment::default();
            adjust.rlimits.push(api::PosixRlimit {
                r#type: "RLIMIT_MEMLOCK".into(),
                hard: u64::MAX,
                soft: u64::MAX,
            });
            adjust.linux = Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    unified: [("rdma.max".to_string(), "rxe0 hca_handle=2".to_string())]
                        .into_iter()
                        .collect(),
                }),
                ..Default::default()
            });
            Ok(adjust)
        })
    }
}

fn pod(name: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: format!("sb-{name}"),
        name: name.into(),
        namespace: "team-a".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_session_as_the_runtime_drives_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let runtime = FakeRuntime::bind(&sock).unwrap();
    let handler = Arc::new(Recorder::default());
    let cfg = PluginConfig {
        socket: sock.clone(),
        name: "erdma".into(),
        idx: "10".into(),
        events: vec![
            Event::RunPodSandbox,
            Event::RemovePodSandbox,
            Event::CreateContainer,
        ],
        budget: Duration::from_millis(300),
        observer: None,
    };
    let cancel = CancellationToken::new();
    let (c2, h2) = (cancel.clone(), handler.clone());
    let session = tokio::spawn(async move { plugin::run_session(&cfg, h2, &c2).await });

    let mut s = runtime.accept().await.unwrap();
    let reg = s.registration().await.expect("RegisterPlugin");
    assert_eq!(
        (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
        ("erdma", "10")
    );
    let events = s.configure().await.unwrap();
    assert_eq!(
        events, 0b1101,
        "RunPodSandbox, RemovePodSandbox, CreateContainer"
    );
    assert!(!api::subscribed(events, Event::StartContainer));
    s.synchronize(vec![pod("old")], vec![]).await.unwrap();
    assert!(
        s.state_change(Event::RunPodSandbox, &pod("p1"), None)
            .await
            .unwrap()
    );
    assert!(
        !s.state_change(Event::StartContainer, &pod("p1"), None)
            .await
            .unwrap(),
        "not subscribed: not sent"
    );
    let c = api::Container {
        name: "main".into(),
        linux: Some(api::LinuxContainer {
            devices: vec![api::LinuxDevice {
                path: "/dev/infiniband/uverbs0".into(),
                r#type: "c".into(),
                major: 231,
                minor: 192,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = s.create_container(&pod("p1"), &c).await.unwrap();
    let adjust = r.adjust.expect("an adjustment");
    assert_eq!(adjust.rlimits[0].r#type, "RLIMIT_MEMLOCK");
    assert_eq!(
        adjust.linux.unwrap().resources.unwrap().unified["rdma.max"],
        "rxe0 hca_handle=2"
    );
    // Over budget: answered with no adjustment instead of failing the container.
    let slow = api::Container {
        name: "slow".into(),
        ..Default::default()
    };
    let r = s.create_container(&pod("p1"), &slow).await.unwrap();
    assert_eq!(
        r.adjust.unwrap_or_default(),
        api::ContainerAdjustment::default()
    );
    // A handler error reaches the runtime as a failed call.
    let err = s
        .state_change(Event::RunPodSandbox, &pod("refuse"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RpcError::Status { message, .. } if message.contains("cannot be configured")),
        "{err}"
    );
    assert_eq!(
        *handler.seen.lock().unwrap(),
        vec![
            "sync 1 pods 0 containers".to_string(),
            "RunPodSandbox team-a/p1".into(),
            "create p1/main [\"/dev/infiniband/uverbs0\"]".into(),
            "RunPodSandbox team-a/refuse".into(),
        ]
    );
    // The runtime goes away: the session ends normally and the caller may reconnect.
    drop(s);
    drop(runtime);
    let r = tokio::time::timeout(Duration::from_secs(10), session).await;
    assert!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
}

/// A runtime that does not say its timeout (containerd 1.7) and a budget raised above the 2 s
/// default's half: the budget holds, and a handler taking 1.2 s still adjusts the container. A
/// runtime telling 2000 ms (containerd 2.x) caps it at 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_budget_holds_when_the_runtime_does_not_say_its_timeout() {
    for (mode, adjusted) in [(Mode::Containerd17, true), (Mode::Nri08, false)] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nri.sock");
        let runtime = FakeRuntime::bind(&sock).unwrap();
        let cfg = PluginConfig {
            socket: sock.clone(),
            name: "erdma".into(),
            idx: "10".into(),
            events: vec![Event::CreateContainer],
            budget: Duration::from_millis(3000),
            observer: None,
        };
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let h = Arc::new(Recorder::default());
        let session = tokio::spawn(async move { plugin::run_session(&cfg, h, &c2).await });
        let mut s = runtime.accept().await.unwrap();
        s.registration().await.expect("RegisterPlugin");
        s.mode = mode;
        s.timeout = Duration::from_secs(2);
        s.configure().await.unwrap();
        s.synchronize(vec![], vec![]).await.unwrap();
        let c = api::Container {
            name: "takes-1200ms".into(),
            ..Default::default()
        };
        let r = s.create_container(&pod("p1"), &c).await.unwrap();
        let rlimits = r.adjust.unwrap_or_default().rlimits.len();
        assert_eq!(rlimits == 1, adjusted, "{mode:?}");
        assert_eq!(s.closed(), None, "answered before the runtime's 2 s");
        cancel.cancel();
        drop(s);
        drop(runtime);
        let _ = tokio::time::timeout(Duration::from_secs(10), session).await;
    }
}

#[tokio::test]
async fn bad_settings_and_a_missing_socket_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = PluginConfig {
        socket: dir.path().join("absent.sock"),
        name: "erdma".into(),
        idx: "1".into(),
        events: vec![],
        budget: Duration::from_millis(100),
        observer: None,
    };
    let h = Arc::new(Recorder::default());
    let cancel = CancellationToken::new();
    let e = plugin::run_session(&cfg, h.clone(), &cancel)
        .await
        .unwrap_err();
    assert!(
        matches!(e, NriError::Config(ref m) if m.contains("two digits")),
        "{e}"
    );
    cfg.idx = "10".into();
    let e = plugin::run_session(&cfg, h, &cancel).await.unwrap_err();
    assert!(
        e.to_string().contains("absent.sock") && e.to_string().contains("disable = false"),
        "{e}"
    );
}

/// A plugin session against the stand-in playing `mode`, registered and configured.
struct Running {
    s: Session,
    handler: Arc<Recorder>,
    cancel: CancellationToken,
    session: tokio::task::JoinHandle<Result<(), NriError>>,
    _runtime: FakeRuntime,
    _dir: tempfile::TempDir,
}

async fn running(mode: Mode, budget: Duration, observer: Option<Arc<dyn HookObserver>>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let runtime = FakeRuntime::bind(&sock).unwrap();
    let handler = Arc::new(Recorder::default());
    let cfg = PluginConfig {
        socket: sock,
        name: "erdma".into(),
        idx: "10".into(),
        events: vec![
            Event::RunPodSandbox,
            Event::RemovePodSandbox,
            Event::CreateContainer,
        ],
        budget,
        observer,
    };
    let cancel = CancellationToken::new();
    let (c2, h2) = (cancel.clone(), handler.clone());
    let session = tokio::spawn(async move { plugin::run_session(&cfg, h2, &c2).await });
    let mut s = runtime.accept().await.unwrap();
    s.registration().await.expect("RegisterPlugin");
    s.mode = mode;
    s.configure().await.unwrap();
    Running {
        s,
        handler,
        cancel,
        session,
        _runtime: runtime,
        _dir: dir,
    }
}

impl Running {
    async fn end(self) {
        self.cancel.cancel();
        drop(self.s);
        let r = tokio::time::timeout(Duration::from_secs(10), self.session).await;
        assert!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
    }
}

fn container(name: &str) -> api::Container {
    api::Container {
        id: format!("c-{name}"),
        name: name.into(),
        ..Default::default()
    }
}

fn adjusted(r: &api::CreateContainerResponse) -> bool {
    r.adjust.as_ref().is_some_and(|a| a.rlimits.len() == 1)
}

/// containerd 2.x tells its 2 s request timeout as 2000 (milliseconds): a handler taking 100 ms
/// fits the 800 ms budget and its adjustment is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100ms_handler_is_applied_under_a_runtime_that_tells_2000ms() {
    let r = running(Mode::Nri08, Duration::from_millis(800), None).await;
    assert_eq!(r.s.timeout, Duration::from_secs(2));
    r.s.synchronize(vec![], vec![]).await.unwrap();
    let resp =
        r.s.create_container(&pod("p1"), &container("takes-100ms"))
            .await
            .unwrap();
    assert!(
        adjusted(&resp),
        "a 100 ms handler under a 2000 ms runtime timeout was cut: {resp:?}"
    );
    r.end().await;
}

/// containerd 1.7 tells no timeouts (0): the plugin keeps its default budget, applies a 100 ms
/// handler's adjustment and cuts a handler that never ends before the runtime's own 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_tells_no_timeout_gets_the_default_budget() {
    let r = running(Mode::Containerd17, Duration::from_millis(800), None).await;
    r.s.synchronize(vec![], vec![]).await.unwrap();
    let resp =
        r.s.create_container(&pod("p1"), &container("takes-100ms"))
            .await
            .unwrap();
    assert!(adjusted(&resp), "{resp:?}");
    let t = std::time::Instant::now();
    let resp =
        r.s.create_container(&pod("p1"), &container("slow"))
            .await
            .unwrap();
    assert!(!adjusted(&resp));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(r.s.closed(), None);
    r.end().await;
}

/// A Synchronize of about 10 MiB does not fit one ttRPC message (4 MiB): the runtime splits it,
/// the plugin echoes `more` with no updates on every part but the last and hands everything to
/// the handler once; the plugin stays registered and serves the next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronize_split_over_several_messages_is_handed_over_once() {
    let r = running(Mode::Nri08, Duration::from_millis(800), None).await;
    let filler = "x".repeat(80 * 1024);
    let pods: Vec<_> = (0..60)
        .map(|i| {
            let mut p = pod(&format!("old-{i}"));
            p.annotations.insert("filler".into(), filler.clone());
            p
        })
        .collect();
    let containers: Vec<_> = (0..60)
        .map(|i| {
            let mut c = container(if i == 59 { "update-me" } else { "old" });
            c.id = format!("c-{i}");
            c.annotations.insert("filler".into(), filler.clone());
            c
        })
        .collect();
    let synced = r.s.synchronize(pods, containers).await.unwrap();
    let parts = &synced.parts;
    assert!(parts.len() >= 3, "{parts:?}");
    let (last, rest) = parts.split_last().unwrap();
    for p in rest {
        assert!(p.more && p.reply_more && p.reply_updates == 0, "{p:?}");
    }
    assert!(!last.more, "{last:?}");
    assert_eq!(parts.iter().map(|p| p.pods).sum::<usize>(), 60);
    assert_eq!(parts.iter().map(|p| p.containers).sum::<usize>(), 60);
    assert_eq!(
        synced
            .update
            .iter()
            .map(|u| u.container_id.as_str())
            .collect::<Vec<_>>(),
        ["c-59"],
        "the last reply carries the handler's updates"
    );
    let seen = r.handler.synced.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the handler is called once");
    let mut ids = seen[0].clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120, "every pod and container once");
    assert!(ids.contains(&"sb-old-0".to_string()) && ids.contains(&"c-59".to_string()));
    assert_eq!(r.s.closed(), None);
    assert!(
        r.s.state_change(Event::RunPodSandbox, &pod("p1"), None)
            .await
            .unwrap()
    );
    assert_eq!(
        r.handler.seen.lock().unwrap().last().map(String::as_str),
        Some("RunPodSandbox team-a/p1")
    );
    r.end().await;
}

/// An NRI v0.12 runtime calls RunPodSandbox and RemovePodSandbox over their own RPCs, which the
/// plugin answers (no fallback to StateChange); a handler error fails the sandbox; methods of
/// unsubscribed events and unknown methods are refused with Unimplemented (12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nri_v012_runtime_gets_its_per_event_rpcs_answered() {
    let r = running(Mode::Nri012, Duration::from_millis(800), None).await;
    r.s.synchronize(vec![], vec![]).await.unwrap();
    assert!(
        r.s.state_change(Event::RunPodSandbox, &pod("p1"), None)
            .await
            .unwrap()
    );
    let err =
        r.s.state_change(Event::RunPodSandbox, &pod("refuse"), None)
            .await
            .unwrap_err();
    assert!(
        matches!(&err, RpcError::Status { method, code: code::UNKNOWN, message, .. }
            if method == "RunPodSandbox" && message.contains("cannot be configured")),
        "{err}"
    );
    assert!(
        r.s.state_change(Event::RemovePodSandbox, &pod("p1"), None)
            .await
            .unwrap()
    );
    assert!(!r.s.fell_back());
    assert_eq!(
        r.s.methods(),
        [
            "Configure",
            "Synchronize",
            "RunPodSandbox",
            "RunPodSandbox",
            "RemovePodSandbox"
        ]
    );
    let unimplemented = |e: RpcError| {
        matches!(
            e,
            RpcError::Status {
                code: code::UNIMPLEMENTED,
                ..
            }
        )
    };
    let start = api::StartContainerRequest {
        pod: Some(pod("p1")),
        container: Some(container("main")),
    };
    let e =
        r.s.call_raw("StartContainer", prost::Message::encode_to_vec(&start))
            .await
            .unwrap_err();
    assert!(unimplemented(e), "an unsubscribed event");
    let state = api::StateChangeEvent {
        event: Event::StopPodSandbox as i32,
        pod: Some(pod("p1")),
        container: None,
    };
    let e =
        r.s.call_raw("StateChange", prost::Message::encode_to_vec(&state))
            .await
            .unwrap_err();
    assert!(unimplemented(e), "an unsubscribed event over StateChange");
    let e = r.s.call_raw("FutureMethod", vec![]).await.unwrap_err();
    assert!(unimplemented(e), "an unknown method");
    assert_eq!(
        *r.handler.seen.lock().unwrap(),
        [
            "sync 0 pods 0 containers",
            "RunPodSandbox team-a/p1",
            "RunPodSandbox team-a/refuse",
            "RemovePodSandbox team-a/p1",
        ]
    );
    let resp =
        r.s.create_container(&pod("p1"), &container("main"))
            .await
            .unwrap();
    assert!(adjusted(&resp), "still served after the refusals");
    r.end().await;
}

/// A plugin of NRI before v0.12: it answers StateChange and refuses every per-event RPC with
/// Unimplemented.
struct OldPlugin {
    refuse: Mutex<Vec<String>>,
}

impl erdma_nri::ttrpc::Service for OldPlugin {
    fn call<'a>(
        &'a self,
        _service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, erdma_nri::ttrpc::Answer> {
        Box::pin(async move {
            use prost::Message as _;
            match method {
                "Configure" => Ok(api::ConfigureResponse {
                    events: api::event_mask(&[Event::RunPodSandbox]),
                }
                .encode_to_vec()),
                "StateChange" => {
                    let ev = api::StateChangeEvent::decode(body.as_slice())
                        .map_err(|e| (code::INTERNAL, e.to_string()))?;
                    let name = ev.pod.unwrap_or_default().name;
                    if name == "refuse" {
                        return Err((code::UNKNOWN, "refused".to_string()));
                    }
                    Ok(Vec::new())
                }
                m => {
                    self.refuse.lock().unwrap().push(m.to_string());
                    Err((code::UNIMPLEMENTED, format!("{m} is not implemented")))
                }
            }
        })
    }
}

/// The stand-in's v0.12 mode falls back as the runtime does: on Unimplemented it sends the event
/// over StateChange and remembers that for the plugin; an error there still fails the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nri_v012_runtime_falls_back_to_state_change_once_per_plugin() {
    use erdma_nri::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nri.sock");
    let runtime = FakeRuntime::bind(&sock).unwrap();
    let old = Arc::new(OldPlugin {
        refuse: Mutex::new(Vec::new()),
    });
    let plugin = {
        let (sock, old) = (sock.clone(), old.clone());
        tokio::spawn(async move {
            let mut mux = Mux::new(tokio::net::UnixStream::connect(&sock).await.unwrap());
            let served = mux.open(PLUGIN_SERVICE_CONN);
            let calls = mux.open(RUNTIME_SERVICE_CONN);
            let _m = mux.start();
            let (client, _t) = erdma_nri::ttrpc::Client::new(calls);
            let register = api::RegisterPluginRequest {
                plugin_name: "old".into(),
                plugin_idx: "20".into(),
            };
            client
                .call(
                    api::RUNTIME_SERVICE,
                    "RegisterPlugin",
                    prost::Message::encode_to_vec(&register),
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
            erdma_nri::ttrpc::serve(served, old).await
        })
    };
    let mut s = runtime.accept().await.unwrap();
    s.registration().await.unwrap();
    s.mode = Mode::Nri012;
    s.configure().await.unwrap();
    assert!(
        s.state_change(Event::RunPodSandbox, &pod("p1"), None)
            .await
            .unwrap()
    );
    assert!(s.fell_back());
    let err = s
        .state_change(Event::RunPodSandbox, &pod("refuse"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RpcError::Status { method, message, .. } if method == "StateChange" && message == "refused"),
        "{err}"
    );
    assert_eq!(
        s.methods(),
        ["Configure", "RunPodSandbox", "StateChange", "StateChange"]
    );
    assert_eq!(*old.refuse.lock().unwrap(), ["RunPodSandbox"]);
    drop(s);
    plugin.abort();
}

#[derive(Default)]
struct Observed(
    Mutex<Vec<(Hook, Outcome, Duration)>>,
    Mutex<Vec<SessionEnd>>,
);

impl HookObserver for Observed {
    fn observe(&self, hook: Hook, outcome: Outcome, elapsed: Duration) {
        self.0.lock().unwrap().push((hook, outcome, elapsed));
    }

    fn session_ended(&self, end: SessionEnd) {
        self.1.lock().unwrap().push(end);
    }
}

/// How each session ended reaches the observer: bad settings, a missing socket, a normal end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_end_is_observed() {
    let seen = Arc::new(Observed::default());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = PluginConfig {
        socket: dir.path().join("absent.sock"),
        name: "erdma".into(),
        idx: "1".into(),
        events: vec![],
        budget: Duration::from_millis(100),
        observer: Some(seen.clone()),
    };
    let h = Arc::new(Recorder::default());
    let cancel = CancellationToken::new();
    plugin::run_session(&cfg, h.clone(), &cancel)
        .await
        .unwrap_err();
    cfg.idx = "10".into();
    plugin::run_session(&cfg, h, &cancel).await.unwrap_err();
    let r = running(Mode::Nri012, Duration::from_millis(300), Some(seen.clone())).await;
    r.end().await;
    let ends: Vec<&str> = seen.1.lock().unwrap().iter().map(|e| e.name()).collect();
    assert_eq!(ends, ["config_error", "connect_error", "ended"]);
}

/// Every hook reaches the observer with its outcome, whichever RPC carried the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hook_is_observed_with_its_outcome() {
    for mode in [Mode::Nri08, Mode::Nri012] {
        let seen = Arc::new(Observed::default());
        let r = running(mode, Duration::from_millis(300), Some(seen.clone())).await;
        r.s.synchronize(vec![pod("old")], vec![]).await.unwrap();
        r.s.state_change(Event::RunPodSandbox, &pod("p1"), None)
            .await
            .unwrap();
        r.s.state_change(Event::RunPodSandbox, &pod("refuse"), None)
            .await
            .unwrap_err();
        r.s.create_container(&pod("p1"), &container("main"))
            .await
            .unwrap();
        r.s.create_container(&pod("p1"), &container("slow"))
            .await
            .unwrap();
        let e =
            r.s.call_raw("CreateContainer", vec![0xff, 0xff])
                .await
                .unwrap_err();
        assert!(
            matches!(
                e,
                RpcError::Status {
                    code: code::INTERNAL,
                    ..
                }
            ),
            "{e}"
        );
        r.s.state_change(Event::RemovePodSandbox, &pod("p1"), None)
            .await
            .unwrap();
        let got = seen.0.lock().unwrap().clone();
        let names: Vec<(&str, &str)> = got.iter().map(|(h, o, _)| (h.name(), o.name())).collect();
        assert_eq!(
            names,
            [
                ("Configure", "ok"),
                ("Synchronize", "ok"),
                ("RunPodSandbox", "ok"),
                ("RunPodSandbox", "error"),
                ("CreateContainer", "ok"),
                ("CreateContainer", "over_budget"),
                ("CreateContainer", "error"),
                ("RemovePodSandbox", "ok"),
            ],
            "{mode:?}"
        );
        let cut = got[5].2;
        assert!(
            cut >= Duration::from_millis(300) && cut < Duration::from_secs(1),
            "{cut:?}"
        );
        r.end().await;
    }
}
