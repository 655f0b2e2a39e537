//! PreStartContainer pod discovery over real gRPC on Unix sockets: a kubelet pod-resources server
//! and a container runtime (CRI) server stand in for the kubelet and containerd, the two
//! boundaries that cannot exist on a build machine.

use erdma_cri::fake::FakeRuntime;
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_cri::{CriClient, CriError, SandboxInfo};
use erdma_kubelet::podresources::Holder;
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use erdma_kubelet::uds;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

struct Kubelet(Vec<pr::PodResources>);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.0.clone(),
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
    async fn get(
        &self,
        _: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

fn sandbox(
    id: &str,
    ns: &str,
    name: &str,
    ready: bool,
    created: i64,
    host: bool,
    ann: &[(&str, &str)],
) -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: id.into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{id}"),
            namespace: ns.into(),
            attempt: 0,
        }),
        state: if ready {
            cri::PodSandboxState::SandboxReady as i32
        } else {
            cri::PodSandboxState::SandboxNotready as i32
        },
        created_at: created,
        network: None,
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(cri::NamespaceOption {
                    network: if host {
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
    }
}

fn pod(ns: &str, name: &str, container: &str, ids: &[&str]) -> pr::PodResources {
    pr::PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![pr::ContainerResources {
            name: container.into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "aliyun/erdma".into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
    }
}

struct Servers {
    _dir: tempfile::TempDir,
    podres: PathBuf,
    cri: PathBuf,
    stop: CancellationToken,
}

impl Servers {
    /// Device IDs → the pod holding them (the pod-resources answer, as the process's one owner
    /// of it publishes it) → its sandbox (CRI), as the agent's pre-start hook does.
    async fn resolve(
        &self,
        cri: &mut CriClient,
        device_ids: &[&str],
    ) -> Result<(Holder, SandboxInfo), CriError> {
        use erdma_kubelet::podresources::{Held, Holders, PodResourcesClient};
        let owner = Holders::new(
            PodResourcesClient::new(&self.podres),
            Held::resource("aliyun/erdma"),
        );
        let snapshot = owner
            .fresh_within(std::time::Duration::from_secs(10))
            .await
            .expect("pod-resources answer");
        let ids: Vec<String> = device_ids.iter().map(|s| s.to_string()).collect();
        let holder = snapshot
            .holding(&ids)
            .cloned()
            .ok_or_else(|| CriError::NotFound(format!("no pod holds {ids:?}")))?;
        let info = cri.pod_sandbox(&holder.namespace, &holder.pod).await?;
        Ok((holder, info))
    }
}

async fn start(kubelet: Kubelet, runtime: FakeRuntime) -> Servers {
    let dir = tempfile::tempdir().unwrap();
    let podres = dir.path().join("pod-resources.sock");
    let cri = dir.path().join("containerd.sock");
    let stop = CancellationToken::new();
    let l = uds::bind(&podres).unwrap();
    let s = stop.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(uds::incoming(l), s.cancelled_owned()),
    );
    let l = uds::bind(&cri).unwrap();
    let s = stop.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(runtime))
            .serve_with_incoming_shutdown(uds::incoming(l), s.cancelled_owned()),
    );
    Servers {
        _dir: dir,
        podres,
        cri,
        stop,
    }
}

const SMCR: &str = "network.alibabacloud.com/erdma-smcr";

fn containerd_info(netns: &str, pid: u32) -> String {
    format!(
        r#"{{"pid": {pid}, "runtimeSpec": {{"linux": {{"namespaces": [{{"type": "pid"}}, {{"type": "network", "path": "{netns}"}}]}}}}}}"#
    )
}

#[tokio::test]
async fn prestart_device_ids_lead_to_the_pods_netns_and_annotation() {
    let s = start(
        Kubelet(vec![
            pod("kube-system", "agent", "agent", &[]),
            pod("default", "web-0", "app", &["erdma_0/7", "erdma_0/8"]),
        ]),
        FakeRuntime(vec![
            // An old, stopped sandbox of the same pod, and another pod.
            (
                sandbox(
                    "old",
                    "default",
                    "web-0",
                    false,
                    10,
                    false,
                    &[(SMCR, "true")],
                ),
                containerd_info("/var/run/netns/cni-old", 1),
            ),
            (
                sandbox(
                    "new",
                    "default",
                    "web-0",
                    true,
                    20,
                    false,
                    &[(SMCR, "true")],
                ),
                containerd_info("/var/run/netns/cni-new", 4242),
            ),
            (
                sandbox("x", "default", "other", true, 30, false, &[]),
                containerd_info("/var/run/netns/cni-x", 2),
            ),
        ]),
    )
    .await;
    let mut cri = CriClient::connect(&s.cri, Path::new("/proc"))
        .await
        .unwrap();
    assert_eq!(
        cri.version().await.unwrap(),
        ("containerd".to_string(), "v2.1.0".to_string())
    );
    // Every sandbox's pod, one per UID, ready or not (what maps a cgroup's pod UID to a name).
    let pods: Vec<(String, String, String)> = cri
        .pods()
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.uid, p.namespace, p.name))
        .collect();
    let p = |u: &str, n: &str| (u.to_string(), "default".to_string(), n.to_string());
    assert_eq!(
        pods,
        vec![
            p("uid-new", "web-0"),
            p("uid-old", "web-0"),
            p("uid-x", "other")
        ]
    );
    let (owner, info) = s.resolve(&mut cri, &["erdma_0/8"]).await.unwrap();
    assert_eq!(
        (
            owner.namespace.as_str(),
            owner.pod.as_str(),
            owner.container.as_str()
        ),
        ("default", "web-0", "app")
    );
    assert_eq!(info.id, "new");
    assert_eq!(info.uid, "uid-new");
    assert!(!info.host_network);
    assert_eq!(info.netns, Some(PathBuf::from("/var/run/netns/cni-new")));
    assert_eq!(info.annotations.get(SMCR).map(String::as_str), Some("true"));
    s.stop.cancel();
}

