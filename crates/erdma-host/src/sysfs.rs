//! Reading sysfs.

use crate::rooted::Root;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// The read did not answer within its time limit (see [`crate::watched`]); its thread was
    /// left behind, still waiting.
    #[error(
        "{path}: no answer within {limit:?}: the read is still blocked (a driver stuck in this attribute?)"
    )]
    NoAnswer {
        /// The path.
        path: PathBuf,
        /// The time limit.
        limit: Duration,
    },
    /// Not read: another attribute of the same directory did not answer within its time limit
    /// (one driver lock usually guards them all; see [`crate::watched`]).
    #[error("{path}: not read: {blocked} in the same directory has not answered within {limit:?}")]
    Skipped {
        /// The path.
        path: PathBuf,
        /// The blocked attribute.
        blocked: PathBuf,
        /// The time limit.
        limit: Duration,
    },
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
            SysfsError::Io {
                path: path.to_path_buf(),
                source: e,
            }
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
    /// Forgets anything cached about the tree's shape (called at the start of every scan, so one
    /// scan sees one consistent view and the next scan sees changes).
    fn refresh(&self) {}
    /// Reads an attribute that is read again and again (a port's state, a link's flags): the
    /// reader may keep it open and read it again in place, which sysfs answers with the current
    /// value. The result is always what [`Sysfs::read_attr`] would return now.
    fn reread_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        self.read_attr(rel)
    }
    /// Closes what [`Sysfs::reread_attr`] keeps open (called by a full scan, after which the
    /// devices may be other ones).
    fn close_rereads(&self) {}
}

/// The real sysfs reader: a directory (the live `/sys` or a captured tree) read through
/// root-confined path resolution.
#[derive(Debug)]
pub struct RootedSysfs {
    root: Root,
    /// Resolved directories by relative path, for one scan (see [`Sysfs::refresh`]).
    dirs: Mutex<DirCache>,
    /// Attributes kept open for [`Sysfs::reread_attr`].
    rereads: Mutex<HashMap<OsString, Arc<OpenAttr>, BuildHasherDefault<Fnv>>>,
}

/// Most attributes a [`RootedSysfs`] keeps open for re-reading (a health re-read of 64 devices
/// keeps ~450); past it, attributes are read by path as [`Sysfs::read_attr`] does.
const MAX_REREADS: usize = 512;

/// An attribute kept open. On sysfs a read at offset 0 runs the attribute's `show` again, and
/// one whose object was removed fails (`ENODEV`); a regular file (a captured tree) may also have
/// been replaced by a rename, which only its link count tells.
#[derive(Debug)]
struct OpenAttr {
    file: std::fs::File,
    on_sysfs: bool,
}

/// What reading an [`OpenAttr`] again found.
enum Reread {
    /// The current content (one short read: the whole attribute).
    Current(Vec<u8>),
    /// Not usable any more (replaced, removed, or larger than a page): read it by path.
    Reopen,
}

impl OpenAttr {
    fn reread(&self) -> Reread {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let read = PAGE.with(|page| {
            let mut page = page.borrow_mut();
            let n = self.file.read_at(&mut page[..], 0)?;
            Ok::<_, io::Error>((n < page.len()).then(|| page[..n].to_vec()))
        });
        let Ok(Some(bytes)) = read else {
            return Reread::Reopen;
        };
        if !self.on_sysfs && !matches!(self.file.metadata(), Ok(m) if m.nlink() > 0) {
            return Reread::Reopen;
        }
        Reread::Current(bytes)
    }
}

thread_local! {
    /// The buffer of the first `read` of an attribute (one page, the most sysfs returns at once).
    static PAGE: RefCell<Vec<u8>> = RefCell::new(vec![0; 4096]);
}

/// Most directory descriptors a [`RootedSysfs`] keeps open at once (the oldest is closed first).
const MAX_DIR_FDS: usize = 32;

/// sysfs reads are many small files in few directories: each directory is resolved once per scan
/// (one `lstat` per new component), and one that a second file is read from also gets an `O_PATH`
/// descriptor, so that further files in it are opened with `openat` and the kernel does not walk
/// the whole path again for every attribute.
#[derive(Debug, Default)]
struct DirCache {
    /// Keyed by the relative path's bytes: a different spelling of one path only costs a miss.
    dirs: HashMap<OsString, Resolved, BuildHasherDefault<Fnv>>,
    /// Relative paths whose entry holds a descriptor, oldest first (at most [`MAX_DIR_FDS`]).
    with_fd: VecDeque<OsString>,
}

