//! What the kernel offers for transparent SMC-R, and the pure choice of a mechanism from it.
//!
//! Probes run in the calling thread's network namespace (use [`crate::netns::run_in`] for a pod).

use crate::pnet::{PnetClient, PnetError};
use crate::sysctl::{SysctlTree, TCP2SMC};
use serde::Serialize;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// `IPPROTO_SMC` (Linux 6.11+).
pub const IPPROTO_SMC: i32 = 256;
/// The kernel function the BPF policy attaches to (`fmod_ret`), since 6.6 with `CONFIG_MPTCP`.
pub const BPF_HOOK: &str = "update_socket_protocol";

/// Capabilities of the running kernel, as seen from one network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// `uname -r`.
    pub kernel: String,
    /// SMC is loaded (the `SMC_PNETID` generic-netlink family resolves).
    pub smc: bool,
    /// Why SMC is not usable, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smc_detail: Option<String>,
    /// `net.smc.tcp2smc` exists (Alibaba Cloud Linux 3).
    pub tcp2smc: bool,
    /// `socket(AF_INET, SOCK_STREAM, IPPROTO_SMC)` works (6.11+).
    pub ipproto_smc: bool,
    /// The `update_socket_protocol` hook and kernel BTF exist (6.6+, `CONFIG_MPTCP`).
    pub bpf_hook: bool,
    /// Why the hook is not usable, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpf_detail: Option<String>,
}

/// How SMC is switched on for a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// `net.smc.tcp2smc=1` in the namespace (Alibaba Cloud Linux 3).
    Tcp2smc,
    /// The agent's BPF program on `update_socket_protocol`, keyed by the namespace cookie.
    BpfPolicy,
}

/// Which mechanism the operator allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MechanismChoice {
    /// `tcp2smc` when present, else the BPF policy.
    #[default]
    Auto,
    /// Only `tcp2smc`.
    Tcp2smc,
    /// Only the BPF policy.
    Bpf,
}

impl std::str::FromStr for MechanismChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(MechanismChoice::Auto),
            "tcp2smc" => Ok(MechanismChoice::Tcp2smc),
            "bpf" => Ok(MechanismChoice::Bpf),
            _ => Err(format!(
                "SMC mechanism {s:?} is not one of auto, tcp2smc, bpf"
            )),
        }
    }
}

/// SMC-R cannot be enabled on this kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("SMC unsupported: {reason}")]
pub struct Unsupported {
    /// Why, with the fix.
    pub reason: String,
}

