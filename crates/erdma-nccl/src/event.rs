//! What one NCCL message says: the facts the analysis needs, classified from the message text.
//!
//! Formats follow NCCL 2.1x–2.2x sources as summarised in `nccl-and-arena.md` §A2/§A3; each
//! classifier accepts the older and newer spellings (for example channel lines with `[busId]` or
//! `[nvmlDev]`, with or without `/connIndex`).

use crate::diagnose::ErrorKind;

/// One IB device listed in `NET/IB : Using [0]erdma_0:1/RoCE ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbDevice<'a> {
    /// NCCL's network device index (`[0]`).
    pub index: u32,
    /// RDMA device name, e.g. `erdma_0`.
    pub name: &'a str,
    /// Port number.
    pub port: u32,
    /// Link layer as printed: `RoCE` (Ethernet) or `IB`.
    pub link_layer: &'a str,
}

/// The transport of one channel connection line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelLink<'a> {
    /// Family: `NET`, `P2P`, `SHM`, `COLLNET`, `NVLS` ...
    pub family: &'a str,
    /// Sub-kind: the net name (`IB`, `Socket`, plugin name) for NET, the mechanism (`CUMEM`,
    /// `IPC`, `direct pointer`) for P2P, `direct` for SHM.
    pub kind: &'a str,
    /// NCCL net device index for NET (`NET/IB/0`).
    pub net_dev: Option<u32>,
    /// `/GDRDMA` present.
    pub gdr: bool,
    /// `[send]` / `[receive]` or none (P2P/SHM lines carry no direction).
    pub direction: Option<&'a str>,
    /// Sending rank and receiving rank (`0[0] -> 1[1]`).
    pub from_rank: Option<u32>,
    /// Receiving rank.
    pub to_rank: Option<u32>,
}

