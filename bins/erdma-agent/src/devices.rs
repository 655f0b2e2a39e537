//! The device state owner: scans the node and publishes the raw inventory when it changed; and
//! the publisher that turns it into the snapshot the device plugin advertises (readiness gate,
//! ERI source, `erdma_model::DeviceSelection`).

use crate::source::EriSource;
use erdma_driver::DriverStatus;
use erdma_inventory::Inventory;
use erdma_inventory::events::DownLinks;
use erdma_model::{DeviceSelection, Excluded, NodeDevices};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Full scans (every GID, MAC, NUMA node, link) run right after the identity pass the agent
/// registers from ([`start_first_scan`]), on an address event, and at least
/// this often as a safety net; in between, the cheap [`Inventory::refresh`] re-reads port state,
/// link state and char-device presence, and notices devices that came or went (which then get a
/// full read of their own).
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(300);

/// After a wake-up, the inventory is read again this long after it (each time measured from the
/// wake-up). The kernel sends the rtnetlink message of `ip link set up/down` before it runs the
/// netdev notifiers, in which an RDMA driver (rxe, for one) moves its port state; that move sends
/// no message of its own. It usually follows within a few milliseconds (the same system call), so
/// the first re-reads come soon, and the last one late enough for a loaded machine.
const SETTLE: [Duration; 3] = [
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(50),
];

/// What makes the reader look between its safety polls.
#[derive(Debug, Clone, Default)]
pub struct Wake {
    /// Re-read health now (and [`SETTLE`] later): rtnetlink link events, `/dev/infiniband`.
    pub refresh: Arc<Notify>,
    /// Links that the messages behind `refresh` showed down: their devices are unhealthy at once.
    pub down: Arc<DownLinks>,
    /// Scan everything now: rtnetlink address events (the GID tables follow the addresses).
    pub rescan: Arc<Notify>,
}

/// Re-reads the inventory every `interval` (the safety poll), at once when `wake.refresh` fires
/// and again at each [`SETTLE`] delay after that, and scans everything when `wake.rescan` fires
/// or `full_every` passed, until `cancel` fires; publishes on `tx` only when it changed.
///
/// A link that the waking message showed down (`wake.down`) makes the healthy devices on it
/// unhealthy before anything is read ([`Inventory::link_down`]), published at once; the re-read
/// follows. The message never makes a device healthy: that takes a port read as `ACTIVE`.
///
/// The full scan reads every GID slot and can take seconds (rxe has 1024 slots per port; more so
/// under emulation), so it runs beside the loop: link events keep being answered by the cheap
/// refresh meanwhile, and the scan's result is refreshed once more when it arrives, so its port
/// and link state are current, not those of when it started.
pub async fn run(
    inventory: Inventory,
    tx: watch::Sender<NodeDevices>,
    interval: Duration,
    full_every: Duration,
    wake: Wake,
    cancel: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_full = tokio::time::Instant::now();
    let mut rescan_due = false;
    let mut raw = tx.borrow().clone();
    // The last wake-up and the next of its SETTLE re-reads.
    let mut settle: Option<(tokio::time::Instant, usize)> = None;
    let mut full_scan: Option<tokio::task::JoinHandle<NodeDevices>> = None;
    // The first full scan completes the identity pass the agent started from: nothing waits
    // for it, so it reads on one thread and leaves the other CPUs to the registration.
    let mut completing = true;
    // An event may have renamed or replaced what the kept-open attributes belong to.
    let mut reopen = false;
    loop {
        let settle_at =
            settle.map_or_else(tokio::time::Instant::now, |(woken, i)| woken + SETTLE[i]);
        let mut scanned = None;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
            _ = wake.refresh.notified() => {
                settle = Some((tokio::time::Instant::now(), 0));
                reopen = true;
                for netdev in wake.down.take() {
                    if let Some(next) = Inventory::link_down(&raw, &netdev) {
                        raw = next;
                        let changed = publish_raw(&tx, &raw);
                        tracing::debug!(%netdev, changed, "link message: link down");
                    }
                }
            }
            _ = wake.rescan.notified() => rescan_due = true,
            _ = tokio::time::sleep_until(settle_at), if settle.is_some() => {
                settle = settle.and_then(|(woken, i)| (i + 1 < SETTLE.len()).then_some((woken, i + 1)));
            }
            r = async { full_scan.as_mut().expect("guarded by is_some").await }, if full_scan.is_some() => {
                full_scan = None;
                tracing::debug!("full scan done");
                scanned = Some(r);
            }
        }
        // A rescan asked for while a scan ran starts as soon as that one is in.
        if full_scan.is_none()
            && (rescan_due || (scanned.is_none() && last_full.elapsed() >= full_every))
        {
            rescan_due = false;
            let inv = inventory.clone();
            // sysfs reads block: keep them off the async workers.
            let unhurried = std::mem::take(&mut completing);
            tracing::debug!(unhurried, "full scan started");
            full_scan = Some(tokio::task::spawn_blocking(move || {
                if unhurried {
                    inv.scan_unhurried()
                } else {
                    inv.scan()
                }
            }));
            last_full = tokio::time::Instant::now();
        }
        let base = match scanned {
            Some(Ok(fresh)) => fresh,
            Some(Err(_)) => {
                tracing::error!("inventory scan panicked; keeping the previous snapshot");
                raw.clone()
            }
            None => raw.clone(),
        };
        let inv = inventory.clone();
        let reopen_now = std::mem::take(&mut reopen);
        let reread = tokio::task::spawn_blocking(move || {
            if reopen_now {
                inv.reopen_attributes();
            }
            inv.refresh(&base)
        });
        // The re-read ends within the read limit per attribute that does not answer; a
        // shutdown does not wait for it.
        let reread = tokio::select! {
            _ = cancel.cancelled() => return,
            r = reread => r,
        };
        let Ok(next) = reread else {
            tracing::error!("inventory refresh panicked; keeping the previous snapshot");
            continue;
        };
        raw = next;
        let changed = publish_raw(&tx, &raw);
        tracing::debug!(changed, "inventory re-read");
    }
}

