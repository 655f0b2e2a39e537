//! Replacing a file so that a reader sees the old one or the new one, never a part: the new file
//! is made under a temporary name in the same directory (same file system) and renamed over the
//! target. The one copy of this pattern for every crate that writes files a runtime or a restarted
//! agent reads (CDI specs, the DRA checkpoint) or binds sockets a watcher sees (kubelet sockets).
//! It lives here, not in `erdma-model` (pure, no I/O): this crate is light without its features
//! (nix, libc), so `erdma-kubelet` and `erdma-dra` depend on it without a heavier build.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A failed step, with its path.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct AtomicError {
    /// What was being done.
    pub what: &'static str,
    /// The path.
    pub path: PathBuf,
    /// The cause.
    pub source: io::Error,
}

impl AtomicError {
    /// Makes the error of step `what` on `path` from its cause (for `map_err`).
    pub fn at(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> AtomicError {
        let path = path.to_path_buf();
        move |source| AtomicError { what, path, source }
    }
}

/// Whether the new content must survive a power loss or kernel crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and its directory after it.
    Disk,
    /// No fsync: the file describes this boot only (it lives on tmpfs, or what it records dies
    /// with the boot), so a crash that loses it loses nothing; saves the milliseconds an fsync
    /// costs on a busy disk.
    Boot,
}

/// The temporary sibling of `path`: `.<file name>.<tag>` in the same directory (hidden, and with
/// an extension no reader of the directory picks up).
pub fn temp_sibling(path: &Path, tag: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{tag}"))
}

/// Makes the new file at `tmp` with `make` and renames it over `path`. When `make` or the rename
/// fails, `tmp` is removed.
pub fn replace_with<T>(
    path: &Path,
    tmp: &Path,
    make: impl FnOnce(&Path) -> Result<T, AtomicError>,
) -> Result<T, AtomicError> {
    let placed = make(tmp).and_then(|made| {
        std::fs::rename(tmp, path).map_err(AtomicError::at("rename into place", path))?;
        Ok(made)
    });
    if placed.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    placed
}

/// Writes `bytes` to `path` atomically (see the module), creating its directory.
pub fn write(path: &Path, bytes: &[u8], durability: Durability) -> Result<(), AtomicError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(AtomicError::at("create directory", dir))?;
    }
    replace_with(path, &temp_sibling(path, "tmp"), |tmp| {
        let mut f = std::fs::File::create(tmp).map_err(AtomicError::at("create", tmp))?;
        f.write_all(bytes).map_err(AtomicError::at("write", tmp))?;
        if durability == Durability::Disk {
            f.sync_all().map_err(AtomicError::at("fsync", tmp))?;
        }
        Ok(())
    })?;
    if durability == Durability::Disk {
        let dir = dir.unwrap_or(Path::new("."));
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(AtomicError::at("fsync directory", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/spec.json");
        for (bytes, durability) in [(&b"one"[..], Durability::Boot), (b"two", Durability::Disk)] {
            write(&path, bytes, durability).expect("written");
            assert_eq!(std::fs::read(&path).expect("read"), bytes);
        }
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["spec.json"]);
        assert_eq!(
            temp_sibling(&path, "tmp"),
            dir.path().join("sub/.spec.json.tmp")
        );
    }

    #[test]
    fn a_failed_step_names_itself_and_cleans_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory in the way: the rename fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).expect("mkdir");
        std::fs::write(path.join("x"), "").expect("fill");
        let e = write(&path, b"new", Durability::Boot).unwrap_err();
        assert_eq!(e.what, "rename into place");
        assert!(e.to_string().contains("taken"), "{e}");
        assert!(!temp_sibling(&path, "tmp").exists());
    }
}
