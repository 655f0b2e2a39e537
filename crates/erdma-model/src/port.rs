//! Ports, GIDs and the enumerations ib_core prints in sysfs (`"4: ACTIVE"`, `"1: CA"`, …).

use serde::Serialize;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Error for a sysfs enumeration value that is not of the form `"<number>: <name>"` or out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid {what} (expected \"<number>: <name>\", e.g. {example:?})")]
pub struct EnumError {
    /// What was being parsed.
    pub what: &'static str,
    /// The offending text.
    pub value: String,
    /// A valid example.
    pub example: &'static str,
}

fn leading_number(s: &str, what: &'static str, example: &'static str) -> Result<u32, EnumError> {
    let err = || EnumError {
        what,
        value: s.to_string(),
        example,
    };
    let (num, _) = s.trim().split_once(':').ok_or_else(err)?;
    num.trim().parse().map_err(|_| err())
}

/// RDMA node type (`/sys/class/infiniband/<dev>/node_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeType {
    /// `1: CA` — InfiniBand/RoCE channel adapter (eRDMA in compat mode, rxe, mlx5).
    Ca,
    /// `2: switch`.
    Switch,
    /// `3: router`.
    Router,
    /// `4: RNIC` — iWARP adapter (eRDMA in its default mode, siw).
    Rnic,
    /// `5: usNIC`.
    Usnic,
    /// `6: usNIC UDP`.
    UsnicUdp,
    /// `7: unknown`.
    Unknown,
}

impl NodeType {
    /// Parses the sysfs text.
    pub fn parse(s: &str) -> Result<Self, EnumError> {
        Ok(match leading_number(s, "node type", "1: CA")? {
            1 => NodeType::Ca,
            2 => NodeType::Switch,
            3 => NodeType::Router,
            4 => NodeType::Rnic,
            5 => NodeType::Usnic,
            6 => NodeType::UsnicUdp,
            7 => NodeType::Unknown,
            _ => {
                return Err(EnumError {
                    what: "node type",
                    value: s.to_string(),
                    example: "1: CA",
                });
            }
        })
    }
}

/// Logical port state (`ports/N/state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortState {
    /// `0: NOP`.
    Nop,
    /// `1: DOWN`.
    Down,
    /// `2: INIT`.
    Init,
    /// `3: ARMED`.
    Armed,
    /// `4: ACTIVE` — the only state in which traffic flows.
    Active,
    /// `5: ACTIVE_DEFER`.
    ActiveDefer,
}

impl PortState {
    /// Parses the sysfs text.
    pub fn parse(s: &str) -> Result<Self, EnumError> {
        const EX: &str = "4: ACTIVE";
        Ok(match leading_number(s, "port state", EX)? {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            _ => {
                return Err(EnumError {
                    what: "port state",
                    value: s.to_string(),
                    example: EX,
                });
            }
        })
    }

    /// Short upper-case name as ibv_devinfo prints it without the `PORT_` prefix.
    pub fn name(&self) -> &'static str {
        match self {
            PortState::Nop => "NOP",
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
        }
    }
}

/// Physical port state (`ports/N/phys_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhysState {
    /// `1: Sleep`.
    Sleep,
    /// `2: Polling`.
    Polling,
    /// `3: Disabled`.
    Disabled,
    /// `4: PortConfigurationTraining`.
    PortConfigurationTraining,
    /// `5: LinkUp`.
    LinkUp,
    /// `6: LinkErrorRecovery`.
    LinkErrorRecovery,
    /// `7: Phy Test`.
    PhyTest,
}

impl PhysState {
    /// Parses the sysfs text.
    pub fn parse(s: &str) -> Result<Self, EnumError> {
        const EX: &str = "5: LinkUp";
        Ok(match leading_number(s, "physical port state", EX)? {
            1 => PhysState::Sleep,
            2 => PhysState::Polling,
            3 => PhysState::Disabled,
            4 => PhysState::PortConfigurationTraining,
            5 => PhysState::LinkUp,
            6 => PhysState::LinkErrorRecovery,
            7 => PhysState::PhyTest,
            _ => {
                return Err(EnumError {
                    what: "physical port state",
                    value: s.to_string(),
                    example: EX,
                });
            }
        })
    }
}

/// Link layer of a port (`ports/N/link_layer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkLayer {
    /// `Ethernet` (RoCE, iWARP, eRDMA).
    Ethernet,
    /// `InfiniBand`.
    Infiniband,
    /// Anything else, kept verbatim.
    Other(String),
}

impl LinkLayer {
    /// Parses the sysfs text; unknown values are kept, not rejected.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "Ethernet" => LinkLayer::Ethernet,
            "InfiniBand" => LinkLayer::Infiniband,
            other => LinkLayer::Other(other.to_string()),
        }
    }
}

/// GID type (`ports/N/gid_attrs/types/I`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GidType {
    /// `IB/RoCE v1`.
    IbRoceV1,
    /// `RoCE v2`.
    RoceV2,
    /// Anything else, kept verbatim.
    Other(String),
}

impl GidType {
    /// Parses the sysfs text.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "IB/RoCE v1" => GidType::IbRoceV1,
            "RoCE v2" => GidType::RoceV2,
            other => GidType::Other(other.to_string()),
        }
    }

    /// The text as sysfs and ibv_devinfo print it.
    pub fn label(&self) -> &str {
        match self {
            GidType::IbRoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
            GidType::Other(s) => s,
        }
    }
}

/// One populated entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gid {
    /// Index in the GID table (what NCCL calls `NCCL_IB_GID_INDEX`).
    pub index: u32,
    /// The GID as an IPv6 address.
    pub gid: Ipv6Addr,
    /// Its type, when the kernel reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_type: Option<GidType>,
    /// The netdev the entry belongs to (RoCE), when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ndev: Option<String>,
}

