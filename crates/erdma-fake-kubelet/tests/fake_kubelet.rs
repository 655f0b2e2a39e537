//! The fake kubelet (library and binary) against a minimal static device plugin.

mod common;

use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig, OtherPlugin};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use erdma_kubelet::deviceplugin::v1beta1::registration_client::RegistrationClient;
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Advertises `dev/0`..`dev/3` (NUMA 0), prefers the highest IDs (or answers `fixed_preference`),
/// records each GetPreferredAllocation request in `preference_requests`, counts PreStart calls. With
/// `pod_resources`, PreStart looks its `resource`'s devices up there first, as the agent's SMC-R hook does, and
/// records the owning `namespace/name` (or `None`) in `owners`; with `fail_pre_start` it fails.
#[derive(Clone, Default)]
struct StaticPlugin {
    pre_starts: Arc<AtomicUsize>,
    stop: CancellationToken,
    pod_resources: Option<PathBuf>,
    resource: String,
    owners: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    fail_pre_start: bool,
    fixed_preference: Option<Vec<String>>,
    preference_requests: Arc<std::sync::Mutex<Vec<api::ContainerPreferredAllocationRequest>>>,
}

type Stream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for StaticPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }))
    }
    type ListAndWatchStream = Stream;
    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<Stream>, Status> {
        let devices = (0..4)
            .map(|i| api::Device {
                id: format!("dev/{i}"),
                health: api::HEALTHY.into(),
                topology: Some(api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: 0 }],
                }),
            })
            .collect();
        let first = futures_once(api::ListAndWatchResponse { devices }, self.stop.clone());
        Ok(Response::new(Box::pin(first)))
    }
    async fn get_preferred_allocation(
        &self,
        r: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let c = &r.get_ref().container_requests[0];
        self.preference_requests.lock().unwrap().push(c.clone());
        let mut ids = c.available_device_i_ds.clone();
        ids.sort();
        ids.reverse();
        ids.truncate(c.allocation_size as usize);
        if let Some(fixed) = &self.fixed_preference {
            ids = fixed.clone();
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: vec![api::ContainerPreferredAllocationResponse {
                device_i_ds: ids,
            }],
        }))
    }
    async fn allocate(
        &self,
        r: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let responses = r
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| api::ContainerAllocateResponse {
                envs: [("IDS".to_string(), c.devices_ids.join(","))]
                    .into_iter()
                    .collect(),
                devices: vec![api::DeviceSpec {
                    container_path: "/dev/x".into(),
                    host_path: "/dev/x".into(),
                    permissions: "rw".into(),
                }],
                ..Default::default()
            })
            .collect();
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses,
        }))
    }
    async fn pre_start_container(
        &self,
        r: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        self.pre_starts.fetch_add(1, Ordering::SeqCst);
        if let Some(sock) = &self.pod_resources {
            let ids = &r.get_ref().devices_ids;
            let ch = uds::connect(sock, ClientAuthority::Localhost, Duration::from_secs(5))
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            let list = PodResourcesListerClient::new(ch)
                .list(pr::ListPodResourcesRequest {})
                .await?
                .into_inner();
            let owner = list
                .pod_resources
                .iter()
                .find(|p| {
                    p.containers.iter().any(|c| {
                        c.devices
                            .iter()
                            .any(|d| d.resource_name == self.resource && d.device_ids == *ids)
                    })
                })
                .map(|p| format!("{}/{}", p.namespace, p.name));
            self.owners.lock().unwrap().push(owner);
        }
        if self.fail_pre_start {
            return Err(Status::failed_precondition("pre-start refused by the test"));
        }
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// One message, then an open stream (as a plugin keeps it open).
fn futures_once(
    msg: api::ListAndWatchResponse,
    stop: CancellationToken,
) -> impl tokio_stream::Stream<Item = Result<api::ListAndWatchResponse, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let _ = tx.send(Ok(msg)).await;
        // Keep the stream open until the receiver goes away or the plugin stops.
        tokio::select! {
            _ = tx.closed() => {}
            _ = stop.cancelled() => {}
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn serve_plugin(path: &Path, mut plugin: StaticPlugin, cancel: CancellationToken) {
    plugin.stop = cancel.clone();
    let listener = uds::bind(path).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(uds::incoming(listener), cancel.cancelled())
            .await
            .unwrap();
    });
}

