//! gRPC over a Unix socket with both `:authority` forms a kubelet may send.

use erdma_kubelet::deviceplugin::v1beta1::registration_client::RegistrationClient;
use erdma_kubelet::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use erdma_kubelet::deviceplugin::v1beta1::{Empty, RegisterRequest};
use erdma_kubelet::uds::{self, ClientAuthority};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<String>>>);

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        self.0.lock().unwrap().push(req.into_inner().resource_name);
        Ok(Response::new(Empty {}))
    }
}

fn req() -> RegisterRequest {
    RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "x.sock".into(),
        resource_name: "aliyun/erdma".into(),
        options: None,
    }
}

#[tokio::test]
async fn server_accepts_localhost_and_socket_path_authorities() {
    let dir = tempfile::Builder::new()
        .prefix("ek")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("k.sock");
    let rec = Recorder::default();
    let listener = uds::bind(&path).unwrap();
    let svc = RegistrationServer::new(rec.clone());
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(uds::incoming(listener), c2.cancelled())
            .await
    });
    for auth in [ClientAuthority::Localhost, ClientAuthority::SocketPath] {
        let ch = uds::connect(&path, auth.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        let mut client = RegistrationClient::new(ch);
        // Several calls on one connection exercise the HPACK dynamic table.
        for _ in 0..3 {
            client
                .register(req())
                .await
                .unwrap_or_else(|e| panic!("{auth:?}: {e}"));
        }
    }
    assert_eq!(rec.0.lock().unwrap().len(), 6);
    cancel.cancel();
    server.await.unwrap().unwrap();
}

/// Proves the client really puts the socket path on the wire: a plain h2 server without the
/// rewriter rejects it, exactly as it rejects old kubelets.
#[tokio::test]
async fn plain_h2_server_rejects_a_socket_path_authority() {
    let dir = tempfile::Builder::new()
        .prefix("ek")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("k.sock");
    let listener = uds::bind(&path).unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Recorder::default()))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                c2.cancelled(),
            )
            .await
    });
    let ch = uds::connect(&path, ClientAuthority::SocketPath, Duration::from_secs(5))
        .await
        .unwrap();
    let err = RegistrationClient::new(ch)
        .register(req())
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}").to_lowercase().contains("protocol"),
        "{err:?}"
    );
    let ch = uds::connect(&path, ClientAuthority::Localhost, Duration::from_secs(5))
        .await
        .unwrap();
    RegistrationClient::new(ch).register(req()).await.unwrap();
    cancel.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn bind_refuses_to_replace_a_regular_file_and_long_paths() {
    let dir = tempfile::Builder::new()
        .prefix("ek")
        .tempdir_in("/tmp")
        .unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let e = uds::bind(&file).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        let long = dir.path().join("x".repeat(120));
        let e = uds::bind(&long).unwrap_err();
        assert!(e.to_string().contains("at most 107"), "{e}");
    });
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}