impl Gid {
    /// The IPv4 address of a `::ffff:a.b.c.d` entry (the one RoCEv2 over IPv4 uses).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.gid.to_ipv4_mapped()
    }

    /// Parses sysfs's GID text (`fe80:0000:…`), returning `None` for malformed text.
    pub fn parse_addr(s: &str) -> Option<Ipv6Addr> {
        s.trim().parse().ok()
    }
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Port {
    /// Port number (1-based).
    pub number: u32,
    /// Logical state; `None` when unreadable.
    pub state: Option<PortState>,
    /// Physical state; `None` when unreadable.
    pub phys_state: Option<PhysState>,
    /// Link layer; `None` when unreadable.
    pub link_layer: Option<LinkLayer>,
    /// Rate text as the kernel prints it (`100 Gb/sec (4X EDR)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Rate in Gb/s parsed from `rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<f64>,
    /// Active IB MTU in bytes derived from the paired netdev's MTU (RoCE/iWARP), as the kernel does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_mtu: Option<u32>,
    /// Populated GID entries in index order (all-zero entries are omitted).
    pub gids: Vec<Gid>,
}

impl Port {
    /// Index of the first RoCEv2 GID that carries an IPv4 address: the GID index NCCL needs
    /// (`NCCL_IB_GID_INDEX`). It differs between devices, so it is reported, never assumed.
    pub fn ipv4_rocev2_gid_index(&self) -> Option<u32> {
        self.gids
            .iter()
            .find(|g| g.ipv4().is_some() && g.gid_type == Some(GidType::RoceV2))
            .map(|g| g.index)
    }
}

/// Parses the kernel's rate text (`"100 Gb/sec (4X EDR)"`, `"2.5 Gb/sec (1X SDR)"`) to Gb/s.
pub fn parse_rate_gbps(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let value: f64 = it.next()?.parse().ok()?;
    match it.next()? {
        "Gb/sec" if value.is_finite() && value >= 0.0 => Some(value),
        _ => None,
    }
}

/// The active IB MTU for an Ethernet netdev MTU, as ib_core's `iboe_get_mtu` computes it: the
/// netdev MTU minus the RoCE headers, rounded down to an IB MTU (256…4096). `None` below 256.
pub fn iboe_active_mtu(netdev_mtu: u32) -> Option<u32> {
    // GRH 40 + UDP 8 + BTH 12 + XRC ext 4 + AtomicETH 28 + ICRC 4.
    const OVERHEAD: u32 = 40 + 8 + 12 + 4 + 28 + 4;
    let payload = netdev_mtu.checked_sub(OVERHEAD)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| payload >= m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_captured_rxe_values() {
        assert_eq!(NodeType::parse("1: CA").unwrap(), NodeType::Ca);
        assert_eq!(NodeType::parse("4: RNIC\n").unwrap(), NodeType::Rnic);
        assert_eq!(PortState::parse("4: ACTIVE").unwrap(), PortState::Active);
        assert_eq!(PortState::parse("1: DOWN").unwrap(), PortState::Down);
        assert_eq!(PhysState::parse("5: LinkUp").unwrap(), PhysState::LinkUp);
        assert_eq!(
            PhysState::parse("3: Disabled").unwrap(),
            PhysState::Disabled
        );
        assert_eq!(LinkLayer::parse("Ethernet\n"), LinkLayer::Ethernet);
        assert_eq!(GidType::parse("RoCE v2"), GidType::RoceV2);
        assert_eq!(parse_rate_gbps("10 Gb/sec (1X FDR10)"), Some(10.0));
        assert_eq!(parse_rate_gbps("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(parse_rate_gbps("fast"), None);
    }

    #[test]
    fn rejects_out_of_range_enums_with_the_value() {
        let e = PortState::parse("9: WEIRD").unwrap_err();
        assert!(e.to_string().contains("9: WEIRD"));
        assert!(NodeType::parse("CA").is_err());
        assert!(PhysState::parse("").is_err());
    }

    #[test]
    fn active_mtu_matches_ibv_devinfo_for_rxe_on_a_1500_netdev() {
        // The rxe capture shows active_mtu 1024 (3) on a 1500-byte veth.
        assert_eq!(iboe_active_mtu(1500), Some(1024));
        assert_eq!(iboe_active_mtu(9000), Some(4096));
        assert_eq!(iboe_active_mtu(8500), Some(4096));
        assert_eq!(iboe_active_mtu(2200), Some(2048));
        assert_eq!(iboe_active_mtu(100), None);
    }

    #[test]
    fn gid_index_is_the_ipv4_rocev2_entry() {
        let g = |index, s: &str| Gid {
            index,
            gid: s.parse().unwrap(),
            gid_type: Some(GidType::RoceV2),
            ndev: None,
        };
        let port = Port {
            number: 1,
            state: None,
            phys_state: None,
            link_layer: None,
            rate: None,
            rate_gbps: None,
            active_mtu: None,
            gids: vec![
                g(0, "fe80::1059:d8ff:fe34:6b1b"),
                g(2, "fd00:77::1"),
                g(3, "::ffff:10.0.1.23"),
            ],
        };
        assert_eq!(port.ipv4_rocev2_gid_index(), Some(3));
    }

    proptest! {
        #[test]
        fn enum_parsers_never_panic(s in ".{0,24}") {
            let _ = NodeType::parse(&s);
            let _ = PortState::parse(&s);
            let _ = PhysState::parse(&s);
            let _ = parse_rate_gbps(&s);
        }

        #[test]
        fn active_mtu_never_exceeds_payload(mtu in 0u32..70000) {
            if let Some(m) = iboe_active_mtu(mtu) {
                prop_assert!(m + 96 <= mtu);
            }
        }
    }
}
