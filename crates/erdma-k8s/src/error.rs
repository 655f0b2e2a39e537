//! The crate's error type.

/// Errors of this crate; messages name the object and the fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was attempted, naming the object.
        what: String,
        /// The client error.
        source: kube::Error,
    },
    /// A watch failed (the watch is retried with back-off).
    #[error("{what}: {message}")]
    Watch {
        /// What was watched.
        what: String,
        /// The watcher's error.
        message: String,
    },
    /// Serialisation of a manifest failed.
    #[error("serialising: {0}")]
    Serialize(String),
    /// Invalid input (options, objects), with the fix.
    #[error("{0}")]
    Invalid(String),
}