async fn register(dir: &Path, version: &str, resource: &str, endpoint: &str) -> Result<(), Status> {
    let ch = uds::connect(
        &dir.join("kubelet.sock"),
        ClientAuthority::Localhost,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    RegistrationClient::new(ch)
        .register(api::RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map(|_| ())
}

fn short_dir() -> tempfile::TempDir {
    common::short_dir("fk")
}

struct Daemon(Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_erdma-fake-kubelet"))
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn read_state(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("fake-kubelet-state.json")).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validates_registration_like_the_kubelet() {
    let dir = short_dir();
    let k = erdma_fake_kubelet::FakeKubelet::start(erdma_fake_kubelet::FakeKubeletConfig::new(
        dir.path(),
    ))
    .await
    .unwrap();
    let e = register(dir.path(), "v1alpha", "example.com/dev", "p.sock")
        .await
        .unwrap_err();
    assert!(e.message().contains("\"v1alpha\""), "{e:?}");
    let e = register(dir.path(), "v1beta1", "kubernetes.io/dev", "p.sock")
        .await
        .unwrap_err();
    assert!(e.message().contains("kubernetes.io/dev"), "{e:?}");
    let e = register(dir.path(), "v1beta1", "example.com/dev", "../p.sock")
        .await
        .unwrap_err();
    assert!(e.message().contains("file name"), "{e:?}");
    // Nothing serves the endpoint: the dial-back inside Register fails.
    let e = register(dir.path(), "v1beta1", "example.com/dev", "nobody.sock")
        .await
        .unwrap_err();
    assert!(e.message().contains("dial"), "{e:?}");
    assert_eq!(k.state().registrations, 0);
    k.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_run_allocate_release_restart_and_pod_resources() {
    let dir = short_dir();
    let pr_sock: PathBuf = dir.path().join("pr.sock");
    let plugin_dir = dir.path().join("dp");
    let mut daemon = Daemon(
        bin()
            .args(["run", "--dir"])
            .arg(&plugin_dir)
            .arg("--pod-resources-socket")
            .arg(&pr_sock)
            .args(["--authority", "socket-path"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("kubelet.sock", || {
        uds::is_socket(&plugin_dir.join("kubelet.sock"))
    })
    .await;
    let plugin = StaticPlugin::default();
    let cancel = CancellationToken::new();
    serve_plugin(&plugin_dir.join("p.sock"), plugin.clone(), cancel.clone());
    register(&plugin_dir, "v1beta1", "example.com/dev", "p.sock")
        .await
        .unwrap();
    wait_until("devices in the state file", || {
        read_state(&plugin_dir)["resources"]["example.com/dev"]["devices"]
            .as_array()
            .is_some_and(|d| d.len() == 4)
    })
    .await;
    let st = read_state(&plugin_dir);
    let r = &st["resources"]["example.com/dev"];
    assert_eq!(r["endpoint"], "p.sock");
    assert_eq!(r["options"]["pre_start_required"], true);
    assert_eq!(
        r["devices"][0],
        serde_json::json!({"id": "dev/0", "health": "Healthy", "numa": [0]})
    );

    // Two one-shot allocations: preferred IDs (highest first), PreStart called, ledger updated.
    let alloc = |pod: &str, n: &str| {
        bin()
            .args(["allocate", "--dir"])
            .arg(&plugin_dir)
            .args([
                "--resource",
                "example.com/dev",
                "--count",
                n,
                "--pod",
                pod,
                "-o",
                "json",
            ])
            .output()
            .unwrap()
    };
    let out = alloc("ns/a", "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a["pod"], "ns/a");
    assert_eq!(a["device_ids"], serde_json::json!(["dev/3", "dev/2"]));
    assert_eq!(a["envs"]["IDS"], "dev/3,dev/2");
    assert_eq!(
        a["devices"][0],
        serde_json::json!({"container_path": "/dev/x", "host_path": "/dev/x", "permissions": "rw"})
    );
    assert_eq!(a["cdi_devices"], serde_json::json!([]));
    assert_eq!(plugin.pre_starts.load(Ordering::SeqCst), 1);
    let b: serde_json::Value = serde_json::from_slice(&alloc("ns/b", "2").stdout).unwrap();
    assert_eq!(b["device_ids"], serde_json::json!(["dev/1", "dev/0"]));
    let out = alloc("ns/c", "1");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("not enough example.com/dev: requested 1, 0 free")
    );
    assert_eq!(
        read_state(&plugin_dir)["allocations"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // pod-resources API from the ledger.
    let ch = uds::connect(&pr_sock, ClientAuthority::Localhost, Duration::from_secs(5))
        .await
        .unwrap();
    let mut prc = PodResourcesListerClient::new(ch);
    let list = prc
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 2);
    assert_eq!(list.pod_resources[0].namespace, "ns");
    assert_eq!(list.pod_resources[0].name, "a");
    assert_eq!(
        list.pod_resources[0].containers[0].devices[0].device_ids,
        vec!["dev/3", "dev/2"]
    );
    assert_eq!(
        list.pod_resources[0].containers[0].devices[0]
            .topology
            .as_ref()
            .unwrap()
            .nodes[0]
            .id,
        0
    );
    let got = prc
        .get(pr::GetPodResourcesRequest {
            pod_name: "b".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.unwrap().containers[0].name, "c");
    let e = prc
        .get(pr::GetPodResourcesRequest {
            pod_name: "zz".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let alloc_res = prc
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alloc_res.devices.len(), 4);

    // Release frees the IDs.
    let out = bin()
        .args(["release", "--dir"])
        .arg(&plugin_dir)
        .args(["--pod", "ns/a"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        read_state(&plugin_dir)["allocations"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let c: serde_json::Value = serde_json::from_slice(&alloc("ns/c", "1").stdout).unwrap();
    assert_eq!(c["device_ids"], serde_json::json!(["dev/3"]));

    // Restart: every socket in the directory is deleted (ours too), kubelet.sock re-created,
    // the resource forgotten, the ledger kept; non-socket files stay.
    std::fs::write(plugin_dir.join("keep.txt"), b"x").unwrap();
    let out = bin()
        .args(["restart", "--dir"])
        .arg(&plugin_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!plugin_dir.join("p.sock").exists());
    assert!(uds::is_socket(&plugin_dir.join("kubelet.sock")));
    assert!(plugin_dir.join("keep.txt").exists());
    wait_until("restart in state", || {
        read_state(&plugin_dir)["kubelet_restarts"] == 1
    })
    .await;
    let st = read_state(&plugin_dir);
    assert!(st["resources"].as_object().unwrap().is_empty());
    assert_eq!(st["allocations"].as_array().unwrap().len(), 2);

    // SIGTERM: exit 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = daemon.0.wait().unwrap();
    assert!(status.success());
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_end_marks_devices_unhealthy() {
    let dir = short_dir();
    let k = erdma_fake_kubelet::FakeKubelet::start(erdma_fake_kubelet::FakeKubeletConfig::new(
        dir.path(),
    ))
    .await
    .unwrap();
    let cancel = CancellationToken::new();
    serve_plugin(
        &dir.path().join("p.sock"),
        StaticPlugin::default(),
        cancel.clone(),
    );
    let before = erdma_fake_kubelet::state::monotonic_us();
    register(dir.path(), "v1beta1", "example.com/dev", "p.sock")
        .await
        .unwrap();
    let s = k
        .wait_for(Duration::from_secs(5), |s| {
            s.resources
                .get("example.com/dev")
                .is_some_and(|r| r.devices.len() == 4)
        })
        .await
        .unwrap();
    // The receipt of the ListAndWatch message is stamped on the boot's monotonic clock.
    let received = s.resources["example.com/dev"].received_monotonic_us;
    assert!(
        before < received && received <= erdma_fake_kubelet::state::monotonic_us(),
        "received at {received} µs, registered after {before} µs"
    );
    cancel.cancel();
    let s = k
        .wait_for(Duration::from_secs(5), |s| {
            s.resources["example.com/dev"]
                .devices
                .iter()
                .all(|d| d.health == "Unhealthy")
        })
        .await
        .unwrap();
    assert!(!s.resources["example.com/dev"].connected);
    k.shutdown().await;
}

/// Like the kubelet, the fake records a container's devices at Allocate, before PreStartContainer:
/// a pre-start hook finds its pod through pod-resources. A failed PreStart fails the container and
/// gives its devices back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestart_finds_its_pod_in_pod_resources_and_a_failure_releases_it() {
    let dir = short_dir();
    let pr_sock = dir.path().join("pr.sock");
    let mut cfg = erdma_fake_kubelet::FakeKubeletConfig::new(dir.path());
    cfg.pod_resources_socket = Some(pr_sock.clone());
    let k = erdma_fake_kubelet::FakeKubelet::start(cfg).await.unwrap();
    let cancel = CancellationToken::new();
    let plugin = StaticPlugin {
        pod_resources: Some(pr_sock.clone()),
        resource: "example.com/dev".into(),
        ..Default::default()
    };
    serve_plugin(&dir.path().join("p.sock"), plugin.clone(), cancel.clone());
    register(dir.path(), "v1beta1", "example.com/dev", "p.sock")
        .await
        .unwrap();
    k.wait_for(Duration::from_secs(5), |s| {
        s.resources
            .get("example.com/dev")
            .is_some_and(|r| r.devices.len() == 4)
    })
    .await
    .unwrap();
    let opts = |pod: &str| erdma_fake_kubelet::AllocateOptions {
        resource: "example.com/dev".into(),
        count: 2,
        pod: pod.into(),
        container: "c".into(),
        authority: ClientAuthority::Localhost,
    };
    let out = k.allocate(&opts("ns/a")).await.unwrap();
    assert!(out.pre_start_called);
    assert_eq!(out.device_ids, vec!["dev/3", "dev/2"]);
    assert_eq!(
        *plugin.owners.lock().unwrap(),
        vec![Some("ns/a".to_string())]
    );
    assert_eq!(k.state().allocations.len(), 1);

    // A plugin whose PreStart fails: it still saw its pod, but the allocation is gone afterwards.
    let failing = StaticPlugin {
        pod_resources: Some(pr_sock.clone()),
        resource: "example.com/other".into(),
        fail_pre_start: true,
        ..Default::default()
    };
    serve_plugin(&dir.path().join("q.sock"), failing.clone(), cancel.clone());
    register(dir.path(), "v1beta1", "example.com/other", "q.sock")
        .await
        .unwrap();
    k.wait_for(Duration::from_secs(5), |s| {
        s.resources
            .get("example.com/other")
            .is_some_and(|r| r.devices.len() == 4)
    })
    .await
    .unwrap();
    let mut o = opts("ns/b");
    o.resource = "example.com/other".into();
    let e = k.allocate(&o).await.unwrap_err().to_string();
    assert!(
        e.contains("PreStartContainer") && e.contains("refused by the test"),
        "{e}"
    );
    assert_eq!(
        *failing.owners.lock().unwrap(),
        vec![Some("ns/b".to_string())]
    );
    let st = k.state();
    assert_eq!(st.allocations.len(), 1, "{:?}", st.allocations);
    assert_eq!(st.allocations[0].pod, "ns/a");
    let ch = uds::connect(&pr_sock, ClientAuthority::Localhost, Duration::from_secs(5))
        .await
        .unwrap();
    let list = PodResourcesListerClient::new(ch)
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    assert_eq!(list.pod_resources[0].name, "a");
    // The failed container's devices are free again: the next container gets the same ones.
    let again = k.allocate(&o).await.unwrap_err().to_string();
    assert!(again.contains("refused by the test"), "{again}");
    assert_eq!(failing.pre_starts.load(Ordering::SeqCst), 2);
    cancel.cancel();
    k.shutdown().await;
}

/// Like the kubelet's device manager: an app container reuses its init container's devices, which
/// GetPreferredAllocation gets as must_include (and among the available IDs); the preferred IDs
/// that are free are used even when the answer is short or names unknown IDs, and the rest is
/// filled from the free IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_from_an_init_container_and_partial_preferences_like_the_kubelet() {
    let dir = short_dir();
    let k = erdma_fake_kubelet::FakeKubelet::start(erdma_fake_kubelet::FakeKubeletConfig::new(
        dir.path(),
    ))
    .await
    .unwrap();
    let cancel = CancellationToken::new();
    let plugin = StaticPlugin::default();
    serve_plugin(&dir.path().join("p.sock"), plugin.clone(), cancel.clone());
    register(dir.path(), "v1beta1", "example.com/dev", "p.sock")
        .await
        .unwrap();
    wait_until("example.com/dev in the state file", || {
        read_state(dir.path())["resources"]["example.com/dev"]["devices"]
            .as_array()
            .is_some_and(|d| d.len() == 4)
    })
    .await;
    let opts =
        |resource: &str, pod: &str, container: &str, count| erdma_fake_kubelet::AllocateOptions {
            resource: resource.into(),
            count,
            pod: pod.into(),
            container: container.into(),
            authority: ClientAuthority::Localhost,
        };
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let init =
        erdma_fake_kubelet::allocate(dir.path(), &opts("example.com/dev", "ns/p", "init", 1))
            .await
            .unwrap();
    assert_eq!(init.device_ids, ids(&["dev/3"]));
    assert!(init.reused.is_empty());

    let app = erdma_fake_kubelet::allocate_reusing(
        dir.path(),
        &opts("example.com/dev", "ns/p", "app", 2),
        Some("init"),
    )
    .await
    .unwrap();
    assert_eq!(app.reused, ids(&["dev/3"]));
    assert_eq!(app.offered, ids(&["dev/0", "dev/1", "dev/2", "dev/3"]));
    assert_eq!(app.preferred, ids(&["dev/3", "dev/2"]));
    assert_eq!(app.device_ids, ids(&["dev/3", "dev/2"]));
    {
        let reqs = plugin.preference_requests.lock().unwrap();
        let last = reqs.last().unwrap();
        assert_eq!(last.must_include_device_i_ds, ids(&["dev/3"]));
        assert_eq!(
            last.available_device_i_ds,
            ids(&["dev/0", "dev/1", "dev/2", "dev/3"])
        );
        assert_eq!(last.allocation_size, 2);
    }
    // A second app container finds nothing left to reuse: the first one holds dev/3.
    let again = erdma_fake_kubelet::allocate_reusing(
        dir.path(),
        &opts("example.com/dev", "ns/p", "app2", 1),
        Some("init"),
    )
    .await
    .unwrap();
    assert!(again.reused.is_empty(), "{again:?}");
    assert_eq!(again.device_ids, ids(&["dev/1"]));

    // A plugin answering one unknown and one free ID: the free one is used, the rest filled up.
    let odd = StaticPlugin {
        fixed_preference: Some(ids(&["dev/9", "dev/2"])),
        ..Default::default()
    };
    serve_plugin(&dir.path().join("q.sock"), odd.clone(), cancel.clone());
    register(dir.path(), "v1beta1", "example.com/odd", "q.sock")
        .await
        .unwrap();
    wait_until("example.com/odd in the state file", || {
        read_state(dir.path())["resources"]["example.com/odd"]["devices"]
            .as_array()
            .is_some_and(|d| d.len() == 4)
    })
    .await;
    let out = erdma_fake_kubelet::allocate(dir.path(), &opts("example.com/odd", "ns/q", "c", 3))
        .await
        .unwrap();
    assert_eq!(out.device_ids, ids(&["dev/2", "dev/0", "dev/1"]));
    cancel.cancel();
    k.shutdown().await;
}

/// Two plugins for one resource, as the kubelet handles them (`pkg/kubelet/cm/devicemanager`:
/// `PluginConnected` replaces the endpoint, every client's stream feeds
/// `PluginListAndWatchReceiver`, `PluginDisconnected` marks the whole resource unhealthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_plugin_for_a_resource_takes_the_endpoint_and_either_ending_marks_it_unhealthy() {
    let dir = short_dir();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let first = OtherPlugin::start(dir.path(), "a.sock", vec!["a-0".into(), "a-1".into()]).unwrap();
    first.register("example.com/dev").await.unwrap();
    kubelet
        .wait_for(Duration::from_secs(10), |s| {
            s.resources["example.com/dev"].healthy_ids().count() == 2
        })
        .await
        .unwrap();
    let second = OtherPlugin::start(dir.path(), "1700000000-b.sock", vec!["b-0".into()]).unwrap();
    second
        .register("example.com/dev")
        .await
        .expect("accepted, not refused");
    let s = kubelet
        .wait_for(Duration::from_secs(10), |s| {
            s.resources["example.com/dev"].healthy_ids().eq(["b-0"])
        })
        .await
        .unwrap();
    let r = &s.resources["example.com/dev"];
    assert_eq!(
        r.endpoint, "1700000000-b.sock",
        "the last registration is the endpoint"
    );
    assert_eq!(
        r.streams,
        ["a.sock", "1700000000-b.sock"],
        "both streams stay open"
    );
    assert!(r.connected);
    assert_eq!(s.registrations, 2);
    // The first plugin goes away: the resource becomes unhealthy although the endpoint's stream is open.
    first.stop().await;
    let s = kubelet
        .wait_for(Duration::from_secs(10), |s| {
            s.resources["example.com/dev"].streams.len() == 1
        })
        .await
        .unwrap();
    let r = &s.resources["example.com/dev"];
    assert_eq!(r.streams, ["1700000000-b.sock"]);
    assert!(r.connected, "the endpoint's own stream is still open");
    assert_eq!(r.healthy_ids().count(), 0, "allocatable drops to 0: {r:?}");
    second.stop().await;
    let s = kubelet
        .wait_for(Duration::from_secs(10), |s| {
            !s.resources["example.com/dev"].connected
        })
        .await
        .unwrap();
    assert!(s.resources["example.com/dev"].streams.is_empty());
    kubelet.shutdown().await;
}
