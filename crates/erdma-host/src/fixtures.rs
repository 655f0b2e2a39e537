//! The named node trees used by tests, benchmarks and the checked-in `testdata/sysfs/` folder.
//!
//! `rxe` is rebuilt from a real capture (kernel 6.12, Soft-RoCE on a veth); the eRDMA trees are
//! **synthetic**, built from the driver facts in the project's erdma device reference (sysfs values
//! per mode, EUI-64 GUIDs, uverbs numbering unrelated to device numbering); the `broken-*` trees are
//! deliberately damaged.

use crate::fake::{NetdevSpec, NodeTree, PciFn, PortSpec, RdmaSpec};
use erdma_model_free::*;

/// Helpers that need no domain crate (this crate sits below the model).
mod erdma_model_free {
    /// The EUI-64 node GUID text of a MAC, as the erdma driver derives it.
    pub fn guid_of(mac: &str) -> String {
        let b: Vec<u8> = mac
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).unwrap_or(0))
            .collect();
        format!(
            "{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
            b[0] ^ 0x02,
            b[1],
            b[2],
            b[3],
            b[4],
            b[5]
        )
    }
    /// The iWARP GID of an eRDMA device: the MAC in the first six bytes.
    pub fn iwarp_gid(mac: &str) -> String {
        let h: String = mac.split(':').collect();
        format!(
            "{}:{}:{}:0000:0000:0000:0000:0000",
            &h[0..4],
            &h[4..8],
            &h[8..12]
        )
    }
    /// The link-local RoCE GID of a MAC.
    pub fn link_local_gid(mac: &str) -> String {
        let g = guid_of(mac).replace(':', "");
        format!(
            "fe80:0000:0000:0000:{}:{}:{}:{}",
            &g[0..4],
            &g[4..8],
            &g[8..12],
            &g[12..16]
        )
    }
    /// The IPv4-mapped GID of an address.
    pub fn ipv4_gid(ip: [u8; 4]) -> String {
        format!(
            "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
            ip[0], ip[1], ip[2], ip[3]
        )
    }
}

/// Names of every fixture, for generators and tests.
pub const ALL: &[&str] = &[
    "rxe-6.12",
    "erdma-iwarp",
    "erdma-compat",
    "broken-garbage",
    "broken-missing",
    "broken-links",
    "broken-no-uverbs",
];

/// Builds the named fixture into `tree`. Returns false for an unknown name.
pub fn build(name: &str, tree: &NodeTree) -> bool {
    match name {
        "rxe-6.12" => rxe(tree),
        "erdma-iwarp" => erdma(tree, false),
        "erdma-compat" => erdma(tree, true),
        "broken-garbage" => broken_garbage(tree),
        "broken-missing" => broken_missing(tree),
        "broken-links" => broken_links(tree),
        "broken-no-uverbs" => broken_no_uverbs(tree),
        _ => return false,
    }
    true
}

/// The real capture of rxe0 on kernel 6.12.95 (Debian), as checked into `testdata/sysfs/`.
pub const RXE_CAPTURE: &str =
    include_str!("../../../testdata/sysfs/sysfs-rxe-6.12.95+deb12-amd64.txt");

/// rxe0 on veth0, from the real capture. What the capture does not hold is completed from what it
/// shows elsewhere: `uverbs0`'s `ibdev`/`dev` (from `ls -l /dev/infiniband`: 231:192), umad0 (231:0),
/// rdma_cm, and veth0's `address` (EUI-64 inverse of node_guid), `mtu` 1500 (the capture's active_mtu
/// 1024 implies it) and `operstate` up.
pub fn rxe(t: &NodeTree) {
    t.import_capture(RXE_CAPTURE).expect("import capture");
    t.write("devices/virtual/infiniband_verbs/uverbs0/ibdev", "rxe0\n");
    t.write("devices/virtual/infiniband_verbs/uverbs0/dev", "231:192\n");
    t.write("devices/virtual/infiniband_mad/umad0/ibdev", "rxe0\n");
    t.write("devices/virtual/infiniband_mad/umad0/port", "1\n");
    t.write("devices/virtual/infiniband_mad/umad0/dev", "231:0\n");
    t.netdev(&NetdevSpec {
        name: "veth0".into(),
        mac: "12:59:d8:34:6b:1b".into(),
        mtu: 1500,
        operstate: "up".into(),
        pci: None,
    });
    t.char_node("infiniband/uverbs0", 231, 192);
    t.char_node("infiniband/umad0", 231, 0);
    t.rdma_cm();
}

