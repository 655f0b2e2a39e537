//! The process's own resident set: giving back what only start-up needed.
//!
//! A long-running agent touches most of its code and read-only data once while it starts (flag
//! parsing, the kubeconfig and TLS set-up, the first scan, registration) and then runs a small
//! loop. The kernel keeps every page it mapped for start-up in the resident set, and maps file
//! pages in windows around each touched page (fault-around), so the idle process carries most
//! of its binary. [`release_startup_pages`] hands those pages back once start-up is over:
//!
//! - the private, read-only, file-backed mappings without anonymous pages (the text, read-only
//!   data and unwind tables of the binary and its libraries) are first marked cold
//!   (`MADV_COLD`: moved to the inactive list, so they are the first page cache the kernel
//!   reclaims under pressure and no longer count in the container's working set) and then
//!   unmapped from this process (`MADV_DONTNEED`). Their pages are the file's own, so nothing is
//!   lost: the next access maps the page again from the page cache (a minor fault), and the
//!   pages the idle loop uses come back on their first use;
//! - freed heap memory goes back to the kernel (`malloc_trim`, glibc).
//!
//! A mapping with anonymous pages is never touched: there the process (or the dynamic linker:
//! RELRO is `r--p` after it wrote the relocations, a debugger's breakpoint in `r-xp`) holds
//! bytes the file does not have, and `MADV_DONTNEED` would drop them. Writable and shared
//! mappings are never touched either. A read-only mapping cannot gain an anonymous page between
//! the read of `smaps` and the release, because nothing can write to it.

use std::fmt;

/// One mapping of `/proc/PID/smaps` that [`release_startup_pages`] may release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMapping {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// The mapped file.
    pub path: String,
}

/// What one [`release`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// File mappings released.
    pub mappings: usize,
    /// Their total size in bytes (mapped size, not all of it was resident).
    pub bytes: u64,
    /// Mappings the kernel refused to release, with its error.
    pub refused: Vec<String>,
    /// Whether `malloc_trim` gave heap memory back.
    pub heap_trimmed: bool,
}

impl fmt::Display for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} read-only file mapping(s), {} KiB mapped, heap trimmed: {}",
            self.mappings,
            self.bytes / 1024,
            self.heap_trimmed
        )?;
        if !self.refused.is_empty() {
            write!(f, "; refused: {}", self.refused.join("; "))?;
        }
        Ok(())
    }
}

/// Reading `/proc/self/smaps` failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read /proc/self/smaps ({0}); the resident set is left as it is")]
pub struct MapsError(#[from] std::io::Error);

/// The releasable mappings in the text of a `/proc/PID/smaps` file: private, not writable,
/// backed by a file (a path that starts with `/`), with `Anonymous: 0 kB`.
///
/// A mapping whose `Anonymous:` line is missing or unreadable is not returned (it may hold
/// private bytes). Lines that are not of the kernel's form are skipped. An upgraded binary's
/// mapping keeps the ` (deleted)` suffix out of the path; its pages are still in the page cache
/// and it is released all the same.
pub fn releasable_mappings(smaps: &str) -> Vec<FileMapping> {
    let mut out = Vec::new();
    // The mapping being read, and whether its Anonymous line said 0.
    let mut current: Option<(FileMapping, Option<bool>)> = None;
    for line in smaps.lines() {
        if let Some(header) = parse_header(line) {
            finish(current.take(), &mut out);
            current = header.map(|m| (m, None));
            continue;
        }
        if let Some(rest) = line.strip_prefix("Anonymous:")
            && let Some((_, anon)) = current.as_mut()
        {
            let kib = rest.trim().strip_suffix("kB").map(str::trim);
            *anon = Some(kib == Some("0"));
        }
    }
    finish(current, &mut out);
    out
}

/// Keeps the mapping just read when its `Anonymous:` line said 0.
fn finish(cur: Option<(FileMapping, Option<bool>)>, out: &mut Vec<FileMapping>) {
    if let Some((m, Some(true))) = cur {
        out.push(m);
    }
}

/// `Some(Some(m))` for the header line of a releasable-looking mapping, `Some(None)` for the
/// header of any other mapping, `None` for a line that is not a header.
fn parse_header(line: &str) -> Option<Option<FileMapping>> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    let p = perms.as_bytes();
    let read_only_private = p[0] == b'r' && p[1] == b'-' && p[3] == b'p';
    if !read_only_private || !path.starts_with('/') || start >= end {
        return Some(None);
    }
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(Some(FileMapping {
        start,
        end,
        path: path.to_string(),
    }))
}

/// Releases the pages start-up left in this process's resident set (see the module docs).
///
/// Safe to call at any time and any number of times: it only drops mappings of unmodified
/// read-only file pages (re-mapped from the page cache on their next use) and free heap
/// memory. Errors of single mappings are collected in [`Released::refused`].
pub fn release_startup_pages() -> Result<Released, MapsError> {
    Ok(release(&own_releasable_mappings()?))
}

