//! The DRA driver's errors.

/// Errors of the DRA driver.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
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
    /// A file could not be parsed.
    #[error("{path} is not a valid {what}: {source}")]
    Json {
        /// What the file should be.
        what: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Kube {
        /// The request.
        what: String,
        /// The cause.
        source: Box<kube::Error>,
    },
    /// Socket helper error.
    #[error(transparent)]
    Uds(#[from] erdma_kubelet::uds::UdsError),
    /// Invalid configuration.
    #[error("{0}")]
    Config(String),
    /// This node's Node object, the owner of its ResourceSlice, is not in the API server.
    #[error(
        "Node {node} not found in the API server: the node's ResourceSlice is owned by its Node (deleted with it) and is not published without it; check that the agent's node name (NODE_NAME) is this node's Node name"
    )]
    NodeNotFound {
        /// The node name the driver was given.
        node: String,
    },
}

/// Result alias.
pub type Result<T, E = DraError> = std::result::Result<T, E>;

impl DraError {
    /// How long the API server asked the client to wait before the next request
    /// (`details.retryAfterSeconds` of a 429 or 5xx Status, as its flow control sends with the
    /// `Retry-After` header); client-go waits at least that long, and so does erdma.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            DraError::Kube { source, .. } => match source.as_ref() {
                kube::Error::Api(s) => s
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|&secs| secs > 0)
                    .map(|secs| std::time::Duration::from_secs(u64::from(secs))),
                _ => None,
            },
            _ => None,
        }
    }
}

pub(crate) fn io_err(
    what: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> DraError {
    let path = path.to_path_buf();
    move |source| DraError::Io { what, path, source }
}

impl From<erdma_host::atomic::AtomicError> for DraError {
    fn from(e: erdma_host::atomic::AtomicError) -> Self {
        DraError::Io {
            what: e.what,
            path: e.path,
            source: e.source,
        }
    }
}