struct Eri {
    dev: &'static str,
    rdma_pci: &'static str,
    net_pci: &'static str,
    netdev: &'static str,
    mac: &'static str,
    numa: &'static str,
    mtu: u32,
    uverbs: u32,
    ipv4: [u8; 4],
    ipv4_gid_index: u32,
}

const ERIS: [Eri; 2] = [
    Eri {
        dev: "erdma_0",
        rdma_pci: "0000:00:05.0",
        net_pci: "0000:00:06.0",
        netdev: "eth1",
        mac: "00:16:3e:0a:1b:2c",
        numa: "0",
        mtu: 8500,
        uverbs: 1,
        ipv4: [192, 0, 2, 23],
        ipv4_gid_index: 2,
    },
    Eri {
        dev: "erdma_1",
        rdma_pci: "0000:80:05.0",
        net_pci: "0000:80:06.0",
        netdev: "eth2",
        mac: "00:16:3e:0a:1b:2d",
        numa: "1",
        mtu: 1500,
        uverbs: 0,
        ipv4: [198, 51, 100, 24],
        ipv4_gid_index: 1,
    },
];

/// Synthetic: an ECS instance with a primary ENI (eth0, no RDMA) and two ERIs on two NUMA nodes,
/// in iWARP (`compat = false`) or RoCE-compat mode. uverbs numbers deliberately do not follow the
/// erdma numbers, as the kernel does not promise they do.
pub fn erdma(t: &NodeTree, compat: bool) {
    t.erdma_module(compat);
    t.pci(&virtio_net("0000:00:04.0", "0"));
    t.netdev(&NetdevSpec {
        name: "eth0".into(),
        mac: "00:16:3e:00:00:01".into(),
        mtu: 1500,
        operstate: "up".into(),
        pci: Some("0000:00:04.0".into()),
    });
    for e in &ERIS {
        t.pci(&PciFn {
            address: e.rdma_pci.into(),
            vendor: "0x1ded".into(),
            device: "0x107f".into(),
            numa_node: e.numa.into(),
            driver: Some("erdma".into()),
        });
        t.pci(&virtio_net(e.net_pci, e.numa));
        t.netdev(&NetdevSpec {
            name: e.netdev.into(),
            mac: e.mac.into(),
            mtu: e.mtu,
            operstate: "up".into(),
            pci: Some(e.net_pci.into()),
        });
        let gids = if compat {
            let mut g = vec![(
                0,
                link_local_gid(e.mac),
                Some("RoCE v2".to_string()),
                Some(e.netdev.to_string()),
            )];
            if e.ipv4_gid_index == 2 {
                g.push((
                    1,
                    "2001:0db8:0000:0001:0000:0000:0000:0017".into(),
                    Some("RoCE v2".into()),
                    Some(e.netdev.into()),
                ));
            }
            g.push((
                e.ipv4_gid_index,
                ipv4_gid(e.ipv4),
                Some("RoCE v2".into()),
                Some(e.netdev.into()),
            ));
            g
        } else {
            vec![(0, iwarp_gid(e.mac), None, None)]
        };
        t.rdma(&RdmaSpec {
            name: e.dev.into(),
            pci: Some(e.rdma_pci.into()),
            parent: None,
            node_type: if compat {
                "1: CA".into()
            } else {
                "4: RNIC".into()
            },
            node_guid: guid_of(e.mac),
            node_desc: "Elastic RDMA(iWARP) stack".into(),
            fw_ver: String::new(),
            ports: vec![PortSpec {
                gids,
                ..PortSpec::default()
            }],
            uverbs: Some(e.uverbs),
            uverbs_node: true,
            umad: compat.then_some(e.uverbs),
        });
    }
    t.rdma_cm();
}

fn virtio_net(address: &str, numa: &str) -> PciFn {
    PciFn {
        address: address.into(),
        vendor: "0x1af4".into(),
        device: "0x1000".into(),
        numa_node: numa.into(),
        driver: Some("virtio-pci".into()),
    }
}

/// Garbage values everywhere in erdma_0; erdma_1 stays good.
pub fn broken_garbage(t: &NodeTree) {
    erdma(t, true);
    let d = "class/infiniband/erdma_0";
    t.write("module/erdma/parameters/compat_mode", "maybe\n");
    t.write(format!("{d}/node_guid"), "zzzz:not:a:guid\n");
    t.write(format!("{d}/node_type"), "42: SPACESHIP\n");
    t.write(format!("{d}/ports/1/state"), "9: WEIRD\n");
    t.write(format!("{d}/ports/1/phys_state"), [0xff, 0xfe, 0x00]);
    t.write(format!("{d}/ports/1/gids/0"), "not-a-gid\n");
    t.write(format!("{d}/ports/1/rate"), vec![b'9'; 100_000]);
    t.write("devices/pci0000:00/0000:00:05.0/numa_node", "banana\n");
    t.write("devices/pci0000:00/0000:00:05.0/vendor", "0xZZZZ\n");
    t.write("class/net/eth1/mtu", "-5\n");
}

