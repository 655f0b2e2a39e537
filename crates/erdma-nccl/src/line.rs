//! The prefix of one NCCL log line: `[ts] <host>:<pid>:<tid> [<cudaDev>] [<file>:<line>] NCCL <LEVEL> <msg>`.
//!
//! NCCL 2.1x–2.2x print INFO lines as `host:pid:tid [dev] NCCL INFO msg`; WARN lines carry the source
//! location before `NCCL WARN`, and newer releases put a `[YYYY-MM-DD HH:MM:SS]` timestamp first.
//! Launchers add their own prefixes (`[1,0]<stdout>:` from mpirun, `[pod/x/c] ` from kubectl), so
//! the prefix is read from the right, starting at the ` NCCL ` marker.

/// Severity of an NCCL log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `NCCL INFO`.
    Info,
    /// `NCCL WARN`.
    Warn,
    /// `NCCL TRACE` (debug builds only).
    Trace,
    /// `NCCL ERROR` / `NCCL ABORT` (seen in some plugins and forks).
    Error,
}

/// One parsed NCCL line; all fields borrow from the input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclLine<'a> {
    /// `host:pid`, the key of the process that wrote the line (empty when the line had no prefix).
    pub process: &'a str,
    /// Host name part of the prefix.
    pub host: &'a str,
    /// Process id part of the prefix.
    pub pid: Option<u32>,
    /// CUDA device in `[n]`, when present.
    pub cuda_dev: Option<u32>,
    /// Source location (`plugin/net.cc:379`) that WARN lines carry.
    pub location: Option<&'a str>,
    /// Level after `NCCL`.
    pub level: Level,
    /// The message after `NCCL <LEVEL> `.
    pub message: &'a str,
}

/// Finds and parses NCCL line prefixes.
#[derive(Debug, Default)]
pub struct PrefixParser {
    _private: (),
}

/// An NCCL line found in raw bytes (not yet checked to be UTF-8): its level, the prefix before the
/// ` NCCL ` marker and the message after `NCCL <LEVEL> `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSplit<'a> {
    /// Level after `NCCL`.
    pub level: Level,
    /// The bytes before the marker (launcher prefix, timestamp, `host:pid:tid [dev] location`).
    pub pre: &'a [u8],
    /// The message after `NCCL <LEVEL> `.
    pub message: &'a [u8],
}

impl PrefixParser {
    /// Parses `line` when it is an NCCL INFO/WARN/TRACE line; `None` for any other line.
    pub fn parse<'a>(&self, line: &'a str) -> Option<NcclLine<'a>> {
        self.split(line).map(|s| s.parse())
    }

    /// Finds the ` NCCL <LEVEL> ` marker of `line` without reading the prefix before it: `None`
    /// exactly when [`PrefixParser::parse`] gives `None`. Most lines of a log need only the level
    /// and the message; [`SplitLine::parse`] reads the prefix of those that need more.
    pub fn split<'a>(&self, line: &'a str) -> Option<SplitLine<'a>> {
        let raw = self.split_bytes(line.as_bytes())?;
        // Both cuts are next to ASCII bytes, so they are char boundaries.
        Some(SplitLine {
            level: raw.level,
            message: &line[line.len() - raw.message.len()..],
            pre: &line[..raw.pre.len()],
        })
    }

    /// [`PrefixParser::split`] on bytes: finds the marker before any UTF-8 check, so that a line
    /// that is not an NCCL line costs one `memchr` pass.
    pub fn split_bytes<'a>(&self, line: &'a [u8]) -> Option<RawSplit<'a>> {
        split_at_marker(line, marker(line)?)
    }
}

/// Where the ` NCCL ` marker of `line` starts: the first `NCCL ` at the start of the line or after
/// a space (the index of its `N`).
pub fn marker(line: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'N', line).find(|&n| is_marker_at(line, n))
}

/// Whether `NCCL ` starts at `n` and is at the start of `line` or after a space.
#[inline]
pub fn is_marker_at(line: &[u8], n: usize) -> bool {
    line.get(n..n + 5) == Some(b"NCCL ") && (n == 0 || line[n - 1] == b' ')
}

