//! An RDMA device as inventoried on a node.

use crate::address::{MacAddr, NodeGuid};
use crate::driver::DeviceMode;
use crate::health::{Finding, Health};
use crate::pnet::PnetId;
use crate::port::{NodeType, Port};
use serde::{Serialize, Serializer};
use std::net::Ipv4Addr;

/// PCI vendor ID of Alibaba (`PCI_VENDOR_ID_ALIBABA`), used by eRDMA.
pub const ALIBABA_PCI_VENDOR: u16 = 0x1ded;
/// PCI device ID of the eRDMA function.
pub const ERDMA_PCI_DEVICE: u16 = 0x107f;

/// Which family a device belongs to, from its kernel driver (or PCI ID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// Alibaba Elastic RDMA (driver `erdma`, PCI 1ded:107f).
    Erdma,
    /// Soft-RoCE (`rdma_rxe`).
    Rxe,
    /// Soft-iWARP (`siw`).
    Siw,
    /// Any other driver (mlx5_core, …), kept by name in [`RdmaDevice::driver`].
    Other,
}

impl DeviceKind {
    /// Classifies a device from its driver name and PCI IDs. PCI IDs win: a renamed or
    /// out-of-tree eRDMA driver is still eRDMA.
    pub fn classify(
        driver: Option<&str>,
        pci_vendor: Option<u16>,
        pci_device: Option<u16>,
    ) -> Self {
        if pci_vendor == Some(ALIBABA_PCI_VENDOR)
            && pci_device.is_none_or(|d| d == ERDMA_PCI_DEVICE)
        {
            return DeviceKind::Erdma;
        }
        match driver {
            Some("erdma") => DeviceKind::Erdma,
            Some("rxe") | Some("rdma_rxe") => DeviceKind::Rxe,
            Some("siw") => DeviceKind::Siw,
            _ => DeviceKind::Other,
        }
    }

    /// True for software devices that have no PCI function of their own.
    pub fn is_virtual(&self) -> bool {
        matches!(self, DeviceKind::Rxe | DeviceKind::Siw)
    }
}

/// The PCI function of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciInfo {
    /// Bus address (`0000:00:05.0`).
    pub address: String,
    /// Vendor ID, when readable.
    #[serde(serialize_with = "hex16", skip_serializing_if = "Option::is_none")]
    pub vendor: Option<u16>,
    /// Device ID, when readable.
    #[serde(serialize_with = "hex16", skip_serializing_if = "Option::is_none")]
    pub device: Option<u16>,
}

fn hex16<S: Serializer>(v: &Option<u16>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(&format_args!("0x{v:04x}")),
        None => s.serialize_none(),
    }
}

/// How the netdev of a device was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetdevPairing {
    /// eRDMA: the netdev whose MAC gives the device's node GUID by the EUI-64 rule.
    GuidMac,
    /// Hardware NICs: `device/net/<name>` under the PCI function.
    PciNet,
    /// Software devices (rxe, siw): the `parent` file.
    Parent,
    /// RoCE GID attributes (`ports/1/gid_attrs/ndevs/0`).
    GidNdev,
}

/// Where the IPv4 addresses of a netdev came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressSource {
    /// The kernel's interface address list of this network namespace.
    Interfaces,
    /// IPv4-mapped RoCE GIDs of the device (when the netdev is not visible here).
    Gids,
    /// No address found.
    None,
}

/// The network interface paired with an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetDev {
    /// Interface name (`eth1`).
    pub name: String,
    /// How it was paired.
    pub paired_by: NetdevPairing,
    /// MAC address, when readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// `operstate` (`up`, `down`, `unknown`, …). The kernel updates it from its link-watch work,
    /// which handles a non-urgent change at most once a second, so it can lag the link by up to
    /// a second (`up` still shown after `ip link set down`, `down` after `up`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operstate: Option<String>,
    /// The link as the kernel has it now: `true` when the interface is administratively up
    /// (`IFF_UP` in `flags`) and has carrier (`carrier` = 1), `false` when it is down or has no
    /// carrier; absent when `flags` or `carrier` cannot be read. Unlike `operstate` it does not lag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_up: Option<bool>,
    /// MTU in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// IPv4 addresses.
    pub ipv4: Vec<Ipv4Addr>,
    /// Where `ipv4` came from.
    pub ipv4_source: AddressSource,
    /// PCI address of the netdev's own device, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
}

impl NetDev {
    /// True when the interface is up: `link_up` when the kernel's live link state was read, else
    /// `operstate`, where `unknown` counts as up (virtual links such as veth and some virtio setups
    /// report it while passing traffic).
    pub fn is_up(&self) -> bool {
        self.link_up.unwrap_or(matches!(
            self.operstate.as_deref(),
            Some("up") | Some("unknown")
        ))
    }
}

/// A character device node under `/dev/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CharDevice {
    /// Path inside a container, which equals the host path (`/dev/infiniband/uverbs0`).
    pub path: String,
    /// Major number, when the node exists and is a character device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    /// Minor number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// Whether the node exists under the dev root. A verbs device the kernel announces in sysfs
    /// whose node is missing is still listed (with the kernel's numbers), so users see what is
    /// expected where; the device is then unhealthy.
    pub present: bool,
}

/// The character devices that belong to one RDMA device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CharDevices {
    /// `uverbsN`, the verbs node every application needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uverbs: Option<CharDevice>,
    /// `umadN`, one per MAD-capable port (RoCE / IB only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub umad: Vec<CharDevice>,
}

