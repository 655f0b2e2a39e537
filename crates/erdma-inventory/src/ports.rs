//! Ports and GID tables.

use crate::read::Notes;
use erdma_host::Sysfs;
use erdma_model::port::parse_rate_gbps;
use erdma_model::{Gid, GidType, LinkLayer, PhysState, Port, PortState};
use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::path::Path;

/// Most GID entries read per port (the kernel's largest tables are 1024 entries, rxe's).
pub(crate) const MAX_GIDS: usize = 4096;

/// Reads every port under `base/ports`; their GID tables only `with_gids` (the identity pass
/// leaves them empty: see [`crate::Inventory::scan_identity`]).
pub(crate) fn read_ports(
    sysfs: &dyn Sysfs,
    base: &Path,
    with_gids: bool,
    notes: &mut Notes,
) -> Vec<Port> {
    let ports_dir = base.join("ports");
    let names = match sysfs.list_dir(&ports_dir) {
        Ok(n) => n,
        Err(e) => {
            notes.findings.push(erdma_model::Finding::error(format!(
                "cannot list ports: {e}"
            )));
            return Vec::new();
        }
    };
    let mut numbers: Vec<u32> = names
        .iter()
        .filter_map(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .collect();
    numbers.sort_unstable();
    numbers
        .into_iter()
        .map(|n| read_port(sysfs, &ports_dir.join(n.to_string()), n, with_gids, notes))
        .collect()
}

fn read_port(
    sysfs: &dyn Sysfs,
    dir: &Path,
    number: u32,
    with_gids: bool,
    notes: &mut Notes,
) -> Port {
    let state = notes.parsed(sysfs, &dir.join("state"), false, PortState::parse);
    let phys_state = notes.parsed(sysfs, &dir.join("phys_state"), false, PhysState::parse);
    let link_layer = notes
        .attr(sysfs, &dir.join("link_layer"), false)
        .map(|s| LinkLayer::parse(&s));
    let rate = notes
        .attr(sysfs, &dir.join("rate"), true)
        .filter(|r| !r.is_empty());
    let rate_gbps = rate.as_deref().and_then(parse_rate_gbps);
    let gids = if with_gids {
        read_gids(sysfs, dir, notes)
    } else {
        Vec::new()
    };
    Port {
        number,
        state,
        phys_state,
        link_layer,
        rate,
        rate_gbps,
        active_mtu: None,
        gids,
    }
}

fn read_gids(sysfs: &dyn Sysfs, dir: &Path, notes: &mut Notes) -> Vec<Gid> {
    let gid_dir = dir.join("gids");
    let Ok(names) = sysfs.list_dir(&gid_dir) else {
        // iWARP devices may have no readable GID directory at all.
        return Vec::new();
    };
    let mut indexes: Vec<u32> = names.iter().filter_map(|n| n.parse().ok()).collect();
    indexes.sort_unstable();
    indexes.truncate(MAX_GIDS);
    let mut out = Vec::new();
    // Three files per GID: one reused path buffer each (push the index, read, pop), so that a
    // port's table costs no allocation per entry beyond the values read.
    let attrs = dir.join("gid_attrs");
    let mut gid_rel = gid_dir.clone();
    let mut type_rel = attrs.join("types");
    let mut ndev_rel = attrs.join("ndevs");
    let mut name = String::new();
    for index in indexes {
        name.clear();
        // Writing to a String cannot fail.
        let _ = write!(name, "{index}");
        gid_rel.push(&name);
        let text = sysfs.read_attr(&gid_rel);
        let rel_shown = |rel: &Path| crate::read::sysfs_path(sysfs, rel);
        // Empty GID slots can fail to read (EINVAL); they carry no information.
        let Ok(text) = text else {
            gid_rel.pop();
            continue;
        };
        let Some(gid) = Gid::parse_addr(&text) else {
            notes.findings.push(erdma_model::Finding::error(format!(
                "{}: {text:?} is not a GID (expected 8 groups of 4 hex digits)",
                rel_shown(&gid_rel)
            )));
            gid_rel.pop();
            continue;
        };
        gid_rel.pop();
        if gid == Ipv6Addr::UNSPECIFIED {
            continue;
        }
        type_rel.push(&name);
        let gid_type = sysfs
            .read_attr(&type_rel)
            .ok()
            .filter(|t| !t.is_empty())
            .map(|t| GidType::parse(&t));
        type_rel.pop();
        ndev_rel.push(&name);
        let ndev = sysfs.read_attr(&ndev_rel).ok().filter(|t| !t.is_empty());
        ndev_rel.pop();
        out.push(Gid {
            index,
            gid,
            gid_type,
            ndev,
        });
    }
    out
}
