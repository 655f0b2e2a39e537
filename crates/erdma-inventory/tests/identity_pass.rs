//! The identity pass (`Inventory::scan_identity`, what the agent registers from) against the full
//! scan of the same tree: on every fixture tree and on random trees, the two agree on everything
//! but what the identity pass defers (the GID tables, the addresses taken from them, and the
//! findings only the GID tables give), and nothing a device plugin advertises or answers differs.

use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_model::device::AddressSource;
use erdma_model::{NodeDevices, container};
use proptest::prelude::*;
use std::sync::Arc;

fn inventory(tree: &NodeTree, addrs: FixedInterfaceAddrs) -> Inventory {
    Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(addrs),
    })
}

/// `full` with what the identity pass defers taken out: GID tables, the GID index, addresses
/// that came from the GIDs; findings are compared apart ([`assert_agree`]).
fn without_deferred(full: &NodeDevices) -> NodeDevices {
    let mut n = full.clone();
    for d in &mut n.devices {
        for p in &mut d.ports {
            p.gids.clear();
        }
        d.gid_index = None;
        if let Some(net) = &mut d.netdev
            && net.ipv4_source == AddressSource::Gids
        {
            net.ipv4.clear();
            net.ipv4_source = AddressSource::None;
        }
        d.findings.clear();
    }
    n
}

/// What a device plugin makes of a snapshot: per device its name, health (with reasons), NUMA
/// node, character devices and the container environment of holding it alone.
fn advertised(n: &NodeDevices) -> Vec<String> {
    n.devices
        .iter()
        .map(|d| {
            format!(
                "{} {:?} {:?} {:?} {:?}",
                d.name,
                d.health,
                d.numa_node,
                d.char_devices,
                container::container_env([d], None)
            )
        })
        .chain(std::iter::once(format!("rdma_cm {:?}", n.rdma_cm)))
        .collect()
}

/// The identity pass agrees with the full scan: equal once the deferred fields are taken out,
/// its findings a subset of the full scan's, and the same to a device plugin.
fn assert_agree(identity: &NodeDevices, full: &NodeDevices, what: &str) {
    let mut id_stripped = identity.clone();
    for (d, f) in id_stripped.devices.iter_mut().zip(&full.devices) {
        for finding in &d.findings {
            assert!(
                f.findings.contains(finding),
                "{what}: {}: identity finding {finding:?} is not the full scan's {:?}",
                d.name,
                f.findings
            );
        }
        d.findings.clear();
        assert!(
            d.ports.iter().all(|p| p.gids.is_empty()) || f.ports == d.ports,
            "{what}: {}: the identity pass read GIDs but not the full scan's",
            d.name
        );
        // A device read whole by the identity pass (netdev only through a GID entry) keeps them.
        for p in &mut d.ports {
            p.gids.clear();
        }
        d.gid_index = None;
        if let Some(net) = &mut d.netdev
            && net.ipv4_source == AddressSource::Gids
        {
            net.ipv4.clear();
            net.ipv4_source = AddressSource::None;
        }
    }
    assert_eq!(
        serde_json::to_value(&id_stripped).unwrap(),
        serde_json::to_value(without_deferred(full)).unwrap(),
        "{what}: identity pass against the full scan"
    );
    assert_eq!(
        advertised(identity),
        advertised(full),
        "{what}: what a device plugin advertises and answers"
    );
    assert_eq!(identity.findings, full.findings, "{what}: node findings");
}

#[test]
fn identity_pass_agrees_with_the_full_scan_on_every_fixture() {
    for name in [
        "rxe-6.12",
        "erdma-compat",
        "erdma-iwarp",
        "broken-garbage",
        "broken-links",
        "broken-missing",
        "broken-no-uverbs",
    ] {
        let tree = NodeTree::temp();
        assert!(fixtures::build(name, &tree), "fixture {name}");
        let inv = inventory(&tree, FixedInterfaceAddrs::default());
        let (identity, full) = (inv.scan_identity(), inv.scan());
        assert_eq!(identity.devices.len(), full.devices.len(), "{name}");
        assert_agree(&identity, &full, name);
    }
}

#[test]
fn identity_pass_reads_no_gid_table_and_agrees_on_a_large_node() {
    let tree = NodeTree::temp();
    fixtures::large(&tree, 20, 2, 16);
    let inv = inventory(&tree, FixedInterfaceAddrs::default());
    let (identity, full) = (inv.scan_identity(), inv.scan());
    assert_eq!(identity.devices.len(), 20);
    for (d, f) in identity.devices.iter().zip(&full.devices) {
        assert!(d.ports.iter().all(|p| p.gids.is_empty()), "{}", d.name);
        assert!(f.ports.iter().all(|p| p.gids.len() == 16), "{}", f.name);
        assert!(d.health.is_healthy() && d.netdev.is_some() && d.pnet_id.is_some());
        assert!(f.gid_index.is_some() && d.gid_index.is_none());
    }
    assert_agree(&identity, &full, "large");
}

