//! The inventory against every fixture tree: the real rxe capture, synthetic eRDMA trees and broken
//! trees. Expected values come from the capture (ibv_devinfo output, `ls -l /dev/infiniband`) and
//! from the driver reference, not from the code under test.

use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_model::device::{AddressSource, NetdevPairing};
use erdma_model::{
    DeviceKind, DeviceMode, GidType, LinkLayer, NodeDevices, NodeType, PhysState, PortState,
};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

fn scan_tree(tree: &NodeTree, addrs: FixedInterfaceAddrs) -> NodeDevices {
    Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(addrs),
    })
    .scan()
}

fn scan_fixture(name: &str) -> NodeDevices {
    let tree = NodeTree::temp();
    assert!(fixtures::build(name, &tree));
    scan_tree(&tree, FixedInterfaceAddrs::default())
}

#[test]
fn real_rxe_capture_matches_ibv_devinfo() {
    let node = scan_fixture("rxe-6.12");
    assert_eq!(node.devices.len(), 1);
    let d = &node.devices[0];
    assert_eq!(d.name, "rxe0");
    assert_eq!(d.kind, DeviceKind::Rxe);
    // ibv_devinfo: transport InfiniBand, node_guid 1059:d8ff:fe34:6b1b, link_layer Ethernet.
    assert_eq!(d.node_type, Some(NodeType::Ca));
    assert_eq!(
        d.node_guid.map(|g| g.to_string()).as_deref(),
        Some("1059:d8ff:fe34:6b1b")
    );
    assert_eq!(d.mode, Some(DeviceMode::Roce));
    let p = d.first_port().expect("port 1");
    assert_eq!(p.state, Some(PortState::Active));
    assert_eq!(p.phys_state, Some(PhysState::LinkUp));
    assert_eq!(p.link_layer, Some(LinkLayer::Ethernet));
    assert_eq!(p.rate_gbps, Some(10.0));
    // ibv_devinfo: active_mtu 1024 (3) on the 1500-byte veth.
    assert_eq!(p.active_mtu, Some(1024));
    // ibv_devinfo: GID[0] fe80::1059:d8ff:fe34:6b1b, GID[1] ::ffff:192.0.2.1, GID[2] 2001:db8:77::1, all RoCE v2.
    let gids: Vec<(u32, String)> = p
        .gids
        .iter()
        .map(|g| (g.index, g.gid.to_string()))
        .collect();
    assert_eq!(
        gids,
        vec![
            (0, "fe80::1059:d8ff:fe34:6b1b".to_string()),
            (1, "::ffff:192.0.2.1".to_string()),
            (2, "2001:db8:77::1".to_string())
        ]
    );
    assert!(
        p.gids
            .iter()
            .all(|g| g.gid_type == Some(GidType::RoceV2) && g.ndev.as_deref() == Some("veth0"))
    );
    assert_eq!(d.gid_index, Some(1));
    // rdma link show: netdev veth0; rxe has no numa_node.
    let n = d.netdev.as_ref().expect("netdev");
    assert_eq!(n.name, "veth0");
    assert_eq!(n.paired_by, NetdevPairing::Parent);
    assert_eq!(n.ipv4, vec![Ipv4Addr::new(192, 0, 2, 1)]);
    assert_eq!(n.ipv4_source, AddressSource::Gids);
    assert_eq!(d.numa_node.0, None);
    // ls -l /dev/infiniband: uverbs0 is 231,192; umad0 231,0; rdma_cm present.
    let uv = d.char_devices.uverbs.as_ref().expect("uverbs");
    assert_eq!(
        (uv.path.as_str(), uv.major, uv.minor),
        ("/dev/infiniband/uverbs0", Some(231), Some(192))
    );
    assert_eq!(d.char_devices.umad.len(), 1);
    assert_eq!(d.char_devices.umad[0].path, "/dev/infiniband/umad0");
    assert_eq!(
        node.rdma_cm.as_ref().map(|c| c.path.as_str()),
        Some("/dev/infiniband/rdma_cm")
    );
    assert!(d.health.is_healthy(), "{:?}", d.health);
}

#[test]
fn live_addresses_win_over_gids() {
    let tree = NodeTree::temp();
    fixtures::rxe(&tree);
    let addrs = FixedInterfaceAddrs(BTreeMap::from([(
        "veth0".to_string(),
        vec![Ipv4Addr::new(10, 9, 8, 7)],
    )]));
    let node = scan_tree(&tree, addrs);
    let n = node.devices[0].netdev.as_ref().unwrap();
    assert_eq!(n.ipv4, vec![Ipv4Addr::new(10, 9, 8, 7)]);
    assert_eq!(n.ipv4_source, AddressSource::Interfaces);
}