/// Publishes `raw` on `tx` when it differs from the last; returns whether it did.
fn publish_raw(tx: &watch::Sender<NodeDevices>, raw: &NodeDevices) -> bool {
    tx.send_if_modified(|cur| {
        if cur == raw {
            return false;
        }
        *cur = raw.clone();
        true
    })
}

/// The inputs of the served snapshot.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The raw inventory.
    pub raw: &'a NodeDevices,
    /// Driver keys and allow-list (`--rdma-driver`, `--exposed-local-eris`).
    pub selection: &'a DeviceSelection,
    /// The driver manager's status (readiness gate).
    pub driver: &'a DriverStatus,
    /// Where the ERIs come from.
    pub source: &'a EriSource,
}

/// What the device plugin advertises: nothing until the driver is ready and the ERI source is
/// known; then the devices the selection keeps (and, with an ERdmaDevice, only its matched
/// ERIs). Every device left out comes with the reason.
pub fn compose(i: &Inputs<'_>) -> (NodeDevices, Vec<Excluded>) {
    let exclude_all = |reason: String| {
        let mut served = i.raw.clone();
        let excluded = served
            .devices
            .drain(..)
            .map(|d| Excluded {
                device: d.name,
                reason: reason.clone(),
            })
            .collect();
        (served, excluded)
    };
    if !i.driver.ready {
        return exclude_all(format!("driver not ready: {}", i.driver.reason));
    }
    let (mut served, mut excluded) = i.selection.apply(i.raw);
    match i.source {
        EriSource::Local => {}
        EriSource::Waiting(why) => {
            excluded.extend(served.devices.drain(..).map(|d| Excluded {
                device: d.name,
                reason: why.clone(),
            }));
        }
        EriSource::Cluster(c) => {
            served.devices.retain(|d| {
                let keep = c.matched.contains_key(&d.name);
                if !keep {
                    excluded.push(Excluded {
                        device: d.name.clone(),
                        reason: format!("not an ERI of ERdmaDevice {}", c.object),
                    });
                }
                keep
            });
        }
    }
    excluded.sort_by(|a, b| a.device.cmp(&b.device));
    (served, excluded)
}

