//! Node RDMA device inventory.
//!
//! [`Inventory::scan`] reads sysfs and `/dev` through the doors of `erdma-host` and returns an
//! immutable [`NodeDevices`] snapshot. It never fails as a whole: every unreadable or malformed
//! value becomes a [`erdma_model::Finding`] on the device (or the node), and a device that cannot
//! be used carries the reasons in its [`erdma_model::Health`].
//!
//! The walk, per device, is: identity (driver, PCI function, kind) → attributes → ports and GIDs →
//! protocol mode → paired netdev → character devices → health. [`Inventory::scan_identity`] is
//! the same walk without the GID tables, for a start that registers before they are read.
//!
//! Every attribute read has a time limit ([`erdma_host::watched`]): a scan or a refresh runs on a
//! thread of its own, and an attribute that does not answer (a driver stuck in it) becomes a
//! finding naming the file, "no answer within 2s", instead of a scan that never ends. The thread
//! stuck in it is left behind and reported by [`Inventory::pending_reads`].

mod chardev;
pub mod events;
mod identity;
mod mode;
mod netdev;
mod node;
mod ports;
mod read;

use erdma_host::watched::{PendingRead, Unanswered, WatchedSysfs};
use erdma_host::{DevFs, InterfaceAddrs, Sysfs};
use erdma_model::{Finding, NodeDevices};
use std::sync::Arc;
use std::time::Duration;

pub use erdma_host::watched::DEFAULT_READ_LIMIT;

pub use node::DEVICE_CLASS;

/// The doors the inventory reads through.
#[derive(Clone)]
pub struct Sources {
    /// sysfs (`/sys` or a fixture tree).
    pub sysfs: Arc<dyn Sysfs>,
    /// The dev directory (`/dev` or a fixture tree).
    pub devfs: Arc<dyn DevFs>,
    /// Interface addresses of this network namespace (use `NoInterfaceAddrs` for fixtures).
    pub addrs: Arc<dyn InterfaceAddrs>,
}

/// Scans a node's RDMA devices.
#[derive(Clone)]
pub struct Inventory {
    /// `sysfs` is `watched`.
    sources: Sources,
    watched: Arc<WatchedSysfs>,
}

impl Inventory {
    /// An inventory reading through `sources`, each attribute read given [`DEFAULT_READ_LIMIT`].
    pub fn new(sources: Sources) -> Self {
        Self::with_read_limit(sources, DEFAULT_READ_LIMIT)
    }

    /// An inventory reading through `sources`, each attribute read given `limit`.
    pub fn with_read_limit(mut sources: Sources, limit: Duration) -> Self {
        let watched = Arc::new(WatchedSysfs::new(sources.sysfs, limit));
        sources.sysfs = watched.clone();
        Inventory { sources, watched }
    }

    /// Takes a snapshot of every RDMA device. Blocks the calling thread (for as long as sysfs
    /// takes, at most about the read limit per attribute that does not answer): call it off an
    /// async runtime's workers.
    pub fn scan(&self) -> NodeDevices {
        self.scan_with(node::Pass::Full, node::Threads::Split)
    }

    /// [`Inventory::scan`] on the calling thread alone: for a scan nothing waits for, such as
    /// the one that completes the identity pass at start, which split over every CPU would take
    /// them from the work that is waited for (the kubelet's first device list). Its wall time is
    /// about the split scan's CPU time. Blocks as [`Inventory::scan`] does.
    pub fn scan_unhurried(&self) -> NodeDevices {
        self.scan_with(node::Pass::Full, node::Threads::One)
    }

