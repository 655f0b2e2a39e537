//! Pure planning: the ERI's desired network state × what the kernel has → changes, as values.

use erdma_cloud::imds::EniAddressing;
use erdma_model::MacAddr;
use serde::Serialize;
use std::fmt;
use std::net::Ipv4Addr;

pub use erdma_model::names::DEFAULT_JUMBO_MTU;
/// Lowest metric erdma gives its routes, so they never win over the primary interface's.
pub const METRIC_FLOOR: u32 = 200;

/// The MTU for jumbo frames from the `--jumbo-frame-mtu` flag (8500 when ≤ 0).
pub fn jumbo_mtu(flag: i64) -> u32 {
    if flag <= 0 {
        DEFAULT_JUMBO_MTU
    } else {
        u32::try_from(flag).unwrap_or(u32::MAX)
    }
}

/// Metric for a new route to a destination that other links already route with `existing`
/// metrics: one more than the highest, at least [`METRIC_FLOOR`].
pub fn route_metric(existing: impl IntoIterator<Item = u32>) -> u32 {
    existing
        .into_iter()
        .max()
        .map(|m| m.saturating_add(1))
        .unwrap_or(0)
        .max(METRIC_FLOOR)
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    /// ifindex.
    pub index: u32,
    /// Name.
    pub name: String,
    /// Hardware address, if Ethernet-like.
    pub mac: Option<MacAddr>,
    /// Administratively up.
    pub up: bool,
    /// MTU.
    pub mtu: u32,
}

/// An IPv4 address on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrView {
    /// ifindex.
    pub index: u32,
    /// Address.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix_len: u8,
}

/// An IPv4 unicast route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    /// Destination network.
    pub dst: Ipv4Addr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Output interface.
    pub oif: Option<u32>,
    /// Gateway.
    pub gateway: Option<Ipv4Addr>,
    /// Metric (`RTA_PRIORITY`, 0 when absent).
    pub metric: u32,
    /// Added by the kernel for an address (`proto kernel`).
    pub kernel: bool,
}

/// The kernel's IPv4 network state relevant to ERI setup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetState {
    /// Links.
    pub links: Vec<LinkView>,
    /// IPv4 addresses.
    pub addrs: Vec<AddrView>,
    /// IPv4 main-table unicast routes.
    pub routes: Vec<RouteView>,
}

/// One ERI netdev to set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EriNetdev {
    /// Interface name (from the ibdev↔netdev pairing).
    pub ifname: String,
    /// Its MAC (checked against the link before anything changes).
    pub mac: MacAddr,
    /// The instance's primary ENI: never touched.
    pub primary: bool,
    /// Jumbo frames requested (CR `jumboFrame`).
    pub jumbo_frame: bool,
}

/// One change to the kernel's network state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum Change {
    /// `ip link set dev X mtu N`.
    SetMtu {
        /// Interface.
        ifname: String,
        /// Current MTU.
        from: u32,
        /// New MTU.
        to: u32,
    },
    /// `ip link set dev X up`.
    LinkUp {
        /// Interface.
        ifname: String,
    },
    /// `ip addr add IP/LEN dev X noprefixroute`.
    AddAddress {
        /// Interface.
        ifname: String,
        /// Address.
        ip: Ipv4Addr,
        /// Prefix length.
        prefix_len: u8,
    },
    /// Deletes the kernel's automatic prefix route (metric 0) that could win over the primary ENI.
    DeletePrefixRoute {
        /// Interface.
        ifname: String,
        /// Network.
        dst: Ipv4Addr,
        /// Prefix length.
        prefix_len: u8,
        /// Its metric.
        metric: u32,
    },
    /// `ip route add DST/LEN [via GW] dev X metric M [scope link src IP]`.
    AddRoute {
        /// Interface.
        ifname: String,
        /// Destination.
        dst: Ipv4Addr,
        /// Prefix length.
        prefix_len: u8,
        /// Gateway (none: a scope-link subnet route).
        gateway: Option<Ipv4Addr>,
        /// Preferred source for a subnet route.
        src: Option<Ipv4Addr>,
        /// Metric.
        metric: u32,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::SetMtu { ifname, to, .. } => write!(f, "ip link set dev {ifname} mtu {to}"),
            Change::LinkUp { ifname } => write!(f, "ip link set dev {ifname} up"),
            Change::AddAddress {
                ifname,
                ip,
                prefix_len,
            } => {
                write!(
                    f,
                    "ip addr add {ip}/{prefix_len} dev {ifname} noprefixroute"
                )
            }
            Change::DeletePrefixRoute {
                ifname,
                dst,
                prefix_len,
                metric,
            } => {
                write!(
                    f,
                    "ip route del {dst}/{prefix_len} dev {ifname} proto kernel metric {metric}"
                )
            }
            Change::AddRoute {
                ifname,
                dst,
                prefix_len,
                gateway,
                src,
                metric,
            } => {
                write!(f, "ip route add {dst}/{prefix_len}")?;
                if let Some(g) = gateway {
                    write!(f, " via {g}")?;
                }
                write!(f, " dev {ifname} metric {metric}")?;
                if let Some(s) = src {
                    write!(f, " scope link src {s}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No such interface.
    #[error(
        "ERI netdev {ifname}: no such interface in this network namespace. Fix: check the ERI is attached and the agent runs with hostNetwork"
    )]
    NoSuchLink {
        /// Interface.
        ifname: String,
    },
    /// The interface has another MAC than the ERI.
    #[error(
        "ERI netdev {ifname}: MAC is {found}, expected {expected}; refusing to configure the wrong interface. Fix: check the ibdev/netdev pairing"
    )]
    WrongMac {
        /// Interface.
        ifname: String,
        /// Its MAC.
        found: String,
        /// The ERI's MAC.
        expected: MacAddr,
    },
}