/// The publisher's inputs as channels.
pub struct PublisherInputs {
    /// Raw inventory.
    pub raw: watch::Receiver<NodeDevices>,
    /// Driver status.
    pub driver: watch::Receiver<DriverStatus>,
    /// ERI source.
    pub source: watch::Receiver<EriSource>,
    /// Instance ID (for the allow-list), once known.
    pub instance_id: watch::Receiver<Option<String>>,
}

/// The served set by name, and the devices left out with reasons (for `/healthz`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedView {
    /// Devices advertised to the kubelet.
    pub served: Vec<String>,
    /// Devices left out, with reasons.
    pub excluded: Vec<Excluded>,
}

/// Recomputes the served snapshot whenever an input changes, until `cancel` fires; publishes it
/// on `out` only when it changed, and logs excluded devices (with reasons) once per change.
pub async fn publish(
    mut inputs: PublisherInputs,
    mut selection: DeviceSelection,
    out: watch::Sender<NodeDevices>,
    view: watch::Sender<ServedView>,
    cancel: CancellationToken,
) {
    let mut last_excluded: Option<Vec<Excluded>> = None;
    let mut open = [true; 4];
    loop {
        selection.instance_id = inputs.instance_id.borrow_and_update().clone();
        let (served, excluded) = {
            let raw = inputs.raw.borrow_and_update();
            let driver = inputs.driver.borrow_and_update();
            let source = inputs.source.borrow_and_update();
            compose(&Inputs {
                raw: &raw,
                selection: &selection,
                driver: &driver,
                source: &source,
            })
        };
        if last_excluded.as_ref() != Some(&excluded) {
            for e in &excluded {
                tracing::info!(device = %e.device, reason = %e.reason, "device not served");
            }
            let names: Vec<String> = served.devices.iter().map(|d| d.name.clone()).collect();
            tracing::info!(served = ?names, excluded = excluded.len(), "served device set");
            view.send_replace(ServedView {
                served: names,
                excluded: excluded.clone(),
            });
            last_excluded = Some(excluded);
        }
        // The snapshot goes out first and the changes are logged after: a slow log sink must
        // not hold a health change back from the kubelet.
        let mut previous = None;
        out.send_if_modified(|cur| {
            if *cur == served {
                return false;
            }
            previous = Some(std::mem::replace(cur, served));
            true
        });
        tracing::debug!(changed = previous.is_some(), "served snapshot composed");
        if let Some(old) = previous {
            log_changes(&old, &out.borrow());
        }
        // A closed input keeps its last value (e.g. the instance ID once fetched).
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = inputs.raw.changed(), if open[0] => open[0] = r.is_ok(),
            r = inputs.driver.changed(), if open[1] => open[1] = r.is_ok(),
            r = inputs.source.changed(), if open[2] => open[2] = r.is_ok(),
            r = inputs.instance_id.changed(), if open[3] => open[3] = r.is_ok(),
        }
        if !open.iter().any(|o| *o) {
            cancel.cancelled().await;
            return;
        }
    }
}

fn log_changes(old: &NodeDevices, new: &NodeDevices) {
    for d in &new.devices {
        match old.device(&d.name) {
            None => tracing::info!(device = %d.name, health = ?d.health, "device appeared"),
            Some(o) if o.health != d.health => {
                tracing::warn!(device = %d.name, health = ?d.health, "device health changed")
            }
            _ => {}
        }
    }
    for d in &old.devices {
        if new.device(&d.name).is_none() {
            tracing::warn!(device = %d.name, "device disappeared");
        }
    }
}