/// FNV-1a: the cache's keys are short paths hashed once per file read, where SipHash and `Path`'s
/// component-wise hashing cost more than the rest of the lookup (no untrusted keys here).
#[derive(Debug)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Debug)]
struct Resolved {
    /// The host path (inside the root, no symlink left in it).
    host: PathBuf,
    /// Files opened in it so far.
    opens: u32,
    fd: Option<Arc<OwnedFd>>,
}

/// Where to open a file: through a directory descriptor or by its host path.
enum DirHandle {
    Fd(Arc<OwnedFd>),
    Path(PathBuf),
}

impl RootedSysfs {
    /// Reads the tree at `base`. Absolute link targets beginning with `/sys` are mapped into it.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        RootedSysfs {
            root: Root::new(base, Some(PathBuf::from("/sys"))),
            dirs: Mutex::new(DirCache::default()),
            rereads: Mutex::new(HashMap::default()),
        }
    }

    fn rereads(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<OsString, Arc<OpenAttr>, BuildHasherDefault<Fnv>>> {
        self.rereads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The root directory.
    pub fn base(&self) -> &Path {
        self.root.base()
    }

    fn display(&self, rel: &Path) -> PathBuf {
        self.root.base().join(rel)
    }

    /// An attribute's bytes as text, bounded, trailing newlines removed.
    fn decode(&self, rel: &Path, buf: Vec<u8>) -> Result<String, SysfsError> {
        // The full path only for an error: building it for every read cost a fifth of a scan.
        if buf.len() as u64 > MAX_ATTR_BYTES {
            return Err(SysfsError::TooLarge(self.display(rel)));
        }
        let mut text =
            String::from_utf8(buf).map_err(|_| SysfsError::NotText(self.display(rel)))?;
        while text.ends_with('\n') {
            text.pop();
        }
        Ok(text)
    }

    /// Resolves a path through the cache: the parent recursively, then one `lstat` of the last
    /// component; a symlink's target is resolved the same way (relative to the resolved parent, or
    /// re-rooted when absolute), so link chains stay inside the root and are bounded.
    fn resolve_dir(&self, rel: &Path) -> io::Result<PathBuf> {
        let mut cache = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        self.resolve_cached(&mut cache, rel, 0)
    }

    fn resolve_cached(&self, cache: &mut DirCache, rel: &Path, hops: usize) -> io::Result<PathBuf> {
        if let Some(hit) = cache.dirs.get(rel.as_os_str()) {
            return Ok(hit.host.clone());
        }
        let simple = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let (true, Some(parent), Some(name)) = (simple, rel.parent(), rel.file_name()) else {
            return self.root.resolve(rel);
        };
        let parent_host = if parent.as_os_str().is_empty() {
            self.root.base().to_path_buf()
        } else {
            self.resolve_cached(cache, parent, hops)?
        };
        let candidate = parent_host.join(name);
        let resolved = match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                if hops >= crate::rooted::MAX_LINK_HOPS {
                    return Err(io::Error::other(format!(
                        "too many levels of symbolic links resolving {}",
                        rel.display()
                    )));
                }
                let target = std::fs::read_link(&candidate)?;
                let parent_rel = parent_host
                    .strip_prefix(self.root.base())
                    .unwrap_or(Path::new(""))
                    .to_path_buf();
                let joined = if target.is_absolute() {
                    target
                        .strip_prefix("/sys")
                        .unwrap_or(&target)
                        .strip_prefix("/")
                        .unwrap_or(&target)
                        .to_path_buf()
                } else {
                    parent_rel.join(&target)
                };
                self.resolve_cached(cache, &normalize(&joined), hops + 1)?
            }
            _ => candidate,
        };
        cache.dirs.insert(
            rel.as_os_str().to_os_string(),
            Resolved {
                host: resolved.clone(),
                opens: 0,
                fd: None,
            },
        );
        Ok(resolved)
    }

    /// The directory `rel` to open a file in: its descriptor when it has (or now earns) one, else
    /// its resolved host path.
    fn dir_handle(&self, rel: &Path) -> io::Result<DirHandle> {
        let mut cache = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = cache.dirs.get_mut(rel.as_os_str())
            && let Some(fd) = &entry.fd
        {
            entry.opens = entry.opens.saturating_add(1);
            return Ok(DirHandle::Fd(fd.clone()));
        }
        let host = self.resolve_cached(&mut cache, rel, 0)?;
        let DirCache { dirs, with_fd } = &mut *cache;
        let Some(entry) = dirs.get_mut(rel.as_os_str()) else {
            // Not cacheable (`..` or `.` in it): resolved from the root every time.
            return Ok(DirHandle::Path(host));
        };
        entry.opens = entry.opens.saturating_add(1);
        if let Some(fd) = &entry.fd {
            return Ok(DirHandle::Fd(fd.clone()));
        }
        if entry.opens < 2 {
            return Ok(DirHandle::Path(host));
        }
        // O_NOFOLLOW: the host path was resolved component by component and holds no symlink;
        // should one have been put there since, opening fails instead of following it.
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(fd) = nix::fcntl::open(entry.host.as_path(), flags, Mode::empty()) else {
            return Ok(DirHandle::Path(host));
        };
        let fd = Arc::new(fd);
        entry.fd = Some(fd.clone());
        with_fd.push_back(rel.as_os_str().to_os_string());
        while with_fd.len() > MAX_DIR_FDS {
            if let Some(old) = with_fd.pop_front()
                && let Some(e) = dirs.get_mut(&old)
            {
                e.fd = None;
            }
        }
        Ok(DirHandle::Fd(fd))
    }

    /// Opens a file: its directory through the cache, then `O_NOFOLLOW`; a final symlink (`ELOOP`)
    /// is resolved inside the root and opened again.
    fn open_file(&self, rel: &Path) -> io::Result<std::fs::File> {
        let Some((parent, name)) = split_last(rel) else {
            return open_nofollow(&self.root.resolve(rel)?);
        };
        let opened = match self.dir_handle(parent)? {
            DirHandle::Fd(dir) => {
                let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                nix::fcntl::openat(&*dir, name, flags, Mode::empty())
                    .map(std::fs::File::from)
                    .map_err(io::Error::from)
            }
            DirHandle::Path(dir) => open_nofollow(&dir.join(name)),
        };
        match opened {
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                open_nofollow(&self.resolve_dir(rel)?)
            }
            other => other,
        }
    }
}

