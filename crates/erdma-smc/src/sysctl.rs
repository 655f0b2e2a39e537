//! Sysctls under a `/proc/sys` root (a fake tree in tests). Files under `/proc/sys/net` belong to
//! the network namespace of the thread that opens them, so use these inside [`crate::netns::run_in`].

use serde::Serialize;
use std::path::{Path, PathBuf};

/// `net.smc.tcp2smc` (Alibaba Cloud Linux 3 kernels only).
pub const TCP2SMC: &str = "net.smc.tcp2smc";
/// `net.ipv6.conf.all.disable_ipv6`.
pub const DISABLE_IPV6_ALL: &str = "net.ipv6.conf.all.disable_ipv6";
/// `net.ipv6.conf.default.disable_ipv6` (interfaces created later).
pub const DISABLE_IPV6_DEFAULT: &str = "net.ipv6.conf.default.disable_ipv6";

/// A sysctl operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    /// The key is malformed.
    #[error("sysctl key {0:?} is not valid (dot-separated names, no '/' or '..')")]
    BadKey(String),
    /// `/proc/sys` is mounted read-only in this mount namespace.
    #[error(
        "sysctl {key}: {path} is read-only. Fix: give the agent a writable /proc/sys (privileged container) or remount it rw"
    )]
    ReadOnly {
        /// The key.
        key: String,
        /// The file.
        path: PathBuf,
    },
    /// Any other I/O error.
    #[error("sysctl {key}: {what} {path}: {source}")]
    Io {
        /// The key.
        key: String,
        /// `read` or `write`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// What [`SysctlTree::ensure`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// The value was already right.
    Unchanged,
    /// Written; holds the previous value.
    Set {
        /// Value before the write.
        previous: String,
    },
    /// The sysctl does not exist on this kernel.
    Absent,
}

/// A `/proc/sys` tree.
#[derive(Debug, Clone)]
pub struct SysctlTree {
    root: PathBuf,
}

impl Default for SysctlTree {
    fn default() -> Self {
        SysctlTree::new("/proc/sys")
    }
}

impl SysctlTree {
    /// A tree rooted at `root` (normally `/proc/sys`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SysctlTree { root: root.into() }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of `key` (`net.smc.tcp2smc` → `<root>/net/smc/tcp2smc`).
    pub fn path_of(&self, key: &str) -> Result<PathBuf, SysctlError> {
        if key.is_empty() || key.contains('/') || key.split('.').any(|p| p.is_empty() || p == "..")
        {
            return Err(SysctlError::BadKey(key.to_string()));
        }
        Ok(key.split('.').fold(self.root.clone(), |p, s| p.join(s)))
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        self.path_of(key).map(|p| p.is_file()).unwrap_or(false)
    }

    /// The trimmed value, or `None` when the sysctl does not exist.
    pub fn read(&self, key: &str) -> Result<Option<String>, SysctlError> {
        let path = self.path_of(key)?;
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SysctlError::Io {
                key: key.to_string(),
                what: "read",
                path,
                source,
            }),
        }
    }

    /// Sets `key` to `value` unless it already has it (idempotent).
    pub fn ensure(&self, key: &str, value: &str) -> Result<Change, SysctlError> {
        let Some(previous) = self.read(key)? else {
            return Ok(Change::Absent);
        };
        if previous == value {
            return Ok(Change::Unchanged);
        }
        let path = self.path_of(key)?;
        let mut f = match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                return Err(SysctlError::ReadOnly {
                    key: key.to_string(),
                    path,
                });
            }
            Err(source) => {
                return Err(SysctlError::Io {
                    key: key.to_string(),
                    what: "open for writing",
                    path,
                    source,
                });
            }
        };
        use std::io::Write;
        f.write_all(format!("{value}\n").as_bytes())
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EROFS) => SysctlError::ReadOnly {
                    key: key.to_string(),
                    path: path.clone(),
                },
                _ => SysctlError::Io {
                    key: key.to_string(),
                    what: "write",
                    path: path.clone(),
                    source,
                },
            })?;
        Ok(Change::Set { previous })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/proc/sys` with the files an Alibaba Cloud Linux 3 kernel has.
    pub(crate) fn alinux3_tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("net/smc")).unwrap();
        std::fs::create_dir_all(d.path().join("net/ipv6/conf/all")).unwrap();
        std::fs::write(d.path().join("net/smc/tcp2smc"), "0\n").unwrap();
        std::fs::write(d.path().join("net/ipv6/conf/all/disable_ipv6"), "0\n").unwrap();
        d
    }

    #[test]
    fn ensure_is_idempotent_and_reports_absent() {
        let d = alinux3_tree();
        let t = SysctlTree::new(d.path());
        assert_eq!(
            t.path_of(TCP2SMC).unwrap(),
            d.path().join("net/smc/tcp2smc")
        );
        assert_eq!(
            t.ensure(TCP2SMC, "1").unwrap(),
            Change::Set {
                previous: "0".into()
            }
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("net/smc/tcp2smc")).unwrap(),
            "1\n"
        );
        assert_eq!(t.ensure(TCP2SMC, "1").unwrap(), Change::Unchanged);
        assert_eq!(t.ensure("net.smc.nope", "1").unwrap(), Change::Absent);
        assert!(!t.exists("net.smc.nope"));
        assert!(t.exists(TCP2SMC));
        for bad in ["", "net..smc", "net/smc", "net.smc.", "..x"] {
            assert!(
                matches!(t.path_of(bad), Err(SysctlError::BadKey(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn unwritable_file_is_an_error_naming_the_key() {
        let d = alinux3_tree();
        let t = SysctlTree::new(d.path());
        // A directory where the file should be: reads fail with a clear error.
        std::fs::create_dir_all(d.path().join("net/smc/wmem")).unwrap();
        let e = t.ensure("net.smc.wmem", "1").unwrap_err();
        assert!(e.to_string().contains("net.smc.wmem"), "{e}");
    }

    /// The real `/proc/sys` of a private namespace: this kernel has no SMC, so `tcp2smc` is absent.
    #[test]
    fn real_proc_sys_in_a_private_netns() {
        let r = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let t = SysctlTree::default();
            (
                t.read(TCP2SMC).unwrap(),
                t.read("net.ipv4.ip_forward").unwrap(),
            )
        })
        .join()
        .unwrap();
        if !Path::new("/proc/sys/net/smc").exists() {
            assert_eq!(r.0, None);
        }
        assert!(r.1.is_some());
    }
}
