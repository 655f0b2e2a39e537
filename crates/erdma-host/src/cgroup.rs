//! The node's cgroup file system: which cgroup version it runs, and the `rdma.max` files of the
//! rdma controller's cgroup v1 hierarchy.
//!
//! The version decides how a container's `rdma.max` can be set: on cgroup v2 (one unified
//! hierarchy) the runtime writes it from the OCI spec's `linux.resources.unified`; on cgroup v1
//! and hybrid hosts runc refuses `unified` outright, and the rdma controller has its own
//! hierarchy (`<root>/rdma`) whose container cgroups runc creates but never limits.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// `statfs` magic of a cgroup v2 file system (`CGROUP2_SUPER_MAGIC`).
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `statfs` magic of a cgroup v1 controller hierarchy (`CGROUP_SUPER_MAGIC`).
pub const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
/// `statfs` magic of tmpfs, what a v1 or hybrid host mounts at `/sys/fs/cgroup`.
pub const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The cgroup version of a host, as runc tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One controller hierarchy per mount (tmpfs at the root).
    V1,
    /// v1 controller hierarchies plus an empty v2 hierarchy at `<root>/unified` (systemd's
    /// hybrid mode); runc treats it as v1.
    Hybrid,
    /// The unified hierarchy at the root.
    V2,
}

impl CgroupVersion {
    /// `v1`, `hybrid` or `v2`.
    pub fn name(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::Hybrid => "hybrid",
            CgroupVersion::V2 => "v2",
        }
    }

    /// Whether a runtime accepts `linux.resources.unified` on this host (runc: v2 only).
    pub fn takes_unified(self) -> bool {
        self == CgroupVersion::V2
    }
}

/// What a host's cgroup root holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The version.
    pub version: CgroupVersion,
    /// Whether the rdma controller has its v1 hierarchy at `<root>/rdma` (v1 and hybrid hosts).
    pub rdma_hierarchy: bool,
}

/// Why the cgroup root could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `statfs` failed.
    #[error("cgroup root {path}: {source}")]
    Statfs {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Neither a cgroup v2 mount nor a tmpfs of v1 hierarchies.
    #[error(
        "cgroup root {path} is neither cgroup2 nor a tmpfs of cgroup v1 hierarchies (file system magic {magic:#x}); the agent reads the host's cgroups through /proc/1/root (needs hostPID)"
    )]
    NotCgroup {
        /// The path.
        path: PathBuf,
        /// Its `statfs` magic.
        magic: i64,
    },
}

fn magic(path: &Path) -> io::Result<i64> {
    let st = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    // The field's type differs between libcs and architectures.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.filesystem_type().0 as i64)
}

/// Reads the layout of the cgroup root `root` (`/sys/fs/cgroup`): cgroup2 there is v2; a tmpfs
/// is v1, or hybrid when `<root>/unified` is cgroup2; the rdma hierarchy is `<root>/rdma` when it
/// is a cgroup v1 mount.
pub fn detect(root: &Path) -> Result<CgroupLayout, CgroupError> {
    let at_root = magic(root).map_err(|source| CgroupError::Statfs {
        path: root.to_path_buf(),
        source,
    })?;
    let is = |rel: &str, want: i64| magic(&root.join(rel)).is_ok_and(|m| m == want);
    match at_root {
        CGROUP2_SUPER_MAGIC => Ok(CgroupLayout {
            version: CgroupVersion::V2,
            rdma_hierarchy: false,
        }),
        TMPFS_MAGIC => Ok(CgroupLayout {
            version: if is("unified", CGROUP2_SUPER_MAGIC) {
                CgroupVersion::Hybrid
            } else {
                CgroupVersion::V1
            },
            rdma_hierarchy: is("rdma", CGROUP_SUPER_MAGIC),
        }),
        magic => Err(CgroupError::NotCgroup {
            path: root.to_path_buf(),
            magic,
        }),
    }
}

/// The node's cgroups, as far as rdma limits need them. Paths are container cgroups relative to
/// the rdma hierarchy (`kubepods/besteffort/pod1/<id>`).
pub trait CgroupFs: Send + Sync {
    /// The host's layout, read once.
    fn layout(&self) -> CgroupLayout;
    /// The text of the v1 `rdma.max` of `cgroup`.
    fn read_rdma_max(&self, cgroup: &Path) -> io::Result<String>;
    /// Writes one `rdma.max` line into the v1 cgroup `cgroup`, which must exist (the runtime
    /// created it): nothing is created.
    fn write_rdma_max(&self, cgroup: &Path, line: &str) -> io::Result<()>;
    /// The host path of `cgroup`'s `rdma.max`, for messages.
    fn rdma_max_path(&self, cgroup: &Path) -> PathBuf;
}