#[test]
fn the_unhurried_scan_on_one_thread_is_the_full_scan() {
    // 40 devices: the split scan reads them on several threads where the machine has the CPUs.
    let tree = NodeTree::temp();
    fixtures::large(&tree, 40, 2, 4);
    let inv = inventory(&tree, FixedInterfaceAddrs::default());
    let (one, split) = (inv.scan_unhurried(), inv.scan());
    assert_eq!(one.devices.len(), 40);
    assert!(
        one.devices
            .iter()
            .all(|d| d.ports.iter().all(|p| p.gids.len() == 4))
    );
    assert_eq!(
        serde_json::to_value(&one).unwrap(),
        serde_json::to_value(&split).unwrap()
    );
}

#[test]
fn a_device_paired_only_through_its_gids_is_read_whole() {
    // No interface carries the MAC of the device's node_guid: the pairing falls back to the
    // GID entries' ndev, which the identity pass cannot see, so it reads that device whole.
    let tree = NodeTree::temp();
    fixtures::large(&tree, 2, 1, 3);
    std::fs::write(
        tree.sys().join("class/net/eth1/address"),
        "02:00:00:00:00:99\n",
    )
    .expect("rewrite eth1's MAC");
    let inv = inventory(&tree, FixedInterfaceAddrs::default());
    let (identity, full) = (inv.scan_identity(), inv.scan());
    let (d, f) = (&identity.devices[0], &full.devices[0]);
    assert_eq!(d.netdev, f.netdev);
    assert!(d.netdev.is_some(), "paired through a GID entry");
    assert_eq!(d.ports, f.ports, "read whole: GIDs included");
    assert!(identity.devices[1].ports[0].gids.is_empty());
    assert_agree(&identity, &full, "paired through GIDs");
    assert_eq!(
        serde_json::to_value(d).unwrap(),
        serde_json::to_value(f).unwrap()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random values in the files of a node (garbage, missing files, down ports, missing char
    /// devices): the two passes still agree.
    #[test]
    fn identity_pass_agrees_on_random_values(
        compat in any::<bool>(),
        writes in prop::collection::vec((0usize..FILES.len(), 0usize..VALUES.len()), 0..12),
    ) {
        let tree = NodeTree::temp();
        fixtures::erdma(&tree, compat);
        for (f, v) in &writes {
            let p = tree.sys().join(FILES[*f]);
            let _ = std::fs::remove_file(&p);
            if let Some(v) = VALUES[*v] {
                let _ = std::fs::write(&p, v);
            }
        }
        let inv = inventory(&tree, FixedInterfaceAddrs::default());
        let (identity, full) = (inv.scan_identity(), inv.scan());
        prop_assert_eq!(identity.devices.len(), full.devices.len());
        assert_agree(&identity, &full, &format!("{writes:?}"));
    }
}

/// Files of `fixtures::erdma` that random values go to.
const FILES: &[&str] = &[
    "class/infiniband/erdma_0/node_guid",
    "class/infiniband/erdma_0/node_type",
    "class/infiniband/erdma_0/ports/1/state",
    "class/infiniband/erdma_0/ports/1/link_layer",
    "class/infiniband/erdma_0/ports/1/gids/0",
    "class/infiniband/erdma_0/ports/1/gids/1",
    "class/infiniband/erdma_0/ports/1/gid_attrs/types/1",
    "class/infiniband/erdma_0/ports/1/gid_attrs/ndevs/1",
    "class/infiniband/erdma_1/node_guid",
    "class/infiniband/erdma_1/ports/1/gids/1",
    "class/net/eth0/address",
    "class/net/eth1/address",
    "class/net/eth1/operstate",
    "module/erdma/parameters/compat_mode",
];

/// `None` removes the file.
const VALUES: &[Option<&str>] = &[
    None,
    Some("garbage\n"),
    Some("1: DOWN\n"),
    Some("4: ACTIVE\n"),
    Some("Ethernet\n"),
    Some("0000:0000:0000:0000:0000:ffff:0a00:0001\n"),
    Some("IB/RoCE v1\n"),
    Some("eth1\n"),
    Some("00:16:3e:00:00:01\n"),
    Some("0216:3eff:fe00:0001\n"),
    Some("up\n"),
    Some("down\n"),
    Some("Y\n"),
];
