//! Checking device nodes under `/dev`.

use crate::rooted::Root;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What is at a `/dev` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevNode {
    /// A character device with these numbers.
    Char {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// Something that is not a character device (a regular file in a fixture tree, a directory…).
    NotChar,
    /// Nothing.
    Missing,
}

/// Read access to a device directory. Paths are relative to the dev root (`infiniband/uverbs0`).
pub trait DevFs: Send + Sync {
    /// What is at `rel`.
    fn node(&self, rel: &Path) -> io::Result<DevNode>;
    /// The path a container sees for `rel` (`/dev/infiniband/uverbs0`).
    fn container_path(&self, rel: &Path) -> String {
        Path::new("/dev").join(rel).display().to_string()
    }
    /// The host path of `rel` (under the dev root), for messages and CDI specs.
    fn host_path(&self, rel: &Path) -> PathBuf;
}

/// The real dev directory (`/dev`, or a fixture directory).
#[derive(Debug, Clone)]
pub struct RootedDevFs {
    root: Root,
}

impl RootedDevFs {
    /// A dev tree at `base`.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        RootedDevFs {
            root: Root::new(base, Some(PathBuf::from("/dev"))),
        }
    }
}

impl DevFs for RootedDevFs {
    fn node(&self, rel: &Path) -> io::Result<DevNode> {
        let path = self.root.resolve(rel)?;
        match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => {
                let rdev = m.rdev();
                Ok(DevNode::Char {
                    major: nix::sys::stat::major(rdev) as u32,
                    minor: nix::sys::stat::minor(rdev) as u32,
                })
            }
            Ok(_) => Ok(DevNode::NotChar),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(DevNode::Missing),
            Err(e) => Err(e),
        }
    }

    fn host_path(&self, rel: &Path) -> PathBuf {
        self.root.base().join(rel)
    }
}