/// [`PrefixParser::split_bytes`] once the marker is known to start at `n` ([`marker`]): reads the
/// level word after it.
#[inline]
pub fn split_at_marker(line: &[u8], n: usize) -> Option<RawSplit<'_>> {
    let rest = &line[n + 5..];
    // The level word ends at a space or at the end of the line; no level word is longer than 5
    // bytes.
    let (level, len) = match rest.first_chunk::<4>() {
        Some(b"INFO") => (Level::Info, 4),
        Some(b"WARN") => (Level::Warn, 4),
        _ => match rest.first_chunk::<5>() {
            Some(b"TRACE") => (Level::Trace, 5),
            Some(b"ERROR" | b"ABORT") => (Level::Error, 5),
            _ => return None,
        },
    };
    let message = match rest.get(len) {
        None => &rest[len..],
        Some(b' ') => &rest[len + 1..],
        Some(_) => return None,
    };
    Some(RawSplit {
        level,
        pre: &line[..n.saturating_sub(1)],
        message,
    })
}

/// An NCCL line cut at its marker: level and message, and the prefix text still unparsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitLine<'a> {
    /// Level after `NCCL`.
    pub level: Level,
    /// The message after `NCCL <LEVEL> `.
    pub message: &'a str,
    pre: &'a str,
}

impl<'a> SplitLine<'a> {
    /// A line from its pieces (text of a [`RawSplit`]).
    pub fn new(level: Level, message: &'a str, pre: &'a str) -> Self {
        SplitLine {
            level,
            message,
            pre,
        }
    }

    /// The text before the marker, unparsed.
    pub fn prefix_text(&self) -> &'a str {
        self.pre
    }

    /// Parses the prefix: the whole line as [`PrefixParser::parse`] gives it.
    pub fn parse(self) -> NcclLine<'a> {
        let SplitLine {
            level,
            message,
            pre,
        } = self;
        let mut pre = pre.trim_end();
        let mut location = None;
        let mut cuda_dev = None;
        // From the right: optional location, optional [dev], then host:pid:tid.
        if let Some((head, last)) = rsplit_token(pre)
            && !is_bracket_number(last)
            && memchr::memchr(b':', last.as_bytes()).is_some()
            && !looks_like_host_pid_tid(last)
        {
            location = Some(last);
            pre = head;
        }
        if let Some((head, last)) = rsplit_token(pre)
            && let Some(n) = bracket_number(last)
        {
            cuda_dev = Some(n);
            pre = head;
        }
        let (process, host, pid) = match rsplit_token(pre) {
            Some((_, token)) => host_pid(token),
            None => ("", "", None),
        };
        NcclLine {
            process,
            host,
            pid,
            cuda_dev,
            location,
            level,
            message,
        }
    }
}

