//! Ports and GID tables.

use crate::read::Notes;
use erdma_host::Sysfs;
use erdma_model::port::parse_rate_gbps;
use erdma_model::{Gid, GidType, LinkLayer, PhysState, Port, PortState};
use std::net::Ipv6Addr;
use std::path::Path;

/// Most GID entries read per port (the kernel's largest tables are 1024 entries, rxe's).
pub(crate) const MAX_GIDS: usize = 4096;

/// Reads every port under `base/ports`.
pub(crate) fn read_ports(sysfs: &dyn Sysfs, base: &Path, notes: &mut Notes) -> Vec<Port> {
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
        .map(|n| read_port(sysfs, &ports_dir.join(n.to_string()), n, notes))
        .collect()
}

fn read_port(sysfs: &dyn Sysfs, dir: &Path, number: u32, notes: &mut Notes) -> Port {
    let state = notes.parsed(sysfs, &dir.join("state"), false, PortState::parse);
    let phys_state = notes.parsed(sysfs, &dir.join("phys_state"), false, PhysState::parse);
    let link_layer = notes
        .attr(sysfs, &dir.join("link_layer"), false)
        .map(|s| LinkLayer::parse(&s));
    let rate = notes
        .attr(sysfs, &dir.join("rate"), true)
        .filter(|r| !r.is_empty());
    let rate_gbps = rate.as_deref().and_then(parse_rate_gbps);
    let gids = read_gids(sysfs, dir, notes);
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
    for index in indexes {
        let rel = gid_dir.join(index.to_string());
        // Empty GID slots can fail to read (EINVAL); they carry no information.
        let Ok(text) = sysfs.read_attr(&rel) else {
            continue;
        };
        let Some(gid) = Gid::parse_addr(&text) else {
            notes.findings.push(erdma_model::Finding::error(format!(
                "{}: {text:?} is not a GID (expected 8 groups of 4 hex digits)",
                crate::read::sysfs_path(sysfs, &rel)
            )));
            continue;
        };
        if gid == Ipv6Addr::UNSPECIFIED {
            continue;
        }
        let attrs = dir.join("gid_attrs");
        let gid_type = sysfs
            .read_attr(&attrs.join("types").join(index.to_string()))
            .ok()
            .filter(|t| !t.is_empty())
            .map(|t| GidType::parse(&t));
        let ndev = sysfs
            .read_attr(&attrs.join("ndevs").join(index.to_string()))
            .ok()
            .filter(|t| !t.is_empty());
        out.push(Gid {
            index,
            gid,
            gid_type,
            ndev,
        });
    }
    out
}
