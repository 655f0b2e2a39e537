//! What wakes the inventory reader between polls: rtnetlink link events (operstate, carrier,
//! netdevs added or removed) and inotify on `/dev/infiniband` (uverbs nodes created or removed).
//! The events carry no state of their own: a wake-up makes the reader look again (the agent
//! re-reads once more 50 ms later, for a port that moves just after the link does).

use futures::StreamExt;
use rtnetlink::MulticastGroup;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Wakes `wake` on every rtnetlink link message until `cancel` fires (call it inside a tokio
/// runtime). Returns `false` when no netlink socket could be opened (polling remains).
pub fn watch_links(wake: Arc<Notify>, cancel: CancellationToken) -> bool {
    let (conn, _handle, mut messages) =
        match rtnetlink::new_multicast_connection(&[MulticastGroup::Link]) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "netlink link events unavailable ({e}); netdev changes are seen by polling only"
                );
                return false;
            }
        };
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => tracing::warn!("netlink connection closed; netdev changes are seen by polling only"),
        }
    });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                m = messages.next() => match m {
                    // The content does not matter, only that links changed.
                    Some(_) => wake.notify_one(),
                    None => return,
                },
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
