//! Fuzzing the inventory through the attribute files of real sysfs trees: the erdma (iWARP and
//! compat) and rxe fixture trees, with one to four of their regular files rewritten as a broken or
//! hostile node could leave them: the file's own value mutated (bytes flipped, inserted, deleted,
//! duplicated, cut; signs, blanks, separators, NULs and huge numbers inserted), arbitrary bytes
//! (invalid UTF-8 too), another attribute's value, empty, or larger than any sysfs attribute.
//!
//! `random_trees.rs` changes the tree's shape; this one keeps the shape and attacks the values, in
//! a full scan and in the cheap re-read (`refresh`) that the agent polls with. Each case must:
//! not panic; list exactly the devices of the unbroken tree (values cannot add or remove a
//! device); explain every device it does not serve; and, for the attributes read as
//! `"<number>: <name>"` or hex groups, leave a finding naming the file when the new content
//! cannot be such a value (not UTF-8, or without a `:`).
//!
//! Bounded memory: files larger than the 64 KiB attribute limit are refused unread; the serialised
//! snapshot stays within a constant plus the size of what was written.

use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_model::NodeDevices;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestRunner;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Content {
    /// The file's own value with edits.
    Mutated(Vec<Edit>),
    /// Arbitrary bytes.
    Bytes(Vec<u8>),
    /// The value of another file of the tree (picked by index).
    Other(Index),
    Empty,
    /// Larger than `erdma_host::MAX_ATTR_BYTES` (64 KiB).
    Huge(u8),
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Duplicate(Index, usize),
    Truncate(Index),
}

fn nasty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8),
        prop::sample::select(vec![
            &b" "[..],
            b"\n",
            b"\0",
            b":",
            b"+",
            b"-1",
            b"0x",
            b"4294967296",
            b"99999999999999999999",
            b"\xff\xfe",
            b"\xc3",
            b"../",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), nasty()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), 0usize..8).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), 0usize..64).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        6 => prop::collection::vec(edit(), 1..5).prop_map(Content::Mutated),
        2 => prop::collection::vec(any::<u8>(), 0..96).prop_map(Content::Bytes),
        2 => any::<Index>().prop_map(Content::Other),
        1 => Just(Content::Empty),
        1 => any::<u8>().prop_map(Content::Huge),
    ]
}

fn mutate(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    let at = |i: &Index, len: usize| i.index(len + 1);
    for e in edits {
        match e {
            Edit::Flip(i, b) => {
                if !data.is_empty() {
                    let p = i.index(data.len());
                    data[p] ^= b | 1;
                }
            }
            Edit::Insert(i, bytes) => {
                let p = at(i, data.len());
                data.splice(p..p, bytes.iter().copied());
            }
            Edit::Delete(i, n) => {
                let p = at(i, data.len());
                data.drain(p..(p + n).min(data.len()));
            }
            Edit::Duplicate(i, n) => {
                let p = at(i, data.len());
                let end = (p + n).min(data.len());
                let copy = data[p..end].to_vec();
                data.splice(end..end, copy);
            }
            Edit::Truncate(i) => {
                let p = at(i, data.len());
                data.truncate(p);
            }
        }
    }
    data
}

/// Every regular file under `dir` (links are not followed: each file once, by its real path).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Writes the files' original contents back when dropped (also when a case fails).
struct Restore(Vec<(PathBuf, Vec<u8>)>);

impl Drop for Restore {
    fn drop(&mut self) {
        for (p, data) in &self.0 {
            let _ = std::fs::write(p, data);
        }
    }
}

fn inventory(tree: &NodeTree) -> Inventory {
    Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs::default()),
    })
}

fn names(n: &NodeDevices) -> Vec<String> {
    let mut v: Vec<String> = n.devices.iter().map(|d| d.name.clone()).collect();
    v.sort();
    v
}

/// What must hold of any snapshot of a tree whose values (not shape) were broken.
fn check(node: &NodeDevices, expected: &[String], written: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(names(node), expected);
    for d in &node.devices {
        if d.health.is_healthy() {
            prop_assert!(!d.ports.is_empty(), "{}: healthy without ports", d.name);
            prop_assert!(
                d.ports
                    .iter()
                    .all(|p| p.state == Some(erdma_model::PortState::Active)),
                "{}: healthy with a port not ACTIVE",
                d.name
            );
        } else {
            prop_assert!(
                !d.health.reasons().is_empty(),
                "{}: unhealthy without reasons",
                d.name
            );
        }
    }
    let json = serde_json::to_string(node).expect("snapshot serialises");
    // Fixed text per device and finding, plus what was written (quoted with escapes: <= 10x).
    let bound = 256 * 1024 + 10 * written;
    prop_assert!(json.len() <= bound, "{} > {}", json.len(), bound);
    Ok(())
}

