//! Network namespaces: run work inside one (on a dedicated thread, so the caller's namespace never
//! changes), identify one (inode and kernel cookie), and tell whether it is the host's.
//!
//! The generic-netlink and `smc_diag` sockets, `/proc/sys/net` and `socket()` all act on the
//! namespace of the *calling thread*, so a pod is configured by doing that work in a thread that
//! joined the pod's namespace with `setns`.

use nix::sched::{CloneFlags, setns};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `SO_NETNS_COOKIE` (Linux 5.14+; not exported by every libc version).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The identity of a network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NetnsId {
    /// Device of the nsfs inode.
    pub dev: u64,
    /// Inode of the namespace (what `ls -l /proc/PID/ns/net` shows).
    pub inode: u64,
}

/// A namespace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file does not exist (the pod is gone, or the path is wrong).
    #[error(
        "network namespace {path} is gone (no such file): the pod was removed before it could be configured; nothing to do"
    )]
    Gone {
        /// The path.
        path: PathBuf,
    },
    /// Opening or joining the namespace failed.
    #[error(
        "network namespace {path}: {what}: {source}. Fix: run as root with CAP_SYS_ADMIN and access to the host's /proc and /var/run/netns"
    )]
    Io {
        /// The path.
        path: PathBuf,
        /// What was attempted.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The worker thread panicked.
    #[error("network namespace {path}: the worker thread panicked")]
    Panicked {
        /// The path.
        path: PathBuf,
    },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> NetnsError {
    let path = path.to_path_buf();
    move |source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            NetnsError::Gone { path }
        } else {
            NetnsError::Io { path, what, source }
        }
    }
}

/// The identity of the namespace file at `path` (e.g. `/proc/123/ns/net`, `/var/run/netns/cni-…`).
pub fn id_of(path: &Path) -> Result<NetnsId, NetnsError> {
    let m = std::fs::metadata(path).map_err(io_err(path, "stat"))?;
    Ok(NetnsId {
        dev: m.dev(),
        inode: m.ino(),
    })
}

/// Runs `f` on a new thread that joined the network namespace at `path`; the caller's namespace is
/// untouched. `NetnsError::Gone` when the namespace no longer exists.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = std::fs::File::open(path).map_err(io_err(path, "open"))?;
    let p = path.to_path_buf();
    let joined = std::thread::Builder::new()
        .name("erdma-netns".into())
        .spawn(move || -> Result<T, NetnsError> {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Io {
                path: p,
                what: "setns",
                source: std::io::Error::from(e),
            })?;
            Ok(f())
        })
        .map_err(io_err(path, "spawn a thread"))?
        .join();
    joined.map_err(|_| NetnsError::Panicked {
        path: path.to_path_buf(),
    })?
}

/// The kernel's cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`), the key
/// the BPF socket policy matches on. Unlike inodes, cookies are never reused.
pub fn current_cookie() -> std::io::Result<u64> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let s = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(std::io::Error::from)?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `s` is an open socket; `cookie`/`len` are valid for writes of the given size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// True when `path` is the same namespace as `host` (by default `/proc/1/ns/net`, the node's
/// namespace when the agent runs with `hostPID`). Host-network pods are never configured.
pub fn is_same(path: &Path, host: &Path) -> Result<bool, NetnsError> {
    Ok(id_of(path)? == id_of(host)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::private_netns;

    #[test]
    fn runs_inside_and_leaves_the_caller_alone() {
        let (ns, stop) = private_netns();
        let ours = current_cookie().unwrap();
        let theirs = run_in(&ns, current_cookie).unwrap().unwrap();
        assert_ne!(ours, theirs);
        assert_eq!(
            current_cookie().unwrap(),
            ours,
            "caller's namespace unchanged"
        );
        assert_eq!(run_in(&ns, current_cookie).unwrap().unwrap(), theirs);
        assert!(!is_same(&ns, Path::new("/proc/self/ns/net")).unwrap());
        assert!(
            is_same(
                Path::new("/proc/self/ns/net"),
                Path::new("/proc/thread-self/ns/net")
            )
            .unwrap()
        );
        // The namespace file identity is the one the thread sees.
        let inode = run_in(&ns, || id_of(Path::new("/proc/thread-self/ns/net")))
            .unwrap()
            .unwrap();
        assert_eq!(inode, id_of(&ns).unwrap());
        drop(stop);
    }

    #[test]
    fn a_missing_namespace_is_gone() {
        let e = run_in(Path::new("/proc/self/task/999999999/ns/net"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Gone { .. }), "{e}");
        assert!(e.to_string().contains("is gone"), "{e}");
        assert!(matches!(
            id_of(Path::new("/nonexistent/ns")),
            Err(NetnsError::Gone { .. })
        ));
    }
}
