//! Regenerates the checked-in fixture trees: `cargo run -p erdma-host --features fake --example make-fixtures`.
//! Each tree lands in `testdata/sysfs/<name>/{sys,dev}` with placeholder files for device nodes.

use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use std::path::Path;

fn main() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sysfs");
    for name in fixtures::ALL {
        let dir = out.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let tree = NodeTree::at(&dir).placeholders_only();
        fixtures::build(name, &tree);
        println!("wrote {}", dir.display());
    }
}
