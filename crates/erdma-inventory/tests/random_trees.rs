//! Property test: random sysfs trees (garbage content, huge and non-UTF-8 files, dangling, absolute,
//! looping and deep links) never make the inventory panic, and every device either parses cleanly
//! or carries the reasons it cannot be used.

use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Paths the inventory reads, so random writes hit them often.
const PATHS: &[&str] = &[
    "class/infiniband/erdma_0/node_type",
    "class/infiniband/erdma_0/node_guid",
    "class/infiniband/erdma_0/parent",
    "class/infiniband/erdma_0/ports/1/state",
    "class/infiniband/erdma_0/ports/1/phys_state",
    "class/infiniband/erdma_0/ports/1/link_layer",
    "class/infiniband/erdma_0/ports/1/rate",
    "class/infiniband/erdma_0/ports/1/gids/0",
    "class/infiniband/erdma_0/ports/1/gid_attrs/types/0",
    "class/infiniband/erdma_0/ports/99999999999/state",
    "class/infiniband/erdma_1/device",
    "class/infiniband/erdma_1/device/numa_node",
    "class/infiniband/erdma_1/device/vendor",
    "class/infiniband/erdma_1/device/driver",
    "class/infiniband/x/node_type",
    "class/infiniband_verbs/uverbs0/ibdev",
    "class/infiniband_verbs/uverbs1/dev",
    "class/infiniband_verbs/uverbs7/ibdev",
    "class/infiniband_mad/umad0/port",
    "class/net/eth1/address",
    "class/net/eth1/mtu",
    "class/net/eth1/operstate",
    "class/net/eth2/device",
    "module/erdma/parameters/compat_mode",
];

#[derive(Debug, Clone)]
enum Op {
    Write(usize, Vec<u8>),
    Huge(usize),
    Link(usize, String),
    Remove(usize),
    /// A chain of `n` links ending at the path (deeper than the 40-hop limit when n > 40).
    Chain(usize, usize),
}

fn content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        "[0-9]{1,3}: [A-Za-z_ ]{0,12}\n".prop_map(String::into_bytes),
        "[0-9a-f:]{0,40}".prop_map(String::into_bytes),
        Just(b"-1\n".to_vec()),
        Just(b"\xff\xfe\xfd".to_vec()),
    ]
}

fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/sys/class/infiniband/erdma_0".to_string()),
        Just("/etc/passwd".to_string()),
        Just("../../../../../../../../..".to_string()),
        Just(".".to_string()),
        Just("erdma_1".to_string()),
        Just("../erdma_0/device".to_string()),
        "[a-z./]{0,30}",
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0..PATHS.len();
    prop_oneof![
        4 => (i.clone(), content()).prop_map(|(i, c)| Op::Write(i, c)),
        1 => i.clone().prop_map(Op::Huge),
        2 => (i.clone(), target()).prop_map(|(i, t)| Op::Link(i, t)),
        1 => i.clone().prop_map(Op::Remove),
        1 => (i, 1usize..60).prop_map(|(i, n)| Op::Chain(i, n)),
    ]
}

fn apply(tree: &NodeTree, op: &Op) {
    let sys = tree.sys();
    let path = |i: usize| sys.join(PATHS[i]);
    let prepare = |p: &Path| {
        if let Some(parent) = p.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir_all(p));
    };
    match op {
        Op::Write(i, c) => {
            let p = path(*i);
            prepare(&p);
            let _ = std::fs::write(&p, c);
        }
        Op::Huge(i) => {
            let p = path(*i);
            prepare(&p);
            let _ = std::fs::write(&p, vec![b'7'; 200_000]);
        }
        Op::Link(i, t) => {
            let p = path(*i);
            prepare(&p);
            let _ = std::os::unix::fs::symlink(PathBuf::from(t), &p);
        }
        Op::Chain(i, n) => {
            let p = path(*i);
            prepare(&p);
            let chain = sys.join("chain");
            let _ = std::fs::create_dir_all(&chain);
            let _ = std::fs::write(chain.join("end"), b"4: ACTIVE\n");
            for k in 0..*n {
                let link = chain.join(format!("l{k}"));
                let _ = std::fs::remove_file(&link);
                let next = if k == 0 {
                    "end".to_string()
                } else {
                    format!("l{}", k - 1)
                };
                let _ = std::os::unix::fs::symlink(next, &link);
            }
            let target = erdma_host::fake::relative_target(
                Path::new(PATHS[*i]),
                &Path::new("chain").join(format!("l{}", n - 1)),
            );
            let _ = std::os::unix::fs::symlink(target, &p);
        }
        Op::Remove(i) => {
            let p = path(*i);
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_trees_never_panic_and_always_explain(start in 0usize..3, ops in prop::collection::vec(op(), 1..25)) {
        let tree = NodeTree::temp();
        match start {
            0 => fixtures::erdma(&tree, false),
            1 => fixtures::erdma(&tree, true),
            _ => {}
        }
        for o in &ops {
            apply(&tree, o);
        }
        let node = Inventory::new(Sources {
            sysfs: Arc::new(RootedSysfs::new(tree.sys())),
            devfs: Arc::new(RootedDevFs::new(tree.dev())),
            addrs: Arc::new(FixedInterfaceAddrs::default()),
        })
        .scan();
        for d in &node.devices {
            if d.health.is_healthy() {
                prop_assert!(!d.ports.is_empty(), "{}: healthy without ports", d.name);
                prop_assert!(
                    d.char_devices.uverbs.as_ref().is_some_and(|c| c.present),
                    "{}: healthy without a uverbs node",
                    d.name
                );
                prop_assert!(d.ports.iter().all(|p| p.state == Some(erdma_model::PortState::Active)));
            } else {
                prop_assert!(!d.health.reasons().is_empty(), "{}: unhealthy without reasons", d.name);
            }
            if d.node_type.is_none() {
                prop_assert!(!d.findings.is_empty(), "{}: node_type unknown without a finding", d.name);
            }
        }
        // Nothing was read from outside the tree: the host's /etc/passwd never shows up.
        let json = serde_json::to_string(&node).unwrap();
        prop_assert!(!json.contains("root:x:0:0"));
    }
}