/// Plans the changes that give `eri` link up, MTU (jumbo when asked), its primary IPv4 address and
/// routes (subnet scope-link, default via the gateway) whose metrics never beat another link's
/// route to the same destination. Nothing when already so (idempotent).
pub fn plan(
    eri: &EriNetdev,
    jumbo_frame_mtu: i64,
    addressing: &EniAddressing,
    state: &NetState,
) -> Result<Vec<Change>, PlanError> {
    let ifname = eri.ifname.clone();
    let link = state
        .links
        .iter()
        .find(|l| l.name == eri.ifname)
        .ok_or_else(|| PlanError::NoSuchLink {
            ifname: ifname.clone(),
        })?;
    if let Some(mac) = link.mac
        && mac != eri.mac
    {
        return Err(PlanError::WrongMac {
            ifname,
            found: mac.to_string(),
            expected: eri.mac,
        });
    }
    let mut changes = Vec::new();
    if eri.jumbo_frame {
        let to = jumbo_mtu(jumbo_frame_mtu);
        if link.mtu != to {
            changes.push(Change::SetMtu {
                ifname: ifname.clone(),
                from: link.mtu,
                to,
            });
        }
    }
    if !link.up {
        changes.push(Change::LinkUp {
            ifname: ifname.clone(),
        });
    }
    let a = addressing;
    if !state
        .addrs
        .iter()
        .any(|x| x.index == link.index && x.ip == a.primary_ip && x.prefix_len == a.prefix_len)
    {
        changes.push(Change::AddAddress {
            ifname: ifname.clone(),
            ip: a.primary_ip,
            prefix_len: a.prefix_len,
        });
    }
    let on_link = |r: &&RouteView| r.oif == Some(link.index);
    let to_dst = |dst: Ipv4Addr, len: u8| move |r: &&RouteView| r.dst == dst && r.prefix_len == len;
    for r in state
        .routes
        .iter()
        .filter(on_link)
        .filter(to_dst(a.network, a.prefix_len))
        .filter(|r| r.kernel)
    {
        changes.push(Change::DeletePrefixRoute {
            ifname: ifname.clone(),
            dst: r.dst,
            prefix_len: r.prefix_len,
            metric: r.metric,
        });
    }
    let others = |dst: Ipv4Addr, len: u8| {
        route_metric(
            state
                .routes
                .iter()
                .filter(|r| r.oif != Some(link.index))
                .filter(to_dst(dst, len))
                .map(|r| r.metric),
        )
    };
    let has_subnet = state
        .routes
        .iter()
        .filter(on_link)
        .filter(to_dst(a.network, a.prefix_len))
        .any(|r| !r.kernel && r.gateway.is_none());
    if !has_subnet {
        changes.push(Change::AddRoute {
            ifname: ifname.clone(),
            dst: a.network,
            prefix_len: a.prefix_len,
            gateway: None,
            src: Some(a.primary_ip),
            metric: others(a.network, a.prefix_len),
        });
    }
    let any = Ipv4Addr::UNSPECIFIED;
    let has_default = state
        .routes
        .iter()
        .filter(on_link)
        .filter(to_dst(any, 0))
        .any(|r| r.gateway == Some(a.gateway));
    if !has_default {
        changes.push(Change::AddRoute {
            ifname,
            dst: any,
            prefix_len: 0,
            gateway: Some(a.gateway),
            src: None,
            metric: others(any, 0),
        });
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eri() -> EriNetdev {
        EriNetdev {
            ifname: "eth1".into(),
            mac: "00:16:3e:00:00:02".parse().unwrap(),
            primary: false,
            jumbo_frame: true,
        }
    }

    fn addressing() -> EniAddressing {
        EniAddressing {
            primary_ip: Ipv4Addr::new(10, 0, 0, 9),
            network: Ipv4Addr::new(10, 0, 0, 0),
            prefix_len: 24,
            gateway: Ipv4Addr::new(10, 0, 0, 253),
        }
    }

    fn node() -> NetState {
        NetState {
            links: vec![
                LinkView {
                    index: 2,
                    name: "eth0".into(),
                    mac: "00:16:3e:00:00:01".parse().ok(),
                    up: true,
                    mtu: 1500,
                },
                LinkView {
                    index: 3,
                    name: "eth1".into(),
                    mac: "00:16:3e:00:00:02".parse().ok(),
                    up: false,
                    mtu: 1500,
                },
            ],
            addrs: vec![AddrView {
                index: 2,
                ip: Ipv4Addr::new(10, 0, 0, 5),
                prefix_len: 24,
            }],
            routes: vec![
                RouteView {
                    dst: Ipv4Addr::UNSPECIFIED,
                    prefix_len: 0,
                    oif: Some(2),
                    gateway: Some(Ipv4Addr::new(10, 0, 0, 253)),
                    metric: 100,
                    kernel: false,
                },
                RouteView {
                    dst: Ipv4Addr::new(10, 0, 0, 0),
                    prefix_len: 24,
                    oif: Some(2),
                    gateway: None,
                    metric: 100,
                    kernel: true,
                },
            ],
        }
    }

    #[test]
    fn metric_rule() {
        assert_eq!(route_metric([]), 200);
        assert_eq!(route_metric([0, 100]), 200);
        assert_eq!(route_metric([100, 250]), 251);
        assert_eq!(route_metric([u32::MAX]), u32::MAX);
        assert_eq!(jumbo_mtu(0), 8500);
        assert_eq!(jumbo_mtu(-1), 8500);
        assert_eq!(jumbo_mtu(9000), 9000);
    }

    #[test]
    fn fresh_eri_gets_everything_with_safe_metrics() {
        let c = plan(&eri(), 8500, &addressing(), &node()).unwrap();
        let text: Vec<String> = c.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            text,
            [
                "ip link set dev eth1 mtu 8500",
                "ip link set dev eth1 up",
                "ip addr add 10.0.0.9/24 dev eth1 noprefixroute",
                "ip route add 10.0.0.0/24 dev eth1 metric 200 scope link src 10.0.0.9",
                "ip route add 0.0.0.0/0 via 10.0.0.253 dev eth1 metric 200",
            ]
        );
    }

    #[test]
    fn metrics_stay_above_other_links_and_kernel_prefix_routes_go() {
        let mut s = node();
        s.routes[0].metric = 300;
        s.routes[1].metric = 512;
        s.addrs.push(AddrView {
            index: 3,
            ip: Ipv4Addr::new(10, 0, 0, 9),
            prefix_len: 24,
        });
        s.routes.push(RouteView {
            dst: Ipv4Addr::new(10, 0, 0, 0),
            prefix_len: 24,
            oif: Some(3),
            gateway: None,
            metric: 0,
            kernel: true,
        });
        let mut e = eri();
        e.jumbo_frame = false;
        let text: Vec<String> = plan(&e, 8500, &addressing(), &s)
            .unwrap()
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            text,
            [
                "ip link set dev eth1 up",
                "ip route del 10.0.0.0/24 dev eth1 proto kernel metric 0",
                "ip route add 10.0.0.0/24 dev eth1 metric 513 scope link src 10.0.0.9",
                "ip route add 0.0.0.0/0 via 10.0.0.253 dev eth1 metric 301",
            ]
        );
    }

    #[test]
    fn configured_eri_needs_nothing() {
        let mut s = node();
        s.links[1].up = true;
        s.links[1].mtu = 8500;
        s.addrs.push(AddrView {
            index: 3,
            ip: Ipv4Addr::new(10, 0, 0, 9),
            prefix_len: 24,
        });
        s.routes.push(RouteView {
            dst: Ipv4Addr::new(10, 0, 0, 0),
            prefix_len: 24,
            oif: Some(3),
            gateway: None,
            metric: 200,
            kernel: false,
        });
        s.routes.push(RouteView {
            dst: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            oif: Some(3),
            gateway: Some(Ipv4Addr::new(10, 0, 0, 253)),
            metric: 200,
            kernel: false,
        });
        assert_eq!(plan(&eri(), 8500, &addressing(), &s).unwrap(), []);
    }

    #[test]
    fn wrong_or_missing_interface_is_refused() {
        let mut e = eri();
        e.mac = "00:16:3e:00:00:09".parse().unwrap();
        let err = plan(&e, 8500, &addressing(), &node())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("eth1") && err.contains("00:16:3e:00:00:02") && err.contains("pairing"),
            "{err}"
        );
        e.ifname = "eth7".into();
        assert!(matches!(
            plan(&e, 8500, &addressing(), &node()),
            Err(PlanError::NoSuchLink { .. })
        ));
    }
}
