//! rtnetlink: reading the kernel's IPv4 state and applying planned changes, optionally in another
//! network namespace (the socket is opened by a thread that did `setns`).

use crate::plan::{AddrView, Change, EriNetdev, LinkView, NetState, PlanError, RouteView, plan};
use erdma_cloud::imds::{Metadata, MetadataError};
use erdma_model::MacAddr;
use futures::TryStreamExt;
use nix::sched::{CloneFlags, setns};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use tokio::task::JoinHandle;

/// An ERI netdev could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    /// Addressing could not be obtained; nothing was changed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The interface is missing or is not the ERI.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A netlink request failed.
    #[error("{step}: {detail}. Fix: {fix}")]
    Netlink {
        /// The step, e.g. `ip link set dev eth1 up`.
        step: String,
        /// The kernel's answer.
        detail: String,
        /// What to do about it.
        fix: String,
    },
    /// The network namespace could not be entered.
    #[error(
        "network namespace {path}: {detail}. Fix: run as root / with CAP_SYS_ADMIN and check the path"
    )]
    Namespace {
        /// The namespace file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

/// What [`RouteNetlink::ensure_eri`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EriSetup {
    /// Interface.
    pub ifname: String,
    /// Skipped because it is the primary ENI.
    pub skipped_primary: bool,
    /// Changes applied, in order (empty when already configured).
    pub changes: Vec<Change>,
}

/// An rtnetlink connection whose driver task stops when this is dropped.
pub struct RouteNetlink {
    handle: Handle,
    task: JoinHandle<()>,
}

impl Drop for RouteNetlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn step_error(step: impl ToString, e: rtnetlink::Error) -> NetdevError {
    let detail = e.to_string();
    let fix = if detail.contains("Operation not permitted") || detail.contains("-1") {
        "run the agent with NET_ADMIN"
    } else if detail.contains("File exists") {
        "another agent or tool configures this interface; remove the conflicting address/route"
    } else {
        "check `ip addr` / `ip route` on the node; the next reconcile retries"
    };
    NetdevError::Netlink {
        step: step.to_string(),
        detail,
        fix: fix.to_string(),
    }
}

