//! Test support shared by every crate that tests SMC paths on a real kernel (feature `testing`):
//! a private network namespace, and the guard of the "SMC unsupported" tests.

use nix::sched::CloneFlags;
use std::path::PathBuf;

/// Creates a namespace held open by a parked thread; returns its `/proc/<tid>/ns/net` path.
pub fn private_netns() -> (PathBuf, std::sync::mpsc::Sender<()>) {
    let (tx_path, rx_path) = std::sync::mpsc::channel();
    let (tx_stop, rx_stop) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare");
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        tx_path
            .send(PathBuf::from(format!("/proc/self/task/{tid}/ns/net")))
            .expect("send");
        let _ = rx_stop.recv();
    });
    (rx_path.recv().expect("path"), tx_stop)
}

/// Fails the calling test unless this kernel cannot provide SMC: the `smc` module is neither
/// loaded nor installed (a module that is merely installed would be auto-loaded by the first
/// SMC socket or netlink request). Tests of the "SMC unsupported" path call it first.
pub fn require_kernel_without_smc() {
    assert!(
        !std::path::Path::new("/sys/module/smc").exists(),
        "needs a kernel without SMC, but smc is loaded here; run this test on a kernel \
         without SMC (the CI host, or the 7.3 lab VM: crates/erdma-smc/lab/run-smcr.sh)"
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    for dir in ["/lib/modules", "/usr/lib/modules"] {
        let dep = std::path::Path::new(dir)
            .join(release.trim())
            .join("modules.dep");
        let listed = std::fs::read_to_string(&dep).unwrap_or_default();
        assert!(
            !listed.lines().any(|l| l.contains("/smc.ko")),
            "needs a kernel without SMC, but {} lists the smc module",
            dep.display()
        );
    }
}
