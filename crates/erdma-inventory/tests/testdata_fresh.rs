//! The checked-in trees under `testdata/sysfs/` are exactly what the fixture builders produce.
//! Regenerate with `cargo run -p erdma-host --features fake --example make-fixtures`.

use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, PartialEq)]
enum Entry {
    File(Vec<u8>),
    Link(PathBuf),
}

fn walk(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(rel, Entry::Link(fs::read_link(&p).unwrap()));
            } else if ft.is_dir() {
                // git keeps no empty directories: compare files and links only.
                stack.push(p);
            } else {
                out.insert(rel, Entry::File(fs::read(&p).unwrap()));
            }
        }
    }
    out
}

#[test]
fn checked_in_fixture_trees_are_fresh() {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sysfs");
    for name in fixtures::ALL {
        let tree = NodeTree::temp().placeholders_only();
        fixtures::build(name, &tree);
        let want = walk(tree.root());
        let have = walk(&testdata.join(name));
        assert!(
            want == have,
            "testdata/sysfs/{name} is stale: run `cargo run -p erdma-host --features fake --example make-fixtures`"
        );
    }
}