/// `rel`'s directory and file name, split at its last `/` (what `Path::parent` and
/// `Path::file_name` give for the plain relative paths the inventory builds, without parsing
/// every component from the back: that was a sixth of a scan). `None` for a path whose last
/// component is empty, `.` or `..`, or that is a single component: the caller resolves those
/// from the root. A parent spelled with a doubled `/` only costs a directory-cache miss.
fn split_last(rel: &Path) -> Option<(&Path, &OsStr)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = rel.as_os_str().as_bytes();
    let at = bytes.iter().rposition(|&b| b == b'/')?;
    let (parent, name) = (&bytes[..at], &bytes[at + 1..]);
    if parent.is_empty() || name.is_empty() || name == b"." || name == b".." {
        return None;
    }
    Some((
        Path::new(OsStr::from_bytes(parent)),
        OsStr::from_bytes(name),
    ))
}

impl Sysfs for RootedSysfs {
    fn read_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        let shown = || self.display(rel);
        let mut file = self
            .open_file(rel)
            .map_err(|e| SysfsError::from_io(&shown(), e))?;
        // sysfs returns a whole attribute (at most a page) in one read; a short first read is EOF.
        // The page is this thread's, reused: clearing 4 KiB for every attribute cost more than
        // the parsing.
        let first = PAGE.with(|page| {
            let mut page = page.borrow_mut();
            let n = file.read(&mut page[..])?;
            Ok::<_, io::Error>((page[..n].to_vec(), n == page.len()))
        });
        let (mut buf, full) = first.map_err(|e| SysfsError::from_io(&shown(), e))?;
        let n = buf.len();
        if full {
            file.take(MAX_ATTR_BYTES + 1 - n as u64)
                .read_to_end(&mut buf)
                .map_err(|e| SysfsError::from_io(&shown(), e))?;
        }
        self.decode(rel, buf)
    }

    fn reread_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        // No lock is held while a file is opened or read: a read that never answers (a stuck
        // driver) must not hold up the re-reads of every other attribute.
        let kept = self.rereads().get(rel.as_os_str()).cloned();
        if let Some(attr) = kept {
            match attr.reread() {
                Reread::Current(bytes) => return self.decode(rel, bytes),
                Reread::Reopen => {
                    let mut open = self.rereads();
                    if open
                        .get(rel.as_os_str())
                        .is_some_and(|a| Arc::ptr_eq(a, &attr))
                    {
                        open.remove(rel.as_os_str());
                    }
                }
            }
        }
        let shown = || self.display(rel);
        let file = self
            .open_file(rel)
            .map_err(|e| SysfsError::from_io(&shown(), e))?;
        let on_sysfs = nix::sys::statfs::fstatfs(&file)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC);
        let attr = Arc::new(OpenAttr { file, on_sysfs });
        match attr.reread() {
            Reread::Current(bytes) => {
                let mut open = self.rereads();
                if open.len() < MAX_REREADS {
                    open.insert(rel.as_os_str().to_os_string(), attr);
                }
                drop(open);
                self.decode(rel, bytes)
            }
            Reread::Reopen => self.read_attr(rel),
        }
    }

    fn close_rereads(&self) {
        self.rereads().clear();
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        let shown = self.display(rel);
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = self
            .resolve_dir(parent)
            .map_err(|e| SysfsError::from_io(&shown, e))?;
        let name = rel
            .file_name()
            .ok_or_else(|| SysfsError::Missing(shown.clone()))?;
        std::fs::read_link(dir.join(name)).map_err(|e| SysfsError::from_io(&shown, e))
    }

    fn list_dir(&self, rel: &Path) -> Result<Vec<String>, SysfsError> {
        let shown = self.display(rel);
        let path = self
            .resolve_dir(rel)
            .map_err(|e| SysfsError::from_io(&shown, e))?;
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
        let full = self
            .resolve_dir(rel)
            .map_err(|e| SysfsError::from_io(&shown, e))?;
        if !full.exists() {
            return Err(SysfsError::Missing(shown));
        }
        Ok(full
            .strip_prefix(self.root.base())
            .map(Path::to_path_buf)
            .unwrap_or_default())
    }

    fn exists(&self, rel: &Path) -> bool {
        self.resolve_dir(rel).map(|p| p.exists()).unwrap_or(false)
    }

    fn describe(&self) -> String {
        self.root.base().display().to_string()
    }

    fn refresh(&self) {
        let mut cache = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        cache.dirs.clear();
        cache.with_fd.clear();
    }
}

