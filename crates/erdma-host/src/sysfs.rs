//! Reading sysfs.

use crate::rooted::Root;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest attribute file read; sysfs attributes are at most one page.
pub const MAX_ATTR_BYTES: u64 = 64 * 1024;

/// Error reading a sysfs path. The message always names the path.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The path does not exist.
    #[error("{0} does not exist")]
    Missing(PathBuf),
    /// The content is not UTF-8 text.
    #[error("{0} is not UTF-8 text")]
    NotText(PathBuf),
    /// The file is larger than any sysfs attribute can be.
    #[error("{0} is larger than {MAX_ATTR_BYTES} bytes, not a sysfs attribute")]
    TooLarge(PathBuf),
    /// Any other I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl SysfsError {
    fn from_io(path: &Path, e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::NotFound {
            SysfsError::Missing(path.to_path_buf())
        } else {
            SysfsError::Io { path: path.to_path_buf(), source: e }
        }
    }

    /// True when the path simply does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, SysfsError::Missing(_))
    }
}

/// Read access to a sysfs tree. Paths are relative to the sysfs root (`class/infiniband`).
pub trait Sysfs: Send + Sync {
    /// Reads an attribute as text with the trailing newline removed.
    fn read_attr(&self, rel: &Path) -> Result<String, SysfsError>;
    /// Reads a symlink's target (unresolved).
    fn read_link(&self, rel: &Path) -> Result<PathBuf, SysfsError>;
    /// Lists a directory's entry names, sorted; non-UTF-8 names are skipped.
    fn list_dir(&self, rel: &Path) -> Result<Vec<String>, SysfsError>;
    /// The path (relative to the root) that `rel` resolves to after following links.
    fn canonical(&self, rel: &Path) -> Result<PathBuf, SysfsError>;
    /// Whether `rel` exists (after following links).
    fn exists(&self, rel: &Path) -> bool;
    /// A human-readable description of the root, for messages (`/sys`).
    fn describe(&self) -> String;
}

/// The real sysfs reader: a directory (the live `/sys` or a captured tree) read through
/// root-confined path resolution.
#[derive(Debug, Clone)]
pub struct RootedSysfs {
    root: Root,
}

impl RootedSysfs {
    /// Reads the tree at `base`. Absolute link targets beginning with `/sys` are mapped into it.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        RootedSysfs { root: Root::new(base, Some(PathBuf::from("/sys"))) }
    }

    /// The root directory.
    pub fn base(&self) -> &Path {
        self.root.base()
    }

    fn display(&self, rel: &Path) -> PathBuf {
        self.root.base().join(rel)
    }
}

impl Sysfs for RootedSysfs {
    fn read_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        let shown = self.display(rel);
        let path = self.root.resolve(rel).map_err(|e| SysfsError::from_io(&shown, e))?;
        let file = std::fs::File::open(&path).map_err(|e| SysfsError::from_io(&shown, e))?;
        let mut buf = Vec::new();
        file.take(MAX_ATTR_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| SysfsError::from_io(&shown, e))?;
        if buf.len() as u64 > MAX_ATTR_BYTES {
            return Err(SysfsError::TooLarge(shown));
        }
        let mut text = String::from_utf8(buf).map_err(|_| SysfsError::NotText(shown))?;
        while text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        let shown = self.display(rel);
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = self.root.resolve(parent).map_err(|e| SysfsError::from_io(&shown, e))?;
        let name = rel.file_name().ok_or_else(|| SysfsError::Missing(shown.clone()))?;
        std::fs::read_link(dir.join(name)).map_err(|e| SysfsError::from_io(&shown, e))
    }

    fn list_dir(&self, rel: &Path) -> Result<Vec<String>, SysfsError> {
        let shown = self.display(rel);
        let path = self.root.resolve(rel).map_err(|e| SysfsError::from_io(&shown, e))?;
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .map_err(|e| SysfsError::from_io(&shown, e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    fn canonical(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        let shown = self.display(rel);
        let out = self.root.resolve_rel(rel).map_err(|e| SysfsError::from_io(&shown, e))?;
        if !self.root.base().join(&out).exists() {
            return Err(SysfsError::Missing(shown));
        }
        Ok(out)
    }

    fn exists(&self, rel: &Path) -> bool {
        self.root.resolve(rel).map(|p| p.exists()).unwrap_or(false)
    }

    fn describe(&self) -> String {
        self.root.base().display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn reads_trim_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "4: ACTIVE\n").unwrap();
        fs::write(dir.path().join("big"), vec![b'x'; 70_000]).unwrap();
        fs::write(dir.path().join("bin"), [0xff, 0xfe, 0x00]).unwrap();
        let s = RootedSysfs::new(dir.path());
        assert_eq!(s.read_attr(Path::new("a")).unwrap(), "4: ACTIVE");
        assert!(matches!(s.read_attr(Path::new("big")), Err(SysfsError::TooLarge(_))));
        assert!(matches!(s.read_attr(Path::new("bin")), Err(SysfsError::NotText(_))));
        let e = s.read_attr(Path::new("nope")).unwrap_err();
        assert!(e.is_missing());
        assert!(e.to_string().contains("nope"));
    }
}
