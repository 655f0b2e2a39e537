//! The device state owner: scans the node, keeps the devices this agent serves, and publishes a
//! new snapshot only when something changed.

use erdma_inventory::Inventory;
use erdma_model::{EriSelector, NodeDevices};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Which devices the agent serves.
#[derive(Debug, Clone)]
pub struct DeviceFilter {
    /// Driver keys (`erdma`, `rxe`, `siw`, or a kernel driver name).
    pub drivers: Vec<String>,
    /// ERI allow-list.
    pub selector: EriSelector,
    /// Instance ID the allow-list is applied with (empty when unknown).
    pub instance_id: String,
}

impl DeviceFilter {
    /// Keeps the devices of the configured drivers that the allow-list exposes.
    pub fn apply(&self, mut node: NodeDevices) -> NodeDevices {
        node.devices.retain(|d| {
            self.drivers.iter().any(|k| k == d.driver_key())
                && self.selector.selects(&self.instance_id, &d.name)
        });
        node
    }
}

/// Full rescans (new or removed devices, driver reloads) happen at least this often; in between,
/// the cheap [`Inventory::refresh`] re-reads port state, operstate and char-device presence.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(5);

/// Scans now and returns the filtered snapshot with a sender that publishes later changes.
pub fn initial(inventory: &Inventory, filter: &DeviceFilter) -> (NodeDevices, NodeDevices) {
    let raw = inventory.scan();
    let served = filter.apply(raw.clone());
    (raw, served)
}

/// Re-reads the inventory every `interval`, and at once when `wake` fires (netlink link events,
/// `/dev/infiniband` changes), until `cancel` fires; publishes on `tx` only when the served
/// snapshot changed.
pub async fn run(
    inventory: Inventory,
    filter: DeviceFilter,
    mut raw: NodeDevices,
    tx: watch::Sender<NodeDevices>,
    interval: Duration,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_full = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
            _ = wake.notified() => {}
        }
        let full = last_full.elapsed() >= FULL_SCAN_EVERY;
        let inv = inventory.clone();
        let prev = raw.clone();
        // sysfs reads block: keep them off the async workers.
        let scanned =
            tokio::task::spawn_blocking(move || if full { inv.scan() } else { inv.refresh(&prev) })
                .await;
        let Ok(next) = scanned else {
            tracing::error!("inventory scan panicked; keeping the previous snapshot");
            continue;
        };
        if full {
            last_full = tokio::time::Instant::now();
        }
        raw = next;
        let served = filter.apply(raw.clone());
        tx.send_if_modified(|cur| {
            if *cur == served {
                return false;
            }
            log_changes(cur, &served);
            *cur = served;
            true
        });
    }
}

/// Wakes the poller on every rtnetlink link message (operstate, carrier, add/remove of netdevs)
/// until `cancel` fires. Returns `false` when no netlink socket could be opened (polling remains).
pub fn watch_links(wake: Arc<Notify>, cancel: CancellationToken) -> bool {
    use nix::sys::socket::{
        AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, socket,
    };
    const RTMGRP_LINK: u32 = 1;
    let fd = match socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    ) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(
                "netlink socket unavailable ({e}); netdev changes are seen by polling only"
            );
            return false;
        }
    };
    if let Err(e) = bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &NetlinkAddr::new(0, RTMGRP_LINK),
    ) {
        tracing::warn!(
            "netlink bind to link events failed ({e}); netdev changes are seen by polling only"
        );
        return false;
    }
    // SAFETY: the OwnedFd moves into the AsyncFd, stays open for its whole life and always
    // returns the same descriptor from as_raw_fd.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    let afd = match registered {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("netlink socket cannot be polled ({e}); polling only");
            return false;
        }
    };
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let guard = tokio::select! {
                _ = cancel.cancelled() => return,
                g = afd.readable() => g,
            };
            let Ok(mut guard) = guard else { return };
            // Drain everything queued; the content does not matter, only that links changed.
            let mut woke = false;
            loop {
                match nix::sys::socket::recv(
                    std::os::fd::AsRawFd::as_raw_fd(afd.get_ref()),
                    &mut buf,
                    nix::sys::socket::MsgFlags::empty(),
                ) {
                    Ok(0) => break,
                    Ok(_) => woke = true,
                    Err(nix::errno::Errno::EAGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    // ENOBUFS: events were dropped; a refresh re-reads everything anyway.
                    Err(nix::errno::Errno::ENOBUFS) => woke = true,
                    Err(e) => {
                        tracing::warn!(
                            "netlink receive failed ({e}); netdev changes are seen by polling only"
                        );
                        return;
                    }
                }
            }
            if woke {
                wake.notify_one();
            }
        }
    });
    true
}

