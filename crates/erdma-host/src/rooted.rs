//! Path resolution confined to a root directory, as if the root were `/`.
//!
//! sysfs is full of symlinks, some relative (`../../devices/...`) and, in captured trees, some
//! absolute (`/sys/devices/...`). Resolving them by hand keeps a fixture tree from escaping into the
//! host's real `/sys`, bounds link chains (a loop is an error, not a hang) and lets the same code
//! read the live system and a fixture.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed while resolving one path (the kernel's own limit is 40).
pub const MAX_LINK_HOPS: usize = 40;

/// A directory treated as `/`.
#[derive(Debug, Clone)]
pub struct Root {
    base: PathBuf,
    /// When the root is the live system, absolute link targets starting with this prefix
    /// (e.g. `/sys`) are re-rooted; with `None` absolute targets are taken relative to the root.
    mount_point: Option<PathBuf>,
}

impl Root {
    /// A root at `base`. Absolute symlink targets under `mount_point` (e.g. `/sys`) are mapped into
    /// `base`; other absolute targets are resolved relative to `base` too, never to the host.
    pub fn new(base: impl Into<PathBuf>, mount_point: Option<PathBuf>) -> Self {
        Root {
            base: base.into(),
            mount_point,
        }
    }

    /// The base directory.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Resolves `rel` (relative to the root) following every symlink inside the root. Returns the
    /// host path and the path relative to the root.
    pub fn resolve(&self, rel: &Path) -> io::Result<PathBuf> {
        let mut hops = 0usize;
        let mut done: Vec<OsString> = Vec::new();
        let mut todo: Vec<OsString> = components(rel).into_iter().rev().collect();
        while let Some(part) = todo.pop() {
            if part == ".." {
                done.pop();
                continue;
            }
            if part == "." || part.is_empty() {
                continue;
            }
            let mut candidate = self.base.clone();
            candidate.extend(done.iter());
            candidate.push(&part);
            match fs::symlink_metadata(&candidate) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(io::Error::other(format!(
                            "too many levels of symbolic links resolving {}",
                            rel.display()
                        )));
                    }
                    let target = fs::read_link(&candidate)?;
                    if target.is_absolute() {
                        done.clear();
                        let stripped = match &self.mount_point {
                            Some(mp) => target
                                .strip_prefix(mp)
                                .map(Path::to_path_buf)
                                .unwrap_or(target),
                            None => target,
                        };
                        todo.extend(components(&stripped).into_iter().rev());
                    } else {
                        todo.extend(components(&target).into_iter().rev());
                    }
                }
                Ok(_) => done.push(part),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Keep walking so that the caller gets a NotFound for the full path.
                    done.push(part);
                }
                Err(e) => return Err(e),
            }
        }
        let mut out = self.base.clone();
        out.extend(done.iter());
        Ok(out)
    }

    /// Like [`Root::resolve`] but returns the resolved path relative to the root.
    pub fn resolve_rel(&self, rel: &Path) -> io::Result<PathBuf> {
        let full = self.resolve(rel)?;
        Ok(full
            .strip_prefix(&self.base)
            .map(Path::to_path_buf)
            .unwrap_or_default())
    }
}

fn components(p: &Path) -> Vec<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn absolute_links_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        fs::create_dir_all(base.join("devices/pci/0000:00:05.0")).unwrap();
        fs::write(base.join("devices/pci/0000:00:05.0/numa_node"), "1\n").unwrap();
        fs::create_dir_all(base.join("class/net/eth1")).unwrap();
        symlink(
            "/sys/devices/pci/0000:00:05.0",
            base.join("class/net/eth1/device"),
        )
        .unwrap();
        let root = Root::new(base, Some(PathBuf::from("/sys")));
        let p = root
            .resolve(Path::new("class/net/eth1/device/numa_node"))
            .unwrap();
        assert_eq!(fs::read_to_string(p).unwrap(), "1\n");
        // Without a mount point, an absolute target is still resolved under the root.
        let root = Root::new(base, None);
        let p = root
            .resolve_rel(Path::new("class/net/eth1/device"))
            .unwrap();
        assert_eq!(p, PathBuf::from("sys/devices/pci/0000:00:05.0"));
    }

    #[test]
    fn link_loops_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let root = Root::new(dir.path(), None);
        let e = root.resolve(Path::new("a/x")).unwrap_err();
        assert!(e.to_string().contains("too many levels"));
    }

    #[test]
    fn dotdot_never_leaves_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path(), None);
        let p = root.resolve(Path::new("../../etc/passwd")).unwrap();
        assert!(p.starts_with(dir.path()));
    }
}