#[tokio::test]
async fn host_network_pods_have_no_netns_and_unknown_devices_are_named() {
    let s = start(
        Kubelet(vec![pod("default", "hostnet", "c", &["erdma_1/0"])]),
        FakeRuntime(vec![(
            sandbox("h", "default", "hostnet", true, 1, true, &[(SMCR, "true")]),
            "{}".to_string(),
        )]),
    )
    .await;
    let mut cri = CriClient::connect(&s.cri, Path::new("/proc"))
        .await
        .unwrap();
    let (_, info) = s.resolve(&mut cri, &["erdma_1/0"]).await.unwrap();
    assert!(info.host_network);
    assert_eq!(info.netns, None);
    let e = s.resolve(&mut cri, &["erdma_9/9"]).await.unwrap_err();
    assert!(matches!(e, CriError::NotFound(_)), "{e}");
    assert!(e.to_string().contains("erdma_9/9"), "{e}");
    s.stop.cancel();
}

#[tokio::test]
async fn missing_sandbox_netns_and_sockets_are_clear_errors() {
    let s = start(
        Kubelet(vec![
            pod("default", "gone", "c", &["erdma_0/1"]),
            pod("default", "nons", "c", &["erdma_0/2"]),
        ]),
        FakeRuntime(vec![(
            sandbox("n", "default", "nons", true, 1, false, &[]),
            r#"{"pid": 0}"#.to_string(),
        )]),
    )
    .await;
    let mut cri = CriClient::connect(&s.cri, Path::new("/proc"))
        .await
        .unwrap();
    let e = s.resolve(&mut cri, &["erdma_0/1"]).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("pod default/gone has no ready sandbox"),
        "{e}"
    );
    let e = s.resolve(&mut cri, &["erdma_0/2"]).await.unwrap_err();
    assert!(matches!(e, CriError::NoNetns { .. }), "{e}");
    // CRI socket missing.
    let e = CriClient::connect(
        Path::new("/nonexistent/containerd.sock"),
        Path::new("/proc"),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/containerd.sock"),
        "{e}"
    );
    s.stop.cancel();
}

/// The whole pre-start path on this machine's real kernel: device IDs → pod (pod-resources) →
/// sandbox (CRI, netns of a real private namespace) → annotation → SMC configuration. This build
/// host has no SMC, so the annotated pod gets "SMC unsupported" and starts on TCP; the
/// unannotated one is left alone.
#[tokio::test]
async fn prestart_end_to_end_with_the_smc_decision() {
    use erdma_smc::annotation::SmcRequest;
    use erdma_smc::configure::{PodOptions, SmcConfigurator};
    use erdma_smc::prestart::{PodSandbox, PreStartOutcome};
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        tx.send(format!("/proc/self/task/{tid}/ns/net")).unwrap();
        let _ = stop_rx.recv();
    });
    let netns = rx.recv().unwrap();
    let s = start(
        Kubelet(vec![
            pod("default", "smc", "app", &["erdma_0/1"]),
            pod("default", "plain", "app", &["erdma_0/2"]),
        ]),
        FakeRuntime(vec![
            (
                sandbox("a", "default", "smc", true, 1, false, &[(SMCR, "true")]),
                containerd_info(&netns, 0),
            ),
            (
                sandbox("b", "default", "plain", true, 1, false, &[]),
                containerd_info(&netns, 0),
            ),
        ]),
    )
    .await;
    let configurator = SmcConfigurator::new(
        PodOptions {
            host_netns: PathBuf::from("/proc/self/ns/net"),
            ..PodOptions::default()
        },
        None,
    );
    let pnet = erdma_model::PnetId::parse("00163E0A1B2C").unwrap();
    let mut cri = CriClient::connect(&s.cri, Path::new("/proc"))
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for id in ["erdma_0/1", "erdma_0/2"] {
        let (_, info) = s.resolve(&mut cri, &[id]).await.unwrap();
        let sandbox = PodSandbox::new(
            &info.namespace,
            &info.name,
            info.netns.clone(),
            SmcRequest::from_annotations(&info.annotations),
            vec![id.to_string()],
        );
        let c = configurator.clone();
        let p = pnet.clone();
        outcomes.push(
            tokio::task::spawn_blocking(move || c.prestart(&sandbox, Some(&p)))
                .await
                .unwrap(),
        );
    }
    assert_eq!(outcomes[1], PreStartOutcome::NotRequested);
    if Path::new("/sys/module/smc").exists() {
        assert!(matches!(
            outcomes[0],
            PreStartOutcome::Configured { .. } | PreStartOutcome::Failed { .. }
        ));
    } else {
        assert!(
            matches!(outcomes[0], PreStartOutcome::Unsupported { .. }),
            "{:?}",
            outcomes[0]
        );
        let m = outcomes[0].event_message().unwrap();
        assert!(m.starts_with("SMC unsupported: "), "{m}");
        assert!(!outcomes[0].fails_container(false));
    }
    drop(stop_tx);
    s.stop.cancel();
}