/// Removes `.` and `..` lexically; `..` never climbs above the root.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Opens a file without following a final symlink (the caller resolved links inside the root).
fn open_nofollow(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fs;

    proptest! {
        /// For the paths the inventory builds (plain components joined by `/`), the byte split
        /// is exactly `Path::parent` and `Path::file_name`.
        #[test]
        fn split_last_is_parent_and_file_name(
            parts in proptest::collection::vec("[a-zA-Z0-9_:.-]{1,12}", 2..8)
        ) {
            prop_assume!(parts.iter().all(|p| p != "." && p != ".."));
            let rel = PathBuf::from(parts.join("/"));
            let (parent, name) = split_last(&rel).expect("two or more plain components");
            prop_assert_eq!(Some(parent), rel.parent());
            prop_assert_eq!(Some(name), rel.file_name());
        }

        /// Anything else is either split as `Path` would, or left to the slow path (`None`).
        #[test]
        fn split_last_never_disagrees(rel in "[a-z./]{0,16}") {
            let rel = PathBuf::from(rel);
            if let Some((parent, name)) = split_last(&rel) {
                prop_assert_eq!(Some(name), rel.file_name());
                prop_assert_eq!(
                    Path::new(parent).components().collect::<Vec<_>>(),
                    rel.parent().map(|p| p.components().collect::<Vec<_>>()).unwrap_or_default()
                );
            }
        }
    }

    /// What happens to an attribute file between two re-reads.
    #[derive(Debug, Clone)]
    enum Change {
        WriteInPlace(String),
        ReplaceByRename(String),
        Remove,
        RemoveDir,
        Keep,
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            "[a-zA-Z0-9: ]{0,12}".prop_map(Change::WriteInPlace),
            "[a-zA-Z0-9: ]{0,12}".prop_map(Change::ReplaceByRename),
            Just(Change::Remove),
            Just(Change::RemoveDir),
            Just(Change::Keep),
        ]
    }

    proptest! {
        /// Whatever happens to the files, a re-read answers what a reader that keeps nothing open
        /// answers now (value or kind of error).
        #[test]
        fn reread_always_agrees_with_a_fresh_read(
            steps in proptest::collection::vec((0usize..3, change()), 1..24)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let files = ["ports/1/state", "ports/1/phys_state", "net/flags"];
            for f in files {
                let p = dir.path().join(f);
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(&p, "initial\n").unwrap();
            }
            let kept = RootedSysfs::new(dir.path());
            for (which, change) in steps {
                let rel = Path::new(files[which]);
                let path = dir.path().join(rel);
                match &change {
                    Change::WriteInPlace(v) => {
                        fs::create_dir_all(path.parent().unwrap()).unwrap();
                        fs::write(&path, format!("{v}\n")).unwrap();
                    }
                    Change::ReplaceByRename(v) => {
                        fs::create_dir_all(path.parent().unwrap()).unwrap();
                        let tmp = dir.path().join("tmp");
                        fs::write(&tmp, format!("{v}\n")).unwrap();
                        fs::rename(&tmp, &path).unwrap();
                    }
                    Change::Remove => {
                        let _ = fs::remove_file(&path);
                    }
                    Change::RemoveDir => {
                        let _ = fs::remove_dir_all(path.parent().unwrap());
                    }
                    Change::Keep => {}
                }
                kept.refresh();
                for f in files {
                    let rel = Path::new(f);
                    let fresh = RootedSysfs::new(dir.path()).read_attr(rel);
                    let again = kept.reread_attr(rel);
                    match (&fresh, &again) {
                        (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{} after {:?}", f, change),
                        (Err(a), Err(b)) => prop_assert_eq!(a.is_missing(), b.is_missing()),
                        _ => prop_assert!(false, "{}: fresh {:?}, re-read {:?}", f, fresh, again),
                    }
                }
            }
        }
    }

    #[test]
    fn rereads_keep_files_open_up_to_the_bound_and_a_scan_closes_them() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_REREADS + 40 {
            fs::write(dir.path().join(format!("a{i}")), format!("{i}\n")).unwrap();
        }
        let s = RootedSysfs::new(dir.path());
        for round in 0..2 {
            for i in 0..MAX_REREADS + 40 {
                assert_eq!(
                    s.reread_attr(Path::new(&format!("a{i}"))).unwrap(),
                    i.to_string(),
                    "round {round}"
                );
            }
        }
        assert_eq!(s.rereads.lock().unwrap().len(), MAX_REREADS);
        s.close_rereads();
        assert_eq!(s.rereads.lock().unwrap().len(), 0);
        assert_eq!(s.reread_attr(Path::new("a7")).unwrap(), "7");
    }

    /// On the live sysfs a kept-open attribute answers the current value: loopback's packet
    /// counter, read again after a datagram to 127.0.0.1, has counted it.
    #[test]
    #[ignore = "reads the live /sys (class/net/lo); runs in the ignored-on-host stage"]
    fn a_kept_open_sysfs_attribute_reads_the_current_value() {
        let s = RootedSysfs::new("/sys");
        let rel = Path::new("class/net/lo/statistics/tx_packets");
        let before: u64 = s.reread_attr(rel).unwrap().parse().unwrap();
        let open = s.rereads.lock().unwrap();
        let attr = open.get(rel.as_os_str()).expect("kept open");
        assert!(attr.on_sysfs, "/sys is sysfs");
        drop(open);
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sock.local_addr().unwrap();
        for _ in 0..3 {
            sock.send_to(b"x", to).unwrap();
        }
        let after: u64 = s.reread_attr(rel).unwrap().parse().unwrap();
        assert!(after >= before + 3, "tx_packets {before} then {after}");
        assert_eq!(s.rereads.lock().unwrap().len(), 1);
    }

    #[test]
    fn split_last_leaves_odd_paths_to_the_slow_path() {
        for odd in ["", "a", "/a", "a/", "a/.", "a/..", "/"] {
            assert_eq!(split_last(Path::new(odd)), None, "{odd:?}");
        }
        assert_eq!(
            split_last(Path::new("class/infiniband/erdma_0/node_guid")),
            Some((
                Path::new("class/infiniband/erdma_0"),
                OsStr::new("node_guid")
            ))
        );
    }

    #[test]
    fn reads_trim_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "4: ACTIVE\n").unwrap();
        fs::write(dir.path().join("big"), vec![b'x'; 70_000]).unwrap();
        fs::write(dir.path().join("bin"), [0xff, 0xfe, 0x00]).unwrap();
        let s = RootedSysfs::new(dir.path());
        assert_eq!(s.read_attr(Path::new("a")).unwrap(), "4: ACTIVE");
        assert!(matches!(
            s.read_attr(Path::new("big")),
            Err(SysfsError::TooLarge(_))
        ));
        assert!(matches!(
            s.read_attr(Path::new("bin")),
            Err(SysfsError::NotText(_))
        ));
        let e = s.read_attr(Path::new("nope")).unwrap_err();
        assert!(e.is_missing());
        assert!(e.to_string().contains("nope"));
    }
}
