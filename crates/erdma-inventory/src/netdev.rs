//! Pairing RDMA devices with their network interfaces.

use crate::identity::pci_ancestor;
use crate::read::Notes;
use erdma_host::Sysfs;
use erdma_model::device::{AddressSource, NetdevPairing};
use erdma_model::{DeviceKind, Finding, MacAddr, NetDev, NodeGuid, Port};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The node's network interfaces, read once per scan.
pub(crate) struct Interfaces {
    /// Interface name by MAC (first name wins; bonds and VLANs share MACs with their lower links).
    by_mac: BTreeMap<MacAddr, String>,
    /// IPv4 addresses by interface name, from the live namespace.
    ipv4: BTreeMap<String, Vec<Ipv4Addr>>,
}

impl Interfaces {
    /// Lists `class/net` and the addresses from `addrs`.
    pub fn read(sysfs: &dyn Sysfs, ipv4: BTreeMap<String, Vec<Ipv4Addr>>) -> Self {
        let mut by_mac: BTreeMap<MacAddr, String> = BTreeMap::new();
        for name in sysfs.list_dir(Path::new("class/net")).unwrap_or_default() {
            let rel = PathBuf::from("class/net").join(&name).join("address");
            if let Some(mac) = sysfs
                .read_attr(&rel)
                .ok()
                .and_then(|a| a.parse::<MacAddr>().ok())
                && !mac.is_zero()
            {
                // Physical functions first: a virtual link (bond, macvlan) may copy the MAC.
                let physical = sysfs.exists(&PathBuf::from("class/net").join(&name).join("device"));
                match by_mac.get(&mac) {
                    Some(existing) if !physical || is_physical(sysfs, existing) => {}
                    _ => {
                        by_mac.insert(mac, name);
                    }
                }
            }
        }
        Interfaces { by_mac, ipv4 }
    }
}

fn is_physical(sysfs: &dyn Sysfs, name: &str) -> bool {
    sysfs.exists(&PathBuf::from("class/net").join(name).join("device"))
}

/// Finds and reads the netdev of a device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pair(
    sysfs: &dyn Sysfs,
    base: &Path,
    kind: &DeviceKind,
    guid: Option<NodeGuid>,
    parent: Option<&str>,
    ports: &[Port],
    ifaces: &Interfaces,
    notes: &mut Notes,
) -> Option<NetDev> {
    let by_gid_ndev = || {
        ports
            .iter()
            .flat_map(|p| &p.gids)
            .find_map(|g| g.ndev.clone())
    };
    let found: Option<(String, NetdevPairing)> = match kind {
        DeviceKind::Erdma => {
            let mac = guid.and_then(|g| g.to_mac_eui64());
            if guid.is_some() && mac.is_none() {
                notes.findings.push(Finding::warning(format!(
                    "node_guid {} is not an EUI-64 of a MAC (bytes 3-4 are not ff:fe): cannot pair by MAC",
                    guid.map(|g| g.to_string()).unwrap_or_default()
                )));
            }
            match mac.and_then(|m| ifaces.by_mac.get(&m)) {
                Some(name) => Some((name.clone(), NetdevPairing::GuidMac)),
                None => {
                    if let Some(m) = mac {
                        notes.findings.push(Finding::warning(format!(
                            "no network interface has MAC {m} (derived from node_guid): is the ERI's netdev present in this namespace?"
                        )));
                    }
                    by_gid_ndev().map(|n| (n, NetdevPairing::GidNdev))
                }
            }
        }
        _ => {
            let from_pci = sysfs
                .list_dir(&base.join("device/net"))
                .ok()
                .and_then(|names| names.into_iter().next())
                .map(|n| (n, NetdevPairing::PciNet));
            from_pci
                .or_else(|| parent.map(|p| (p.to_string(), NetdevPairing::Parent)))
                .or_else(|| by_gid_ndev().map(|n| (n, NetdevPairing::GidNdev)))
        }
    };
    let (name, paired_by) = found?;
    Some(read_netdev(sysfs, name, paired_by, ports, ifaces, notes))
}

fn read_netdev(
    sysfs: &dyn Sysfs,
    name: String,
    paired_by: NetdevPairing,
    ports: &[Port],
    ifaces: &Interfaces,
    notes: &mut Notes,
) -> NetDev {
    let dir = PathBuf::from("class/net").join(&name);
    if !sysfs.exists(&dir) {
        notes.findings.push(Finding::warning(format!(
            "netdev {name} named by the device is not in {}/class/net",
            sysfs.describe()
        )));
    }
    let mac = notes.parsed(sysfs, &dir.join("address"), true, |s| s.parse::<MacAddr>());
    let operstate = notes.attr(sysfs, &dir.join("operstate"), true);
    let link_up = live_link(sysfs, &name);
    let mtu = notes.parsed(sysfs, &dir.join("mtu"), true, |s| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{s:?} is not an MTU"))
    });
    let pci_address = sysfs
        .canonical(&dir.join("device"))
        .ok()
        .as_deref()
        .and_then(pci_ancestor)
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string));
    let (ipv4, ipv4_source) = match ifaces.ipv4.get(&name) {
        Some(list) if !list.is_empty() => (list.clone(), AddressSource::Interfaces),
        _ => {
            let from_gids: Vec<Ipv4Addr> = ports
                .iter()
                .flat_map(|p| &p.gids)
                .filter_map(|g| g.ipv4())
                .collect();
            if from_gids.is_empty() {
                (Vec::new(), AddressSource::None)
            } else {
                (from_gids, AddressSource::Gids)
            }
        }
    };
    NetDev {
        name,
        paired_by,
        mac,
        operstate,
        link_up,
        mtu,
        ipv4,
        ipv4_source,
        pci_address,
    }
}

/// The live link state of netdev `name` (see [`NetDev::link_up`]): `IFF_UP` from `flags` and
/// `carrier`. The kernel answers `carrier` only while the interface is running (an error
/// otherwise), so it is read only when `IFF_UP` is set. `None` when either cannot be read.
pub(crate) fn live_link(sysfs: &dyn Sysfs, name: &str) -> Option<bool> {
    const IFF_UP: u32 = 0x1;
    let dir = PathBuf::from("class/net").join(name);
    let flags = sysfs.reread_attr(&dir.join("flags")).ok()?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).ok()?;
    if flags & IFF_UP == 0 {
        return Some(false);
    }
    match sysfs.reread_attr(&dir.join("carrier")).ok()?.trim() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}