/// Attributes parsed as `"<number>: <name>"` or hex groups: a value without `:` (or not UTF-8)
/// cannot be one, and must leave a finding naming the file (`<device>/<rest>`).
const COLON_ATTRS: &[&str] = &["node_type", "state", "phys_state", "node_guid"];

/// File names the inventory parses (not just reads): half of the writes go to one of these.
const PARSED: &[&str] = &[
    "node_type",
    "state",
    "phys_state",
    "node_guid",
    "link_layer",
    "rate",
    "numa_node",
    "vendor",
    "device",
    "address",
    "flags",
    "carrier",
    "operstate",
    "compat_mode",
    "dev",
    "ibdev",
    "port",
    "mtu",
    "0",
    "1",
];

/// Cases: 48, or `PROPTEST_CASES` (scripts/test.sh's fuzz stage raises it).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

#[test]
fn broken_values_in_real_trees() {
    // One tree per fixture for the whole run (building one costs more than the scans): each case
    // breaks some files and puts them back at the end. The runner is explicit so that the trees
    // are the test's own and removed after it.
    let trees = [NodeTree::temp(), NodeTree::temp(), NodeTree::temp()];
    fixtures::erdma(&trees[0], false);
    fixtures::erdma(&trees[1], true);
    fixtures::rxe(&trees[2]);
    let strategy = (
        0usize..3,
        prop::collection::vec((any::<bool>(), any::<Index>(), content()), 1..5),
    );
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases()));
    let result = runner.run(&strategy, |(start, writes)| {
        let tree = &trees[start];
        let inv = inventory(tree);
        let before = inv.scan();
        let expected = names(&before);
        prop_assert!(!expected.is_empty());

        let all = files(&tree.sys());
        let restore = Restore(
            all.iter()
                .map(|p| (p.clone(), std::fs::read(p).unwrap_or_default()))
                .collect(),
        );
        let parsed: Vec<usize> = (0..all.len())
            .filter(|&i| {
                all[i]
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| PARSED.contains(&n))
            })
            .collect();
        let original = |i: usize| restore.0[i].1.clone();
        let mut written = 0;
        let mut broken: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        for (target_parsed, which, c) in &writes {
            let i = if *target_parsed {
                parsed[which.index(parsed.len())]
            } else {
                which.index(all.len())
            };
            let data = match c {
                Content::Mutated(edits) => mutate(original(i), edits),
                Content::Bytes(b) => b.clone(),
                Content::Other(j) => original(j.index(all.len())),
                Content::Empty => Vec::new(),
                Content::Huge(b) => vec![*b; 64 * 1024 + 1 + usize::from(*b)],
            };
            std::fs::write(&all[i], &data).expect("write fixture file");
            written += data.len().min(64 * 1024);
            broken.retain(|(p, _)| p != &all[i]);
            broken.push((all[i].clone(), data));
        }

        let after = inv.scan();
        check(&after, &expected, written)?;
        // The agent's poll re-reads the changing attributes of the snapshot it holds: from the
        // unbroken one and from the broken one.
        check(&inv.refresh(&before), &expected, written)?;
        check(&inv.refresh(&after), &expected, written)?;

        for (path, data) in &broken {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let p = path.to_string_lossy();
            let Some((_, rel)) = p.rsplit_once("/infiniband/") else {
                continue;
            };
            let Some((dev, _)) = rel.split_once('/') else {
                continue;
            };
            let impossible = std::str::from_utf8(data).map_or(true, |s| !s.contains(':'));
            if COLON_ATTRS.contains(&name) && impossible && !rel.contains("/hw_counters/") {
                let d = after.device(dev).expect("device listed");
                let f: Vec<&String> = d.findings.iter().map(|f| &f.message).collect();
                prop_assert!(
                    f.iter().any(|m| m.contains(rel)),
                    "{} = {:?}: no finding names it: {:?}",
                    rel,
                    String::from_utf8_lossy(data),
                    f
                );
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