#[test]
fn erdma_iwarp_two_numa_nodes() {
    let node = scan_fixture("erdma-iwarp");
    assert_eq!(node.erdma_compat_mode, Some(false));
    let names: Vec<&str> = node.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["erdma_0", "erdma_1"]);
    let (d0, d1) = (&node.devices[0], &node.devices[1]);
    for d in [d0, d1] {
        assert_eq!(d.kind, DeviceKind::Erdma);
        assert_eq!(d.driver.as_deref(), Some("erdma"));
        assert_eq!(d.mode, Some(DeviceMode::Iwarp));
        assert_eq!(d.node_type, Some(NodeType::Rnic));
        assert!(d.char_devices.umad.is_empty(), "iWARP has no umad");
        assert!(d.health.is_healthy(), "{:?}", d.health);
        assert!(
            d.findings
                .iter()
                .all(|f| f.severity == erdma_model::Severity::Info),
            "{:?}",
            d.findings
        );
        assert_eq!(d.gid_index, None);
    }
    assert_eq!(d0.numa_node.0, Some(0));
    assert_eq!(d1.numa_node.0, Some(1));
    // Paired by the EUI-64 rule, never with the primary eth0.
    assert_eq!(d0.netdev.as_ref().unwrap().name, "eth1");
    assert_eq!(
        d0.netdev.as_ref().unwrap().paired_by,
        NetdevPairing::GuidMac
    );
    assert_eq!(d1.netdev.as_ref().unwrap().name, "eth2");
    assert_eq!(d0.pnet_id.as_ref().unwrap().as_str(), "00163E0A1B2C");
    assert_eq!(d1.pnet_id.as_ref().unwrap().as_str(), "00163E0A1B2D");
    // uverbs numbering is not the erdma numbering.
    assert_eq!(
        d0.char_devices.uverbs.as_ref().unwrap().path,
        "/dev/infiniband/uverbs1"
    );
    assert_eq!(
        d1.char_devices.uverbs.as_ref().unwrap().path,
        "/dev/infiniband/uverbs0"
    );
    assert_eq!(d0.pci.as_ref().unwrap().address, "0000:00:05.0");
    assert_eq!(d0.netdev.as_ref().unwrap().mtu, Some(8500));
    assert_eq!(d0.first_port().unwrap().active_mtu, Some(4096));
    assert!(node.rdma_cm.is_some());
}

#[test]
fn erdma_compat_reports_gid_index_per_device() {
    let node = scan_fixture("erdma-compat");
    assert_eq!(node.erdma_compat_mode, Some(true));
    let (d0, d1) = (&node.devices[0], &node.devices[1]);
    assert_eq!(d0.mode, Some(DeviceMode::Roce));
    assert_eq!(d0.gid_index, Some(2));
    assert_eq!(d1.gid_index, Some(1));
    assert_eq!(
        d0.netdev.as_ref().unwrap().ipv4,
        vec![Ipv4Addr::new(192, 0, 2, 23)]
    );
    assert_eq!(d0.char_devices.umad[0].path, "/dev/infiniband/umad1");
    assert_eq!(d1.char_devices.umad[0].path, "/dev/infiniband/umad0");
}

#[test]
fn mode_mismatch_is_a_finding_not_a_failure() {
    let tree = NodeTree::temp();
    fixtures::erdma(&tree, false);
    tree.erdma_module(true); // parameter says compat, devices still say RNIC
    let node = scan_tree(&tree, FixedInterfaceAddrs::default());
    let d = &node.devices[0];
    assert_eq!(
        d.mode,
        Some(DeviceMode::Roce),
        "the module parameter decides"
    );
    assert!(
        d.findings
            .iter()
            .any(|f| f.message.contains("mode mismatch")),
        "{:?}",
        d.findings
    );
    assert!(d.health.is_healthy());
}

#[test]
fn upstream_driver_without_compat_mode_infers_from_node_type() {
    let tree = NodeTree::temp();
    fixtures::erdma(&tree, true);
    tree.remove("module");
    let node = scan_tree(&tree, FixedInterfaceAddrs::default());
    assert_eq!(node.erdma_compat_mode, None);
    assert!(
        node.devices
            .iter()
            .all(|d| d.mode == Some(DeviceMode::Roce))
    );
}

