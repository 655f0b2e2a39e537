//! Link arguments of the agent binary.
//!
//! - Packed relative relocations (`DT_RELR`, glibc 2.36+, binutils 2.38+): the dynamic linker
//!   reads a few KiB at start instead of ~0.5 MiB of `.rela.dyn`, pages that would otherwise count
//!   in every node's agent RSS until they are reclaimed.
//! - The function order of `link-order.txt` (LLD's `--symbol-ordering-file`): the functions the
//!   agent runs while idle first, then those only its start-up runs, then everything else. The
//!   kernel maps a binary's pages in 64 KiB windows around each page a process touches
//!   (fault-around), so code that runs is spread over nearly every window of the text unless it is
//!   kept together; kept together, start-up maps its ~3 MiB instead of the whole text and the idle
//!   loop a few windows. `scripts/agent-link-order.sh` regenerates the file from the functions the
//!   agent runs (callgrind over the agent bench); a symbol the file names that the binary no
//!   longer has is skipped, a function it does not name is placed after the ordered ones. Only
//!   where rustc links with LLD (its default for x86_64-unknown-linux-gnu).
use std::path::Path;

fn main() {
    println!("cargo:rustc-link-arg-bin=erdma-agent=-Wl,-z,pack-relative-relocs");
    println!("cargo:rerun-if-changed=link-order.txt");
    let target = std::env::var("TARGET").unwrap_or_default();
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out = std::env::var("OUT_DIR").unwrap_or_default();
    let order = Path::new(&dir).join("link-order.txt");
    // The linker is given a copy under OUT_DIR, not the source path: cargo reuses this script's
    // output for a checkout at another path sharing the target dir (a clean clone in CI), and a
    // path into the old checkout would no longer exist there.
    let copy = Path::new(&out).join("link-order.txt");
    if target == "x86_64-unknown-linux-gnu"
        && order.is_file()
        && !out.is_empty()
        && std::fs::copy(&order, &copy).is_ok()
    {
        println!(
            "cargo:rustc-link-arg-bin=erdma-agent=-Wl,--symbol-ordering-file={}",
            copy.display()
        );
        println!("cargo:rustc-link-arg-bin=erdma-agent=-Wl,--no-warn-symbol-ordering");
    }
}
