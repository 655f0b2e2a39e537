//! With the `bpf` feature: compiles the BPF socket policy (`src/policy/*.bpf.c`) with clang into
//! `OUT_DIR`. Needs `clang` and `libbpf-dev` (Debian: `apt-get install clang libbpf-dev
//! libelf-dev`); `ERDMA_BPF_CLANG` names another clang. Without clang the build goes on with
//! empty objects (a cargo warning says so) and loading the policy reports that it was not built,
//! so a machine without clang still builds and tests everything else.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/policy");
    println!("cargo:rerun-if-env-changed=ERDMA_BPF_CLANG");
    if std::env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("ERDMA_BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    // Debian keeps <asm/types.h> in the multiarch directory.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    for name in ["smc_policy", "rejected"] {
        let src = format!("src/policy/{name}.bpf.c");
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .args(["-I", &multiarch, "-c", &src, "-o"])
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!(
                "{clang} failed ({s}) compiling {src}. Fix: install the BPF headers (`apt-get install libbpf-dev linux-libc-dev`) or build without the `bpf` feature"
            ),
            Err(e) => {
                println!(
                    "cargo:warning=cannot run {clang} ({e}): the SMC BPF policy is not built; `apt-get install clang libbpf-dev libelf-dev` (or set ERDMA_BPF_CLANG)"
                );
                std::fs::write(&obj, b"").expect("write an empty object into OUT_DIR");
            }
        }
    }
}
