//! Regenerates the Rust code of the CRI proto into a temporary directory (protox, no system
//! protoc) and fails when the checked-in `src/gen/runtime_v1.rs` differs.
//!
//! To refresh it after editing the .proto:
//! `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-cri --test generated_code_is_fresh`

use std::path::{Path, PathBuf};

#[test]
fn checked_in_generated_code_matches_the_proto() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let fds = protox::compile([root.join("runtime/v1/api.proto")], [&root]).expect("proto parses");
    let tmp = tempfile::tempdir().expect("temp dir");
    tonic_prost_build::configure()
        .out_dir(tmp.path())
        .btree_map(".")
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)
        .expect("code generation succeeds");
    let fresh = std::fs::read_to_string(tmp.path().join("runtime.v1.rs")).expect("generated");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen/runtime_v1.rs");
    if std::env::var_os("ERDMA_REGENERATE_PROTOS").is_some() {
        std::fs::write(&path, &fresh).expect("write generated code");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale; run `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-cri --test generated_code_is_fresh` and commit it",
        path.display()
    );
}
