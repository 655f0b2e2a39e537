//! The process's own resident set: giving back what only start-up needed.
//!
//! A long-running agent touches most of its code once while it starts (flag parsing, the
//! kubeconfig and TLS set-up, the first scan, registration) and then runs a small loop. The
//! kernel keeps every page it mapped for start-up in the resident set, and maps file pages in
//! windows around each touched page (fault-around), so the idle process carries most of its
//! binary. [`release_startup_pages`] hands those pages back once start-up is over:
//!
//! - the executable, private, file-backed mappings (`r-xp`: the text of the binary and its
//!   libraries) are first marked cold (`MADV_COLD`: moved to the inactive list, so they are the
//!   first page cache the kernel reclaims under pressure and no longer count in the container's
//!   working set) and then unmapped from this process (`MADV_DONTNEED`). Text is never written,
//!   so nothing is lost: the next call into a released page maps it again from the page cache
//!   (a minor fault), and the pages the idle loop uses come back on their first use;
//! - freed heap memory goes back to the kernel (`malloc_trim`, glibc).
//!
//! Only executable mappings are touched: read-only data can hold relocated pointers (RELRO is
//! `r--p` after the dynamic linker wrote it), and dropping those would re-read unrelocated bytes.

use std::fmt;

/// One mapping line of `/proc/PID/maps` that [`release_startup_pages`] may release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMapping {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// The mapped file.
    pub path: String,
}

/// What one [`release_startup_pages`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Executable file mappings released.
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
            "{} executable mapping(s), {} KiB mapped, heap trimmed: {}",
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

/// Reading `/proc/self/maps` failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read /proc/self/maps ({0}); the resident set is left as it is")]
pub struct MapsError(#[from] std::io::Error);

/// The executable, private, file-backed mappings in the text of a `/proc/PID/maps` file.
///
/// Lines that are not of the kernel's form (`START-END PERMS OFFSET DEV INODE [PATH]`) are
/// skipped. Anonymous mappings and the kernel's pseudo files (`[vdso]`, `[vsyscall]`) are not
/// returned: only paths that start with `/`, without the ` (deleted)` suffix's file (an
/// upgraded binary still maps the old text, which cannot be read again from its path but is
/// still in the page cache; it is released all the same, so it keeps the suffix out of the
/// path only).
pub fn text_mappings(maps: &str) -> Vec<TextMapping> {
    maps.lines().filter_map(parse_text_mapping).collect()
}

fn parse_text_mapping(line: &str) -> Option<TextMapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next()?.trim_start();
    if perms != "r-xp" || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    if start >= end {
        return None;
    }
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(TextMapping {
        start,
        end,
        path: path.to_string(),
    })
}

/// Releases the pages start-up left in this process's resident set (see the module docs).
///
/// Safe to call at any time and any number of times: it only drops mappings of unmodified
/// executable file pages (re-mapped from the page cache on their next use) and free heap
/// memory. Errors of single mappings are collected in [`Released::refused`].
pub fn release_startup_pages() -> Result<Released, MapsError> {
    Ok(release(&own_text_mappings()?))
}

/// The executable file mappings of this process, from `/proc/self/maps`.
pub fn own_text_mappings() -> Result<Vec<TextMapping>, MapsError> {
    Ok(text_mappings(&std::fs::read_to_string("/proc/self/maps")?))
}

/// Releases `mappings` (from [`own_text_mappings`]) and trims the heap: what
/// [`release_startup_pages`] does, for a caller that reports what it is about to release
/// before it releases it (reporting afterwards would bring the reporting code's pages back).
pub fn release(mappings: &[TextMapping]) -> Released {
    let mut out = Released::default();
    for m in mappings {
        let len = m.end - m.start;
        let addr = m.start as *mut libc::c_void;
        // SAFETY: the range is a whole executable private file mapping of this process, as the
        // kernel listed it; MADV_COLD and MADV_DONTNEED on it change no byte a program can read
        // (the text is re-read from the unchanged file on the next access). A mapping that went
        // away since the read makes madvise fail with ENOMEM, which is reported, not acted on.
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

    // A real /proc/PID/maps of the agent (trimmed), as Linux 6.18 writes it.
    const MAPS: &str = "\
55d4c2a00000-55d4c2d4e000 r--p 00000000 fe:00 1835123                    /usr/local/bin/erdma-agent
55d4c2d4e000-55d4c3c1b000 r-xp 0034e000 fe:00 1835123                    /usr/local/bin/erdma-agent
55d4c3c1b000-55d4c3d6f000 r--p 0121b000 fe:00 1835123                    /usr/local/bin/erdma-agent
55d4c3d6f000-55d4c3d74000 rw-p 0136f000 fe:00 1835123                    /usr/local/bin/erdma-agent
55d4c4f31000-55d4c4f73000 rw-p 00000000 00:00 0                          [heap]
7f0a1c000000-7f0a1c021000 rw-p 00000000 00:00 0 
7f0a1e828000-7f0a1e9a0000 r-xp 00028000 fe:00 1049011                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f0a1e9f8000-7f0a1ea0a000 r-xp 00001000 fe:00 1049020                    /usr/lib/x86_64-linux-gnu/libelf-0.188.so (deleted)
7ffd5a3e1000-7ffd5a3e3000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn only_executable_private_file_mappings() {
        let got = text_mappings(MAPS);
        let want = vec![
            TextMapping {
                start: 0x55d4c2d4e000,
                end: 0x55d4c3c1b000,
                path: "/usr/local/bin/erdma-agent".into(),
            },
            TextMapping {
                start: 0x7f0a1e828000,
                end: 0x7f0a1e9a0000,
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            },
            TextMapping {
                start: 0x7f0a1e9f8000,
                end: 0x7f0a1ea0a000,
                path: "/usr/lib/x86_64-linux-gnu/libelf-0.188.so".into(),
            },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn shared_writable_and_malformed_lines_are_skipped() {
        let maps = "\
7f00-7f10 r-xs 00000000 fe:00 1 /dev/shm/x
7f10-7f20 rwxp 00000000 fe:00 1 /tmp/jit
7f30-7f20 r-xp 00000000 fe:00 1 /bin/backwards
zz-7f40 r-xp 00000000 fe:00 1 /bin/nothex
7f40-7f50 r-xp
7f50-7f60 r-xp 00000000 fe:00 1 relative/path
";
        assert_eq!(text_mappings(maps), Vec::new());
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
            for m in text_mappings(&s) {
                prop_assert!(m.start < m.end);
                prop_assert!(m.path.starts_with('/'));
            }
        }

        #[test]
        fn a_well_formed_text_line_round_trips(
            start in 0usize..(usize::MAX / 2),
            len in 1usize..(1 << 30),
            path in "/[a-z0-9_./-]{1,40}",
        ) {
            let line = format!("{:x}-{:x} r-xp 00001000 fe:00 42                 {path}", start, start + len);
            let got = text_mappings(&line);
            prop_assert_eq!(got, vec![TextMapping { start, end: start + len, path: path.clone() }]);
        }
    }
}