/// The releasable mappings of this process, from `/proc/self/smaps`.
pub fn own_releasable_mappings() -> Result<Vec<FileMapping>, MapsError> {
    Ok(releasable_mappings(&std::fs::read_to_string(
        "/proc/self/smaps",
    )?))
}

/// Releases `mappings` (from [`own_releasable_mappings`]) and trims the heap: what
/// [`release_startup_pages`] does, for a caller that reports what it is about to release
/// before it releases it (reporting afterwards would bring the reporting code's pages back).
pub fn release(mappings: &[FileMapping]) -> Released {
    let mut out = Released::default();
    for m in mappings {
        let len = m.end - m.start;
        let addr = m.start as *mut libc::c_void;
        // SAFETY: the range is a whole private, read-only file mapping of this process without
        // anonymous pages, as the kernel listed it: every byte in it is the file's, so
        // MADV_COLD and MADV_DONTNEED change no byte a program can read (the next access maps
        // the same page cache page). A mapping that went away since the read makes madvise fail
        // with ENOMEM, which is reported, not acted on.
        unsafe {
            // MADV_COLD (Linux 5.4) is advice only: an older kernel's EINVAL changes nothing.
            libc::madvise(addr, len, libc::MADV_COLD);
            if libc::madvise(addr, len, libc::MADV_DONTNEED) != 0 {
                out.refused.push(format!(
                    "{} {:x}-{:x}: {}",
                    m.path,
                    m.start,
                    m.end,
                    std::io::Error::last_os_error()
                ));
                continue;
            }
        }
        out.mappings += 1;
        out.bytes += len as u64;
    }
    out.heap_trimmed = trim_heap();
    out
}

/// Makes every thread allocate from one malloc arena (glibc's `M_ARENA_MAX`), to be called
/// before any thread starts. glibc gives each thread that allocates while another holds the
/// lock an arena of its own, which keeps its free pages; an agent that allocates little and
/// rarely at once only pays for them. Returns whether the setting took (always `false` off
/// glibc, where there is nothing to limit).
pub fn single_malloc_arena() -> bool {
    set_arena_max()
}

#[cfg(target_env = "gnu")]
fn set_arena_max() -> bool {
    // SAFETY: mallopt only changes a malloc tuning parameter; M_ARENA_MAX (-8) with value 1
    // is documented in mallopt(3).
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}

#[cfg(not(target_env = "gnu"))]
fn set_arena_max() -> bool {
    false
}

/// Gives the heap's free memory back to the kernel (glibc's `malloc_trim`; false elsewhere or
/// when nothing was given back): after a burst of allocations that is over (a usage read), so
/// that the resident set returns to the idle loop's.
pub fn give_back_free_heap() -> bool {
    trim_heap()
}

