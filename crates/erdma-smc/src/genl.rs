//! The generic-netlink codec shared by the SMC families (`SMC_PNETID`, `SMC_GEN_NETLINK`) and
//! `smc_diag`: `nlmsghdr` (16 bytes) + `genlmsghdr` (4 bytes) + attributes (`nlattr`, 4-byte
//! aligned), as in `linux/netlink.h` and `linux/genetlink.h`. Pure byte work: the sockets are the
//! clients' (`pnet`, `ueid`, `diag`).

/// `GENL_ID_CTRL`: the nlctrl family.
pub const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_GETFAMILY`.
pub const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16).
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME` (string).
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// Size of `nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// Size of `genlmsghdr`.
pub const GENL_HDRLEN: usize = 4;
/// Appends a netlink attribute (header, payload, padding to 4 bytes).
pub fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (align4(len) - len), 0);
}

/// Appends a NUL-terminated string attribute.
pub fn put_str_attr(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    put_attr(buf, kind, &v);
}

/// `n` rounded up to the netlink alignment (4 bytes).
pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Encodes one generic-netlink request: `nlmsghdr` + `genlmsghdr` + the given attribute bytes.
pub fn encode_request(
    family: u16,
    flags: u16,
    seq: u32,
    cmd: u8,
    version: u8,
    attrs: &[u8],
) -> Vec<u8> {
    let len = NLMSG_HDRLEN + GENL_HDRLEN + attrs.len();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&family.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills in ours
    buf.push(cmd);
    buf.push(version);
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(attrs);
    buf
}

/// `CTRL_CMD_GETFAMILY` for `name`.
pub fn encode_get_family(seq: u32, name: &str) -> Vec<u8> {
    let mut attrs = Vec::new();
    put_str_attr(&mut attrs, CTRL_ATTR_FAMILY_NAME, name);
    encode_request(
        GENL_ID_CTRL,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
        &attrs,
    )
}

/// Attributes of one message: `(type, payload)` in order.
pub type Attrs = Vec<(u16, Vec<u8>)>;

/// One decoded netlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `NLMSG_ERROR`: 0 is an ACK, otherwise a negative errno.
    Error(i32),
    /// `NLMSG_DONE`: end of a dump.
    Done,
    /// A generic-netlink message: command and attributes `(type, payload)`.
    Genl {
        /// Sequence number.
        seq: u32,
        /// Command.
        cmd: u8,
        /// Attributes in order.
        attrs: Vec<(u16, Vec<u8>)>,
    },
}

/// The native-endian u16 at `at`, if the buffer holds it.
pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The native-endian u32 at `at`, if the buffer holds it.
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses attributes; `None` when an attribute overruns the buffer.
pub fn decode_attrs(mut b: &[u8]) -> Option<Vec<(u16, Vec<u8>)>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16_at(b, 0)?);
        let kind = u16_at(b, 2)? & 0x3fff; // strip NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if len < 4 || len > b.len() {
            return None;
        }
        out.push((kind, b[4..len].to_vec()));
        b = &b[align4(len).min(b.len())..];
    }
    Some(out)
}

/// Splits a datagram into messages. Errors name the offset that is wrong.
pub fn decode_messages(mut b: &[u8]) -> Result<Vec<Message>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let len = u32_at(b, 0).ok_or("truncated nlmsghdr")? as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(format!("nlmsg_len {len} with {} bytes left", b.len()));
        }
        let kind = u16_at(b, 4).ok_or("truncated nlmsghdr")?;
        let seq = u32_at(b, 8).ok_or("truncated nlmsghdr")?;
        let body = &b[NLMSG_HDRLEN..len];
        let msg = match kind {
            NLMSG_ERROR => {
                let e = u32_at(body, 0).ok_or("truncated nlmsgerr")? as i32;
                Message::Error(e)
            }
            NLMSG_DONE => Message::Done,
            _ => {
                if body.len() < GENL_HDRLEN {
                    return Err(format!("message of {len} bytes has no genlmsghdr"));
                }
                let attrs =
                    decode_attrs(&body[GENL_HDRLEN..]).ok_or("attribute overruns its message")?;
                Message::Genl {
                    seq,
                    cmd: body[0],
                    attrs,
                }
            }
        };
        out.push(msg);
        b = &b[align4(len).min(b.len())..];
    }
    Ok(out)
}

/// The string in a NUL-terminated string attribute (lossy UTF-8).
pub fn attr_str(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(&payload[..end]).into_owned()
}
