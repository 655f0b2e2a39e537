//! CRI's `KeyValue.value` (a container's environment variable) is `bytes` on the wire
//! (k8s.io/cri-api runtime/v1 since the kubelet restored binary env values), so a value that is
//! not UTF-8 must decode, and must not take the whole `CreateContainerRequest` down with it.
//!
//! The messages here are encoded by small wire mirrors declared in this file (the field numbers
//! and types of the upstream proto), never by the crate's own generated types.

use erdma_cri::CriClient;
use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_kubelet::uds::{self, ClientAuthority};
use prost::Message;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Clone, PartialEq, prost::Message)]
struct WireKeyValue {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireContainerMetadata {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireContainerConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<WireContainerMetadata>,
    #[prost(message, repeated, tag = "6")]
    envs: Vec<WireKeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireCreateContainerRequest {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    config: Option<WireContainerConfig>,
}

/// The value's bytes, whatever the generated field type.
fn value_bytes(e: &cri::KeyValue) -> &[u8] {
    e.value.as_ref()
}

/// Latin-1 "café" and a lone continuation byte: neither is UTF-8.
const LATIN1_VALUE: &[u8] = b"caf\xe9 \x80";

fn request(sandbox: &str) -> WireCreateContainerRequest {
    WireCreateContainerRequest {
        pod_sandbox_id: sandbox.to_string(),
        config: Some(WireContainerConfig {
            metadata: Some(WireContainerMetadata { name: "app".into() }),
            envs: vec![
                WireKeyValue {
                    key: "GREETING".into(),
                    value: LATIN1_VALUE.to_vec(),
                },
                WireKeyValue {
                    key: "PLAIN".into(),
                    value: b"ascii".to_vec(),
                },
            ],
        }),
    }
}

#[test]
fn a_non_utf8_env_value_decodes_byte_for_byte() {
    let bytes = request("s1").encode_to_vec();

    let decoded = cri::CreateContainerRequest::decode(bytes.as_slice())
        .expect("a non-UTF-8 env value is valid CRI");

    assert_eq!(decoded.pod_sandbox_id, "s1");
    let config = decoded.config.expect("config");
    assert_eq!(config.metadata.expect("metadata").name, "app");
    let envs: Vec<(&str, &[u8])> = config
        .envs
        .iter()
        .map(|e| (e.key.as_str(), value_bytes(e)))
        .collect();
    assert_eq!(
        envs,
        [("GREETING", LATIN1_VALUE), ("PLAIN", b"ascii".as_slice())]
    );
}

#[tokio::test]
async fn create_container_with_a_non_utf8_env_value_reaches_the_runtime() {
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("containerd.sock");
    let runtime = RecordingRuntime::default();
    let cancel = CancellationToken::new();
    let listener = uds::bind(&socket).unwrap();
    let served = {
        let runtime = runtime.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(runtime))
                .serve_with_incoming_shutdown(uds::incoming(listener), cancel.cancelled_owned())
                .await
        })
    };
    let mut client = CriClient::connect(&socket, Path::new("/proc"))
        .await
        .unwrap();
    let sandbox = client
        .run_pod_sandbox(cri::PodSandboxConfig::default())
        .await
        .unwrap();

    let channel = uds::connect(&socket, ClientAuthority::Localhost, Duration::from_secs(2))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec =
        tonic_prost::ProstCodec::<WireCreateContainerRequest, cri::CreateContainerResponse>::default();
    let created = grpc
        .unary(
            tonic::Request::new(request(&sandbox)),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/CreateContainer",
            ),
            codec,
        )
        .await
        .expect("the runtime accepts the request")
        .into_inner();
    assert!(!created.container_id.is_empty());

    let recorded_envs: Vec<Vec<(String, Vec<u8>)>> = runtime
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Recorded::CreateContainer(_, config) => Some(
                config
                    .envs
                    .iter()
                    .map(|e| (e.key.clone(), value_bytes(e).to_vec()))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(
        recorded_envs,
        [vec![
            ("GREETING".to_string(), LATIN1_VALUE.to_vec()),
            ("PLAIN".to_string(), b"ascii".to_vec()),
        ]]
    );
    cancel.cancel();
    served.await.unwrap().unwrap();
}
