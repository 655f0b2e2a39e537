//! What wakes the inventory reader between its slow safety polls: rtnetlink link events
//! (operstate, carrier, netdevs added or removed) and inotify on `/dev/infiniband` (uverbs nodes
//! created or removed, i.e. RDMA devices coming and going) ask for the cheap health re-read;
//! rtnetlink address events ask for a full scan (an address change changes the RoCE GID table,
//! which only the full scan reads). The events carry no state of their own: a wake-up makes the
//! reader look again (the agent re-reads once more 50 ms later, for a port that moves just after
//! the link does).

use futures::StreamExt;
use rtnetlink::MulticastGroup;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What a routing netlink message asks the inventory reader to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link changed (flags, carrier, operstate, added, removed): re-read health.
    Link,
    /// An address was added or removed: the GID tables changed, scan everything.
    Address,
    /// Anything else on the subscribed groups.
    Other,
}

/// Classifies one routing netlink message.
pub fn classify(
    m: &rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
) -> LinkEvent {
    use rtnetlink::packet_core::NetlinkPayload;
    use rtnetlink::packet_route::RouteNetlinkMessage as R;
    match &m.payload {
        NetlinkPayload::InnerMessage(R::NewLink(_) | R::DelLink(_) | R::SetLink(_)) => {
            LinkEvent::Link
        }
        NetlinkPayload::InnerMessage(R::NewAddress(_) | R::DelAddress(_)) => LinkEvent::Address,
        _ => LinkEvent::Other,
    }
}

/// Wakes `wake` on every rtnetlink link message and `rescan` on every address message, until
/// `cancel` fires (call it inside a tokio runtime). Returns `false` when no netlink socket could
/// be opened (the safety poll remains).
pub fn watch_links(wake: Arc<Notify>, rescan: Arc<Notify>, cancel: CancellationToken) -> bool {
    let groups = [
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ];
    let (conn, _handle, mut messages) = match rtnetlink::new_multicast_connection(&groups) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                "netlink link events unavailable ({e}); netdev changes are seen by the safety poll only"
            );
            return false;
        }
    };
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => tracing::warn!("netlink connection closed; netdev changes are seen by the safety poll only"),
        }
    });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                m = messages.next() => match m {
                    Some((m, _)) => match classify(&m) {
                        LinkEvent::Link => wake.notify_one(),
                        LinkEvent::Address => rescan.notify_one(),
                        LinkEvent::Other => {}
                    },
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

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use rtnetlink::packet_route::RouteNetlinkMessage as R;
    use rtnetlink::packet_route::{
        address::AddressMessage, link::LinkMessage, route::RouteMessage,
    };

    fn msg(m: R) -> NetlinkMessage<R> {
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(m))
    }

    #[test]
    fn links_wake_the_health_read_and_addresses_the_full_scan() {
        assert_eq!(
            classify(&msg(R::NewLink(LinkMessage::default()))),
            LinkEvent::Link
        );
        assert_eq!(
            classify(&msg(R::DelLink(LinkMessage::default()))),
            LinkEvent::Link
        );
        assert_eq!(
            classify(&msg(R::NewAddress(AddressMessage::default()))),
            LinkEvent::Address
        );
        assert_eq!(
            classify(&msg(R::DelAddress(AddressMessage::default()))),
            LinkEvent::Address
        );
        assert_eq!(
            classify(&msg(R::NewRoute(RouteMessage::default()))),
            LinkEvent::Other
        );
    }
}
