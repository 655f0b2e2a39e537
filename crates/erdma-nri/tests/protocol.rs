//! The plugin runner against the runtime stand-in over a real Unix socket: registration, the
//! subscription mask, Synchronize, events, adjustments, the time budget and session end.

use erdma_nri::api::{self, Event};
use erdma_nri::fake::FakeRuntime;
use erdma_nri::plugin::{self, Handler, NriError, PluginConfig};
use erdma_nri::ttrpc::{BoxFuture, RpcError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
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
            Vec::new()
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
/// default's half: the budget holds, and a handler taking 1.2 s still adjusts the container. The
/// same runtime telling 2 s caps it at 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_budget_holds_when_the_runtime_does_not_say_its_timeout() {
    for (announce, adjusted) in [(false, true), (true, false)] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nri.sock");
        let runtime = FakeRuntime::bind(&sock).unwrap();
        let cfg = PluginConfig {
            socket: sock.clone(),
            name: "erdma".into(),
            idx: "10".into(),
            events: vec![Event::CreateContainer],
            budget: Duration::from_millis(3000),
        };
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let h = Arc::new(Recorder::default());
        let session = tokio::spawn(async move { plugin::run_session(&cfg, h, &c2).await });
        let mut s = runtime.accept().await.unwrap();
        s.registration().await.expect("RegisterPlugin");
        s.announce_timeout = announce;
        s.timeout = Duration::from_secs(2);
        s.configure().await.unwrap();
        s.synchronize(vec![], vec![]).await.unwrap();
        let c = api::Container {
            name: "takes-1200ms".into(),
            ..Default::default()
        };
        let r = s.create_container(&pod("p1"), &c).await.unwrap();
        let rlimits = r.adjust.unwrap_or_default().rlimits.len();
        assert_eq!(rlimits == 1, adjusted, "announced timeout: {announce}");
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