#[cfg(target_env = "gnu")]
fn trim_heap() -> bool {
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the kernel.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(target_env = "gnu"))]
fn trim_heap() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    #[cfg(target_env = "gnu")]
    fn glibc_takes_the_one_arena_setting() {
        assert!(single_malloc_arena(), "mallopt(M_ARENA_MAX, 1) refused");
        // Allocation still works from several threads at once.
        let sums: Vec<usize> = (0..4)
            .map(|i| std::thread::spawn(move || (0..1000).map(|n| vec![i; n % 64].len()).sum()))
            .map(|t| t.join().unwrap())
            .collect();
        assert_eq!(sums, vec![31_020; 4]);
    }

    // Parts of a real /proc/PID/smaps of the agent (Linux 6.18; fields trimmed to the ones that
    // matter and two others).
    const SMAPS: &str = "\
55d4c2a00000-55d4c2d4e000 r--p 00000000 fe:00 1835123                    /usr/local/bin/erdma-agent
Size:               3384 kB
Rss:                1220 kB
Anonymous:             0 kB
55d4c2d4e000-55d4c3c1b000 r-xp 0034e000 fe:00 1835123                    /usr/local/bin/erdma-agent
Size:              15156 kB
Rss:               14096 kB
Anonymous:             0 kB
55d4c3c1b000-55d4c3d6f000 r--p 0121b000 fe:00 1835123                    /usr/local/bin/erdma-agent
Size:               1360 kB
Rss:                 808 kB
Anonymous:           808 kB
55d4c3d6f000-55d4c3d74000 rw-p 0136f000 fe:00 1835123                    /usr/local/bin/erdma-agent
Rss:                  20 kB
Anonymous:            20 kB
55d4c4f31000-55d4c4f73000 rw-p 00000000 00:00 0                          [heap]
Anonymous:           224 kB
7f0a1c000000-7f0a1c021000 rw-p 00000000 00:00 0 
Anonymous:           132 kB
7f0a1e828000-7f0a1e9a0000 r-xp 00028000 fe:00 1049011                    /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0a1e9f8000-7f0a1ea0a000 r-xp 00001000 fe:00 1049020                    /usr/lib/x86_64-linux-gnu/libelf-0.188.so (deleted)
Anonymous:             0 kB
7f0a1ea0a000-7f0a1ea0c000 r-xp 00001000 fe:00 1049021                    /usr/lib/x86_64-linux-gnu/libz.so.1
Anonymous:             4 kB
7f0a1ea0c000-7f0a1ea0e000 r--s 00000000 fe:00 1049022                    /dev/shm/shared
Anonymous:             0 kB
7ffd5a3e1000-7ffd5a3e3000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
Anonymous:             0 kB
";

    #[test]
    fn only_private_read_only_file_mappings_without_anonymous_pages() {
        let got = releasable_mappings(SMAPS);
        let want = vec![
            FileMapping {
                start: 0x55d4c2a00000,
                end: 0x55d4c2d4e000,
                path: "/usr/local/bin/erdma-agent".into(),
            },
            FileMapping {
                start: 0x55d4c2d4e000,
                end: 0x55d4c3c1b000,
                path: "/usr/local/bin/erdma-agent".into(),
            },
            FileMapping {
                start: 0x7f0a1e828000,
                end: 0x7f0a1e9a0000,
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            },
            FileMapping {
                start: 0x7f0a1e9f8000,
                end: 0x7f0a1ea0a000,
                path: "/usr/lib/x86_64-linux-gnu/libelf-0.188.so".into(),
            },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_mapping_without_a_readable_anonymous_line_is_kept() {
        let smaps = "\
7f00-7f10 r-xp 00000000 fe:00 1 /bin/a
Rss:                  4 kB
7f10-7f20 r--p 00000000 fe:00 1 /bin/b
Anonymous:          lots
7f20-7f30 r--p 00000000 fe:00 1 /bin/c
Anonymous:             0 kB
7f30-7f40 r-xp
7f40-7f50 r-xp 00000000 fe:00 1 relative/path
Anonymous:             0 kB
7f60-7f50 r-xp 00000000 fe:00 1 /bin/backwards
Anonymous:             0 kB
";
        assert_eq!(
            releasable_mappings(smaps),
            vec![FileMapping {
                start: 0x7f20,
                end: 0x7f30,
                path: "/bin/c".into()
            }]
        );
    }

    fn rss_file_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("RssFile in /proc/self/status")
    }

    #[test]
    fn releasing_shrinks_the_file_backed_resident_set() {
        let before = rss_file_kib();
        let released = release_startup_pages().expect("/proc/self/maps is readable");
        let after = rss_file_kib();
        assert!(
            after < before,
            "RssFile {before} KiB before, {after} KiB after: {released}"
        );
    }

    #[test]
    fn releasing_keeps_the_process_working() {
        // This test process's own text is released; running on afterwards (and calling code
        // that was just unmapped) proves the pages come back from the page cache.
        let released = release_startup_pages().expect("/proc/self/maps is readable");
        assert!(released.mappings >= 1, "{released}");
        assert!(released.refused.is_empty(), "{released}");
        let v: Vec<u64> = (0..1000).map(|i| i * 3).collect();
        assert_eq!(v.iter().sum::<u64>(), 1_498_500);
        let again = release_startup_pages().expect("again");
        assert_eq!(again.mappings, released.mappings);
    }

    proptest! {
        #[test]
        fn never_panics_and_returns_only_sane_ranges(s in "\\PC{0,400}") {
            for m in releasable_mappings(&s) {
                prop_assert!(m.start < m.end);
                prop_assert!(m.path.starts_with('/'));
            }
        }

        #[test]
        fn a_mapping_is_releasable_exactly_when_read_only_private_and_without_anonymous_pages(
            start in 0usize..(usize::MAX / 2),
            len in 1usize..(1 << 30),
            perms in "[r-][w-][x-][ps]",
            anon in 0u32..3,
            path in "/[a-z0-9_./-]{1,40}",
        ) {
            let text = format!(
                "{:x}-{:x} {perms} 00001000 fe:00 42                 {path}\nRss:  8 kB\nAnonymous:  {anon} kB\n",
                start,
                start + len
            );
            let p = perms.as_bytes();
            let want = p[0] == b'r' && p[1] == b'-' && p[3] == b'p' && anon == 0;
            let got = releasable_mappings(&text);
            if want {
                prop_assert_eq!(got, vec![FileMapping { start, end: start + len, path: path.clone() }]);
            } else {
                prop_assert_eq!(got, Vec::new());
            }
        }
    }
}
