//! Who a device is: driver, PCI function, NUMA node and family.

use crate::read::Notes;
use erdma_host::Sysfs;
use erdma_model::device::NumaNode;
use erdma_model::{DeviceKind, NodeType, PciInfo};
use std::path::{Path, PathBuf};

/// Identity facts of one device.
pub(crate) struct Identity {
    pub driver: Option<String>,
    pub pci: Option<PciInfo>,
    pub numa: NumaNode,
    /// The `parent` netdev of a software device.
    pub parent: Option<String>,
    pub kind: DeviceKind,
}

/// True for a PCI bus address `dddd:bb:dd.f`.
pub(crate) fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// The nearest PCI function at or above a resolved device path (`…/0000:00:05.0/virtio3` →
/// `…/0000:00:05.0`), relative to the sysfs root.
pub(crate) fn pci_ancestor(resolved: &Path) -> Option<PathBuf> {
    resolved
        .ancestors()
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_pci_address)
        })
        .map(Path::to_path_buf)
}

fn parse_hex16(s: &str) -> Result<u16, String> {
    let t = s.trim();
    let digits = t.strip_prefix("0x").unwrap_or(t);
    u16::from_str_radix(digits, 16)
        .map_err(|_| format!("{t:?} is not a 16-bit hex ID (expected e.g. 0x1ded)"))
}

/// Reads the PCI function at `pci_rel` (relative to the sysfs root).
pub(crate) fn read_pci(
    sysfs: &dyn Sysfs,
    pci_rel: &Path,
    notes: &mut Notes,
) -> (PciInfo, NumaNode) {
    let address = pci_rel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let vendor = notes.parsed(sysfs, &pci_rel.join("vendor"), true, parse_hex16);
    let device = notes.parsed(sysfs, &pci_rel.join("device"), true, parse_hex16);
    let numa = notes
        .parsed(sysfs, &pci_rel.join("numa_node"), true, NumaNode::parse)
        .unwrap_or_default();
    (
        PciInfo {
            address,
            vendor,
            device,
        },
        numa,
    )
}

/// Reads the identity of the device at `base` (`class/infiniband/<name>`).
pub(crate) fn read(
    sysfs: &dyn Sysfs,
    base: &Path,
    node_type: Option<NodeType>,
    notes: &mut Notes,
) -> Identity {
    let dev_link = base.join("device");
    if let Ok(target) = sysfs.read_link(&dev_link)
        && !sysfs.exists(&dev_link)
    {
        notes.findings.push(erdma_model::Finding::error(format!(
            "{} is a dangling or looping link (-> {}): the device's driver and PCI function are unknown",
            crate::read::sysfs_path(sysfs, &dev_link),
            target.display()
        )));
        return Identity {
            driver: None,
            pci: None,
            numa: NumaNode::UNKNOWN,
            parent: None,
            kind: DeviceKind::Other,
        };
    }
    if sysfs.exists(&dev_link) {
        let driver = sysfs
            .read_link(&dev_link.join("driver"))
            .ok()
            .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_string));
        let (pci, numa) = match sysfs
            .canonical(&dev_link)
            .ok()
            .as_deref()
            .and_then(pci_ancestor)
        {
            Some(pci_rel) => {
                let (pci, numa) = read_pci(sysfs, &pci_rel, notes);
                (Some(pci), numa)
            }
            None => {
                // Not on PCI (platform or auxiliary device): NUMA may still be on the device itself.
                let numa = notes.parsed(sysfs, &dev_link.join("numa_node"), true, NumaNode::parse);
                (None, numa.unwrap_or_default())
            }
        };
        let kind = DeviceKind::classify(
            driver.as_deref(),
            pci.as_ref().and_then(|p| p.vendor),
            pci.as_ref().and_then(|p| p.device),
        );
        return Identity {
            driver,
            pci,
            numa,
            parent: None,
            kind,
        };
    }

    // Software devices (rxe, siw) have no `device` link; `parent` names the netdev they run on,
    // whose own PCI function carries the NUMA node.
    let parent = notes
        .attr(sysfs, &base.join("parent"), true)
        .filter(|p| !p.is_empty());
    let kind = match node_type {
        Some(NodeType::Rnic) => DeviceKind::Siw,
        Some(NodeType::Ca) if parent.is_some() => DeviceKind::Rxe,
        _ if parent.is_some() => DeviceKind::Rxe,
        _ => DeviceKind::Other,
    };
    let driver = match kind {
        DeviceKind::Rxe => Some("rdma_rxe".to_string()),
        DeviceKind::Siw => Some("siw".to_string()),
        _ => None,
    };
    let mut pci = None;
    let mut numa = NumaNode::UNKNOWN;
    if let Some(p) = &parent {
        let net_dev = PathBuf::from("class/net").join(p).join("device");
        if let Some(pci_rel) = sysfs
            .canonical(&net_dev)
            .ok()
            .as_deref()
            .and_then(pci_ancestor)
        {
            let (info, n) = read_pci(sysfs, &pci_rel, notes);
            pci = Some(info);
            numa = n;
        }
    }
    Identity {
        driver,
        pci,
        numa,
        parent,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_address_shape() {
        assert!(is_pci_address("0000:00:05.0"));
        assert!(is_pci_address("0000:af:1f.7"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("virtio3"));
        assert!(!is_pci_address("0000:00:05:0"));
    }

    #[test]
    fn finds_pci_parent_of_virtio() {
        let p = Path::new("devices/pci0000:00/0000:00:06.0/virtio3");
        assert_eq!(
            pci_ancestor(p),
            Some(PathBuf::from("devices/pci0000:00/0000:00:06.0"))
        );
        assert_eq!(pci_ancestor(Path::new("devices/virtual/net/veth0")), None);
    }
}