impl RouteNetlink {
    /// Connects in the calling thread's network namespace; must run inside a tokio runtime.
    pub fn connect() -> Result<Self, NetdevError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| NetdevError::Netlink {
            step: "open NETLINK_ROUTE".into(),
            detail: e.to_string(),
            fix: "run the agent with NET_ADMIN".into(),
        })?;
        Ok(RouteNetlink {
            handle,
            task: tokio::spawn(conn),
        })
    }

    /// Connects inside the network namespace at `netns` (e.g. `/run/netns/x`, `/proc/<pid>/ns/net`):
    /// a helper thread enters it and opens the socket; the connection is then driven by the calling
    /// runtime. Must run inside a tokio runtime.
    pub fn connect_in_netns(netns: &Path) -> Result<Self, NetdevError> {
        let path = netns.to_path_buf();
        let rt = tokio::runtime::Handle::current();
        let err = |detail: String| NetdevError::Namespace {
            path: netns.to_path_buf(),
            detail,
        };
        let opened = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| format!("open: {e}"))?;
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
            let _guard = rt.enter();
            rtnetlink::new_connection()
                .map(|(c, h, _)| (c, h))
                .map_err(|e| format!("open NETLINK_ROUTE: {e}"))
        })
        .join()
        .map_err(|_| err("helper thread panicked".into()))?
        .map_err(err)?;
        let (conn, handle) = opened;
        Ok(RouteNetlink {
            handle,
            task: tokio::spawn(conn),
        })
    }

    /// The rtnetlink handle.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Reads links, IPv4 addresses and IPv4 main-table unicast routes.
    pub async fn read_state(&self) -> Result<NetState, NetdevError> {
        let mut state = NetState::default();
        let mut links = self.handle.link().get().execute();
        while let Some(m) = links
            .try_next()
            .await
            .map_err(|e| step_error("ip link show", e))?
        {
            let mut name = String::new();
            let mut mtu = 0;
            let mut mac = None;
            for a in &m.attributes {
                match a {
                    LinkAttribute::IfName(n) => name = n.clone(),
                    LinkAttribute::Mtu(v) => mtu = *v,
                    LinkAttribute::Address(b) if b.len() == 6 => {
                        let mut x = [0u8; 6];
                        x.copy_from_slice(b);
                        mac = Some(MacAddr(x));
                    }
                    _ => {}
                }
            }
            state.links.push(LinkView {
                index: m.header.index,
                name,
                mac,
                up: m.header.flags.contains(LinkFlags::Up),
                mtu,
            });
        }
        let mut addrs = self.handle.address().get().execute();
        while let Some(m) = addrs
            .try_next()
            .await
            .map_err(|e| step_error("ip -4 addr show", e))?
        {
            if m.header.family != AddressFamily::Inet {
                continue;
            }
            let ip = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            let ip = ip.or_else(|| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(ip) = ip {
                state.addrs.push(AddrView {
                    index: m.header.index,
                    ip,
                    prefix_len: m.header.prefix_len,
                });
            }
        }
        let mut routes = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute();
        while let Some(m) = routes
            .try_next()
            .await
            .map_err(|e| step_error("ip -4 route show", e))?
        {
            let mut table = u32::from(m.header.table);
            let mut r = RouteView {
                dst: Ipv4Addr::UNSPECIFIED,
                prefix_len: m.header.destination_prefix_length,
                oif: None,
                gateway: None,
                metric: 0,
                kernel: m.header.protocol == RouteProtocol::Kernel,
            };
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => r.dst = *d,
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => r.gateway = Some(*g),
                    RouteAttribute::Oif(i) => r.oif = Some(*i),
                    RouteAttribute::Priority(p) => r.metric = *p,
                    RouteAttribute::Table(t) => table = *t,
                    _ => {}
                }
            }
            if table == u32::from(RouteHeader::RT_TABLE_MAIN) && m.header.kind == RouteType::Unicast
            {
                state.routes.push(r);
            }
        }
        Ok(state)
    }

    /// Applies one change.
    pub async fn apply(&self, state: &NetState, change: &Change) -> Result<(), NetdevError> {
        let index_of = |ifname: &str| {
            state
                .links
                .iter()
                .find(|l| l.name == ifname)
                .map(|l| l.index)
                .ok_or_else(|| {
                    NetdevError::Plan(PlanError::NoSuchLink {
                        ifname: ifname.to_string(),
                    })
                })
        };
        let h = &self.handle;
        let result = match change {
            Change::SetMtu { ifname, to, .. } => {
                let msg = LinkUnspec::new_with_index(index_of(ifname)?)
                    .mtu(*to)
                    .build();
                h.link().set(msg).execute().await
            }
            Change::LinkUp { ifname } => {
                let msg = LinkUnspec::new_with_index(index_of(ifname)?).up().build();
                h.link().set(msg).execute().await
            }
            Change::AddAddress {
                ifname,
                ip,
                prefix_len,
            } => {
                let mut req = h
                    .address()
                    .add(index_of(ifname)?, IpAddr::V4(*ip), *prefix_len);
                // No automatic prefix route: it would have metric 0 and could beat the primary ENI's.
                req.message_mut()
                    .attributes
                    .push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
                req.execute().await
            }
            Change::DeletePrefixRoute {
                ifname,
                dst,
                prefix_len,
                metric,
            } => {
                let msg = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(*dst, *prefix_len)
                    .output_interface(index_of(ifname)?)
                    .priority(*metric)
                    .protocol(RouteProtocol::Kernel)
                    .scope(RouteScope::Link)
                    .build();
                h.route().del(msg).execute().await
            }
            Change::AddRoute {
                ifname,
                dst,
                prefix_len,
                gateway,
                src,
                metric,
            } => {
                let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(*dst, *prefix_len)
                    .output_interface(index_of(ifname)?)
                    .priority(*metric);
                if let Some(g) = gateway {
                    b = b.gateway(*g);
                } else {
                    b = b.scope(RouteScope::Link);
                }
                if let Some(s) = src {
                    b = b.pref_source(*s);
                }
                h.route().add(b.build()).execute().await
            }
        };
        result.map_err(|e| step_error(change, e))
    }

    /// Sets up one ERI netdev (seed §9, `EnsureNetDevice`): the primary ENI is left alone; otherwise
    /// the addressing is fetched first (a metadata failure changes nothing), then the planned changes
    /// are applied in order. Every change is convergent, so a retry after a failure completes the
    /// setup; a second run changes nothing.
    pub async fn ensure_eri<M: Metadata>(
        &self,
        metadata: &M,
        eri: &EriNetdev,
        jumbo_frame_mtu: i64,
    ) -> Result<EriSetup, NetdevError> {
        if eri.primary {
            tracing::debug!(ifname = %eri.ifname, "netdev: primary ENI left untouched");
            return Ok(EriSetup {
                ifname: eri.ifname.clone(),
                skipped_primary: true,
                changes: Vec::new(),
            });
        }
        let addressing = metadata.eni_addressing(eri.mac).await?;
        let state = self.read_state().await?;
        let changes = plan(eri, jumbo_frame_mtu, &addressing, &state)?;
        for c in &changes {
            tracing::info!(ifname = %eri.ifname, change = %c, "netdev: applying");
            self.apply(&state, c).await?;
        }
        Ok(EriSetup {
            ifname: eri.ifname.clone(),
            skipped_primary: false,
            changes,
        })
    }

    /// Sets up every ERI in turn; one ERI's failure does not stop the others. Returns one result
    /// per ERI, in order (the agent reports failures as not-ready devices and retries).
    pub async fn ensure_eris<M: Metadata>(
        &self,
        metadata: &M,
        eris: &[EriNetdev],
        jumbo_frame_mtu: i64,
    ) -> Vec<(String, Result<EriSetup, NetdevError>)> {
        let mut out = Vec::with_capacity(eris.len());
        for eri in eris {
            let r = self.ensure_eri(metadata, eri, jumbo_frame_mtu).await;
            if let Err(e) = &r {
                tracing::warn!(ifname = %eri.ifname, error = %e, "netdev: ERI setup failed; will retry");
            }
            out.push((eri.ifname.clone(), r));
        }
        out
    }
}
