//! Regenerates the Rust code of the kubelet protos into a temporary directory (pure Rust: protox
//! parses the .proto files, no system protoc) and fails when the checked-in `src/gen/*.rs` differ.
//!
//! To refresh the checked-in files after editing a .proto:
//! `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-kubelet --test generated_code_is_fresh`

use std::path::{Path, PathBuf};

/// (proto file relative to `proto/`, file prost writes for its package, checked-in name under `src/gen/`)
const APIS: &[(&str, &str, &str)] = &[
    (
        "deviceplugin/v1beta1/api.proto",
        "v1beta1.rs",
        "deviceplugin_v1beta1.rs",
    ),
    ("podresources/v1/api.proto", "v1.rs", "podresources_v1.rs"),
    (
        "pluginregistration/v1/api.proto",
        "pluginregistration.rs",
        "pluginregistration_v1.rs",
    ),
    (
        "dra/v1/api.proto",
        "k8s.io.kubelet.pkg.apis.dra.v1.rs",
        "dra_v1.rs",
    ),
    (
        "dra-health/v1alpha1/api.proto",
        "v1alpha1.rs",
        "dra_health_v1alpha1.rs",
    ),
    ("dra-health/v1/api.proto", "v1.rs", "dra_health_v1.rs"),
];

fn generate(proto: &str, out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let fds = protox::compile([root.join(proto)], [&root]).expect("protos parse");
    tonic_prost_build::configure()
        .out_dir(out)
        .btree_map(".")
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)
        .expect("code generation succeeds");
}

#[test]
fn checked_in_generated_code_matches_the_protos() {
    let gen_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    let regenerate = std::env::var_os("ERDMA_REGENERATE_PROTOS").is_some();
    let mut stale = Vec::new();
    for (proto, produced, checked_in) in APIS {
        // One output directory per package: two unrelated `v1` packages must never share a file.
        let tmp = tempfile::tempdir().expect("temp dir");
        generate(proto, tmp.path());
        let fresh =
            std::fs::read_to_string(tmp.path().join(produced)).expect("generated file exists");
        let path = gen_dir.join(checked_in);
        if regenerate {
            std::fs::write(&path, &fresh).expect("write generated code");
            continue;
        }
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != fresh {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated code is stale: {stale:?}; run `ERDMA_REGENERATE_PROTOS=1 cargo test -p erdma-kubelet --test generated_code_is_fresh` and commit src/gen"
    );
}
