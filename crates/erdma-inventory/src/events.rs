//! What wakes the inventory reader between its slow safety polls: rtnetlink link events
//! (operstate, carrier, netdevs added or removed) and inotify on `/dev/infiniband` (uverbs nodes
//! created or removed, i.e. RDMA devices coming and going) ask for the cheap health re-read;
//! rtnetlink address events ask for a full scan (an address change changes the RoCE GID table,
//! which only the full scan reads). A wake-up makes the reader look again (the agent re-reads a
//! few more times within 50 ms, for a port that moves just after the link does). One fact is
//! taken from the message itself: a link that it shows down ([`DownLinks`]), which is enough to
//! judge the devices on it unusable before anything is read.

use futures::StreamExt;
use rtnetlink::MulticastGroup;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What a routing netlink message asks the inventory reader to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link changed (flags, carrier, operstate, added, removed): re-read health. `netdev` and
    /// `down` come from the message: whether it shows the link down, as the live link state
    /// (`flags` and `carrier` in sysfs) would read it.
    Link {
        /// The interface name, when the message carries it.
        netdev: Option<String>,
        /// `IFF_UP` cleared, up without carrier (`IFF_LOWER_UP` cleared), or the link deleted.
        down: bool,
    },
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
        NetlinkPayload::InnerMessage(R::NewLink(l) | R::SetLink(l)) => LinkEvent::Link {
            netdev: name(l),
            down: !l.header.flags.contains(LinkFlags::Up | LinkFlags::LowerUp),
        },
        NetlinkPayload::InnerMessage(R::DelLink(l)) => LinkEvent::Link {
            netdev: name(l),
            down: true,
        },
        NetlinkPayload::InnerMessage(R::NewAddress(_) | R::DelAddress(_)) => LinkEvent::Address,
        _ => LinkEvent::Other,
    }
}

fn name(l: &LinkMessage) -> Option<String> {
    l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

/// The link state of each netdev as the latest link message about it showed it, until the
/// reader takes them: the reader judges the devices on a link shown down unusable at once,
/// before its sysfs re-read (a later message that shows the link up again cancels that).
#[derive(Debug, Default)]
pub struct DownLinks(Mutex<BTreeMap<String, bool>>);

impl DownLinks {
    /// Records what the latest message about `netdev` showed.
    pub fn record(&self, netdev: String, down: bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(netdev, down);
    }

    /// The netdevs whose latest message showed them down, forgetting every record.
    pub fn take(&self) -> Vec<String> {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        taken
            .into_iter()
            .filter_map(|(netdev, down)| down.then_some(netdev))
            .collect()
    }
}

/// Wakes `wake` on every rtnetlink link message (after recording in `down` what it showed) and
/// `rescan` on every address message, until `cancel` fires (call it inside a tokio runtime).
/// Returns `false` when no netlink socket could be opened (the safety poll remains).
pub fn watch_links(
    wake: Arc<Notify>,
    rescan: Arc<Notify>,
    down: Arc<DownLinks>,
    cancel: CancellationToken,
) -> bool {
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
                        LinkEvent::Link { netdev, down: is_down } => {
                            if let Some(n) = &netdev {
                                down.record(n.clone(), is_down);
                            }
                            wake.notify_one();
                            tracing::debug!(?netdev, down = is_down, "rtnetlink link message");
                        }
                        LinkEvent::Address => {
                            rescan.notify_one();
                            tracing::debug!("rtnetlink address message");
                        }
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
    use rtnetlink::packet_route::{address::AddressMessage, route::RouteMessage};

    fn msg(m: R) -> NetlinkMessage<R> {
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(m))
    }

    /// A link message of `name` with `flags`, as the kernel builds it (`dev_get_flags`).
    fn link(name: &str, flags: LinkFlags) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.flags = flags;
        l.attributes.push(LinkAttribute::IfName(name.into()));
        l
    }

    fn link_event(netdev: &str, down: bool) -> LinkEvent {
        LinkEvent::Link {
            netdev: Some(netdev.into()),
            down,
        }
    }

    #[test]
    fn links_wake_the_health_read_and_addresses_the_full_scan() {
        let running = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Running;
        assert_eq!(
            classify(&msg(R::NewLink(link("eth0", running)))),
            link_event("eth0", false)
        );
        assert_eq!(
            classify(&msg(R::NewLink(link("eth0", LinkFlags::Broadcast)))),
            link_event("eth0", true),
            "IFF_UP cleared: down"
        );
        assert_eq!(
            classify(&msg(R::NewLink(link("eth0", LinkFlags::Up)))),
            link_event("eth0", true),
            "up without carrier: down"
        );
        assert_eq!(
            classify(&msg(R::DelLink(link("eth0", running)))),
            link_event("eth0", true),
            "a deleted link is down whatever its last flags"
        );
        assert_eq!(
            classify(&msg(R::NewLink(LinkMessage::default()))),
            LinkEvent::Link {
                netdev: None,
                down: true
            }
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

    #[test]
    fn the_latest_message_per_link_decides_and_taking_forgets() {
        let d = DownLinks::default();
        d.record("eth0".into(), true);
        d.record("eth1".into(), true);
        d.record("eth1".into(), false);
        d.record("eth2".into(), false);
        assert_eq!(d.take(), ["eth0"], "eth1 came back up after it went down");
        assert!(d.take().is_empty(), "taken once");
    }
}