/// A classified NCCL message.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// `NCCL version 2.28.9+cuda13.0`.
    Version(&'a str),
    /// `NET/IB : Using [0]erdma_0:1/RoCE [RO]; OOB eth0:10.0.1.23<0>` (devices may be empty).
    IbUsing {
        /// The devices listed.
        devices: Vec<IbDevice<'a>>,
        /// Out-of-band interface (`eth0:10.0.1.23<0>`).
        oob: Option<&'a str>,
        /// `[RO]` (PCI relaxed ordering) shown.
        relaxed_ordering: bool,
    },
    /// `NET/Socket : Using [0]eth0:192.0.2.2<0>`.
    SocketUsing(Vec<&'a str>),
    /// `Using network IB`.
    UsingNetwork(&'a str),
    /// `Initialized NET plugin Socket` / `Loaded net plugin X` / `Assigned NET plugin X to comm`.
    NetPluginReady(&'a str),
    /// `Failed to initialize NET plugin IB`.
    NetPluginFailed(&'a str),
    /// Communicator init line: rank / nranks / commId (`ncclCommInitRank...`, `comm 0x.. rank ..`).
    Comm {
        /// The rank of this process in the communicator.
        rank: Option<u32>,
        /// Size of the communicator.
        nranks: Option<u32>,
        /// `nNodes` of the summary line (2.19+).
        nnodes: Option<u32>,
        /// `commId 0x...` (2.17+).
        comm_id: Option<u64>,
        /// `- Init COMPLETE` seen.
        complete: bool,
    },
    /// A `Channel .. via ...` connection.
    Channel(ChannelLink<'a>),
    /// `NET/IB : GPU Direct RDMA Enabled for HCA 0 'erdma_0'`.
    GdrDecision {
        /// Net name (`IB`, `Socket`).
        net: &'a str,
        /// Enabled or Disabled.
        enabled: bool,
        /// HCA name in quotes.
        hca: &'a str,
    },
    /// `NCCL_IB_GID_INDEX set by environment to 3.` and the like.
    EnvSet {
        /// Variable name.
        name: &'a str,
        /// Value as printed (trailing `.` removed).
        value: &'a str,
    },
    /// `NET/IB: ... GID 3 (0/...)` on QP connect: the GID index in use.
    GidInUse(i64),
    /// `<file>:<line> -> <code>`: an NCCL error code returned up the stack.
    ReturnCode(u32),
    /// A known error, warning or notable condition.
    Problem(ErrorKind),
    /// A WARN that none of the classifiers knows.
    UnknownWarn,
    /// Anything else.
    Other,
}

/// Classifies an NCCL message (the text after `NCCL INFO ` / `NCCL WARN `). `warn` is true for
/// WARN (and higher) lines: connection failures count only there, since NCCL logs its retries at
/// INFO level, and skipping those searches keeps INFO lines cheap.
pub fn classify(msg: &str, warn: bool) -> Event<'_> {
    let b = msg.as_bytes();
    let Some(&first) = b.first() else {
        return Event::Other;
    };
    match first {
        b'N' => classify_n(msg),
        b'C' => classify_c(msg, warn),
        b'U' => {
            if let Some(net) = msg.strip_prefix("Using network ") {
                Event::UsingNetwork(trim(net))
            } else {
                Event::Other
            }
        }
        b'I' => {
            if let Some(p) = msg.strip_prefix("Initialized NET plugin ") {
                Event::NetPluginReady(trim(p))
            } else {
                Event::Other
            }
        }
        b'A' => {
            if let Some(p) = msg.strip_prefix("Assigned NET plugin ") {
                Event::NetPluginReady(trim(p.trim_end_matches(" to comm")))
            } else {
                Event::Other
            }
        }
        b'F' => {
            if let Some(p) = msg.strip_prefix("Failed to initialize NET plugin ") {
                Event::NetPluginFailed(trim(p))
            } else if msg.starts_with("Failed to initialize any NET plugin") {
                Event::Problem(ErrorKind::NetPluginInitFailed)
            } else {
                Event::Other
            }
        }
        b'n' if msg.starts_with("ncclCommInit") => comm_event(msg),
        b'c' if msg.starts_with("comm 0x") => comm_event(msg),
        _ => classify_rest(msg, warn),
    }
}

/// Whether an INFO message may say anything: `false` only when [`classify`]`(text, false)` is
/// [`Event::Other`] for the text of `msg` (lossy or not). Decided on the raw bytes from the first
/// bytes of the message, without a UTF-8 check: most INFO lines of a log (ring and tree layouts,
/// proxy connections, allocations) end here.
pub fn may_classify(msg: &[u8]) -> bool {
    let Some(&first) = msg.first() else {
        return false;
    };
    match first {
        b'N' => {
            msg.starts_with(b"NET/")
                || msg.starts_with(b"NCCL_")
                || msg.starts_with(b"NCCL version ")
        }
        b'C' => {
            if msg.starts_with(b"Channel ") {
                find_bytes(msg, b" via ").is_some()
            } else {
                msg.starts_with(b"Call to ibv_")
                    || msg.starts_with(b"Cuda failure")
                    || may_classify_rest(msg)
            }
        }
        b'U' => msg.starts_with(b"Using network "),
        b'I' => msg.starts_with(b"Initialized NET plugin "),
        b'A' => msg.starts_with(b"Assigned NET plugin "),
        b'F' => msg.starts_with(b"Failed to initialize "),
        b'n' if msg.starts_with(b"ncclCommInit") => true,
        b'c' if msg.starts_with(b"comm 0x") => true,
        _ => may_classify_rest(msg),
    }
}

/// [`may_classify`] for the INFO messages that `classify_rest` reads: a return code
/// (`init.cc:421 -> 5`: a first token with a `:`, then `->` after whitespace) or one of two
/// prefixes.
fn may_classify_rest(msg: &[u8]) -> bool {
    match msg.first() {
        Some(b'B') if msg.starts_with(b"Bootstrap : no socket interface found") => return true,
        Some(b'D') if msg.starts_with(b"Duplicate GPU detected") => return true,
        _ => {}
    }
    // The first token is short: where it ends within 16 bytes, two compares of those bytes say
    // where and whether it holds a `:`; else a plain loop.
    let head = msg.first_chunk::<16>().map(|h| {
        (
            crate::scan::mask16(h, *b"    "),
            crate::scan::mask16(h, *b"::::"),
        )
    });
    let (colon, space) = match head {
        Some((spaces, colons)) if spaces != 0 => {
            let space = spaces.trailing_zeros() as usize;
            (colons & ((1 << space) - 1) != 0, Some(space))
        }
        _ => {
            let mut colon = false;
            let mut space = None;
            for (i, &b) in msg.iter().enumerate() {
                if b == b' ' {
                    space = Some(i);
                    break;
                }
                colon |= b == b':';
            }
            (colon, space)
        }
    };
    let Some(space) = space.filter(|_| colon) else {
        return false;
    };
    // The next token must be `->`; whitespace other than ASCII (U+00A0 ...) could come first.
    match msg[space..]
        .iter()
        .find(|b| !matches!(b, b'\t'..=b'\r' | b' '))
    {
        Some(b'-') => true,
        Some(b) => !b.is_ascii(),
        None => false,
    }
}

fn classify_n(msg: &str) -> Event<'_> {
    if let Some(v) = msg.strip_prefix("NCCL version ") {
        return Event::Version(tokens(v).next().unwrap_or(""));
    }
    if let Some(rest) = msg.strip_prefix("NET/IB") {
        // Also `NET/IBext` / `NET/IBext_v8` (nccl-rdma-sharp-plugins), which logs the same lines.
        let rest = if rest.starts_with("ext") {
            rest.trim_start_matches(|c: char| c != ' ' && c != ':')
        } else {
            rest
        };
        return classify_net_ib(rest.trim_start_matches([' ', ':']).trim_start(), msg);
    }
    if let Some(rest) = msg.strip_prefix("NET/Socket") {
        let rest = rest.trim_start_matches([' ', ':']).trim_start();
        if let Some(list) = rest.strip_prefix("Using") {
            let ifaces = list
                .split_whitespace()
                .filter(|t| t.starts_with('['))
                .collect();
            return Event::SocketUsing(ifaces);
        }
        if rest.starts_with("GPU Direct RDMA") {
            return gdr_event("Socket", rest);
        }
        if rest.starts_with("No usable listening interface") {
            return Event::Problem(ErrorKind::SocketNoInterface);
        }
        return Event::Other;
    }
    if let Some(rest) = msg.strip_prefix("NET/Plugin") {
        let rest = rest.trim_start_matches([' ', ':']).trim_start();
        if let Some(name) = rest.strip_prefix("Loaded net plugin ") {
            return Event::NetPluginReady(trim(find(name, " (").map_or(name, |i| &name[..i])));
        }
        return Event::Other;
    }
    if msg.starts_with("NCCL_") {
        // `NCCL_X set by environment to Y.`; 2.28 also prints `NCCL_X set to Y` (no "by environment").
        if let Some(at) = find(msg, " set by environment to ") {
            let name = &msg[..at];
            let value = msg[at + " set by environment to ".len()..]
                .trim()
                .trim_end_matches('.');
            return Event::EnvSet { name, value };
        }
        return Event::Other;
    }
    if msg.starts_with("NET/") {
        // A NET plugin's own GPU Direct decision: NET/<name> : GPU Direct RDMA ...
        if let Some(sep) = find(msg, " : GPU Direct RDMA") {
            let net = &msg[4..sep];
            return gdr_event(net, &msg[sep + 3..]);
        }
    }
    Event::Other
}

fn classify_net_ib<'a>(rest: &'a str, full: &'a str) -> Event<'a> {
    if let Some(list) = rest.strip_prefix("Using") {
        return ib_using(list);
    }
    if rest.starts_with("No device found") {
        return Event::Problem(ErrorKind::IbNoDevice);
    }
    if rest.starts_with("GPU Direct RDMA") {
        return gdr_event("IB", rest);
    }
    if rest.starts_with("Unable to open device")
        || rest.starts_with("Unable to query device")
        || rest.starts_with("Unable to query port")
    {
        return Event::Problem(ErrorKind::IbDeviceUnusable);
    }
    if rest.starts_with("No IP interface found") {
        return Event::Problem(ErrorKind::IbNoIpInterface);
    }
    if rest.starts_with("Got completion") || find(rest, "Got completion from peer").is_some() {
        return Event::Problem(ErrorKind::IbCompletionError);
    }
    if find(rest, "async fatal event").is_some() || find(rest, "GID table changed").is_some() {
        return Event::Problem(ErrorKind::IbAsyncEvent);
    }
    if rest.starts_with("Attempted to connect incompatible devices") {
        return Event::Problem(ErrorKind::IbIncompatibleDevices);
    }
    // QP connect lines: `NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 7 mtu 5 ... GID 3 (0/..)` and
    // `NET/IB: Dev 0 Port 1 qpn 7 mtu 5 GID 3 (..)` before 2.19.
    if let Some(at) = find(full, " GID ") {
        let tail = &full[at + 5..];
        let num = tail.split([' ', '(']).next().unwrap_or("");
        if let Ok(g) = num.parse::<i64>() {
            return Event::GidInUse(g);
        }
    }
    Event::Other
}

fn ib_using(list: &str) -> Event<'_> {
    let (devs, oob) = match list.find(';') {
        Some(i) => (
            &list[..i],
            list[i + 1..].trim().strip_prefix("OOB ").map(str::trim),
        ),
        None => (list, None),
    };
    let mut devices = Vec::new();
    let mut relaxed_ordering = false;
    for tok in tokens(devs) {
        if tok == "[RO]" {
            relaxed_ordering = true;
            continue;
        }
        if let Some(d) = ib_device(tok) {
            devices.push(d);
        }
    }
    Event::IbUsing {
        devices,
        oob,
        relaxed_ordering,
    }
}

/// `[0]erdma_0:1/RoCE` (also `[0]mlx5_0:1/IB/SHARP`).
fn ib_device(tok: &str) -> Option<IbDevice<'_>> {
    let rest = tok.strip_prefix('[')?;
    let close = rest.find(']')?;
    let index = rest[..close].parse().ok()?;
    let rest = &rest[close + 1..];
    let colon = rest.rfind(':')?;
    let name = &rest[..colon];
    let after = &rest[colon + 1..];
    let mut parts = after.split('/');
    let port = parts.next()?.parse().ok()?;
    let link_layer = parts.next().unwrap_or("");
    if name.is_empty() {
        return None;
    }
    Some(IbDevice {
        index,
        name,
        port,
        link_layer,
    })
}

fn gdr_event<'a>(net: &'a str, rest: &'a str) -> Event<'a> {
    // "GPU Direct RDMA Enabled for HCA 0 'erdma_0'" / "... Disabled for HCA 0 'lo' (...)"
    let enabled = find(rest, "RDMA Enabled").is_some();
    let hca = rest.split('\'').nth(1).unwrap_or("");
    Event::GdrDecision { net, enabled, hca }
}

fn classify_c(msg: &str, warn: bool) -> Event<'_> {
    if msg.starts_with("Channel ") {
        if let Some(link) = channel(msg) {
            return Event::Channel(link);
        }
        return Event::Other;
    }
    if msg.starts_with("Call to ibv_reg_mr") || msg.starts_with("Call to ibv_reg_dmabuf_mr") {
        return Event::Problem(ErrorKind::IbRegMrFailed);
    }
    if msg.starts_with("Call to ibv_modify_qp") {
        return Event::Problem(ErrorKind::IbModifyQpFailed);
    }
    if msg.starts_with("Call to ibv_") {
        return Event::Problem(ErrorKind::IbVerbsCallFailed);
    }
    if msg.starts_with("Cuda failure") {
        return Event::Problem(ErrorKind::CudaFailure);
    }
    classify_rest(msg, warn)
}