/// Splits off the last whitespace-separated token: `(everything before, token)`.
fn rsplit_token(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let mut end = b.len();
    while end > 0 && (b[end - 1] == b' ' || b[end - 1] == b'\t') {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    // Split points are ASCII, so both halves stay on char boundaries.
    match memchr::memrchr2(b' ', b'\t', &b[..end]) {
        Some(i) => Some((&s[..i], &s[i + 1..end])),
        None => Some(("", &s[..end])),
    }
}

fn bracket_number(tok: &str) -> Option<u32> {
    let b = tok.as_bytes();
    if b.len() < 3 || b[0] != b'[' || b[b.len() - 1] != b']' {
        return None;
    }
    tok[1..tok.len() - 1].parse().ok()
}

fn is_bracket_number(tok: &str) -> bool {
    bracket_number(tok).is_some()
}

/// `host:pid:tid`: at least two colons, the last two fields all digits.
fn looks_like_host_pid_tid(tok: &str) -> bool {
    let b = tok.as_bytes();
    let Some(c2) = memchr::memrchr(b':', b) else {
        return false;
    };
    let Some(c1) = memchr::memrchr(b':', &b[..c2]) else {
        return false;
    };
    let digits = |x: &[u8]| !x.is_empty() && x.iter().all(u8::is_ascii_digit);
    digits(&b[c2 + 1..]) && digits(&b[c1 + 1..c2])
}

/// `host:pid:tid` (possibly glued to a launcher prefix such as `[1,0]<stdout>:`) → (`host:pid`, host, pid).
fn host_pid(token: &str) -> (&str, &str, Option<u32>) {
    // Drop a launcher prefix glued to the host name: keep what follows the last ']' or '>'.
    let token = match memchr::memrchr2(b']', b'>', token.as_bytes()) {
        Some(i) => &token[i + 1..],
        None => token,
    };
    let token = token.trim_start_matches(':');
    let Some(tid_at) = memchr::memrchr(b':', token.as_bytes()) else {
        return (token, token, None);
    };
    let host_pid = &token[..tid_at];
    match memchr::memrchr(b':', host_pid.as_bytes()) {
        Some(pid_at) => {
            let pid = host_pid[pid_at + 1..].parse().ok();
            (host_pid, &host_pid[..pid_at], pid)
        }
        None => (host_pid, host_pid, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parser as it was before the marker search moved to bytes (memmem, `str` level word):
    /// the reference the proptest below holds the fast one to.
    fn reference_parse(line: &str) -> Option<NcclLine<'_>> {
        let bytes = line.as_bytes();
        let (pre, rest) = if bytes.starts_with(b"NCCL ") {
            ("", &line[5..])
        } else {
            let at = memchr::memmem::find(bytes, b" NCCL ")?;
            (&line[..at], &line[at + 6..])
        };
        let (word, message) = match memchr::memchr(b' ', rest.as_bytes()) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let level = match word {
            "INFO" => Level::Info,
            "WARN" => Level::Warn,
            "TRACE" => Level::Trace,
            "ERROR" | "ABORT" => Level::Error,
            _ => return None,
        };
        Some(SplitLine::new(level, message, pre).parse())
    }

    proptest::proptest! {
        #[test]
        fn parse_equals_reference(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "NCCL", " NCCL ", "NCCL ", " ", "INFO", "WARN", "TRACE", "ERROR", "ABORT", "INF",
                "N", "vm:881:881", "[1]", "[x]", "plugin/net.cc:379", "[1,0]<stdout>:", ":", "\t",
                "msg", "é", "[2026-11-29 13:51:19]",
            ]), 0..14),
        ) {
            let line = pieces.concat();
            let p = PrefixParser::default();
            proptest::prop_assert_eq!(p.parse(&line), reference_parse(&line));
            let raw = p.split_bytes(line.as_bytes());
            let split = p.split(&line);
            proptest::prop_assert_eq!(raw.is_some(), split.is_some());
            if let (Some(r), Some(s)) = (raw, split) {
                proptest::prop_assert_eq!(r.message, s.message.as_bytes());
                proptest::prop_assert_eq!(r.pre, s.prefix_text().as_bytes());
            }
        }
    }

    #[test]
    fn info_line_from_nccl_2_28() {
        let p = PrefixParser::default();
        let l = p
            .parse("vm:881:881 [1] NCCL INFO NET/IB : No device found.")
            .expect("nccl line");
        assert_eq!(l.process, "vm:881");
        assert_eq!(l.host, "vm");
        assert_eq!(l.pid, Some(881));
        assert_eq!(l.cuda_dev, Some(1));
        assert_eq!(l.level, Level::Info);
        assert_eq!(l.location, None);
        assert_eq!(l.message, "NET/IB : No device found.");
    }

    #[test]
    fn warn_line_with_timestamp_and_location() {
        let p = PrefixParser::default();
        let l = p
            .parse("[2026-11-29 13:51:19] vm:880:880 [0] plugin/net.cc:379 NCCL WARN Failed to initialize any NET plugin")
            .expect("nccl line");
        assert_eq!(l.process, "vm:880");
        assert_eq!(l.cuda_dev, Some(0));
        assert_eq!(l.location, Some("plugin/net.cc:379"));
        assert_eq!(l.level, Level::Warn);
        assert_eq!(l.message, "Failed to initialize any NET plugin");
    }

    #[test]
    fn mpirun_tag_output_prefix_is_dropped() {
        let p = PrefixParser::default();
        let l = p
            .parse("[1,0]<stdout>:node-a:1234:1290 [0] NCCL INFO Using network IB")
            .expect("nccl line");
        assert_eq!(l.process, "node-a:1234");
        assert_eq!(l.host, "node-a");
        assert_eq!(l.message, "Using network IB");
    }

    #[test]
    fn other_lines_are_not_nccl() {
        let p = PrefixParser::default();
        assert!(
            p.parse("[rank0]: Traceback (most recent call last):")
                .is_none()
        );
        assert!(p.parse("the NCCL library is great").is_none());
        assert!(p.parse("").is_none());
    }

    #[test]
    fn bare_nccl_line_has_no_process() {
        let p = PrefixParser::default();
        let l = p
            .parse("NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")
            .expect("nccl line");
        assert_eq!(l.process, "");
        assert_eq!(l.pid, None);
    }
}
