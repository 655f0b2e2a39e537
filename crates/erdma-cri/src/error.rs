//! The crate's error type.

use std::path::PathBuf;

/// A CRI or pod-discovery failure.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// No runtime socket exists.
    #[error(
        "no container runtime socket found (tried {tried}). Fix: pass the runtime socket (--cri-socket / RUNTIME_SOCK) and mount it into the agent"
    )]
    SocketMissing {
        /// The paths tried, comma-separated.
        tried: String,
    },
    /// Connecting failed.
    #[error("cannot connect to {what} at {path}: {detail}")]
    Connect {
        /// `container runtime` or `kubelet pod-resources`.
        what: &'static str,
        /// The socket.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// A call failed.
    #[error("{call} on {path}: {detail}")]
    Call {
        /// The RPC.
        call: &'static str,
        /// The socket.
        path: PathBuf,
        /// The status or timeout.
        detail: String,
    },
    /// The object is not there.
    #[error("{0}")]
    NotFound(String),
    /// The runtime did not say where the network namespace is.
    #[error(
        "sandbox {id} of pod {pod}: the runtime reported no network namespace path or pid (verbose PodSandboxStatus info). Fix: use containerd or CRI-O, which report runtimeSpec.linux.namespaces"
    )]
    NoNetns {
        /// Sandbox id.
        id: String,
        /// `namespace/name`.
        pod: String,
    },
}