    /// The identity pass: [`Inventory::scan`] without the GID tables, what a device plugin needs
    /// to register — the devices, their ports (state, link layer, rate), NUMA nodes, modes,
    /// paired netdevs (MAC, link state), PNET IDs, character devices and health — without the
    /// reads of the GID tables (three files per entry: the address, its type, its netdev; most
    /// of a scan on a node whose ports carry full tables). Blocks as [`Inventory::scan`] does.
    ///
    /// Deferred to the full scan that should follow (what differs from [`Inventory::scan`] of
    /// the same tree):
    /// - every port's `gids` is empty, so [`erdma_model::RdmaDevice::gid_index`] is `None`;
    /// - a netdev without an IPv4 address in this namespace has no addresses, where the full
    ///   scan takes them from the IPv4-mapped GIDs (`ipv4_source` `Gids`);
    /// - the findings the GID tables give (a malformed GID file; RoCE-compat eRDMA with only
    ///   RoCE v1 GIDs) are missing.
    ///
    /// Everything else is the full scan's, device for device: in particular a device whose
    /// netdev can be paired only through a GID entry's `ndev` (no interface has the MAC of its
    /// `node_guid`, no `device/net`, no `parent`) is read whole here, so its netdev and health
    /// never differ. Nothing a device plugin advertises or answers (slots, health, NUMA
    /// topology, character devices, the container's environment: device names and PNET ID)
    /// depends on what is deferred.
    pub fn scan_identity(&self) -> NodeDevices {
        self.scan_with(node::Pass::Identity, node::Threads::Split)
    }

    /// One scan of `pass` on `threads`, each read watched (see [`Inventory::scan`]).
    fn scan_with(&self, pass: node::Pass, threads: node::Threads) -> NodeDevices {
        let sources = self.sources.clone();
        self.watched
            .run(move || node::scan(&sources, pass, threads))
            .unwrap_or_else(given_up)
    }

    /// Re-reads only what changes at run time (port states, netdev operstate, char-device presence)
    /// for the devices of `previous`, and recomputes their health. Falls back to a full
    /// [`Inventory::scan`] when the set of devices, the erdma module mode or a device's uverbs
    /// mapping may have changed. About 5 reads per device instead of ~100: cheap enough to poll.
    /// Blocks as [`Inventory::scan`] does.
    pub fn refresh(&self, previous: &NodeDevices) -> NodeDevices {
        let sources = self.sources.clone();
        // Taken by the first run of the job; a run started again after a blocked read (the first
        // one left behind with it) scans everything instead.
        let previous = std::sync::Mutex::new(Some(previous.clone()));
        self.watched
            .run(move || {
                let taken = previous.lock().unwrap_or_else(|e| e.into_inner()).take();
                taken
                    .and_then(|p| node::refresh(&sources, p))
                    .unwrap_or_else(|| node::scan(&sources, node::Pass::Full, node::Threads::Split))
            })
            .unwrap_or_else(given_up)
    }

    /// The attribute reads waiting now, the longest first: those of a scan in progress, and
    /// those given up that are still blocked (their threads left behind). What a shutdown
    /// abandons.
    pub fn pending_reads(&self) -> Vec<PendingRead> {
        self.watched.pending()
    }

    /// Forgets the attributes the health re-read keeps open, so that the next re-read opens them
    /// by path again. Call it after a link or device event: a netdev renamed, or deleted and
    /// another created under its name, keeps its open attributes but not its path.
    pub fn reopen_attributes(&self) {
        self.sources.sysfs.close_rereads();
    }

    /// `previous` after a link message showed netdev `netdev` down (see
    /// [`events::DownLinks`]): every healthy device on it becomes unhealthy ("netdev … is down"),
    /// without reading anything, as the live link state would have it. Never makes a device
    /// healthy, and leaves unhealthy devices as they are: the re-read that follows tells the
    /// whole truth. `None` when no healthy device is on `netdev`.
    pub fn link_down(previous: &NodeDevices, netdev: &str) -> Option<NodeDevices> {
        node::link_down(previous, netdev)
    }
}

/// The snapshot when sysfs does not answer at all: no device, and the reads that are blocked.
fn given_up(e: Unanswered) -> NodeDevices {
    let mut node = NodeDevices::empty();
    node.findings.push(Finding::error(format!(
        "{e}; no device is listed until they answer (a driver stuck? see dmesg for hung tasks)"
    )));
    node
}
