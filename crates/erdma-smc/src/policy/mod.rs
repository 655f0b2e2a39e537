//! The BPF socket policy for upstream kernels (6.11+): an `fmod_ret` program on
//! `update_socket_protocol` that returns `IPPROTO_SMC` for `AF_INET`/`AF_INET6` stream sockets
//! created in the network namespaces listed in its map (keyed by namespace cookie). The program
//! is `smc_policy.bpf.c`, compiled by `build.rs` with clang and loaded with libbpf (CO-RE).
//!
//! The link and the map can be pinned in bpffs (`/sys/fs/bpf/erdma-smc/`) so the policy survives
//! agent restarts and `smcr-init` can add its own namespace to the agent's map.

use crate::configure::SocketPolicy;
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, ObjectBuilder, PrintLevel};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The compiled policy.
pub static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/smc_policy.bpf.o"));
/// A program the verifier rejects (tests of the rejection path).
#[doc(hidden)]
pub static REJECTED_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rejected.bpf.o"));

pub use erdma_model::names::BPF_PIN_DIR as PIN_DIR;
/// File name of the pinned map in the pin directory.
pub const MAP_PIN: &str = "smc_netns";
/// File name of the pinned link.
pub const LINK_PIN: &str = "smc_policy_link";
const PROG_NAME: &str = "smc_policy";

/// The policy could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The kernel refused the program (verifier, missing BTF/hook, no JIT, no permission).
    #[error("the kernel rejected the SMC BPF policy: {error}{log}. Fix: {}", load_fix(*denied))]
    Load {
        /// libbpf's error.
        error: String,
        /// The kernel refused before verifying (EPERM): tracing programs are not allowed here
        /// (missing CAP_BPF/CAP_PERFMON, or a sandbox/LSM that forbids BPF trampolines).
        denied: bool,
        /// The end of the verifier / libbpf log, `; log: …`, when there was one.
        log: String,
    },
    /// Attaching to `update_socket_protocol` failed.
    #[error(
        "attaching the SMC BPF policy to update_socket_protocol failed: {0}. Fix: kernel 6.6+ with CONFIG_MPTCP and BPF trampolines"
    )]
    Attach(String),
    /// A map operation failed.
    #[error("SMC BPF policy map: {0}")]
    Map(String),
    /// Pinning or opening pins failed.
    #[error(
        "bpffs {path}: {error}. Fix: mount bpffs (`mount -t bpf bpf /sys/fs/bpf`) and give the container /sys/fs/bpf"
    )]
    Pin {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
}

/// libbpf's messages during a load, kept for the error text.
static LOG: Mutex<String> = Mutex::new(String::new());

fn capture(_level: PrintLevel, msg: String) {
    if let Ok(mut log) = LOG.lock() {
        log.push_str(&msg);
    }
}

fn log_tail() -> String {
    let log = LOG.lock().map(|l| l.clone()).unwrap_or_default();
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    // The verifier's reason ("R0 invalid mem access …") can sit above its statistics and, on
    // newer kernels, a "Suggestion:" paragraph: keep the reason lines, then the last few lines.
    const REASONS: &[&str] = &[
        "invalid",
        "not allowed",
        "unknown",
        "cannot",
        "unbounded",
        "misaligned",
    ];
    let mut keep: Vec<&str> = lines
        .iter()
        .filter(|l| REASONS.iter().any(|r| l.contains(r)))
        .take(2)
        .copied()
        .collect();
    for l in &lines[lines.len().saturating_sub(4)..] {
        if !keep.contains(l) {
            keep.push(l);
        }
    }
    format!("; log: {}", keep.join(" | "))
}

fn load_fix(denied: bool) -> &'static str {
    if denied {
        "the kernel refused tracing BPF programs before verifying them (EPERM): run the agent with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN on a host whose kernel/sandbox allows fentry/fmod_ret programs; SMC-R pods are reported unsupported meanwhile"
    } else {
        "needs Linux 6.6+ with CONFIG_MPTCP, BTF (/sys/kernel/btf/vmlinux) and a BPF JIT; SMC-R pods are reported unsupported meanwhile"
    }
}

fn load_error(e: libbpf_rs::Error) -> PolicyError {
    PolicyError::Load {
        // EPERM: refused before verification. EACCES (same kind) is the verifier saying no.
        denied: e.kind() == libbpf_rs::ErrorKind::PermissionDenied
            && e.to_string().contains("(os error 1)"),
        error: e.to_string(),
        log: log_tail(),
    }
}

impl PolicyError {
    /// True when the kernel refused tracing programs outright (EPERM before verification).
    pub fn denied(&self) -> bool {
        matches!(self, PolicyError::Load { denied: true, .. })
    }
}