/// `Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA` and the older forms.
fn channel(msg: &str) -> Option<ChannelLink<'_>> {
    let via_at = find(msg, " via ")?;
    let head = &msg[..via_at];
    let via = trim(&msg[via_at + 5..]);
    let direction = if head.ends_with("[send]") {
        Some("send")
    } else if head.ends_with("[receive]") {
        Some("receive")
    } else {
        None
    };
    let (from_rank, to_rank) = match find(head, " : ") {
        Some(i) => {
            // The first two pieces of `split(" -> ")`.
            let ranks = &head[i + 3..];
            let (from, to) = match find(ranks, " -> ") {
                Some(j) => {
                    let rest = &ranks[j + 4..];
                    (
                        &ranks[..j],
                        Some(find(rest, " -> ").map_or(rest, |k| &rest[..k])),
                    )
                }
                None => (ranks, None),
            };
            (rank_of(from), to.and_then(rank_of))
        }
        None => (None, None),
    };
    // via: NET/IB/0/GDRDMA, NET/IB/0(3)/GDRDMA, NET/Socket/0, P2P/CUMEM/read, P2P/direct pointer,
    // SHM/direct/direct, COLLNET/...
    let via = find(via, " comm ").map_or(via, |i| &via[..i]);
    let (family, rest) = match find_char(via, b'/') {
        Some(i) => (&via[..i], &via[i + 1..]),
        None => (via, ""),
    };
    let (kind, tail) = match find_char(rest, b'/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let mut net_dev = None;
    if family == "NET" {
        let dev_tok = tail.split('/').next().unwrap_or("");
        let digits = dev_tok.split('(').next().unwrap_or("");
        net_dev = digits.parse().ok();
    }
    if family.is_empty() {
        return None;
    }
    Some(ChannelLink {
        family,
        kind,
        net_dev,
        gdr: find(tail, "GDRDMA").is_some(),
        direction,
        from_rank,
        to_rank,
    })
}

