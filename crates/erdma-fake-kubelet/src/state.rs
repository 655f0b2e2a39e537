//! The state file, the allocation ledger, and the lock that serialises their updates between
//! the daemon and one-shot commands.

use crate::error::{FakeKubeletError, Result};
use crate::{LEDGER_FILE, LOCK_FILE, STATE_FILE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Options a plugin registered with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionsState {
    /// `pre_start_required`.
    pub pre_start_required: bool,
    /// `get_preferred_allocation_available`.
    pub get_preferred_allocation_available: bool,
}

/// One advertised device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Device ID.
    pub id: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    /// NUMA nodes from the topology (empty when the plugin sent none).
    pub numa: Vec<i64>,
}

/// A registered resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceState {
    /// Socket file name of the plugin.
    pub endpoint: String,
    /// Registered options.
    pub options: OptionsState,
    /// Devices from the latest ListAndWatch message.
    pub devices: Vec<DeviceState>,
    /// Whether the ListAndWatch stream of `endpoint` (the plugin registered last) is open.
    #[serde(default)]
    pub connected: bool,
    /// Endpoints whose ListAndWatch stream is open, oldest registration first (more than one when
    /// two plugins registered the same resource).
    #[serde(default)]
    pub streams: Vec<String>,
    /// ListAndWatch messages received since registration.
    #[serde(default)]
    pub updates: u64,
    /// When the latest ListAndWatch message arrived: microseconds of `CLOCK_MONOTONIC`, the
    /// clock every process of one boot shares, so another process can time its own action
    /// against the kubelet's receipt without the state file's write and read in between.
    #[serde(default)]
    pub received_monotonic_us: u64,
}

/// Now, in microseconds of `CLOCK_MONOTONIC` (see [`ResourceState::received_monotonic_us`]).
pub fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000
    })
}

impl ResourceState {
    /// IDs of healthy devices.
    pub fn healthy_ids(&self) -> impl Iterator<Item = &str> {
        self.devices
            .iter()
            .filter(|d| d.health == "Healthy")
            .map(|d| d.id.as_str())
    }
}

/// One container's allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// `namespace/name`.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Resource name.
    pub resource: String,
    /// Allocated device IDs.
    pub device_ids: Vec<String>,
}

/// Content of `fake-kubelet-state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    /// Registered resources by name.
    pub resources: BTreeMap<String, ResourceState>,
    /// The allocation ledger.
    pub allocations: Vec<AllocationRecord>,
    /// Successful registrations since the daemon started.
    #[serde(default)]
    pub registrations: u64,
    /// Simulated kubelet restarts since the daemon started.
    #[serde(default)]
    pub kubelet_restarts: u64,
}

/// An exclusive lock on `<dir>/fake-kubelet.lock`, released on drop.
pub struct DirLock {
    _lock: nix::fcntl::Flock<File>,
}

/// Takes the directory lock (blocking).
pub fn lock(dir: &Path) -> Result<DirLock> {
    let path = dir.join(LOCK_FILE);
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| FakeKubeletError::Io {
            what: "open lock file",
            path: path.clone(),
            source,
        })?;
    let lock =
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
            FakeKubeletError::Io {
                what: "lock",
                path,
                source: std::io::Error::from(e),
            }
        })?;
    Ok(DirLock { _lock: lock })
}

pub(crate) fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> Result<T> {
    match std::fs::read(path) {
        Ok(b) if b.is_empty() => Ok(T::default()),
        Ok(b) => serde_json::from_slice(&b).map_err(|source| FakeKubeletError::Json {
            path: path.into(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(source) => Err(FakeKubeletError::Io {
            what: "read",
            path: path.into(),
            source,
        }),
    }
}

pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let tmp: PathBuf = path.with_extension("json.tmp");
    let mut text = serde_json::to_vec_pretty(value).map_err(|source| FakeKubeletError::Json {
        path: path.into(),
        source,
    })?;
    text.push(b'\n');
    std::fs::write(&tmp, &text).map_err(|source| FakeKubeletError::Io {
        what: "write",
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| FakeKubeletError::Io {
        what: "rename into",
        path: path.into(),
        source,
    })
}

/// Reads the ledger (call with the lock held).
pub fn read_ledger(dir: &Path) -> Result<Vec<AllocationRecord>> {
    read_json(&dir.join(LEDGER_FILE))
}

/// Writes the ledger (call with the lock held).
pub fn write_ledger(dir: &Path, ledger: &[AllocationRecord]) -> Result<()> {
    write_json(&dir.join(LEDGER_FILE), &ledger)
}

/// Reads the state file (call with the lock held for a consistent view).
pub fn read_state(dir: &Path) -> Result<StateFile> {
    read_json(&dir.join(STATE_FILE))
}

/// Writes the state file (call with the lock held).
pub fn write_state(dir: &Path, state: &StateFile) -> Result<()> {
    write_json(&dir.join(STATE_FILE), state)
}