/// The loaded policy: the attached link (absent when opened from a pin) and the map.
pub struct BpfSocketPolicy {
    link: Option<Link>,
    map: MapHandle,
}

impl std::fmt::Debug for BpfSocketPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfSocketPolicy")
            .field("attached_here", &self.link.is_some())
            .finish()
    }
}

impl BpfSocketPolicy {
    /// Loads the built-in program and attaches it. The program detaches when this value is
    /// dropped, unless it was pinned.
    pub fn load() -> Result<Self, PolicyError> {
        Self::load_object(OBJECT)
    }

    /// Loads a compiled policy object (the built-in one, or a test fixture).
    pub fn load_object(object: &[u8]) -> Result<Self, PolicyError> {
        if object.is_empty() {
            return Err(PolicyError::Load {
                error: "this binary was built without clang, so it has no BPF policy object".into(),
                denied: false,
                log: String::new(),
            });
        }
        static LOADING: Mutex<()> = Mutex::new(());
        let _one_at_a_time = LOADING.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(mut l) = LOG.lock() {
            l.clear();
        }
        let previous = libbpf_rs::set_print(Some((PrintLevel::Info, capture)));
        let loaded = (|| {
            let open = ObjectBuilder::default()
                .open_memory(object)
                .map_err(load_error)?;
            open.load().map_err(load_error)
        })();
        libbpf_rs::set_print(previous);
        let obj = loaded?;
        let prog = obj
            .progs_mut()
            .find(|p| p.name() == PROG_NAME)
            .ok_or_else(|| PolicyError::Load {
                error: format!("object has no program {PROG_NAME}"),
                denied: false,
                log: String::new(),
            })?;
        let link = prog
            .attach_trace()
            .map_err(|e| PolicyError::Attach(e.to_string()))?;
        let map = obj
            .maps()
            .find(|m| m.name() == MAP_PIN)
            .ok_or_else(|| PolicyError::Map(format!("object has no map {MAP_PIN}")))?;
        let map = MapHandle::try_from(&map).map_err(|e| PolicyError::Map(e.to_string()))?;
        Ok(BpfSocketPolicy {
            link: Some(link),
            map,
        })
    }

    /// Pins the link and the map under `dir` (created if needed), so the policy outlives this
    /// process and other processes (`smcr-init`) can open the map.
    pub fn pin(&mut self, dir: &Path) -> Result<(), PolicyError> {
        let pin_err = |path: &Path| {
            let path = path.to_path_buf();
            move |e: libbpf_rs::Error| PolicyError::Pin {
                path,
                error: e.to_string(),
            }
        };
        std::fs::create_dir_all(dir).map_err(|e| PolicyError::Pin {
            path: dir.to_path_buf(),
            error: e.to_string(),
        })?;
        let map_path = dir.join(MAP_PIN);
        self.map.pin(&map_path).map_err(pin_err(&map_path))?;
        if let Some(link) = self.link.as_mut() {
            let link_path = dir.join(LINK_PIN);
            link.pin(&link_path).map_err(pin_err(&link_path))?;
        }
        Ok(())
    }

    /// Opens the map a previous load pinned under `dir` (agent restart, `smcr-init`). The
    /// program stays attached through its pinned link.
    pub fn open_pinned(dir: &Path) -> Result<Self, PolicyError> {
        let link_path = dir.join(LINK_PIN);
        if !link_path.exists() {
            return Err(PolicyError::Pin {
                path: link_path,
                error: "no pinned SMC policy link (the agent has not loaded the policy)".into(),
            });
        }
        let map_path = dir.join(MAP_PIN);
        let map = MapHandle::from_pinned_path(&map_path).map_err(|e| PolicyError::Pin {
            path: map_path,
            error: e.to_string(),
        })?;
        Ok(BpfSocketPolicy { link: None, map })
    }