/// `haystack.find(needle)` for the short messages of a log line: one `memchr` per candidate of the
/// needle's first non-space byte, where `str::find` would first build a two-way searcher (which
/// costs more than the whole search on a line this short).
#[inline(always)]
fn find(haystack: &str, needle: &str) -> Option<usize> {
    find_bytes(haystack.as_bytes(), needle.as_bytes())
}

/// [`find`] on bytes.
#[inline(always)]
fn find_bytes(h: &[u8], n: &[u8]) -> Option<usize> {
    let Some(k) = n.iter().position(|&b| b != b' ') else {
        return memchr::memmem::find(h, n);
    };
    let mut from = k;
    while from < h.len() {
        let p = from + find_byte(&h[from..], n[k])?;
        if h.get(p - k..p - k + n.len())
            .is_some_and(|w| w.iter().zip(n).all(|(a, b)| a == b))
        {
            return Some(p - k);
        }
        from = p + 1;
    }
    None
}

/// Where byte `b` first is in `h`: a plain loop over the short pieces of a message, where the
/// set-up of `memchr` costs more than the search.
#[inline]
fn find_byte(h: &[u8], b: u8) -> Option<usize> {
    if h.len() < 32 {
        h.iter().position(|&x| x == b)
    } else {
        memchr::memchr(b, h)
    }
}

