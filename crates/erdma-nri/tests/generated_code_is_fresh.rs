//! Regenerates the Rust code of the NRI and ttRPC protos into a temporary directory (pure Rust:
//! protox parses the .proto files, no system protoc) and fails when the checked-in `src/gen/*.rs`
//! differ.
//!
//! To refresh the checked-in files after editing a .proto:
//! `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-nri --test generated_code_is_fresh`

use std::path::{Path, PathBuf};

/// (proto file relative to `proto/`, file prost writes for its package, checked-in name)
const APIS: &[(&str, &str, &str)] = &[
    (
        "nri/v1alpha1/api.proto",
        "nri.pkg.api.v1alpha1.rs",
        "nri_v1alpha1.rs",
    ),
    ("ttrpc/request.proto", "ttrpc.rs", "ttrpc.rs"),
];

fn generate(proto: &str, out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let fds = protox::compile([root.join(proto)], [&root]).expect("protos parse");
    prost_build::Config::new()
        .out_dir(out)
        .btree_map(["."])
        .compile_fds(fds)
        .expect("code generation succeeds");
}

#[test]
fn checked_in_generated_code_matches_the_protos() {
    let gen_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    let regenerate = std::env::var_os("ERDMA_REGENERATE_PROTOS").is_some();
    let mut stale = Vec::new();
    for (proto, produced, checked_in) in APIS {
        let tmp = tempfile::tempdir().expect("temp dir");
        generate(proto, tmp.path());
        let fresh =
            std::fs::read_to_string(tmp.path().join(produced)).expect("generated file exists");
        let path = gen_dir.join(checked_in);
        if regenerate {
            std::fs::write(&path, &fresh).expect("write generated code");
            continue;
        }
        if std::fs::read_to_string(&path).unwrap_or_default() != fresh {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated code is stale: {stale:?}; run `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-nri --test generated_code_is_fresh` and commit src/gen"
    );
}