/// Wakes the poller when `<dev_root>/infiniband` changes (uverbs nodes created or removed).
/// Returns the watcher, which must be kept alive; `None` when inotify is unavailable.
pub fn watch_dev(dev_root: &Path, wake: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let ib = dev_root.join("infiniband");
    let target = if ib.is_dir() {
        ib
    } else {
        dev_root.to_path_buf()
    };
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok() {
            wake.notify_one();
        }
    })
    .map_err(|e| {
        tracing::warn!("inotify unavailable ({e}); char-device changes are seen by polling only")
    })
    .ok()?;
    w.watch(&target, RecursiveMode::NonRecursive)
        .map_err(
            |e| tracing::warn!(dir = %target.display(), "inotify watch failed ({e}); polling only"),
        )
        .ok()?;
    Some(w)
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

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::{DeviceKind, RdmaDevice};

    #[test]
    fn filter_by_driver_and_allow_list() {
        let mut n = NodeDevices::empty();
        n.devices = vec![
            RdmaDevice::named("erdma_0", DeviceKind::Erdma),
            RdmaDevice::named("erdma_1", DeviceKind::Erdma),
            RdmaDevice::named("rxe0", DeviceKind::Rxe),
        ];
        let f = DeviceFilter {
            drivers: vec!["erdma".into()],
            selector: EriSelector::default(),
            instance_id: String::new(),
        };
        let names: Vec<String> = f
            .apply(n.clone())
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["erdma_0", "erdma_1"]);
        let f = DeviceFilter {
            drivers: vec!["erdma".into(), "rxe".into()],
            selector: EriSelector::parse("i-abc erdma_1/rxe*").unwrap(),
            instance_id: "i-abc".into(),
        };
        let names: Vec<String> = f
            .apply(n.clone())
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["erdma_1", "rxe0"]);
        let f = DeviceFilter {
            instance_id: "i-other".into(),
            ..f
        };
        assert!(f.apply(n).devices.is_empty());
    }

    #[tokio::test]
    async fn dev_changes_wake_the_poller() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("infiniband")).unwrap();
        let wake = Arc::new(Notify::new());
        let _w = watch_dev(dev.path(), wake.clone()).expect("inotify watch");
        std::fs::write(dev.path().join("infiniband/uverbs9"), b"").unwrap();
        tokio::time::timeout(Duration::from_secs(2), wake.notified())
            .await
            .expect("woken by the new uverbs node");
    }

    #[tokio::test]
    async fn link_changes_wake_the_poller() {
        let wake = Arc::new(Notify::new());
        let cancel = CancellationToken::new();
        assert!(
            watch_links(wake.clone(), cancel.clone()),
            "netlink route socket"
        );
        let name = format!("erdmanl{}", std::process::id() % 100_000);
        let peer = format!("{name}p");
        let added = std::process::Command::new("ip")
            .args(["link", "add", &name, "type", "veth", "peer", "name", &peer])
            .output();
        match added {
            Ok(o) if o.status.success() => {}
            other => {
                eprintln!("skipping: cannot create a veth pair here ({other:?})");
                return;
            }
        }
        let woke = tokio::time::timeout(Duration::from_secs(2), wake.notified()).await;
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &name])
            .output();
        cancel.cancel();
        assert!(woke.is_ok(), "a new link must wake the poller");
    }
}
