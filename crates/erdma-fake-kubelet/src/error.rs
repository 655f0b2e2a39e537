//! The fake kubelet's error type.

/// Errors of the fake kubelet.
#[derive(Debug, thiserror::Error)]
pub enum FakeKubeletError {
    /// File I/O failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed.
    #[error("{path} is not valid JSON for the fake kubelet: {source}")]
    Json {
        /// The path.
        path: std::path::PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// Socket helper error.
    #[error(transparent)]
    Uds(#[from] erdma_kubelet::uds::UdsError),
    /// A gRPC call to the plugin failed.
    #[error("{call} on {endpoint} failed: {status}")]
    Rpc {
        /// The RPC.
        call: &'static str,
        /// The plugin socket.
        endpoint: String,
        /// The status.
        status: Box<tonic::Status>,
    },
    /// A container runtime (CRI) call failed.
    #[error(transparent)]
    Cri(#[from] erdma_cri::CriError),
    /// The request cannot be satisfied.
    #[error("{0}")]
    Refused(String),
}

/// Result alias.
pub type Result<T, E = FakeKubeletError> = std::result::Result<T, E>;