/// Picks the mechanism (pure). `policy_loaded` says whether the agent holds a loaded BPF policy.
pub fn choose(
    caps: &Capabilities,
    choice: MechanismChoice,
    policy_loaded: bool,
) -> Result<Mechanism, Unsupported> {
    let k = &caps.kernel;
    if !caps.smc {
        return Err(Unsupported {
            reason: caps.smc_detail.clone().unwrap_or_else(|| {
                format!("kernel {k} has no SMC. Fix: `modprobe smc` (kernel with CONFIG_SMC)")
            }),
        });
    }
    let bpf_ok = caps.ipproto_smc && caps.bpf_hook && policy_loaded;
    let bpf_why = || {
        let mut why = Vec::new();
        if !caps.ipproto_smc {
            why.push("IPPROTO_SMC sockets are not supported (needs Linux 6.11+)".to_string());
        }
        if !caps.bpf_hook {
            why.push(caps.bpf_detail.clone().unwrap_or_else(|| {
                format!("the {BPF_HOOK} BPF hook is missing (needs Linux 6.6+ with CONFIG_MPTCP and BTF)")
            }));
        }
        if !policy_loaded {
            why.push("the agent has no loaded BPF socket policy".to_string());
        }
        why.join("; ")
    };
    let no_tcp2smc = "net.smc.tcp2smc is absent (only Alibaba Cloud Linux 3 kernels have it; removed in Alibaba Cloud Linux 4)";
    match choice {
        MechanismChoice::Tcp2smc if caps.tcp2smc => Ok(Mechanism::Tcp2smc),
        MechanismChoice::Tcp2smc => Err(Unsupported {
            reason: format!("kernel {k}: {no_tcp2smc}"),
        }),
        MechanismChoice::Bpf if bpf_ok => Ok(Mechanism::BpfPolicy),
        MechanismChoice::Bpf => Err(Unsupported {
            reason: format!("kernel {k}: {}", bpf_why()),
        }),
        MechanismChoice::Auto if caps.tcp2smc => Ok(Mechanism::Tcp2smc),
        MechanismChoice::Auto if bpf_ok => Ok(Mechanism::BpfPolicy),
        MechanismChoice::Auto => Err(Unsupported {
            reason: format!("kernel {k}: {no_tcp2smc}, and {}", bpf_why()),
        }),
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Whether `socket(AF_INET, SOCK_STREAM, IPPROTO_SMC)` succeeds in this namespace.
pub fn ipproto_smc_works() -> bool {
    // SAFETY: plain socket(2); the fd is owned and closed right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            IPPROTO_SMC,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    true
}

/// Whether a plain `socket(AF_INET, SOCK_STREAM, 0)` made in this namespace is an SMC socket
/// (`SO_PROTOCOL` reads `IPPROTO_SMC`): what the agent's BPF socket policy does for a namespace
/// it enabled. Needs no privilege, so an unprivileged container can check its own namespace.
pub fn tcp_sockets_become_smc() -> std::io::Result<bool> {
    // SAFETY: plain socket(2); the fd is owned below and closed on drop.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut protocol: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `protocol` and `len` outlive the call and `len` is the size of `protocol`.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&owned),
            libc::SOL_SOCKET,
            libc::SO_PROTOCOL,
            (&mut protocol as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(protocol == IPPROTO_SMC)
}

/// Whether `kallsyms` (text) lists the BPF hook function and `btf` exists.
pub fn bpf_hook_present(kallsyms: &Path, btf: &Path) -> Result<(), String> {
    if !btf.exists() {
        return Err(format!(
            "{} is missing (kernel without CONFIG_DEBUG_INFO_BTF): BPF programs cannot attach to {BPF_HOOK}",
            btf.display()
        ));
    }
    let found = kallsyms_lists(kallsyms, BPF_HOOK)
        .map_err(|e| format!("cannot read {}: {e}", kallsyms.display()))?;
    if found {
        Ok(())
    } else {
        Err(format!(
            "kernel has no {BPF_HOOK} (needs Linux 6.6+ with CONFIG_MPTCP)"
        ))
    }
}

/// Whether a `kallsyms` file lists symbol `name` (its third field, followed by the end of the
/// line or a module tab). Streams the file through one buffer: a distribution kernel's
/// `/proc/kallsyms` is several MB, and the agent probes it while it starts.
fn kallsyms_lists(kallsyms: &Path, name: &str) -> std::io::Result<bool> {
    use std::io::Read;
    let needle = format!(" {name}");
    let finder = memchr::memmem::Finder::new(needle.as_bytes());
    let mut f = std::fs::File::open(kallsyms)?;
    let mut buf = vec![0u8; 256 * 1024];
    // Bytes kept from the previous read: a match may straddle two reads, and its next byte is
    // needed to tell `name` from `name_longer`.
    let mut kept = 0;
    loop {
        let n = f.read(&mut buf[kept..])?;
        let end = kept + n;
        let hay = &buf[..end];
        let mut from = 0;
        while let Some(i) = finder.find(&hay[from..]) {
            let at = from + i;
            match hay.get(at + needle.len()) {
                Some(b'\n' | b'\t') => return Ok(true),
                Some(_) => from = at + 1,
                None if n == 0 => return Ok(true),
                None => break,
            }
        }
        if n == 0 {
            return Ok(false);
        }
        // Keep the tail that could start a match.
        let keep = needle.len().min(end);
        buf.copy_within(end - keep..end, 0);
        kept = keep;
    }
}

/// Probes the running kernel from the calling thread's namespace, reading sysctls from `sysctl`.
pub fn probe(sysctl: &SysctlTree) -> Capabilities {
    let (smc, smc_detail) = match PnetClient::open() {
        Ok(_) => (true, None),
        Err(e @ PnetError::SmcUnavailable) => (false, Some(e.to_string())),
        Err(e) => (false, Some(format!("cannot query SMC: {e}"))),
    };
    let hook = bpf_hook_present(
        Path::new("/proc/kallsyms"),
        Path::new("/sys/kernel/btf/vmlinux"),
    );
    Capabilities {
        kernel: kernel_release(),
        smc,
        smc_detail: smc_detail.map(|d| {
            d.strip_prefix("SMC unavailable: ")
                .map(str::to_string)
                .unwrap_or(d)
        }),
        tcp2smc: sysctl.exists(TCP2SMC),
        ipproto_smc: ipproto_smc_works(),
        bpf_hook: hook.is_ok(),
        bpf_detail: hook.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn caps(smc: bool, tcp2smc: bool, ipproto: bool, hook: bool) -> Capabilities {
        Capabilities {
            kernel: "6.12.95".into(),
            smc,
            smc_detail: None,
            tcp2smc,
            ipproto_smc: ipproto,
            bpf_hook: hook,
            bpf_detail: None,
        }
    }

    #[test]
    fn choice_matrix() {
        use Mechanism::*;
        use MechanismChoice as C;
        // Alibaba Cloud Linux 3: tcp2smc wins in auto.
        assert_eq!(
            choose(&caps(true, true, false, false), C::Auto, false),
            Ok(Tcp2smc)
        );
        assert_eq!(
            choose(&caps(true, true, true, true), C::Auto, true),
            Ok(Tcp2smc)
        );
        // Upstream 6.12: BPF when the policy is loaded.
        assert_eq!(
            choose(&caps(true, false, true, true), C::Auto, true),
            Ok(BpfPolicy)
        );
        assert_eq!(
            choose(&caps(true, true, true, true), C::Bpf, true),
            Ok(BpfPolicy)
        );
        let e = choose(&caps(true, false, true, true), C::Auto, false).unwrap_err();
        assert!(e.to_string().contains("no loaded BPF socket policy"), "{e}");
        // 6.1: SMC but neither mechanism.
        let e = choose(&caps(true, false, false, true), C::Auto, true).unwrap_err();
        let t = e.to_string();
        assert!(t.starts_with("SMC unsupported: kernel 6.12.95"), "{t}");
        assert!(t.contains("tcp2smc is absent") && t.contains("6.11"), "{t}");
        let e = choose(&caps(true, false, true, true), C::Tcp2smc, true).unwrap_err();
        assert!(e.to_string().contains("Alibaba Cloud Linux 4"), "{e}");
        let e = choose(&caps(true, true, true, false), C::Bpf, true).unwrap_err();
        assert!(e.to_string().contains("CONFIG_MPTCP"), "{e}");
        // No SMC at all: that is the reason, whatever else there is.
        let e = choose(&caps(false, true, true, true), C::Auto, true).unwrap_err();
        assert!(e.to_string().contains("modprobe smc"), "{e}");
        assert_eq!("bpf".parse::<MechanismChoice>(), Ok(C::Bpf));
        assert!(
            "ebpf"
                .parse::<MechanismChoice>()
                .unwrap_err()
                .contains("auto, tcp2smc, bpf")
        );
    }

    #[test]
    fn bpf_hook_detection_from_files() {
        let d = tempfile::tempdir().unwrap();
        let ks = d.path().join("kallsyms");
        let btf = d.path().join("vmlinux");
        std::fs::write(&ks, "ffffffff81e2e0b0 W update_socket_protocol\n").unwrap();
        assert!(bpf_hook_present(&ks, &btf).unwrap_err().contains("BTF"));
        std::fs::write(&btf, "").unwrap();
        assert_eq!(bpf_hook_present(&ks, &btf), Ok(()));
        std::fs::write(&ks, "ffffffff81e2e0b0 T update_socket_protocol_x\n").unwrap();
        assert!(
            bpf_hook_present(&ks, &btf)
                .unwrap_err()
                .contains("CONFIG_MPTCP")
        );
    }

    /// The streamed search agrees with a line-by-line reading wherever the name falls against
    /// the read buffer's edges, and for names that only start like it.
    #[test]
    fn kallsyms_search_across_buffer_edges() {
        let d = tempfile::tempdir().unwrap();
        let ks = d.path().join("kallsyms");
        for pad in [
            0usize,
            1,
            7,
            256 * 1024 - 30,
            256 * 1024 - 10,
            256 * 1024 + 3,
        ] {
            for (tail, want) in [
                ("update_socket_protocol\n", true),
                ("update_socket_protocol\t[mptcp]\n", true),
                ("update_socket_protocol", true),
                ("update_socket_protocol_x\n", false),
                ("update_socket_protocoX\n", false),
            ] {
                let mut text = String::new();
                while text.len() < pad {
                    text.push_str("ffffffff81000000 t some_other_symbol\n");
                }
                text.truncate(pad);
                text.push_str("\nffffffff81e2e0b0 W ");
                text.push_str(tail);
                std::fs::write(&ks, &text).unwrap();
                let by_lines = text
                    .lines()
                    .any(|l| l.split_whitespace().nth(2) == Some(BPF_HOOK));
                assert_eq!(by_lines, want, "reference, pad {pad}, {tail:?}");
                assert_eq!(
                    kallsyms_lists(&ks, BPF_HOOK).unwrap(),
                    want,
                    "pad {pad}, {tail:?}"
                );
            }
        }
    }

    /// This machine: no SMC module, so the probe says so and the choice is "SMC unsupported".
    #[test]
    fn real_probe() {
        let c = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            probe(&SysctlTree::default())
        })
        .join()
        .unwrap();
        let smc_loaded = Path::new("/sys/module/smc").exists();
        assert_eq!(c.smc, smc_loaded, "{c:?}");
        assert_eq!(c.tcp2smc, Path::new("/proc/sys/net/smc/tcp2smc").exists());
        if !smc_loaded {
            assert!(!c.ipproto_smc);
            let e = choose(&c, MechanismChoice::Auto, true)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("SMC unsupported: ") && e.contains("modprobe smc"),
                "{e}"
            );
        }
        assert!(!c.kernel.is_empty());
    }
}