impl CharDevices {
    /// The nodes that exist, in a stable order: uverbs first, then umad. These are what a
    /// container can be given.
    pub fn all(&self) -> impl Iterator<Item = &CharDevice> {
        self.uverbs
            .iter()
            .chain(self.umad.iter())
            .filter(|c| c.present)
    }
}

/// A NUMA node, or unknown (sysfs `-1`). Serialised as the integer sysfs uses, `-1` for unknown:
/// never coerced to 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NumaNode(pub Option<u32>);

impl NumaNode {
    /// Unknown NUMA placement.
    pub const UNKNOWN: NumaNode = NumaNode(None);

    /// Parses sysfs `numa_node` text: `-1` is unknown; other negatives and garbage are errors.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        match t.parse::<i64>() {
            Ok(-1) => Ok(NumaNode(None)),
            Ok(n) if (0..=i64::from(u16::MAX)).contains(&n) => Ok(NumaNode(Some(n as u32))),
            _ => Err(format!(
                "{t:?} is not a NUMA node (expected -1 or 0..65535)"
            )),
        }
    }
}

impl std::fmt::Display for NumaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("-1"),
        }
    }
}

impl Serialize for NumaNode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(n) => s.serialize_i64(i64::from(n)),
            None => s.serialize_i64(-1),
        }
    }
}

/// An RDMA device (`/sys/class/infiniband/<name>`) with everything erdma needs to serve it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RdmaDevice {
    /// ib device name (`erdma_0`, `rxe0`).
    pub name: String,
    /// Kernel driver name, when known (`erdma`, `rxe`, `mlx5_core`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Device family.
    pub kind: DeviceKind,
    /// PCI function (for software devices: the parent netdev's PCI function).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciInfo>,
    /// Node type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_type: Option<NodeType>,
    /// Node GUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_guid: Option<NodeGuid>,
    /// Node description (`Elastic RDMA(iWARP) stack`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_desc: Option<String>,
    /// Firmware version text (often empty for eRDMA and rxe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fw_ver: Option<String>,
    /// Protocol mode as detected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<DeviceMode>,
    /// NUMA node (`-1` = unknown).
    pub numa_node: NumaNode,
    /// Ports, by number.
    pub ports: Vec<Port>,
    /// GID index of the first RoCE v2 IPv4 GID on port 1 (`NCCL_IB_GID_INDEX`); differs per
    /// device, so it is reported rather than assumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
    /// Paired network interface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netdev: Option<NetDev>,
    /// SMC-R PNET ID (from the netdev MAC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pnet_id: Option<PnetId>,
    /// Character devices of this device.
    pub char_devices: CharDevices,
    /// Whether the device can be given to pods now.
    pub health: Health,
    /// Everything discovery noticed (unreadable files, mode mismatch, …).
    pub findings: Vec<Finding>,
}

impl RdmaDevice {
    /// A device with only its name and kind known; discovery fills in the rest.
    pub fn named(name: impl Into<String>, kind: DeviceKind) -> Self {
        RdmaDevice {
            name: name.into(),
            driver: None,
            kind,
            pci: None,
            node_type: None,
            node_guid: None,
            node_desc: None,
            fw_ver: None,
            mode: None,
            numa_node: NumaNode::UNKNOWN,
            ports: Vec::new(),
            gid_index: None,
            netdev: None,
            pnet_id: None,
            char_devices: CharDevices::default(),
            health: Health::Healthy,
            findings: Vec::new(),
        }
    }

    /// The driver name used to select devices (`erdma`, `rxe`, `siw`, or the kernel's name).
    pub fn driver_key(&self) -> &str {
        match (&self.kind, self.driver.as_deref()) {
            (DeviceKind::Erdma, _) => "erdma",
            (DeviceKind::Rxe, _) => "rxe",
            (DeviceKind::Siw, _) => "siw",
            (DeviceKind::Other, Some(d)) => d,
            (DeviceKind::Other, None) => "unknown",
        }
    }

    /// Port 1, the only port eRDMA and the software devices have.
    pub fn first_port(&self) -> Option<&Port> {
        self.ports.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_minus_one_is_unknown_not_zero() {
        assert_eq!(NumaNode::parse("-1\n").unwrap(), NumaNode::UNKNOWN);
        assert_eq!(NumaNode::parse("1").unwrap(), NumaNode(Some(1)));
        assert!(NumaNode::parse("-2").is_err());
        assert!(NumaNode::parse("zero").is_err());
        assert_eq!(serde_json::to_string(&NumaNode::UNKNOWN).unwrap(), "-1");
        assert_eq!(serde_json::to_string(&NumaNode(Some(0))).unwrap(), "0");
    }

    #[test]
    fn classification_prefers_pci_ids() {
        assert_eq!(
            DeviceKind::classify(Some("weird"), Some(0x1ded), Some(0x107f)),
            DeviceKind::Erdma
        );
        assert_eq!(
            DeviceKind::classify(Some("erdma"), None, None),
            DeviceKind::Erdma
        );
        assert_eq!(
            DeviceKind::classify(Some("rdma_rxe"), None, None),
            DeviceKind::Rxe
        );
        assert_eq!(
            DeviceKind::classify(Some("mlx5_core"), Some(0x15b3), Some(0x101d)),
            DeviceKind::Other
        );
    }
}