/// `s.find(c)` for an ASCII `c` (the index is a char boundary).
#[inline]
fn find_char(s: &str, c: u8) -> Option<usize> {
    find_byte(s.as_bytes(), c)
}

/// The whitespace-separated tokens of `s`, exactly as [`str::split_whitespace`] gives them, read
/// as bytes when `s` is ASCII (no UTF-8 decoding per character).
enum Tokens<'a> {
    Ascii(&'a str, usize),
    Unicode(std::str::SplitWhitespace<'a>),
}

fn tokens(s: &str) -> Tokens<'_> {
    if s.is_ascii() {
        Tokens::Ascii(s, 0)
    } else {
        Tokens::Unicode(s.split_whitespace())
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        match self {
            Tokens::Unicode(it) => it.next(),
            Tokens::Ascii(s, pos) => {
                // ASCII whitespace as `char::is_whitespace` has it: \t \n \x0b \x0c \r and space.
                let ws = |b: u8| matches!(b, b'\t'..=b'\r' | b' ');
                let b = s.as_bytes();
                let mut i = *pos;
                while i < b.len() && ws(b[i]) {
                    i += 1;
                }
                let start = i;
                while i < b.len() && !ws(b[i]) {
                    i += 1;
                }
                *pos = i;
                (start < i).then(|| &s[start..i])
            }
        }
    }
}

/// `s.trim()`, without decoding characters when both ends are ASCII (the usual case).
#[inline]
fn trim(s: &str) -> &str {
    let ws = |b: &u8| matches!(b, b'\t'..=b'\r' | b' ');
    let b = s.as_bytes();
    let start = b.iter().position(|x| !ws(x)).unwrap_or(b.len());
    let end = b.iter().rposition(|x| !ws(x)).map_or(start, |i| i + 1);
    let non_ascii = |i: Option<usize>| i.and_then(|i| b.get(i)).is_some_and(|x| !x.is_ascii());
    if non_ascii(Some(start)) || non_ascii(end.checked_sub(1)) {
        // Whitespace other than ASCII (U+00A0 ...) may be there: let `str::trim` decide.
        return s.trim();
    }
    &s[start..end]
}

/// `0[0]` / `1[3e000]` → 0 / 1.
fn rank_of(tok: &str) -> Option<u32> {
    // The usual form, read in place: up to 9 digits, then `[` or the end.
    let b = tok.as_bytes();
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if (1..=9).contains(&digits) && b.get(digits).is_none_or(|&c| c == b'[') {
        return Some(
            b[..digits]
                .iter()
                .fold(0, |n, d| n * 10 + u32::from(d - b'0')),
        );
    }
    let tok = trim(tok);
    let end = find_char(tok, b'[').unwrap_or(tok.len());
    parse_u32(trim(&tok[..end]))
}