/// The first inventory scan, started at once on a thread of its own beside the API client and
/// the SMC-R probe, and awaited by [`start`] when it is needed: the identity pass
/// ([`Inventory::scan_identity`]: every device's identity, ports, netdev, char devices and
/// health, without the GID tables), which is all the device plugin registers and answers from.
/// A full scan completes it once the kubelet has the served devices ([`Complete`]), published
/// as any later scan is.
///
/// What the identity snapshot lacks until then — the GID tables, the GID index, IPv4 addresses
/// taken from the GIDs, the findings the GID tables give — is read by nothing the agent serves:
/// the kubelet's ListAndWatch (slots, health, NUMA node), Allocate and PreStartContainer (char
/// devices, device names, PNET ID from the MAC), the ERdmaDevice match (netdev MAC), the DRA
/// attributes, ERI netdev and SMC-R pnet setup all come from fields the identity pass reads as
/// the full scan does (the inventory's `identity_pass` tests hold them equal). The completion
/// changes no health and no advertised device, so the kubelet gets no update from it (the device
/// plugin sends one only when what it advertises changed).
pub fn start_first_scan(inventory: &Inventory) -> tokio::task::JoinHandle<NodeDevices> {
    let inv = inventory.clone();
    tokio::task::spawn_blocking(move || inv.scan_identity())
}

/// The device state owner: waits for the first scan (each sysfs read with a time limit; a
/// shutdown does not wait for it: `None`, logged as abandoned), then re-reads on link and
/// `/dev` events and the safety poll. The raw inventory's channel, and [`Complete`]: the first
/// scan is the identity pass, and the full scan that completes it runs when that is called.
pub async fn start(
    first_scan: tokio::task::JoinHandle<NodeDevices>,
    inventory: Inventory,
    s: &crate::cli::Settings,
    tasks: &mut crate::tasks::Tasks,
) -> anyhow::Result<Option<(watch::Receiver<NodeDevices>, Complete)>> {
    use anyhow::Context;
    let scanned = {
        let _waiting = tasks.pending.enter("the initial inventory scan");
        tokio::select! {
            r = first_scan => Some(r),
            _ = tasks.cancel.cancelled() => None,
        }
    };
    let Some(raw) = scanned else {
        tracing::warn!("abandoned: the initial inventory scan");
        return Ok(None);
    };
    let raw = raw.context("initial inventory scan")?;
    tracing::info!(
        devices = ?raw.devices.iter().map(|d| (&d.name, d.health.is_healthy())).collect::<Vec<_>>(),
        drivers = ?s.rdma_drivers,
        "initial inventory"
    );
    let (raw_tx, raw_rx) = watch::channel(raw);
    let wake = Wake::default();
    erdma_inventory::events::watch_links(
        wake.refresh.clone(),
        wake.rescan.clone(),
        wake.down.clone(),
        tasks.cancel.clone(),
    );
    tasks.keep(erdma_inventory::events::watch_dev(
        &s.dev_root,
        wake.refresh.clone(),
    ));
    let cancel = tasks.cancel.clone();
    let complete = Complete {
        rescan: wake.rescan.clone(),
        started_up: tasks.started_up.clone(),
    };
    tasks.spawn(
        "the device inventory",
        run(
            inventory,
            raw_tx,
            s.poll_interval,
            FULL_SCAN_EVERY,
            wake,
            cancel,
        ),
    );
    Ok(Some((raw_rx, complete)))
}

/// Starts the full scan that completes the identity pass the agent started from
/// ([`start_first_scan`]). The agent calls it once the kubelet has the devices: with the device
/// plugin, [`SETTLE_AFTER_HANDOVER`] after ListAndWatch handed over a list with at least one
/// device (or [`COMPLETE_AT_LATEST`] after the start, for a node that serves none yet); with
/// DRA, at once.
/// On a node of few cores, the full scan's reads (two threads) beside the registration and the
/// transfer of a 12 800-slot list would only delay them.
#[derive(Debug, Clone)]
pub struct Complete {
    rescan: Arc<Notify>,
    started_up: crate::tasks::StartedUp,
}

/// How long after the hand-over of the first device list the deferred work starts: hyper asks
/// ListAndWatch for its next message once the list is in HTTP/2's send buffer, not once the
/// kubelet read it, and a 12 800-slot list (375 KB) takes a few milliseconds more to cross the
/// socket and be decoded; work started at once would compete with that on a node of few cores.
pub const SETTLE_AFTER_HANDOVER: Duration = Duration::from_millis(100);

/// The latest the full scan starts after the identity pass, registered or not.
pub const COMPLETE_AT_LATEST: Duration = Duration::from_secs(1);