#[test]
fn netdev_down_makes_the_device_unhealthy_with_the_fix() {
    let node = scan_fixture("broken-no-uverbs");
    let d0 = &node.devices[0];
    assert!(
        d0.health
            .reasons()
            .iter()
            .any(|r| r.contains("no uverbs device") && r.contains("modprobe ib_uverbs"))
    );
    let d1 = &node.devices[1];
    let reasons = d1.health.reasons().join("\n");
    assert!(reasons.contains("uverbs0 is missing"), "{reasons}");
    // The node the kernel announced is still listed, with its numbers, as missing.
    let uv = d1.char_devices.uverbs.as_ref().expect("listed");
    assert_eq!(
        (uv.path.as_str(), uv.minor, uv.present),
        ("/dev/infiniband/uverbs0", Some(192), false)
    );
    assert_eq!(
        d1.char_devices.all().count(),
        0,
        "a missing node is never handed to a container"
    );
    assert!(
        reasons.contains("port 1 is DOWN because netdev eth2 is down"),
        "{reasons}"
    );
    assert_eq!(node.usable().count(), 0);
}

#[test]
fn garbage_values_become_findings_and_the_rest_still_works() {
    let node = scan_fixture("broken-garbage");
    let d0 = node.device("erdma_0").unwrap();
    let text: Vec<&str> = d0.findings.iter().map(|f| f.message.as_str()).collect();
    let all = text.join("\n");
    for needle in [
        "42: SPACESHIP",
        "banana",
        "9: WEIRD",
        "zzzz",
        "not UTF-8",
        "larger than",
        "not-a-gid",
        "\"-5\"",
    ] {
        assert!(all.contains(needle), "missing finding for {needle}: {all}");
    }
    assert_eq!(d0.numa_node.0, None, "garbage NUMA is unknown, never 0");
    assert!(!d0.health.is_healthy());
    assert!(
        node.findings
            .iter()
            .any(|f| f.message.contains("\"maybe\""))
    );
    // erdma_1 is untouched and usable.
    assert!(node.device("erdma_1").unwrap().health.is_healthy());
}

#[test]
fn missing_files_and_bad_links_never_panic() {
    for name in ["broken-missing", "broken-links"] {
        let node = scan_fixture(name);
        assert!(!node.devices.is_empty());
        for d in &node.devices {
            if !d.health.is_healthy() {
                assert!(!d.health.reasons().is_empty());
            }
        }
    }
    let node = scan_fixture("broken-links");
    let ghost = node.device("ghost").unwrap();
    assert!(
        ghost
            .findings
            .iter()
            .any(|f| f.message.contains("too many levels of symbolic links"))
    );
    let e1 = node.device("erdma_1").unwrap();
    assert!(
        e1.findings
            .iter()
            .any(|f| f.message.contains("dangling or looping link"))
    );
}

#[test]
fn empty_root_reports_the_missing_class() {
    let tree = NodeTree::temp();
    let node = scan_tree(&tree, FixedInterfaceAddrs::default());
    assert!(node.devices.is_empty());
    assert!(node.findings[0].message.contains("class/infiniband"));
}

#[test]
#[ignore = "needs root (mknod of real character devices); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
fn real_char_devices_are_checked_against_sysfs_numbers() {
    assert!(
        is_root(),
        "needs root to create character device nodes; run with --ignored as root"
    );
    let tree = NodeTree::temp();
    fixtures::erdma(&tree, false);
    // A stale node: right name, wrong numbers.
    tree.char_node("infiniband/uverbs1", 231, 250);
    let stale = tree.dev().join("infiniband/uverbs1");
    let kind = std::fs::metadata(&stale).expect("stale node").file_type();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&kind),
        "mknod {} made no character device (a filesystem mounted nodev?)",
        stale.display()
    );
    let node = scan_tree(&tree, FixedInterfaceAddrs::default());
    let d0 = &node.devices[0];
    assert!(
        d0.health
            .reasons()
            .iter()
            .any(|r| r.contains("stale device node")),
        "{:?}",
        d0.health
    );
    let d1 = &node.devices[1];
    assert_eq!(d1.char_devices.uverbs.as_ref().unwrap().minor, Some(192));
    assert!(
        d1.findings.is_empty(),
        "real char devices give no placeholder finding: {:?}",
        d1.findings
    );
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