/// Files missing: erdma_0 has no node_type and no port state; erdma_1 has no ports at all.
pub fn broken_missing(t: &NodeTree) {
    erdma(t, false);
    t.remove("class/infiniband/erdma_0/node_type");
    t.remove("class/infiniband/erdma_0/ports/1/state");
    t.remove("class/infiniband/erdma_1/ports");
    t.remove("module");
}

/// Dangling and looping links: erdma_0's class link points nowhere, erdma_1's device link loops,
/// and an extra `ghost` device links to itself.
pub fn broken_links(t: &NodeTree) {
    erdma(t, false);
    t.raw_link(
        std::path::Path::new("class/infiniband/erdma_0"),
        std::path::Path::new("../../devices/nowhere/erdma_0"),
    );
    t.raw_link(
        std::path::Path::new("devices/pci0000:00/0000:80:05.0/infiniband/erdma_1/device"),
        std::path::Path::new("device"),
    );
    t.raw_link(
        std::path::Path::new("class/infiniband/ghost"),
        std::path::Path::new("ghost"),
    );
}

/// erdma_0 has no uverbs class device at all; erdma_1's uverbs node is missing from /dev; the
/// eth2 netdev of erdma_1 is down with its port DOWN.
pub fn broken_no_uverbs(t: &NodeTree) {
    erdma(t, false);
    t.remove("class/infiniband_verbs/uverbs1");
    t.remove_dev("infiniband/uverbs0");
    t.set_operstate("eth2", "down");
    t.write("class/infiniband/erdma_1/ports/1/state", "1: DOWN\n");
    t.write(
        "class/infiniband/erdma_1/ports/1/phys_state",
        "3: Disabled\n",
    );
}

/// Synthetic scale tree for benchmarks: `devices` eRDMA devices in RoCE-compat mode, each with
/// `ports` ports of `gids` populated RoCE v2 GIDs, spread over two NUMA nodes.
pub fn large(t: &NodeTree, devices: u32, ports: u32, gids: u32) {
    t.erdma_module(true);
    for i in 0..devices {
        let bus = i / 32;
        let slot = i % 32;
        let rdma_pci = format!("0000:{:02x}:{:02x}.0", bus * 2, slot);
        let net_pci = format!("0000:{:02x}:{:02x}.0", bus * 2 + 1, slot);
        let numa = (i % 2).to_string();
        let mac = format!(
            "00:16:3e:{:02x}:{:02x}:{:02x}",
            (i >> 16) as u8,
            (i >> 8) as u8,
            i as u8
        );
        let netdev = format!("eth{}", i + 1);
        t.pci(&PciFn {
            address: rdma_pci.clone(),
            vendor: "0x1ded".into(),
            device: "0x107f".into(),
            numa_node: numa.clone(),
            driver: Some("erdma".into()),
        });
        t.pci(&virtio_net(&net_pci, &numa));
        t.netdev(&NetdevSpec {
            name: netdev.clone(),
            mac: mac.clone(),
            mtu: 8500,
            operstate: "up".into(),
            pci: Some(net_pci),
        });
        let port_specs = (0..ports)
            .map(|_| PortSpec {
                gids: (0..gids)
                    .map(|g| {
                        let gid = if g == 0 {
                            link_local_gid(&mac)
                        } else {
                            ipv4_gid([10, (i % 250) as u8, (g % 250) as u8, 1])
                        };
                        (g, gid, Some("RoCE v2".to_string()), Some(netdev.clone()))
                    })
                    .collect(),
                ..PortSpec::default()
            })
            .collect();
        t.rdma(&RdmaSpec {
            name: format!("erdma_{i}"),
            pci: Some(rdma_pci),
            parent: None,
            node_type: "1: CA".into(),
            node_guid: guid_of(&mac),
            node_desc: "Elastic RDMA(iWARP) stack".into(),
            fw_ver: String::new(),
            ports: port_specs,
            uverbs: Some(i),
            uverbs_node: true,
            umad: None,
        });
    }
    t.rdma_cm();
}