impl Complete {
    /// Starts the full scan now (a stored permit: the reader takes it at its next wait), and
    /// marks the start as over ([`crate::tasks::StartedUp`]).
    pub fn now(&self) {
        self.rescan.notify_one();
        self.started_up.set();
    }

    /// Starts the full scan [`SETTLE_AFTER_HANDOVER`] after `ready` returns, or once
    /// [`COMPLETE_AT_LATEST`] passed.
    pub fn after(
        self,
        ready: impl Future<Output = ()> + Send + 'static,
        tasks: &mut crate::tasks::Tasks,
    ) {
        let cancel = tasks.cancel.clone();
        tasks.spawn("completing the first inventory", async move {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = async {
                    ready.await;
                    tokio::time::sleep(SETTLE_AFTER_HANDOVER).await;
                } => {}
                _ = tokio::time::sleep(COMPLETE_AT_LATEST) => {}
            }
            tracing::debug!("completing the identity pass with a full scan");
            self.now();
        });
    }
}

/// The publisher of the served snapshot, computed once now so that the first list of the
/// device plugin or the DRA driver is already right; `/healthz` gets its view.
pub fn start_publish(
    s: &crate::cli::Settings,
    inputs: PublisherInputs,
    view: &mut watch::Receiver<ServedView>,
    tasks: &mut crate::tasks::Tasks,
) -> watch::Receiver<NodeDevices> {
    let selection = DeviceSelection {
        drivers: s.rdma_drivers.clone(),
        eris: s.exposed_local_eris.clone(),
        instance_id: s.instance_id.clone(),
    };
    let (first, _) = compose(&Inputs {
        raw: &inputs.raw.borrow(),
        selection: &selection,
        driver: &inputs.driver.borrow(),
        source: &inputs.source.borrow(),
    });
    let (served_tx, served_rx) = watch::channel(first);
    let (view_tx, view_rx) = watch::channel(ServedView::default());
    *view = view_rx;
    let cancel = tasks.cancel.clone();
    tasks.spawn(
        "publishing the served devices",
        publish(inputs, selection, served_tx, view_tx, cancel),
    );
    served_rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A driver that moves its port state just after the reader looked (as rxe does in the netdev
    /// notifier that runs after the rtnetlink message went out): the port file reads as it is, then
    /// the fixture is switched to the next state.
    struct PortMovesAfterRead {
        tree: erdma_host::fake::NodeTree,
        reads: std::sync::atomic::AtomicUsize,
        then: std::sync::Mutex<Option<&'static str>>,
    }
    const PORT: &str = "class/infiniband/erdma_1/ports/1/state";
    impl Hooks for PortMovesAfterRead {
        fn after_read(&self, rel: &Path) {
            if rel == Path::new(PORT) {
                self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(next) = self.then.lock().unwrap().take() {
                    self.tree.write(PORT, next);
                }
            }
        }
    }

    /// What a test does around the real sysfs reads.
    trait Hooks: Send + Sync + 'static {
        fn after_read(&self, _rel: &Path) {}
        fn before_list(&self, _rel: &Path) {}
    }

    /// The real sysfs of a fixture tree with [`Hooks`] around its reads.
    struct Hooked<H> {
        inner: erdma_host::RootedSysfs,
        hooks: H,
    }
    impl<H: Hooks> erdma_host::Sysfs for Hooked<H> {
        fn read_attr(&self, rel: &Path) -> Result<String, erdma_host::SysfsError> {
            let v = self.inner.read_attr(rel);
            self.hooks.after_read(rel);
            v
        }
        fn read_link(&self, rel: &Path) -> Result<std::path::PathBuf, erdma_host::SysfsError> {
            self.inner.read_link(rel)
        }
        fn list_dir(&self, rel: &Path) -> Result<Vec<String>, erdma_host::SysfsError> {
            self.hooks.before_list(rel);
            self.inner.list_dir(rel)
        }
        fn canonical(&self, rel: &Path) -> Result<std::path::PathBuf, erdma_host::SysfsError> {
            self.inner.canonical(rel)
        }
        fn exists(&self, rel: &Path) -> bool {
            self.inner.exists(rel)
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn refresh(&self) {
            self.inner.refresh()
        }
    }

    /// One wake-up, and the port state that changed right after the woken read is still seen
    /// (by the settle re-read), although the poll interval is an hour and nothing wakes again.
    #[tokio::test]
    async fn a_port_change_just_after_the_woken_read_is_seen_without_polling() {
        use std::sync::atomic::Ordering;
        let tree = erdma_host::fake::NodeTree::temp();
        erdma_host::fixtures::erdma(&tree, false);
        let sysfs = Arc::new(Hooked {
            inner: erdma_host::RootedSysfs::new(tree.sys()),
            hooks: PortMovesAfterRead {
                tree: erdma_host::fake::NodeTree::at(tree.root()),
                reads: Default::default(),
                then: Default::default(),
            },
        });
        let inv = Inventory::new(erdma_inventory::Sources {
            sysfs: sysfs.clone(),
            devfs: Arc::new(erdma_host::RootedDevFs::new(tree.dev())),
            addrs: Arc::new(erdma_host::fake::FixedInterfaceAddrs::default()),
        });
        let first = inv.scan();
        assert!(first.devices[1].health.is_healthy());
        sysfs.hooks.reads.store(0, Ordering::SeqCst);
        let (tx, mut rx) = watch::channel(first);
        let wake = Wake::default();
        let cancel = CancellationToken::new();
        tokio::spawn(run(
            inv,
            tx,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
            wake.clone(),
            cancel.clone(),
        ));
        // The interval's first tick reads at once; wait for it so that only the wake-up follows.
        while sysfs.hooks.reads.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tree.write(PORT, "1: DOWN\n");
        *sysfs.hooks.then.lock().unwrap() = Some("4: ACTIVE\n");
        wake.refresh.notify_one();
        let hang_guard = Duration::from_secs(30);
        tokio::time::timeout(hang_guard, rx.changed())
            .await
            .expect("the woken read publishes")
            .unwrap();
        assert!(!rx.borrow_and_update().devices[1].health.is_healthy());
        tokio::time::timeout(hang_guard, rx.changed())
            .await
            .expect("the settle re-read publishes the port that came back")
            .unwrap();
        assert!(rx.borrow().devices[1].health.is_healthy());
        cancel.cancel();
    }

    /// Every re-read after the first one hangs at its first step (listing the devices) until
    /// released.
    struct ReadsAfterTheFirstHang {
        lists: std::sync::atomic::AtomicUsize,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }
    impl Hooks for ReadsAfterTheFirstHang {
        fn before_list(&self, rel: &Path) {
            if rel == Path::new(erdma_inventory::DEVICE_CLASS)
                && self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1
            {
                let _ = self.release.lock().unwrap().recv();
            }
        }
    }

    /// A link message that shows the link down makes the healthy device on it unhealthy at once,
    /// published before the re-read (which hangs here, and whose sysfs still shows the link up).
    #[tokio::test]
    async fn a_link_message_showing_the_link_down_is_published_before_any_read() {
        use std::sync::atomic::Ordering;
        let tree = erdma_host::fake::NodeTree::temp();
        erdma_host::fixtures::erdma(&tree, false);
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let sysfs = Arc::new(Hooked {
            inner: erdma_host::RootedSysfs::new(tree.sys()),
            hooks: ReadsAfterTheFirstHang {
                lists: Default::default(),
                release: std::sync::Mutex::new(gate),
            },
        });
        let inv = Inventory::new(erdma_inventory::Sources {
            sysfs: sysfs.clone(),
            devfs: Arc::new(erdma_host::RootedDevFs::new(tree.dev())),
            addrs: Arc::new(erdma_host::fake::FixedInterfaceAddrs::default()),
        });
        let first = inv.scan();
        assert!(first.devices.iter().all(|d| d.health.is_healthy()));
        let on_eth2 = first
            .devices
            .iter()
            .position(|d| d.netdev.as_ref().is_some_and(|n| n.name == "eth2"))
            .expect("a device on eth2");
        sysfs.hooks.lists.store(0, Ordering::SeqCst);
        let (tx, mut rx) = watch::channel(first);
        let wake = Wake::default();
        let cancel = CancellationToken::new();
        tokio::spawn(run(
            inv,
            tx,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
            wake.clone(),
            cancel.clone(),
        ));
        // The interval's first tick re-reads at once (and does not hang); the wake-up follows it.
        while sysfs.hooks.lists.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        wake.down.record("eth1".into(), false);
        wake.down.record("eth2".into(), true);
        wake.refresh.notify_one();
        tokio::time::timeout(Duration::from_secs(30), rx.changed())
            .await
            .expect("published without waiting for the re-read")
            .unwrap();
        let now = rx.borrow_and_update().clone();
        let dev = &now.devices[on_eth2];
        assert_eq!(
            dev.health.reasons(),
            ["netdev eth2 is down: bring it up (ip link set eth2 up)"]
        );
        assert_eq!(dev.netdev.as_ref().and_then(|n| n.link_up), Some(false));
        assert!(
            now.devices
                .iter()
                .enumerate()
                .all(|(i, d)| i == on_eth2 || d.health.is_healthy()),
            "only the device on eth2"
        );
        cancel.cancel();
        drop(release);
    }

    /// A full scan whose GID listing hangs until released, as a slow full scan does.
    struct SlowGids {
        blocked: std::sync::atomic::AtomicBool,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }
    impl Hooks for SlowGids {
        fn before_list(&self, rel: &Path) {
            if rel.ends_with("gids") {
                self.blocked
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = self.release.lock().unwrap().recv();
                self.blocked
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// A link event is answered while the periodic full scan is still running.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_event_during_a_slow_full_scan_is_answered_at_once() {
        use std::sync::atomic::Ordering;
        let tree = erdma_host::fake::NodeTree::temp();
        erdma_host::fixtures::erdma(&tree, false);
        let first = Inventory::new(erdma_inventory::Sources {
            sysfs: Arc::new(erdma_host::RootedSysfs::new(tree.sys())),
            devfs: Arc::new(erdma_host::RootedDevFs::new(tree.dev())),
            addrs: Arc::new(erdma_host::fake::FixedInterfaceAddrs::default()),
        })
        .scan();
        assert!(first.devices[1].health.is_healthy());
        let (release, gate) = std::sync::mpsc::channel();
        let sysfs = Arc::new(Hooked {
            inner: erdma_host::RootedSysfs::new(tree.sys()),
            hooks: SlowGids {
                blocked: Default::default(),
                release: std::sync::Mutex::new(gate),
            },
        });
        let inv = Inventory::new(erdma_inventory::Sources {
            sysfs: sysfs.clone(),
            devfs: Arc::new(erdma_host::RootedDevFs::new(tree.dev())),
            addrs: Arc::new(erdma_host::fake::FixedInterfaceAddrs::default()),
        });
        let (tx, mut rx) = watch::channel(first);
        let wake = Wake::default();
        let cancel = CancellationToken::new();
        tokio::spawn(run(
            inv,
            tx,
            Duration::from_millis(100),
            Duration::from_secs(3600),
            wake.clone(),
            cancel.clone(),
        ));
        // An address event asks for a full scan, which hangs in the GIDs.
        wake.rescan.notify_one();
        while !sysfs.hooks.blocked.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tree.write(PORT, "1: DOWN\n");
        wake.refresh.notify_one();
        tokio::time::timeout(Duration::from_secs(30), rx.changed())
            .await
            .expect("the link event is answered during the scan")
            .unwrap();
        assert!(!rx.borrow_and_update().devices[1].health.is_healthy());
        assert!(
            sysfs.hooks.blocked.load(Ordering::SeqCst),
            "answered while the full scan still ran"
        );
        // The scan finishes: its result is refreshed, so the port is still DOWN, not as it was
        // when the scan started.
        release.send(()).unwrap();
        release.send(()).unwrap();
        while sysfs.hooks.blocked.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!rx.borrow().devices[1].health.is_healthy());
        cancel.cancel();
        drop(release);
    }
}