#[test]
fn refresh_follows_health_changes_and_new_devices() {
    let tree = NodeTree::temp();
    fixtures::erdma(&tree, false);
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs::default()),
    });
    let first = inv.scan();
    assert_eq!(inv.refresh(&first), first, "nothing changed");
    // The ERI goes down: the driver reports the port DOWN and the netdev down.
    tree.set_operstate("eth2", "down");
    tree.write("class/infiniband/erdma_1/ports/1/state", "1: DOWN\n");
    let down = inv.refresh(&first);
    assert!(down.devices[0].health.is_healthy());
    assert!(
        down.devices[1]
            .health
            .reasons()
            .iter()
            .any(|r| r.contains("port 1 is DOWN because netdev eth2 is down"))
    );
    // The uverbs node disappears.
    tree.remove_dev("infiniband/uverbs1");
    let gone = inv.refresh(&down);
    assert!(
        gone.devices[0]
            .health
            .reasons()
            .iter()
            .any(|r| r.contains("uverbs1 is missing"))
    );
    // Everything comes back.
    tree.set_operstate("eth2", "up");
    tree.write("class/infiniband/erdma_1/ports/1/state", "4: ACTIVE\n");
    tree.char_node("infiniband/uverbs1", 231, 193);
    assert_eq!(inv.refresh(&gone), first);
    // A new device means a full scan.
    fixtures::rxe(&tree);
    let grown = inv.refresh(&first);
    assert_eq!(grown.devices.len(), 3);
}

/// `operstate` lags the link by up to a second (the kernel's link-watch work); `flags` (IFF_UP) and
/// `carrier` do not. When they can be read they decide the netdev's part of the health.
#[test]
fn the_live_link_state_wins_over_a_lagging_operstate() {
    let tree = NodeTree::temp();
    fixtures::erdma(&tree, false);
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs::default()),
    });
    let first = inv.scan();
    assert!(first.devices[1].health.is_healthy());
    assert_eq!(
        first.devices[1].netdev.as_ref().unwrap().link_up,
        Some(true)
    );
    // `ip link set eth2 up` a moment ago: the port is ACTIVE, the carrier is there, operstate
    // still says down.
    tree.write("class/net/eth2/operstate", "down\n");
    tree.write("class/net/eth2/flags", "0x1003\n");
    tree.write("class/net/eth2/carrier", "1\n");
    for node in [inv.refresh(&first), inv.scan()] {
        let d = &node.devices[1];
        assert_eq!(d.netdev.as_ref().unwrap().link_up, Some(true));
        assert!(d.health.is_healthy(), "{:?}", d.health);
    }
    // `ip link set eth2 down` a moment ago: IFF_UP is clear (the kernel refuses to read carrier
    // then), operstate still says up, and this driver has not taken the port down yet.
    tree.write("class/net/eth2/operstate", "up\n");
    tree.write("class/net/eth2/flags", "0x1002\n");
    tree.remove("class/net/eth2/carrier");
    for node in [inv.refresh(&first), inv.scan()] {
        let d = &node.devices[1];
        assert_eq!(d.netdev.as_ref().unwrap().link_up, Some(false));
        let reasons = d.health.reasons().join("\n");
        assert!(reasons.contains("netdev eth2 is down"), "{reasons}");
    }
    // Up without carrier (cable pulled): down, and the port hint says so.
    tree.write("class/net/eth2/flags", "0x1003\n");
    tree.write("class/net/eth2/carrier", "0\n");
    tree.write("class/infiniband/erdma_1/ports/1/state", "1: DOWN\n");
    let d = &inv.refresh(&first).devices[1];
    let reasons = d.health.reasons().join("\n");
    assert!(
        reasons.contains("port 1 is DOWN because netdev eth2 is down"),
        "{reasons}"
    );
    // Neither `flags` nor `carrier` readable: operstate decides.
    tree.write("class/infiniband/erdma_1/ports/1/state", "4: ACTIVE\n");
    tree.remove("class/net/eth2/flags");
    tree.remove("class/net/eth2/carrier");
    tree.write("class/net/eth2/operstate", "down\n");
    for node in [inv.refresh(&first), inv.scan()] {
        let d = &node.devices[1];
        assert_eq!(d.netdev.as_ref().unwrap().link_up, None);
        let reasons = d.health.reasons().join("\n");
        assert!(reasons.contains("netdev eth2 is down"), "{reasons}");
    }
}
