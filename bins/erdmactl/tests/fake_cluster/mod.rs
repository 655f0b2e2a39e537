//! The workspace's fake API server (`erdma_k8s::fake`) served on a local port, with a kubeconfig
//! pointing at it: the cluster erdmactl's install, top and doctor tests talk to.

use erdma_k8s::fake::FakeApiServer;
use std::path::PathBuf;

/// A running fake API server; stops when dropped.
pub struct Cluster {
    pub api: FakeApiServer,
    pub kubeconfig: PathBuf,
    cancel: tokio_util::sync::CancellationToken,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// An empty cluster.
pub fn start() -> Cluster {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = FakeApiServer::new();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    rt.spawn(api.clone().serve_http(listener, cancel.clone()));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    erdma_k8s::fake::kubeconfig(&kubeconfig, addr).unwrap();
    Cluster {
        api,
        kubeconfig,
        cancel,
        _rt: rt,
        _dir: dir,
    }
}
