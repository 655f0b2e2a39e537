//! DRA (Dynamic Resource Allocation, `resource.k8s.io/v1`) kubelet plugin for eRDMA.
//!
//! - [`slice`]: the pure mapping inventory → ResourceSlice devices: one device per eRDMA device
//!   (same [`erdma_model::DeviceSelection`] rules as the device plugin), attributes, consumable
//!   capacity (`shares`, `hcaHandle`, `hcaObject`; KEP-5075) with `allowMultipleAllocations`, and
//!   a device taint (KEP-5055) instead of vanishing when a device is unhealthy.
//! - [`publish`]: keeps this node's ResourceSlice in the API server equal to the mapping
//!   (create / update on change, stale slices of this driver on this node removed), and reads
//!   back from the stored slice which fields the API server dropped ([`readback`]: the feature
//!   gates that are off).
//! - [`claims`]: NodePrepareResources / NodeUnprepareResources: reads the allocation of a claim,
//!   checks it against the inventory and the device's capacity, writes a per-claim CDI spec
//!   ([`cdi`]) and records the claim in a checkpoint file ([`checkpoint`], appended by
//!   [`journal`]) so repeated calls and restarts of the kubelet or the agent are idempotent.
//! - [`claim_cache`]: this node's allocated claims, fed by a watch of ResourceClaims, so that a
//!   prepare reads its claim from memory (a GET when the cache does not hold it).
//! - [`server`]: the plugin-watcher registration socket and the DRA service socket.
//!
//! Driver name: `erdma.alibabacloud.com` — the domain of the eRDMA product's owner, the same
//! domain as erdma's CRD group (`network.alibabacloud.com`), and distinct from dranet's
//! `dra.net`, so both can run on one cluster without claiming each other's devices.

pub mod cdi;
pub mod checkpoint;
pub mod claim_cache;
pub mod claims;
pub mod config;
pub mod health;
pub mod journal;
pub mod publish;
pub mod quantity;
pub mod readback;
pub mod server;
pub mod slice;

pub use claims::Driver;
pub use config::{CapacityModel, DraConfig};

/// Default driver name.
pub const DRIVER_NAME: &str = erdma_model::names::DRA_DRIVER;

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

/// Writes `bytes` to `path` atomically for readers and against a crash of this process: a
/// temporary file in the same directory, fully written, renamed over `path` (a reader, and a
/// restarted agent, sees the old file or the new one, never a part).
///
/// No fsync: what these files describe lives for one boot only. The CDI specs sit on tmpfs
/// (`/var/run/cdi`) and the checkpoint records claims of containers, both gone after a power
/// loss or kernel crash, the only events an fsync guards against; the kubelet prepares every
/// claim again after a reboot. The one thing such a crash could leave, a checkpoint cut short,
/// is recognised by [`checkpoint::Checkpoint::load`] as written before this boot and set aside.
/// An fsync on the kubelet's disk costs milliseconds at p99 on every prepare and unprepare,
/// which the runtime waits for while it creates the container.
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(bytes).map_err(io_err("write", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_err("rename into place", path))?;
    Ok(())
}
