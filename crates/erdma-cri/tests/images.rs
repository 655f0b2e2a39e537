//! `ImageStatus` over a real Unix socket against the recording runtime: a present image comes
//! back with its ID, digests and user; an absent one as `None` (CRI: the response has no image).

use erdma_cri::CriClient;
use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::image_service_server::ImageServiceServer;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_kubelet::uds;
use std::path::Path;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn image_status_finds_present_images_and_reports_absent_ones() {
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("containerd.sock");
    let runtime = RecordingRuntime::default();
    runtime.add_image(cri::Image {
        id: "sha256:0123abcd".into(),
        repo_tags: vec!["lab.local/rdma-tools:1".into()],
        repo_digests: vec!["lab.local/rdma-tools@sha256:feed".into()],
        size: 4096,
        uid: Some(cri::Int64Value { value: 1000 }),
        ..Default::default()
    });
    let cancel = CancellationToken::new();
    let listener = uds::bind(&socket).unwrap();
    let served = {
        let runtime = runtime.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(runtime.clone()))
                .add_service(ImageServiceServer::new(runtime))
                .serve_with_incoming_shutdown(uds::incoming(listener), cancel.cancelled_owned())
                .await
        })
    };
    let mut cri = CriClient::connect(&socket, Path::new("/proc"))
        .await
        .unwrap();

    let by_tag = cri.image_status("lab.local/rdma-tools:1").await.unwrap();
    let image = by_tag.expect("the tagged image is present");
    assert_eq!(image.id, "sha256:0123abcd");
    assert_eq!(image.repo_digests, ["lab.local/rdma-tools@sha256:feed"]);
    assert_eq!(image.uid, Some(cri::Int64Value { value: 1000 }));
    // By ID, as the kubelet names the image in CreateContainer.
    assert!(cri.image_status("sha256:0123abcd").await.unwrap().is_some());
    assert_eq!(
        cri.image_status("docker.io/library/busybox:latest")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        runtime.calls(),
        [
            Recorded::ImageStatus("lab.local/rdma-tools:1".into()),
            Recorded::ImageStatus("sha256:0123abcd".into()),
            Recorded::ImageStatus("docker.io/library/busybox:latest".into()),
        ]
    );
    cancel.cancel();
    served.await.unwrap().unwrap();
}
