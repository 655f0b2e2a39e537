//! Set-up shared by the integration tests: a short temporary directory, the recording CRI
//! runtime served on a Unix socket, the fake kubelet with a stand-in device plugin, the lab
//! node, and the names of the CRI calls the runtime recorded.

// Each test file is its own crate and uses only some of these helpers: the others would be
// dead code there.
#![allow(dead_code)]

use erdma_cri::CriClient;
use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::image_service_server::ImageServiceServer;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_fake_kubelet::podspec::translate::{CgroupDriver, NodeInfo};
use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig, OtherPlugin};
use erdma_kubelet::uds;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A temporary directory under `/tmp` named `<prefix>…`: short, so the Unix socket paths in
/// it stay within `sun_path`'s limit.
pub fn short_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap()
}

/// The lab node `lab-node` with 2 CPUs, at `ip`, with `memory_bytes` of memory.
pub fn lab_node(ip: &str, memory_bytes: i64) -> NodeInfo {
    NodeInfo {
        name: "lab-node".into(),
        ip: ip.into(),
        cpu_millis: 2000,
        memory_bytes,
        cgroup_driver: CgroupDriver::Cgroupfs,
    }
}

/// An image the runtime has, with the id `id` and the one tag `tag`.
pub fn image(id: &str, tag: &str) -> cri::Image {
    cri::Image {
        id: id.into(),
        repo_tags: vec![tag.into()],
        ..Default::default()
    }
}

/// A recording runtime with `images`, served on `<dir>/cri.sock` until `cancel`, and a client
/// connected to it.
pub async fn runtime(
    dir: &Path,
    cancel: &CancellationToken,
    images: Vec<cri::Image>,
) -> (RecordingRuntime, CriClient) {
    let rt = RecordingRuntime::default();
    for image in images {
        rt.add_image(image);
    }
    let socket = dir.join("cri.sock");
    let listener = uds::bind(&socket).unwrap();
    let served = rt.clone();
    let c = cancel.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(served.clone()))
            .add_service(ImageServiceServer::new(served))
            .serve_with_incoming_shutdown(uds::incoming(listener), c.cancelled_owned())
            .await
    });
    let client = CriClient::connect(&socket, Path::new("/proc"))
        .await
        .unwrap();
    (rt, client)
}

/// The fake kubelet in `dir` and a stand-in device plugin on `<dir>/dev.sock` registered for
/// `resource` with the devices `ids`, once the kubelet sees all of them healthy.
pub async fn kubelet_with_plugin(
    dir: &Path,
    resource: &str,
    ids: &[&str],
) -> (FakeKubelet, OtherPlugin) {
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir))
        .await
        .unwrap();
    let plugin = OtherPlugin::start(
        dir,
        "dev.sock",
        ids.iter().map(|id| id.to_string()).collect(),
    )
    .unwrap();
    plugin.register(resource).await.unwrap();
    kubelet
        .wait_for(Duration::from_secs(10), |s| {
            s.resources
                .get(resource)
                .is_some_and(|r| r.healthy_ids().count() == ids.len())
        })
        .await
        .unwrap();
    // `pod run` admits from the state file, which the daemon writes after its in-memory view:
    // wait until the file lists the devices too (a loaded machine can lag here).
    let listed = || {
        erdma_fake_kubelet::state::read_state(dir).is_ok_and(|st| {
            st.resources
                .get(resource)
                .is_some_and(|r| r.healthy_ids().count() == ids.len())
        })
    };
    for _ in 0..200 {
        if listed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed(), "the state file never listed {resource}'s devices");
    (kubelet, plugin)
}

/// The names of the CRI calls `rt` recorded, in order.
pub fn call_names(rt: &RecordingRuntime) -> Vec<&'static str> {
    rt.calls()
        .iter()
        .map(|c| match c {
            Recorded::RunPodSandbox(_) => "RunPodSandbox",
            Recorded::CreateContainer(..) => "CreateContainer",
            Recorded::StartContainer(_) => "StartContainer",
            Recorded::ExecSync(..) => "ExecSync",
            Recorded::StopContainer(_) => "StopContainer",
            Recorded::RemoveContainer(_) => "RemoveContainer",
            Recorded::StopPodSandbox(_) => "StopPodSandbox",
            Recorded::RemovePodSandbox(_) => "RemovePodSandbox",
            Recorded::ImageStatus(_) => "ImageStatus",
        })
        .collect()
}