/// `s.parse::<u32>()`, with the usual few digits read in place.
#[inline]
fn parse_u32(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    if !b.is_empty() && b.len() <= 9 && b.iter().all(u8::is_ascii_digit) {
        // At most 9 digits: no overflow.
        return Some(b.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')));
    }
    s.parse().ok()
}

fn comm_event(msg: &str) -> Event<'_> {
    let mut rank = None;
    let mut nranks = None;
    let mut nnodes = None;
    let mut comm_id = None;
    let mut it = tokens(msg);
    while let Some(tok) = it.next() {
        match tok {
            "rank" => rank = it.next().and_then(parse_u32),
            "nranks" | "nRanks" => nranks = it.next().and_then(parse_u32),
            "nNodes" => nnodes = it.next().and_then(parse_u32),
            "commId" => {
                comm_id = it
                    .next()
                    .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            }
            _ => {}
        }
    }
    Event::Comm {
        rank,
        nranks,
        nnodes,
        comm_id,
        complete: msg.ends_with("Init COMPLETE"),
    }
}

fn classify_rest(msg: &str, warn: bool) -> Event<'_> {
    // `init.cc:421 -> 5` (error code unwinding), possibly followed by ` [Async thread]`: the first
    // token is a source location.
    let first = match memchr::memchr(b' ', msg.as_bytes()) {
        Some(i) => &msg[..i],
        None => msg,
    };
    let is_location = memchr::memrchr(b':', first.as_bytes()).is_some_and(|c| {
        first[..c].ends_with(".cc") || first[..c].ends_with(".h") || first[..c].ends_with(".cu")
    });
    if is_location {
        let mut it = tokens(&msg[first.len()..]);
        if it.next() == Some("->")
            && let Some(Ok(c)) = it.next().map(str::parse)
        {
            return Event::ReturnCode(c);
        }
    }
    if msg.starts_with("Bootstrap : no socket interface found") {
        return Event::Problem(ErrorKind::SocketNoInterface);
    }
    if msg.starts_with("Duplicate GPU detected") {
        return Event::Problem(ErrorKind::DuplicateGpu);
    }
    if !warn {
        return Event::Other;
    }
    if find(msg, "no socket interface found").is_some() {
        return Event::Problem(ErrorKind::SocketNoInterface);
    }
    if find(msg, "Connection closed by remote peer").is_some()
        || find(msg, "remote process exited").is_some()
    {
        return Event::Problem(ErrorKind::PeerConnectionClosed);
    }
    if find(msg, "Connection refused").is_some() || find(msg, "timed out").is_some() {
        return Event::Problem(ErrorKind::ConnectTimeout);
    }
    Event::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn find_equals_str_find(
            h in proptest::collection::vec(proptest::sample::select(vec![" ", "via", "v", "->", "-", ">", ":", "comm", "GDRDMA", "a", "é"]), 0..24),
            n in proptest::sample::select(vec![" via ", " -> ", " : ", " comm ", "GDRDMA"]),
        ) {
            let h = h.concat();
            proptest::prop_assert_eq!(find(&h, n), h.find(n));
        }
    }

    proptest::proptest! {
        /// The INFO pre-filter never drops a message that says something.
        #[test]
        fn may_classify_false_means_other(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                &b"NCCL version "[..], b"NET/", b"NET/IB : ", b"NCCL_", b"NCCL", b"Channel ", b" via ",
                b"NET/IB/0", b"Call to ibv_", b"Cuda failure", b"Using network ", b"Initialized NET plugin ",
                b"Assigned NET plugin ", b"Failed to initialize ", b"any NET plugin", b"ncclCommInit",
                b"comm 0x", b"Bootstrap : no socket interface found", b"Duplicate GPU detected",
                b"init.cc:12", b"x.h:1", b".cu:", b":", b" ", b"\t", b"\x0b", b"->", b"-", b" -> ", b"5",
                b"N", b"C", b"c", b"n", b"U", b"I", b"A", b"F", b"B", b"D", b"rank", "\u{a0}".as_bytes(),
                "\u{2003}".as_bytes(), &[0xff], &[0xc2], b"Tree 3 : -1 -> 0", b"Ring", b"GID ",
            ]), 0..8),
        ) {
            let msg = pieces.concat();
            let text = String::from_utf8_lossy(&msg);
            if !may_classify(&msg) {
                proptest::prop_assert_eq!(classify(&text, false), Event::Other);
            }
        }

        /// The first token's end and `:` found 16 bytes at a time are those of a byte loop.
        #[test]
        fn may_classify_rest_equals_the_byte_loop(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                &b"init.cc:12"[..], b"abcdefghijklmnop", b":", b" ", b"\t", b"->", b"-", b"5", b"x",
                "\u{a0}".as_bytes(), &[0xff], b"B", b"D",
            ]), 0..10),
        ) {
            let msg = pieces.concat();
            let space = msg.iter().position(|&b| b == b' ');
            let colon = msg[..space.unwrap_or(msg.len())].contains(&b':');
            let expect = match space.filter(|_| colon) {
                None => false,
                Some(space) => match msg[space..].iter().find(|b| !matches!(b, b'\t'..=b'\r' | b' ')) {
                    Some(b'-') => true,
                    Some(b) => !b.is_ascii(),
                    None => false,
                },
            };
            let prefixed = msg.starts_with(b"Bootstrap : no socket interface found")
                || msg.starts_with(b"Duplicate GPU detected");
            proptest::prop_assert_eq!(may_classify_rest(&msg), expect || prefixed);
        }

        #[test]
        fn tokens_and_trim_equal_std(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                " ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\u{a0}", "\u{2003}", "\u{85}", "a", "rank",
                "é", "[0]",
            ]), 0..12),
        ) {
            let s = pieces.concat();
            proptest::prop_assert_eq!(tokens(&s).collect::<Vec<_>>(), s.split_whitespace().collect::<Vec<_>>());
            proptest::prop_assert_eq!(trim(&s), s.trim());
        }

        #[test]
        fn rank_of_equals_the_plain_parse(s in "[ 0-9a\\[\\]]{0,14}") {
            let t = s.trim();
            let plain = t[..t.find('[').unwrap_or(t.len())].trim().parse::<u32>().ok();
            proptest::prop_assert_eq!(rank_of(&s), plain);
        }

        #[test]
        fn parse_u32_equals_std(s in "[+-]?[0-9 a]{0,12}") {
            proptest::prop_assert_eq!(parse_u32(&s), s.parse::<u32>().ok());
        }
    }

    #[test]
    fn pre_filter_keeps_the_lines_that_matter_and_drops_chatter() {
        for msg in [
            "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
            "comm 0x5611c0b0 rank 1 nranks 2 cudaDev 0 busId 3d000 commId 0x1b2c3d4e5f607182 - Init COMPLETE",
            "NCCL_SOCKET_IFNAME set by environment to eth0",
            "init.cc:421 -> 5",
            "NET/IB : No device found.",
        ] {
            assert!(may_classify(msg.as_bytes()), "{msg}");
        }
        for msg in [
            "Channel 13/64 : 0",
            "Tree 56 : -1 -> 0 -> -1/-1/-1",
            "channel.cc:46 Cuda Alloc Size 4 pointer 0x7f3ffb000000",
            "Connected to proxy localRank 0 -> connection 0x7fe8a8005588",
            " 1 : GPU/0-60",
            "",
        ] {
            assert!(!may_classify(msg.as_bytes()), "{msg}");
            assert_eq!(classify(msg, false), Event::Other, "{msg}");
        }
    }

    fn classify_info(msg: &str) -> Event<'_> {
        classify(msg, false)
    }

    #[test]
    fn ib_using_with_erdma_devices_and_relaxed_ordering() {
        let e = classify_info(
            "NET/IB : Using [0]erdma_0:1/RoCE [1]erdma_1:1/RoCE [RO]; OOB eth0:10.0.1.23<0>",
        );
        let Event::IbUsing {
            devices,
            oob,
            relaxed_ordering,
        } = e
        else {
            panic!("not IbUsing: {e:?}")
        };
        assert_eq!(devices.len(), 2);
        assert_eq!(
            devices[0],
            IbDevice {
                index: 0,
                name: "erdma_0",
                port: 1,
                link_layer: "RoCE"
            }
        );
        assert_eq!(devices[1].name, "erdma_1");
        assert_eq!(oob, Some("eth0:10.0.1.23<0>"));
        assert!(relaxed_ordering);
    }

    #[test]
    fn ib_using_without_devices_after_no_device_found() {
        let e = classify_info("NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>");
        assert_eq!(
            e,
            Event::IbUsing {
                devices: vec![],
                oob: Some("eth0:192.0.2.2<0>"),
                relaxed_ordering: true
            }
        );
    }

    #[test]
    fn older_ib_using_with_space_before_semicolon() {
        let e = classify_info("NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.1.1<0>");
        let Event::IbUsing { devices, .. } = e else {
            panic!("not IbUsing")
        };
        assert_eq!(devices[0].link_layer, "IB");
    }

    #[test]
    fn channel_forms() {
        let Event::Channel(c) =
            classify_info("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA")
        else {
            panic!("channel")
        };
        assert_eq!(
            (c.family, c.kind, c.net_dev, c.gdr, c.direction),
            ("NET", "IB", Some(0), true, Some("send"))
        );
        assert_eq!((c.from_rank, c.to_rank), (Some(0), Some(1)));
        let Event::Channel(c) =
            classify_info("Channel 01/0 : 1[1] -> 0[0] [receive] via NET/Socket/0")
        else {
            panic!("channel")
        };
        assert_eq!(
            (c.family, c.kind, c.gdr, c.direction),
            ("NET", "Socket", false, Some("receive"))
        );
        let Event::Channel(c) = classify_info("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM") else {
            panic!("channel")
        };
        assert_eq!((c.family, c.kind, c.direction), ("P2P", "CUMEM", None));
        let Event::Channel(c) = classify_info("Channel 00 : 0[0] -> 1[1] via SHM/direct/direct")
        else {
            panic!("channel")
        };
        assert_eq!((c.family, c.kind), ("SHM", "direct"));
        let Event::Channel(c) =
            classify_info("Channel 02/1 : 3[3] -> 11[3] [send] via NET/IB/0(3)/GDRDMA")
        else {
            panic!("channel")
        };
        assert_eq!((c.net_dev, c.gdr), (Some(0), true));
        let Event::Channel(c) = classify_info("Channel 00 : 0[3d000] -> 1[3e000] via P2P/IPC")
        else {
            panic!("channel")
        };
        assert_eq!((c.from_rank, c.to_rank, c.kind), (Some(0), Some(1), "IPC"));
        assert_eq!(classify_info("Channel 00/24 : 0 1"), Event::Other);
    }

    #[test]
    fn comm_lines() {
        let e = classify_info(
            "ncclCommInitRankConfig comm 0x454f94d0 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 70 commId 0x856452113e1e50a1 - Init START",
        );
        assert_eq!(
            e,
            Event::Comm {
                rank: Some(1),
                nranks: Some(2),
                nnodes: None,
                comm_id: Some(0x856452113e1e50a1),
                complete: false
            }
        );
        let e = classify_info(
            "comm 0x16972540 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
        );
        assert_eq!(
            e,
            Event::Comm {
                rank: Some(1),
                nranks: Some(2),
                nnodes: Some(2),
                comm_id: None,
                complete: false
            }
        );
    }

    #[test]
    fn gid_env_gdr_and_codes() {
        assert_eq!(
            classify_info("NCCL_IB_GID_INDEX set by environment to 3."),
            Event::EnvSet {
                name: "NCCL_IB_GID_INDEX",
                value: "3"
            }
        );
        assert_eq!(
            classify_info(
                "NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 1031 mtu 3 query_ece={supported=0} GID 3 (0/6B00A8C0FFFF0000) fifoRkey=0x1 fifoLkey=0x2"
            ),
            Event::GidInUse(3)
        );
        assert_eq!(
            classify_info("NET/IB : GPU Direct RDMA Enabled for HCA 0 'erdma_0'"),
            Event::GdrDecision {
                net: "IB",
                enabled: true,
                hca: "erdma_0"
            }
        );
        assert_eq!(
            classify_info("NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'"),
            Event::GdrDecision {
                net: "Socket",
                enabled: false,
                hca: "lo"
            }
        );
        assert_eq!(classify_info("init.cc:421 -> 5"), Event::ReturnCode(5));
        assert_eq!(
            classify_info("group.cc:76 -> 5 [Async thread]"),
            Event::ReturnCode(5)
        );
        assert_eq!(
            classify_info("Using network Socket"),
            Event::UsingNetwork("Socket")
        );
        assert_eq!(
            classify_info("Failed to initialize NET plugin IB"),
            Event::NetPluginFailed("IB")
        );
        assert_eq!(
            classify_info("Failed to initialize any NET plugin"),
            Event::Problem(ErrorKind::NetPluginInitFailed)
        );
    }
}