/// The real cgroup file system below a root (`/proc/1/root/sys/fs/cgroup`, or a directory laid
/// out like one).
#[derive(Debug, Clone)]
pub struct RootedCgroupFs {
    root: PathBuf,
    layout: CgroupLayout,
}

impl RootedCgroupFs {
    /// The cgroups at `root`, whose layout is read now ([`detect`]).
    pub fn detect(root: impl Into<PathBuf>) -> Result<Self, CgroupError> {
        let root = root.into();
        let layout = detect(&root)?;
        Ok(RootedCgroupFs { root, layout })
    }

    /// The cgroups at `root` with a layout the caller knows (a directory laid out like a v1 host).
    pub fn with_layout(root: impl Into<PathBuf>, layout: CgroupLayout) -> Self {
        RootedCgroupFs {
            root: root.into(),
            layout,
        }
    }
}

impl CgroupFs for RootedCgroupFs {
    fn layout(&self) -> CgroupLayout {
        self.layout
    }

    fn read_rdma_max(&self, cgroup: &Path) -> io::Result<String> {
        std::fs::read_to_string(self.rdma_max_path(cgroup))
    }

    fn write_rdma_max(&self, cgroup: &Path, line: &str) -> io::Result<()> {
        // The kernel takes one device per write(2), so the line goes in one call; no O_CREAT: a
        // missing cgroup is an error, never a file made here.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.rdma_max_path(cgroup))?;
        let written = f.write(line.as_bytes())?;
        if written != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{written} of {} bytes written", line.len()),
            ));
        }
        Ok(())
    }

    fn rdma_max_path(&self, cgroup: &Path) -> PathBuf {
        self.root.join("rdma").join(cgroup).join("rdma.max")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file system type `/proc/self/mountinfo` gives the mount at `path` (its last entry).
    fn fstype_of_mount(path: &str) -> Option<String> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        text.lines()
            .filter_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let mount_point = left.split(' ').nth(4)?;
                let fstype = right.split(' ').next()?;
                (mount_point == path).then(|| fstype.to_string())
            })
            .next_back()
    }

    #[test]
    fn this_hosts_version_agrees_with_its_mount_table() {
        let fstype = fstype_of_mount("/sys/fs/cgroup")
            .expect("/sys/fs/cgroup is a mount point in /proc/self/mountinfo");
        let layout = detect(Path::new("/sys/fs/cgroup")).expect("the cgroup root reads");
        match fstype.as_str() {
            "cgroup2" => assert_eq!(layout.version, CgroupVersion::V2),
            "tmpfs" => {
                let hybrid =
                    fstype_of_mount("/sys/fs/cgroup/unified").as_deref() == Some("cgroup2");
                let want = if hybrid {
                    CgroupVersion::Hybrid
                } else {
                    CgroupVersion::V1
                };
                assert_eq!(layout.version, want);
                assert_eq!(
                    layout.rdma_hierarchy,
                    fstype_of_mount("/sys/fs/cgroup/rdma").as_deref() == Some("cgroup")
                );
            }
            other => panic!("/sys/fs/cgroup is {other}"),
        }
    }

    #[test]
    fn a_directory_that_is_no_cgroup_root_is_refused_with_its_magic() {
        let dir = tempfile::tempdir().unwrap();
        let e = detect(dir.path()).unwrap_err();
        assert!(matches!(e, CgroupError::NotCgroup { .. }), "{e}");
        assert!(e.to_string().contains("neither cgroup2"), "{e}");
        let e = detect(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, CgroupError::Statfs { .. }), "{e}");
    }

    #[test]
    fn rdma_max_is_written_into_an_existing_cgroup_only() {
        let dir = tempfile::tempdir().unwrap();
        let cg = Path::new("kubepods/besteffort/pod1/c1");
        std::fs::create_dir_all(dir.path().join("rdma").join(cg)).unwrap();
        std::fs::write(dir.path().join("rdma").join(cg).join("rdma.max"), "").unwrap();
        let fs = RootedCgroupFs::with_layout(
            dir.path(),
            CgroupLayout {
                version: CgroupVersion::V1,
                rdma_hierarchy: true,
            },
        );
        fs.write_rdma_max(cg, "erdma_0 hca_handle=2").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("rdma/kubepods/besteffort/pod1/c1/rdma.max"))
                .unwrap(),
            "erdma_0 hca_handle=2"
        );
        assert_eq!(fs.read_rdma_max(cg).unwrap(), "erdma_0 hca_handle=2");
        let gone = Path::new("kubepods/besteffort/pod1/c2");
        let e = fs.write_rdma_max(gone, "erdma_0 hca_handle=2").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(!dir.path().join("rdma").join(gone).exists());
    }
}