    /// Removes the pins under `dir`; the program detaches once no process holds the link (the
    /// kernel frees the link from a work queue, so it takes effect within moments, not at once).
    pub fn unpin(dir: &Path) -> Result<(), PolicyError> {
        for name in [LINK_PIN, MAP_PIN] {
            let p = dir.join(name);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(PolicyError::Pin {
                        path: p,
                        error: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether this value holds the attached link (false when opened from pins).
    pub fn attached_here(&self) -> bool {
        self.link.is_some()
    }

    fn present(&self, cookie: u64) -> Result<bool, String> {
        self.map
            .lookup(&cookie.to_ne_bytes(), MapFlags::ANY)
            .map(|v| v.is_some())
            .map_err(|e| format!("lookup of netns cookie {cookie}: {e}"))
    }
}

impl SocketPolicy for BpfSocketPolicy {
    fn enable(&self, netns_cookie: u64) -> Result<bool, String> {
        if self.present(netns_cookie)? {
            return Ok(false);
        }
        self.map
            .update(&netns_cookie.to_ne_bytes(), &[1], MapFlags::ANY)
            .map_err(|e| format!("adding netns cookie {netns_cookie}: {e}"))?;
        Ok(true)
    }

    fn disable(&self, netns_cookie: u64) -> Result<bool, String> {
        if !self.present(netns_cookie)? {
            return Ok(false);
        }
        self.map
            .delete(&netns_cookie.to_ne_bytes())
            .map_err(|e| format!("removing netns cookie {netns_cookie}: {e}"))?;
        Ok(true)
    }

    fn enabled(&self) -> Result<Vec<u64>, String> {
        let mut out: Vec<u64> = self
            .map
            .keys()
            .filter_map(|k| k.try_into().ok().map(u64::from_ne_bytes))
            .collect();
        out.sort_unstable();
        Ok(out)
    }
}

/// Keeps `AsFd` in scope for callers that want the map's descriptor.
impl AsFd for BpfSocketPolicy {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.map.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_object_is_a_clear_error() {
        let e = BpfSocketPolicy::load_object(b"not an ELF").unwrap_err();
        assert!(matches!(e, PolicyError::Load { .. }), "{e}");
        assert!(!e.denied(), "{e}");
    }

    /// Tests that need a kernel which loads tracing BPF programs: `#[ignore]`d, run with
    /// `--ignored` in the lab VMs (`crates/erdma-smc/lab/run-smcr.sh`); `scripts/test.sh` leaves
    /// every `::lab::` module to the lab.
    mod lab {
        use super::*;
        use crate::netns::{current_cookie, run_in};
        use crate::testing::private_netns;
        use std::os::fd::{FromRawFd, OwnedFd};

        /// Loads the policy on this kernel, or fails the test saying what is missing: these tests
        /// are `#[ignore]`d and run only where the kernel loads tracing BPF programs (the lab VMs).
        fn load_or_fail() -> BpfSocketPolicy {
            assert!(
                !OBJECT.is_empty(),
                "needs the BPF object: build with clang, libbpf-dev and libelf-dev installed"
            );
            BpfSocketPolicy::load().unwrap_or_else(|e| {
                panic!("needs a kernel that loads the SMC BPF policy (BTF, fmod_ret, CAP_BPF): {e}")
            })
        }

        /// socket(AF_INET, SOCK_STREAM | flags, proto): Ok(SO_PROTOCOL) or Err(errno).
        fn tcp_socket(flags: i32, proto: i32) -> Result<i32, i32> {
            // SAFETY: plain socket(2)/getsockopt(2) on a descriptor owned right away.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | flags, proto);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
                let owned = OwnedFd::from_raw_fd(fd);
                let mut p: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                libc::getsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&owned),
                    libc::SOL_SOCKET,
                    libc::SO_PROTOCOL,
                    (&mut p as *mut libc::c_int).cast(),
                    &mut len,
                );
                Ok(p)
            }
        }

        fn udp_ok() -> bool {
            // SAFETY: as above.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
                if fd >= 0 {
                    drop(OwnedFd::from_raw_fd(fd));
                }
                fd >= 0
            }
        }

        /// Real kernel: the policy loads, and only the listed namespace gets SMC sockets. Without
        /// the smc module (the 7.3 lab VM), the rewritten protocol makes socket() fail with
        /// EPROTONOSUPPORT, which proves the rewrite as well; with SMC (the 6.12 lab VM) the
        /// socket is an IPPROTO_SMC one.
        #[test]
        #[ignore = "needs root and a kernel that loads tracing BPF programs (BTF, fmod_ret); run with --ignored by crates/erdma-smc/lab/run-smcr.sh in the 6.12 (SMC) and 7.3 (no SMC) VMs"]
        fn real_kernel_scoping_by_netns_cookie() {
            let policy = load_or_fail();
            let smc = Path::new("/sys/module/smc").exists();
            let (pod_a, stop_a) = private_netns();
            let (pod_b, stop_b) = private_netns();
            let cookie_a = run_in(&pod_a, current_cookie).unwrap().unwrap();
            assert!(policy.enable(cookie_a).unwrap());
            assert!(!policy.enable(cookie_a).unwrap(), "idempotent");
            assert_eq!(policy.enabled().unwrap(), [cookie_a]);
            let expect_rewritten = if smc {
                Ok(256)
            } else {
                Err(libc::EPROTONOSUPPORT)
            };
            let in_a = run_in(&pod_a, || {
                (
                    tcp_socket(0, 0),
                    tcp_socket(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, libc::IPPROTO_TCP),
                    udp_ok(),
                )
            })
            .unwrap();
            assert_eq!(in_a.0, expect_rewritten, "pod A: TCP becomes SMC");
            assert_eq!(in_a.1, expect_rewritten, "pod A: flags and IPPROTO_TCP too");
            assert!(in_a.2, "pod A: UDP untouched");
            let in_b = run_in(&pod_b, || tcp_socket(0, 0)).unwrap();
            assert_eq!(in_b, Ok(libc::IPPROTO_TCP), "pod B: plain TCP");
            assert_eq!(tcp_socket(0, 0), Ok(libc::IPPROTO_TCP), "host: plain TCP");
            // Pod A removed from the policy: plain TCP again.
            assert!(policy.disable(cookie_a).unwrap());
            assert!(!policy.disable(cookie_a).unwrap());
            assert_eq!(
                run_in(&pod_a, || tcp_socket(0, 0)).unwrap(),
                Ok(libc::IPPROTO_TCP)
            );
            // Dropping the policy detaches it.
            assert!(policy.enable(cookie_a).unwrap());
            drop(policy);
            assert_eq!(
                run_in(&pod_a, || tcp_socket(0, 0)).unwrap(),
                Ok(libc::IPPROTO_TCP)
            );
            drop((stop_a, stop_b));
        }

        #[test]
        #[ignore = "needs root and a kernel that loads tracing BPF programs (BTF, fmod_ret); run with --ignored by crates/erdma-smc/lab/run-smcr.sh in the 6.12 (SMC) and 7.3 (no SMC) VMs"]
        fn a_verifier_rejection_is_a_clear_error() {
            drop(load_or_fail());
            assert!(
                !REJECTED_OBJECT.is_empty(),
                "needs the rejected BPF object (built with the policy)"
            );
            let e = BpfSocketPolicy::load_object(REJECTED_OBJECT).unwrap_err();
            assert!(!e.denied(), "{e}");
            let t = e.to_string();
            assert!(matches!(e, PolicyError::Load { .. }), "{t}");
            assert!(
                t.starts_with("the kernel rejected the SMC BPF policy"),
                "{t}"
            );
            assert!(t.contains("; log: "), "verifier log included: {t}");
            assert!(t.contains("Fix: "), "{t}");
            assert!(
                t.contains("R0 invalid mem access") || t.contains("invalid mem access"),
                "verifier reason shown: {t}"
            );
        }

        #[test]
        #[ignore = "needs root, a bpffs mount and a kernel that loads tracing BPF programs (BTF, fmod_ret); run with --ignored by crates/erdma-smc/lab/run-smcr.sh in the 6.12 (SMC) and 7.3 (no SMC) VMs"]
        fn pins_survive_the_loader_and_are_shared() {
            drop(load_or_fail());
            let d = tempfile::tempdir().unwrap();
            let fs = d.path().join("bpffs");
            std::fs::create_dir(&fs).unwrap();
            let src = std::ffi::CString::new("bpf").unwrap();
            let dst = std::ffi::CString::new(fs.to_str().unwrap()).unwrap();
            // SAFETY: mount(2) with valid C strings.
            let rc = unsafe {
                libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    src.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            assert_eq!(
                rc,
                0,
                "needs to mount bpffs (root): {}",
                std::io::Error::last_os_error()
            );
            let result = std::panic::catch_unwind(|| {
                let dir = fs.join("erdma-smc");
                let missing = BpfSocketPolicy::open_pinned(&dir).unwrap_err();
                assert!(
                    missing.to_string().contains("has not loaded the policy"),
                    "{missing}"
                );
                let mut p = BpfSocketPolicy::load().unwrap();
                p.pin(&dir).unwrap();
                let (ns, stop) = private_netns();
                let cookie = run_in(&ns, current_cookie).unwrap().unwrap();
                drop(p); // the pinned link keeps the program attached
                let other = BpfSocketPolicy::open_pinned(&dir).unwrap();
                assert!(!other.attached_here());
                assert!(other.enable(cookie).unwrap());
                assert_ne!(
                    run_in(&ns, || tcp_socket(0, 0)).unwrap(),
                    Ok(libc::IPPROTO_TCP),
                    "still attached through the pin"
                );
                drop(other);
                BpfSocketPolicy::unpin(&dir).unwrap();
                // The kernel frees an unpinned link from a work queue: allow it a moment.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                let mut got = run_in(&ns, || tcp_socket(0, 0)).unwrap();
                while got != Ok(libc::IPPROTO_TCP) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    got = run_in(&ns, || tcp_socket(0, 0)).unwrap();
                }
                assert_eq!(got, Ok(libc::IPPROTO_TCP), "unpinned: detached");
                drop(stop);
            });
            // SAFETY: umount2(2) of the bpffs mounted above.
            unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
            if let Err(p) = result {
                std::panic::resume_unwind(p);
            }
        }
    }
}
