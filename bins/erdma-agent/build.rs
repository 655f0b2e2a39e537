//! Link the agent with packed relative relocations (`DT_RELR`, glibc 2.36+, binutils 2.38+): the
//! dynamic linker reads a few KiB at start instead of ~0.5 MiB of `.rela.dyn`, pages that would
//! otherwise count in every node's agent RSS until they are reclaimed.
fn main() {
    println!("cargo:rustc-link-arg-bin=erdma-agent=-Wl,-z,pack-relative-relocs");
}
