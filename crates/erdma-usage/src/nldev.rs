//! The RDMA netlink "nldev" codec: dump requests for the kernel's resource tracking and a parser of
//! the answers into plain types. Pure byte work; the socket is [`crate::source`]'s.
//!
//! Every number here is taken from the kernel's uapi header `include/uapi/rdma/rdma_netlink.h`
//! (as carried by iproute2 in `rdma/include/uapi/rdma/rdma_netlink.h`, commit ee2a4a8, whose
//! enums were compiled and printed to check the values) and from `linux/netlink.h`. How the kernel
//! answers is `drivers/infiniband/core/nldev.c` (read at gregkh/linux 0b28000b) and, for the
//! dump flag, `rdma_nl_rcv_msg` in `drivers/infiniband/core/netlink.c`:
//!
//! - A resource dump (`RDMA_NLDEV_CMD_RES_{QP,CQ,MR,PD}_GET` with `NLM_F_DUMP`) needs
//!   `RDMA_NLDEV_ATTR_DEV_INDEX` (`res_get_common_dumpit` answers `-EINVAL` without it); without
//!   `RDMA_NLDEV_ATTR_PORT_INDEX` it lists every object of that device. Each answer message
//!   (`NLM_F_MULTI`) holds the device handle (`DEV_INDEX`, `DEV_NAME`) and one table attribute
//!   (`RES_QP`, ...) of entries (`RES_QP_ENTRY`, ...), each a nested attribute set; a device
//!   with many objects answers in several messages, and the dump ends with `NLMSG_DONE`, whose
//!   payload is the dump's error (0, or a negative errno).
//! - Per entry `fill_res_name_pid`: `RDMA_NLDEV_ATTR_RES_KERN_NAME` for kernel objects, otherwise
//!   `RDMA_NLDEV_ATTR_RES_PID` in the reader's PID namespace, left out when it is 0 (the task is
//!   gone or not visible from the reader's namespace).
//! - `RDMA_NLDEV_CMD_GET` with `NLM_F_DUMP` lists the devices (`_nldev_get_dumpit`); its
//!   `PORT_INDEX` is the number of ports (`rdma_end_port`).
//! - `RDMA_NLDEV_CMD_STAT_GET` without `NLM_F_DUMP` and without `STAT_RES`, with `DEV_INDEX` and
//!   `PORT_INDEX`, answers the port's hardware counters (`stat_get_doit_default_counter`):
//!   `STAT_HWCOUNTERS` of `STAT_HWCOUNTER_ENTRY` {`_ENTRY_NAME`, `_ENTRY_VALUE`}, the values
//!   `rdma statistic` and `hw_counters/` in sysfs show.
//!
//! Tables nest without `NLA_F_NESTED` (`nla_nest_start_noflag`), the hardware counter tables with
//! it (`nla_nest_start`): the parser masks the flag bits (`NLA_TYPE_MASK`). u64 attributes come
//! from `nla_put_u64_64bit(.., RDMA_NLDEV_ATTR_PAD)`, which may put a `PAD` (type 0) attribute
//! first on architectures without efficient unaligned access: type 0 is skipped.
//!
//! The parser never panics and allocates in proportion to its input at most: each entry it returns
//! consumed at least one attribute header of input, strings are cut to [`MAX_NAME`] bytes, and a
//! malformed length is an error, never a read past the buffer.

use serde::Serialize;
use std::fmt;

/// `NETLINK_RDMA` (`linux/netlink.h`): the socket protocol.
pub const NETLINK_RDMA: i32 = 20;
/// `RDMA_NL_NLDEV`: the "RDMA device interface" netlink client (`enum { RDMA_NL_RDMA_CM = 1, ..}`).
pub const RDMA_NL_NLDEV: u16 = 5;

/// `RDMA_NL_GET_TYPE(client, op)`: `(client << 10) + op`.
pub const fn nl_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + op
}

/// `RDMA_NL_GET_CLIENT(type)`.
pub const fn nl_client(ty: u16) -> u16 {
    (ty & (((1 << 6) - 1) << 10)) >> 10
}

/// `RDMA_NL_GET_OP(type)`.
pub const fn nl_op(ty: u16) -> u16 {
    ty & ((1 << 10) - 1)
}

/// `enum rdma_nldev_command` (the ones read here).
pub mod cmd {
    /// `RDMA_NLDEV_CMD_GET` (can dump): devices.
    pub const GET: u16 = 1;
    /// `RDMA_NLDEV_CMD_PORT_GET` (can dump).
    pub const PORT_GET: u16 = 5;
    /// `RDMA_NLDEV_CMD_RES_GET` (can dump): per-device resource summary.
    pub const RES_GET: u16 = 9;
    /// `RDMA_NLDEV_CMD_RES_QP_GET` (can dump).
    pub const RES_QP_GET: u16 = 10;
    /// `RDMA_NLDEV_CMD_RES_CQ_GET` (can dump).
    pub const RES_CQ_GET: u16 = 12;
    /// `RDMA_NLDEV_CMD_RES_MR_GET` (can dump).
    pub const RES_MR_GET: u16 = 13;
    /// `RDMA_NLDEV_CMD_RES_PD_GET` (can dump).
    pub const RES_PD_GET: u16 = 14;
    /// `RDMA_NLDEV_CMD_STAT_GET`.
    pub const STAT_GET: u16 = 17;
}

/// `enum rdma_nldev_attr` (the ones read or sent here).
pub mod attr {
    /// `RDMA_NLDEV_ATTR_PAD` (= `RDMA_NLDEV_ATTR_UNSPEC`).
    pub const PAD: u16 = 0;
    /// `RDMA_NLDEV_ATTR_DEV_INDEX` (u32).
    pub const DEV_INDEX: u16 = 1;
    /// `RDMA_NLDEV_ATTR_DEV_NAME` (string).
    pub const DEV_NAME: u16 = 2;
    /// `RDMA_NLDEV_ATTR_PORT_INDEX` (u32).
    pub const PORT_INDEX: u16 = 3;
    /// `RDMA_NLDEV_ATTR_RES_SUMMARY` (nested table).
    pub const RES_SUMMARY: u16 = 15;
    /// `RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY` (nested table).
    pub const RES_SUMMARY_ENTRY: u16 = 16;
    /// `RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_NAME` (string).
    pub const RES_SUMMARY_ENTRY_NAME: u16 = 17;
    /// `RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_CURR` (u64).
    pub const RES_SUMMARY_ENTRY_CURR: u16 = 18;
    /// `RDMA_NLDEV_ATTR_RES_QP` (nested table).
    pub const RES_QP: u16 = 19;
    /// `RDMA_NLDEV_ATTR_RES_QP_ENTRY` (nested table).
    pub const RES_QP_ENTRY: u16 = 20;
    /// `RDMA_NLDEV_ATTR_RES_LQPN` (u32).
    pub const RES_LQPN: u16 = 21;
    /// `RDMA_NLDEV_ATTR_RES_TYPE` (u8).
    pub const RES_TYPE: u16 = 26;
    /// `RDMA_NLDEV_ATTR_RES_STATE` (u8).
    pub const RES_STATE: u16 = 27;
    /// `RDMA_NLDEV_ATTR_RES_PID` (u32).
    pub const RES_PID: u16 = 28;
    /// `RDMA_NLDEV_ATTR_RES_KERN_NAME` (string).
    pub const RES_KERN_NAME: u16 = 29;
    /// `RDMA_NLDEV_ATTR_RES_CQ` (nested table).
    pub const RES_CQ: u16 = 35;
    /// `RDMA_NLDEV_ATTR_RES_CQ_ENTRY` (nested table).
    pub const RES_CQ_ENTRY: u16 = 36;
    /// `RDMA_NLDEV_ATTR_RES_CQE` (u32).
    pub const RES_CQE: u16 = 37;
    /// `RDMA_NLDEV_ATTR_RES_USECNT` (u64).
    pub const RES_USECNT: u16 = 38;
    /// `RDMA_NLDEV_ATTR_RES_MR` (nested table).
    pub const RES_MR: u16 = 40;
    /// `RDMA_NLDEV_ATTR_RES_MR_ENTRY` (nested table).
    pub const RES_MR_ENTRY: u16 = 41;
    /// `RDMA_NLDEV_ATTR_RES_MRLEN` (u64).
    pub const RES_MRLEN: u16 = 45;
    /// `RDMA_NLDEV_ATTR_RES_PD` (nested table).
    pub const RES_PD: u16 = 46;
    /// `RDMA_NLDEV_ATTR_RES_PD_ENTRY` (nested table).
    pub const RES_PD_ENTRY: u16 = 47;
    /// `RDMA_NLDEV_ATTR_RES_PDN` (u32).
    pub const RES_PDN: u16 = 60;
    /// `RDMA_NLDEV_ATTR_RES_CQN` (u32).
    pub const RES_CQN: u16 = 61;
    /// `RDMA_NLDEV_ATTR_RES_MRN` (u32).
    pub const RES_MRN: u16 = 62;
    /// `RDMA_NLDEV_ATTR_STAT_HWCOUNTERS` (nested table).
    pub const STAT_HWCOUNTERS: u16 = 80;
    /// `RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY` (nested table).
    pub const STAT_HWCOUNTER_ENTRY: u16 = 81;
    /// `RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME` (string).
    pub const STAT_HWCOUNTER_ENTRY_NAME: u16 = 82;
    /// `RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE` (u64).
    pub const STAT_HWCOUNTER_ENTRY_VALUE: u16 = 83;
}

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x01;
/// `NLM_F_MULTI`.
pub const NLM_F_MULTI: u16 = 0x02;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x04;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 0x2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 0x3;
/// `sizeof(struct nlmsghdr)`.
pub const NLMSG_HDRLEN: usize = 16;
/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 1 << 15;
/// `NLA_F_NET_BYTEORDER`.
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
/// `NLA_TYPE_MASK`.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// Longest string kept from an attribute (`IB_DEVICE_NAME_MAX` is 64); longer ones are cut.
pub const MAX_NAME: usize = 64;

/// The kernel's name of a command, for errors.
pub fn command_name(op: u16) -> &'static str {
    match op {
        cmd::GET => "RDMA_NLDEV_CMD_GET",
        cmd::PORT_GET => "RDMA_NLDEV_CMD_PORT_GET",
        cmd::RES_GET => "RDMA_NLDEV_CMD_RES_GET",
        cmd::RES_QP_GET => "RDMA_NLDEV_CMD_RES_QP_GET",
        cmd::RES_CQ_GET => "RDMA_NLDEV_CMD_RES_CQ_GET",
        cmd::RES_MR_GET => "RDMA_NLDEV_CMD_RES_MR_GET",
        cmd::RES_PD_GET => "RDMA_NLDEV_CMD_RES_PD_GET",
        cmd::STAT_GET => "RDMA_NLDEV_CMD_STAT_GET",
        _ => "RDMA_NLDEV_CMD_?",
    }
}

// ---------------------------------------------------------------------------------------------
// Encoder

/// `n` rounded up to the netlink alignment (`NLMSG_ALIGNTO` = `NLA_ALIGNTO` = 4).
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends one u32 attribute (header, payload; 8 bytes, already aligned).
pub fn put_u32(buf: &mut Vec<u8>, kind: u16, value: u32) {
    buf.extend_from_slice(&8u16.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&value.to_ne_bytes());
}

/// One nldev request: `nlmsghdr` (no family header: nldev parses attributes right after it) and
/// u32 attributes. Port id 0: the kernel fills in the sender's.
pub fn encode_request(op: u16, flags: u16, seq: u32, attrs: &[(u16, u32)]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + 8 * attrs.len();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&nl_type(op).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    for &(kind, value) in attrs {
        put_u32(&mut buf, kind, value);
    }
    buf
}

/// A dump request (`NLM_F_REQUEST | NLM_F_DUMP`), as iproute2's `rdma resource show` sends it
/// (`_res_send_msg`), with the device index when given (the resource dumps need one).
pub fn encode_dump(op: u16, seq: u32, dev_index: Option<u32>) -> Vec<u8> {
    let attrs: Vec<(u16, u32)> = dev_index
        .map(|i| (attr::DEV_INDEX, i))
        .into_iter()
        .collect();
    encode_request(op, NLM_F_REQUEST | NLM_F_DUMP, seq, &attrs)
}

/// `RDMA_NLDEV_CMD_STAT_GET` for one port's default (hardware) counters: a plain request, the
/// answer is one message or an `NLMSG_ERROR`.
pub fn encode_port_stat(seq: u32, dev_index: u32, port: u32) -> Vec<u8> {
    encode_request(
        cmd::STAT_GET,
        NLM_F_REQUEST,
        seq,
        &[(attr::DEV_INDEX, dev_index), (attr::PORT_INDEX, port)],
    )
}

// ---------------------------------------------------------------------------------------------
// Parser: messages and attributes

/// Why bytes could not be read as an nldev answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer than 16 bytes where a `nlmsghdr` should start.
    #[error("truncated nlmsghdr at byte {at} ({left} bytes left)")]
    TruncatedHeader {
        /// Offset in the datagram.
        at: usize,
        /// Bytes left there.
        left: usize,
    },
    /// `nlmsg_len` below the header size or past the datagram.
    #[error("nlmsg_len {len} at byte {at} with {left} bytes left")]
    BadMessageLength {
        /// Offset in the datagram.
        at: usize,
        /// The length field.
        len: usize,
        /// Bytes left there.
        left: usize,
    },
    /// `nla_len` below the header size or past its container.
    #[error("attribute type {kind} at byte {at}: nla_len {len} with {left} bytes left")]
    BadAttrLength {
        /// Offset inside the attribute block.
        at: usize,
        /// The (masked) type.
        kind: u16,
        /// The length field.
        len: usize,
        /// Bytes left there.
        left: usize,
    },
    /// A fixed-size attribute of the wrong size.
    #[error("{what}: {got} bytes, {want} expected")]
    BadSize {
        /// Which attribute.
        what: &'static str,
        /// Its size in the uapi header.
        want: usize,
        /// What came.
        got: usize,
    },
    /// An entry without an attribute the kernel always sends.
    #[error("{what} without {missing}")]
    Missing {
        /// Which entry or message.
        what: &'static str,
        /// Which attribute.
        missing: &'static str,
    },
    /// An error message too short for its `int error`.
    #[error("NLMSG_ERROR/NLMSG_DONE with a {0}-byte payload")]
    ShortError(usize),
}

/// One netlink message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlMsg<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// `nlmsg_pid`.
    pub pid: u32,
    /// The bytes after the header, up to `nlmsg_len`.
    pub payload: &'a [u8],
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The messages of one datagram, in order; the iterator ends after the first error.
pub fn messages(buf: &[u8]) -> Messages<'_> {
    Messages {
        buf,
        at: 0,
        failed: false,
    }
}

/// Iterator of [`messages`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    buf: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<NlMsg<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.at..];
        let fail = |s: &mut Self, e| {
            s.failed = true;
            Some(Err(e))
        };
        if rest.len() < NLMSG_HDRLEN {
            let e = ParseError::TruncatedHeader {
                at: self.at,
                left: rest.len(),
            };
            return fail(self, e);
        }
        let len = u32_at(rest, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            let e = ParseError::BadMessageLength {
                at: self.at,
                len,
                left: rest.len(),
            };
            return fail(self, e);
        }
        let msg = NlMsg {
            ty: u16_at(rest, 4).unwrap_or(0),
            flags: u16_at(rest, 6).unwrap_or(0),
            seq: u32_at(rest, 8).unwrap_or(0),
            pid: u32_at(rest, 12).unwrap_or(0),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        self.at = self.at.saturating_add(align4(len));
        Some(Ok(msg))
    }
}

/// The attributes of a block, `(type with the flag bits masked, payload)`, in order; the iterator
/// ends after the first error. A trailing run of fewer than 4 bytes (padding) is ignored.
pub fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs {
        buf,
        at: 0,
        failed: false,
    }
}

/// Iterator of [`attrs`].
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    buf: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.at..];
        if rest.len() < 4 {
            return None;
        }
        let len = usize::from(u16_at(rest, 0).unwrap_or(0));
        let kind = u16_at(rest, 2).unwrap_or(0) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            self.failed = true;
            let e = ParseError::BadAttrLength {
                at: self.at,
                kind,
                len,
                left: rest.len(),
            };
            return Some(Err(e));
        }
        self.at = self.at.saturating_add(align4(len));
        Some(Ok((kind, &rest[4..len])))
    }
}

/// A classified answer message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// An nldev message: `nl_op(ty)` and its attribute block.
    Data {
        /// The command (`RDMA_NL_GET_OP`).
        op: u16,
        /// The client (`RDMA_NL_GET_CLIENT`), [`RDMA_NL_NLDEV`] for answers to our requests.
        client: u16,
        /// `nlmsg_seq`.
        seq: u32,
        /// The attribute block.
        attrs: &'a [u8],
    },
    /// `NLMSG_DONE`: the end of a dump, with its error (0 or a negative errno).
    Done {
        /// `nlmsg_seq`.
        seq: u32,
        /// The dump's error.
        error: i32,
    },
    /// `NLMSG_ERROR`: 0 is an acknowledgement, otherwise a negative errno.
    Error {
        /// `nlmsg_seq`.
        seq: u32,
        /// `struct nlmsgerr.error`.
        error: i32,
    },
    /// Another control message (`NLMSG_NOOP`, `NLMSG_OVERRUN`, ...).
    Control {
        /// `nlmsg_type`.
        ty: u16,
        /// `nlmsg_seq`.
        seq: u32,
    },
}

/// Sorts a message into data, done, error or other control.
pub fn classify(msg: NlMsg<'_>) -> Result<Reply<'_>, ParseError> {
    let error = |p: &[u8]| {
        u32_at(p, 0)
            .map(|e| e as i32)
            .ok_or(ParseError::ShortError(p.len()))
    };
    Ok(match msg.ty {
        NLMSG_ERROR => Reply::Error {
            seq: msg.seq,
            error: error(msg.payload)?,
        },
        // Kernels since 2.6 put the dump's error in NLMSG_DONE; an empty one is a clean end.
        NLMSG_DONE => Reply::Done {
            seq: msg.seq,
            error: if msg.payload.is_empty() {
                0
            } else {
                error(msg.payload)?
            },
        },
        ty if ty < 0x10 => Reply::Control { ty, seq: msg.seq },
        ty => Reply::Data {
            op: nl_op(ty),
            client: nl_client(ty),
            seq: msg.seq,
            attrs: msg.payload,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Plain types

/// QP state: `enum ib_qp_state` (`include/rdma/ib_verbs.h`), named as iproute2's
/// `qp_states_to_str` (`rdma/res-qp.c`) names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QpState {
    /// `IB_QPS_RESET` (0).
    Reset,
    /// `IB_QPS_INIT` (1).
    Init,
    /// `IB_QPS_RTR` (2).
    Rtr,
    /// `IB_QPS_RTS` (3).
    Rts,
    /// `IB_QPS_SQD` (4).
    Sqd,
    /// `IB_QPS_SQE` (5).
    Sqe,
    /// `IB_QPS_ERR` (6).
    Err,
    /// A value this crate does not know.
    Unknown(u8),
}

impl QpState {
    /// From `RDMA_NLDEV_ATTR_RES_STATE`.
    pub fn from_raw(v: u8) -> Self {
        match v {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            4 => Self::Sqd,
            5 => Self::Sqe,
            6 => Self::Err,
            v => Self::Unknown(v),
        }
    }

    /// iproute2's name ("RTS", ...; "UNKNOWN" for others).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
            Self::Unknown(_) => "UNKNOWN",
        }
    }
}

/// QP type: `enum ib_qp_type` as exported (the reserved types are not), named as iproute2's
/// `qp_types_to_str` (`rdma/res.c`) names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QpType {
    /// `IB_QPT_SMI` (0).
    Smi,
    /// `IB_QPT_GSI` (1).
    Gsi,
    /// `IB_QPT_RC` (2).
    Rc,
    /// `IB_QPT_UC` (3).
    Uc,
    /// `IB_QPT_UD` (4).
    Ud,
    /// `IB_QPT_RAW_IPV6` (5).
    RawIpv6,
    /// `IB_QPT_RAW_ETHERTYPE` (6).
    RawEthertype,
    /// `IB_QPT_RAW_PACKET` (8).
    RawPacket,
    /// `IB_QPT_XRC_INI` (9).
    XrcIni,
    /// `IB_QPT_XRC_TGT` (10).
    XrcTgt,
    /// `IB_QPT_DRIVER` (0xFF).
    Driver,
    /// Any other value.
    Unknown(u8),
}

impl QpType {
    /// From `RDMA_NLDEV_ATTR_RES_TYPE`.
    pub fn from_raw(v: u8) -> Self {
        match v {
            0 => Self::Smi,
            1 => Self::Gsi,
            2 => Self::Rc,
            3 => Self::Uc,
            4 => Self::Ud,
            5 => Self::RawIpv6,
            6 => Self::RawEthertype,
            8 => Self::RawPacket,
            9 => Self::XrcIni,
            10 => Self::XrcTgt,
            0xff => Self::Driver,
            v => Self::Unknown(v),
        }
    }

    /// iproute2's name ("RC", ...; "UNKNOWN" for others).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Smi => "SMI",
            Self::Gsi => "GSI",
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Ud => "UD",
            Self::RawIpv6 => "RAW_IPV6",
            Self::RawEthertype => "RAW_ETHERTYPE",
            Self::RawPacket => "RAW_PACKET",
            Self::XrcIni => "XRC_INI",
            Self::XrcTgt => "XRC_TGT",
            Self::Driver => "DRIVER",
            Self::Unknown(_) => "UNKNOWN",
        }
    }

    /// The management QPs every port has (QP0/QP1), owned by the kernel's MAD layer.
    pub fn is_management(self) -> bool {
        matches!(self, Self::Smi | Self::Gsi)
    }
}

macro_rules! serialize_as_str {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Self::Unknown(v) => write!(f, "UNKNOWN({v})"),
                    s => f.write_str(s.as_str()),
                }
            }
        }
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    };
}
serialize_as_str!(QpState);
serialize_as_str!(QpType);

/// Who created an object: `fill_res_name_pid`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// A user process, by its PID in the reader's PID namespace.
    Pid(u32),
    /// A kernel user (`RES_KERN_NAME`, e.g. `ib_core`, `smc`, `rdma_cm`).
    Kernel(String),
    /// Neither: the task is gone or lives in a PID namespace the reader cannot see.
    Unknown,
}

/// Fields every resource entry has.
pub trait Resource {
    /// The device index (`RDMA_NLDEV_ATTR_DEV_INDEX`).
    fn dev_index(&self) -> u32;
    /// The device name (`RDMA_NLDEV_ATTR_DEV_NAME`).
    fn dev_name(&self) -> &str;
    /// `RDMA_NLDEV_ATTR_RES_PID`, when the kernel sent one.
    fn pid(&self) -> Option<u32>;
    /// `RDMA_NLDEV_ATTR_RES_KERN_NAME`, for kernel objects.
    fn kern_name(&self) -> Option<&str>;
    /// The owner, from the two above (a PID wins; the kernel never sends both).
    fn owner(&self) -> Owner {
        match (self.pid(), self.kern_name()) {
            (Some(p), _) => Owner::Pid(p),
            (None, Some(k)) => Owner::Kernel(k.to_string()),
            (None, None) => Owner::Unknown,
        }
    }
}

macro_rules! impl_resource {
    ($t:ty) => {
        impl Resource for $t {
            fn dev_index(&self) -> u32 {
                self.dev_index
            }
            fn dev_name(&self) -> &str {
                &self.dev_name
            }
            fn pid(&self) -> Option<u32> {
                self.pid
            }
            fn kern_name(&self) -> Option<&str> {
                self.kern_name.as_deref()
            }
        }
    };
}

/// One RDMA device (`RDMA_NLDEV_CMD_GET`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DeviceEntry {
    /// `RDMA_NLDEV_ATTR_DEV_INDEX`.
    pub index: u32,
    /// `RDMA_NLDEV_ATTR_DEV_NAME`.
    pub name: String,
    /// Number of ports (`RDMA_NLDEV_ATTR_PORT_INDEX` of this command: `rdma_end_port`).
    pub ports: u32,
}

/// One queue pair (`RDMA_NLDEV_CMD_RES_QP_GET`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct QpEntry {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// Port, once the QP has one (not yet in `create_qp()`).
    pub port: Option<u32>,
    /// Local QP number.
    pub lqpn: u32,
    /// State.
    pub state: QpState,
    /// Type.
    pub qp_type: QpType,
    /// Creator's PID in the reader's PID namespace.
    pub pid: Option<u32>,
    /// Kernel user's name.
    pub kern_name: Option<String>,
}
impl_resource!(QpEntry);

/// One memory region (`RDMA_NLDEV_CMD_RES_MR_GET`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct MrEntry {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// MR number (`RES_MRN`, the restrack id).
    pub mrn: Option<u32>,
    /// Registered length in bytes (`RES_MRLEN`, `mr->length`): memory the MR pins.
    pub mr_len: u64,
    /// Its PD (`RES_PDN`, user MRs only).
    pub pdn: Option<u32>,
    /// Creator's PID.
    pub pid: Option<u32>,
    /// Kernel user's name.
    pub kern_name: Option<String>,
}
impl_resource!(MrEntry);

/// One completion queue (`RDMA_NLDEV_CMD_RES_CQ_GET`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CqEntry {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// CQ number (`RES_CQN`).
    pub cqn: Option<u32>,
    /// Entries (`RES_CQE`).
    pub cqe: Option<u32>,
    /// Users (`RES_USECNT`).
    pub users: Option<u64>,
    /// Creator's PID.
    pub pid: Option<u32>,
    /// Kernel user's name.
    pub kern_name: Option<String>,
}
impl_resource!(CqEntry);

/// One protection domain (`RDMA_NLDEV_CMD_RES_PD_GET`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PdEntry {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// PD number (`RES_PDN`).
    pub pdn: Option<u32>,
    /// Users (`RES_USECNT`).
    pub users: Option<u64>,
    /// Creator's PID.
    pub pid: Option<u32>,
    /// Kernel user's name.
    pub kern_name: Option<String>,
}
impl_resource!(PdEntry);

/// One port's hardware counters (`RDMA_NLDEV_CMD_STAT_GET`), by the driver's names (rxe:
/// `sent_pkts`, `rcvd_pkts`, ...; the same as sysfs `hw_counters/`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct PortCounters {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// Port.
    pub port: u32,
    /// Counter name → value.
    pub counters: std::collections::BTreeMap<String, u64>,
}

/// One device's object counts (`RDMA_NLDEV_CMD_RES_GET`): "pd", "cq", "qp", "cm_id", "mr", ...
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ResSummary {
    /// Device index.
    pub dev_index: u32,
    /// Device name.
    pub dev_name: String,
    /// Resource name → count.
    pub counts: std::collections::BTreeMap<String, u64>,
}

// ---------------------------------------------------------------------------------------------
// Parser: attribute values and the message kinds

fn get_u8(what: &'static str, p: &[u8]) -> Result<u8, ParseError> {
    match p {
        [v] => Ok(*v),
        _ => Err(ParseError::BadSize {
            what,
            want: 1,
            got: p.len(),
        }),
    }
}

fn get_u32(what: &'static str, p: &[u8]) -> Result<u32, ParseError> {
    let a: [u8; 4] = p.try_into().map_err(|_| ParseError::BadSize {
        what,
        want: 4,
        got: p.len(),
    })?;
    Ok(u32::from_ne_bytes(a))
}

fn get_u64(what: &'static str, p: &[u8]) -> Result<u64, ParseError> {
    let a: [u8; 8] = p.try_into().map_err(|_| ParseError::BadSize {
        what,
        want: 8,
        got: p.len(),
    })?;
    Ok(u64::from_ne_bytes(a))
}

/// A NUL-terminated string attribute: up to the first NUL, cut to [`MAX_NAME`] bytes, lossy UTF-8.
pub fn get_string(p: &[u8]) -> String {
    let end = p
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(p.len())
        .min(MAX_NAME);
    String::from_utf8_lossy(&p[..end]).into_owned()
}

/// The device handle every answer starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Handle {
    index: Option<u32>,
    name: Option<String>,
}

impl Handle {
    fn take(&mut self, kind: u16, p: &[u8]) -> Result<bool, ParseError> {
        match kind {
            attr::DEV_INDEX => self.index = Some(get_u32("RDMA_NLDEV_ATTR_DEV_INDEX", p)?),
            attr::DEV_NAME => self.name = Some(get_string(p)),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn require(self, what: &'static str) -> Result<(u32, String), ParseError> {
        let index = self.index.ok_or(ParseError::Missing {
            what,
            missing: "RDMA_NLDEV_ATTR_DEV_INDEX",
        })?;
        let name = self.name.ok_or(ParseError::Missing {
            what,
            missing: "RDMA_NLDEV_ATTR_DEV_NAME",
        })?;
        Ok((index, name))
    }
}

/// One `RDMA_NLDEV_CMD_GET` answer (attribute block) as a device.
pub fn parse_device(block: &[u8]) -> Result<DeviceEntry, ParseError> {
    let mut h = Handle::default();
    let mut ports = None;
    for a in attrs(block) {
        let (kind, p) = a?;
        if !h.take(kind, p)? && kind == attr::PORT_INDEX {
            ports = Some(get_u32("RDMA_NLDEV_ATTR_PORT_INDEX", p)?);
        }
    }
    let (index, name) = h.require("RDMA_NLDEV_CMD_GET answer")?;
    Ok(DeviceEntry {
        index,
        name,
        ports: ports.unwrap_or(0),
    })
}

/// A resource table answer: the handle, then `table` of `entry` attribute sets, each handed to
/// `f` with the device index and name. A message without the table holds no entries.
fn parse_table<T>(
    what: &'static str,
    block: &[u8],
    table: u16,
    entry: u16,
    mut f: impl FnMut(u32, &str, &[u8]) -> Result<T, ParseError>,
) -> Result<Vec<T>, ParseError> {
    let mut h = Handle::default();
    let mut tables = Vec::new();
    for a in attrs(block) {
        let (kind, p) = a?;
        if !h.take(kind, p)? && kind == table {
            tables.push(p);
        }
    }
    let (index, name) = h.require(what)?;
    let mut out = Vec::new();
    for t in tables {
        for a in attrs(t) {
            let (kind, p) = a?;
            if kind == entry {
                out.push(f(index, &name, p)?);
            }
        }
    }
    Ok(out)
}

/// PID and kernel name of an entry (`fill_res_name_pid`); PID 0 counts as none.
#[derive(Default)]
struct Creator {
    pid: Option<u32>,
    kern_name: Option<String>,
}

impl Creator {
    fn take(&mut self, kind: u16, p: &[u8]) -> Result<bool, ParseError> {
        match kind {
            attr::RES_PID => {
                self.pid = Some(get_u32("RDMA_NLDEV_ATTR_RES_PID", p)?).filter(|&p| p != 0)
            }
            attr::RES_KERN_NAME => self.kern_name = Some(get_string(p)),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// One `RDMA_NLDEV_CMD_RES_QP_GET` answer message's QPs. `LQPN`, `TYPE` and `STATE` are
/// required, as iproute2's `res_qp_line` requires them.
pub fn parse_qps(block: &[u8]) -> Result<Vec<QpEntry>, ParseError> {
    const WHAT: &str = "RDMA_NLDEV_ATTR_RES_QP_ENTRY";
    parse_table(
        "RDMA_NLDEV_CMD_RES_QP_GET answer",
        block,
        attr::RES_QP,
        attr::RES_QP_ENTRY,
        |dev_index, dev_name, e| {
            let (mut port, mut lqpn, mut state, mut ty) = (None, None, None, None);
            let mut c = Creator::default();
            for a in attrs(e) {
                let (kind, p) = a?;
                if c.take(kind, p)? {
                    continue;
                }
                match kind {
                    attr::PORT_INDEX => port = Some(get_u32("RDMA_NLDEV_ATTR_PORT_INDEX", p)?),
                    attr::RES_LQPN => lqpn = Some(get_u32("RDMA_NLDEV_ATTR_RES_LQPN", p)?),
                    attr::RES_STATE => state = Some(get_u8("RDMA_NLDEV_ATTR_RES_STATE", p)?),
                    attr::RES_TYPE => ty = Some(get_u8("RDMA_NLDEV_ATTR_RES_TYPE", p)?),
                    _ => {}
                }
            }
            let missing = |m| ParseError::Missing {
                what: WHAT,
                missing: m,
            };
            Ok(QpEntry {
                dev_index,
                dev_name: dev_name.to_string(),
                port,
                lqpn: lqpn.ok_or(missing("RDMA_NLDEV_ATTR_RES_LQPN"))?,
                state: QpState::from_raw(state.ok_or(missing("RDMA_NLDEV_ATTR_RES_STATE"))?),
                qp_type: QpType::from_raw(ty.ok_or(missing("RDMA_NLDEV_ATTR_RES_TYPE"))?),
                pid: c.pid,
                kern_name: c.kern_name,
            })
        },
    )
}

/// One `RDMA_NLDEV_CMD_RES_MR_GET` answer message's MRs. `MRLEN` is required, as iproute2's
/// `res_mr_line` requires it.
pub fn parse_mrs(block: &[u8]) -> Result<Vec<MrEntry>, ParseError> {
    parse_table(
        "RDMA_NLDEV_CMD_RES_MR_GET answer",
        block,
        attr::RES_MR,
        attr::RES_MR_ENTRY,
        |dev_index, dev_name, e| {
            let (mut mrn, mut len, mut pdn) = (None, None, None);
            let mut c = Creator::default();
            for a in attrs(e) {
                let (kind, p) = a?;
                if c.take(kind, p)? {
                    continue;
                }
                match kind {
                    attr::RES_MRN => mrn = Some(get_u32("RDMA_NLDEV_ATTR_RES_MRN", p)?),
                    attr::RES_MRLEN => len = Some(get_u64("RDMA_NLDEV_ATTR_RES_MRLEN", p)?),
                    attr::RES_PDN => pdn = Some(get_u32("RDMA_NLDEV_ATTR_RES_PDN", p)?),
                    _ => {}
                }
            }
            Ok(MrEntry {
                dev_index,
                dev_name: dev_name.to_string(),
                mrn,
                mr_len: len.ok_or(ParseError::Missing {
                    what: "RDMA_NLDEV_ATTR_RES_MR_ENTRY",
                    missing: "RDMA_NLDEV_ATTR_RES_MRLEN",
                })?,
                pdn,
                pid: c.pid,
                kern_name: c.kern_name,
            })
        },
    )
}

/// One `RDMA_NLDEV_CMD_RES_CQ_GET` answer message's CQs.
pub fn parse_cqs(block: &[u8]) -> Result<Vec<CqEntry>, ParseError> {
    parse_table(
        "RDMA_NLDEV_CMD_RES_CQ_GET answer",
        block,
        attr::RES_CQ,
        attr::RES_CQ_ENTRY,
        |dev_index, dev_name, e| {
            let (mut cqn, mut cqe, mut users) = (None, None, None);
            let mut c = Creator::default();
            for a in attrs(e) {
                let (kind, p) = a?;
                if c.take(kind, p)? {
                    continue;
                }
                match kind {
                    attr::RES_CQN => cqn = Some(get_u32("RDMA_NLDEV_ATTR_RES_CQN", p)?),
                    attr::RES_CQE => cqe = Some(get_u32("RDMA_NLDEV_ATTR_RES_CQE", p)?),
                    attr::RES_USECNT => users = Some(get_u64("RDMA_NLDEV_ATTR_RES_USECNT", p)?),
                    _ => {}
                }
            }
            Ok(CqEntry {
                dev_index,
                dev_name: dev_name.to_string(),
                cqn,
                cqe,
                users,
                pid: c.pid,
                kern_name: c.kern_name,
            })
        },
    )
}

/// One `RDMA_NLDEV_CMD_RES_PD_GET` answer message's PDs.
pub fn parse_pds(block: &[u8]) -> Result<Vec<PdEntry>, ParseError> {
    parse_table(
        "RDMA_NLDEV_CMD_RES_PD_GET answer",
        block,
        attr::RES_PD,
        attr::RES_PD_ENTRY,
        |dev_index, dev_name, e| {
            let (mut pdn, mut users) = (None, None);
            let mut c = Creator::default();
            for a in attrs(e) {
                let (kind, p) = a?;
                if c.take(kind, p)? {
                    continue;
                }
                match kind {
                    attr::RES_PDN => pdn = Some(get_u32("RDMA_NLDEV_ATTR_RES_PDN", p)?),
                    attr::RES_USECNT => users = Some(get_u64("RDMA_NLDEV_ATTR_RES_USECNT", p)?),
                    _ => {}
                }
            }
            Ok(PdEntry {
                dev_index,
                dev_name: dev_name.to_string(),
                pdn,
                users,
                pid: c.pid,
                kern_name: c.kern_name,
            })
        },
    )
}

/// Name/value pairs of a counter-like table (`STAT_HWCOUNTERS` or `RES_SUMMARY`).
fn parse_named_values(
    block: &[u8],
    entry: u16,
    name_attr: u16,
    value_attr: u16,
    what: &'static str,
    out: &mut std::collections::BTreeMap<String, u64>,
) -> Result<(), ParseError> {
    for a in attrs(block) {
        let (kind, e) = a?;
        if kind != entry {
            continue;
        }
        let (mut name, mut value) = (None, None);
        for a in attrs(e) {
            let (kind, p) = a?;
            if kind == name_attr {
                name = Some(get_string(p));
            } else if kind == value_attr {
                value = Some(get_u64(what, p)?);
            }
        }
        if let (Some(n), Some(v)) = (name, value) {
            out.insert(n, v);
        }
    }
    Ok(())
}

/// One `RDMA_NLDEV_CMD_STAT_GET` (default counter) answer.
pub fn parse_port_counters(block: &[u8]) -> Result<PortCounters, ParseError> {
    let mut h = Handle::default();
    let mut port = None;
    let mut counters = std::collections::BTreeMap::new();
    for a in attrs(block) {
        let (kind, p) = a?;
        if h.take(kind, p)? {
            continue;
        }
        match kind {
            attr::PORT_INDEX => port = Some(get_u32("RDMA_NLDEV_ATTR_PORT_INDEX", p)?),
            attr::STAT_HWCOUNTERS => parse_named_values(
                p,
                attr::STAT_HWCOUNTER_ENTRY,
                attr::STAT_HWCOUNTER_ENTRY_NAME,
                attr::STAT_HWCOUNTER_ENTRY_VALUE,
                "RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE",
                &mut counters,
            )?,
            _ => {}
        }
    }
    let what = "RDMA_NLDEV_CMD_STAT_GET answer";
    let (dev_index, dev_name) = h.require(what)?;
    let port = port.ok_or(ParseError::Missing {
        what,
        missing: "RDMA_NLDEV_ATTR_PORT_INDEX",
    })?;
    Ok(PortCounters {
        dev_index,
        dev_name,
        port,
        counters,
    })
}

/// One `RDMA_NLDEV_CMD_RES_GET` answer.
pub fn parse_res_summary(block: &[u8]) -> Result<ResSummary, ParseError> {
    let mut h = Handle::default();
    let mut counts = std::collections::BTreeMap::new();
    for a in attrs(block) {
        let (kind, p) = a?;
        if !h.take(kind, p)? && kind == attr::RES_SUMMARY {
            parse_named_values(
                p,
                attr::RES_SUMMARY_ENTRY,
                attr::RES_SUMMARY_ENTRY_NAME,
                attr::RES_SUMMARY_ENTRY_CURR,
                "RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_CURR",
                &mut counts,
            )?;
        }
    }
    let (dev_index, dev_name) = h.require("RDMA_NLDEV_CMD_RES_GET answer")?;
    Ok(ResSummary {
        dev_index,
        dev_name,
        counts,
    })
}

/// The answer of one datagram of a dump: parsed items and whether `NLMSG_DONE` came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpPart<T> {
    /// Items of the data messages with the expected sequence number and command.
    pub items: Vec<T>,
    /// `NLMSG_DONE` seen (with error 0).
    pub done: bool,
}

/// Where a dump or request ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The bytes were malformed.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The kernel answered an errno (`NLMSG_ERROR`, or `NLMSG_DONE` carrying one); positive.
    #[error("errno {0}")]
    Errno(i32),
}

/// Parses one datagram of an answer to request `seq` for command `op`: messages of other
/// sequence numbers or commands are skipped (a late answer to an earlier request), an
/// acknowledgement (`NLMSG_ERROR` 0) is skipped, an error ends it.
pub fn parse_answer<T>(
    buf: &[u8],
    seq: u32,
    op: u16,
    mut parse: impl FnMut(&[u8]) -> Result<Vec<T>, ParseError>,
) -> Result<DumpPart<T>, AnswerError> {
    let mut part = DumpPart {
        items: Vec::new(),
        done: false,
    };
    for m in messages(buf) {
        let m = m?;
        if m.seq != seq {
            continue;
        }
        match classify(m)? {
            Reply::Data {
                op: o,
                client,
                attrs,
                ..
            } if o == op && client == RDMA_NL_NLDEV => {
                part.items.extend(parse(attrs)?);
            }
            Reply::Data { .. } | Reply::Control { .. } => {}
            Reply::Error { error: 0, .. } => {}
            Reply::Error { error, .. } | Reply::Done { error, .. } if error != 0 => {
                return Err(AnswerError::Errno(error.saturating_neg()));
            }
            Reply::Done { .. } | Reply::Error { .. } => {
                part.done = true;
                break;
            }
        }
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand-built messages, laid out from `struct nlmsghdr` / `struct nlattr` (linux/netlink.h)
    // and the attribute numbers of rdma_netlink.h written as literals, not through the encoder.

    fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
        let len = 4 + payload.len();
        let mut v = Vec::new();
        v.extend_from_slice(&(len as u16).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn nest(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(kind, &parts.concat())
    }

    fn msg(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&4242u32.to_ne_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn s(x: &str) -> Vec<u8> {
        let mut v = x.as_bytes().to_vec();
        v.push(0);
        v
    }

    /// RDMA_NL_NLDEV (5) << 10 + op.
    const QP_GET_TYPE: u16 = 5 * 1024 + 10;

    fn qp_answer(seq: u32) -> Vec<u8> {
        // A user RC QP in RTS on port 1 (pid 4321) and the kernel's GSI QP1 (ib_core).
        let user = nest(
            20,
            &[
                nla(3, &1u32.to_ne_bytes()),
                nla(21, &17u32.to_ne_bytes()),
                nla(22, &18u32.to_ne_bytes()),
                nla(60, &3u32.to_ne_bytes()),
                nla(28, &4321u32.to_ne_bytes()),
                nla(24, &0x77u32.to_ne_bytes()),
                nla(26, &[2]),
                nla(27, &[3]),
            ],
        );
        let kernel = nest(
            20,
            &[
                nla(3, &1u32.to_ne_bytes()),
                nla(21, &1u32.to_ne_bytes()),
                nla(29, &s("ib_core")),
                nla(24, &0u32.to_ne_bytes()),
                nla(26, &[1]),
                nla(27, &[3]),
            ],
        );
        let body = [
            nla(1, &7u32.to_ne_bytes()),
            nla(2, &s("rxe0")),
            nest(19, &[user, kernel]),
        ]
        .concat();
        msg(QP_GET_TYPE, 0x2, seq, &body)
    }

    #[test]
    fn type_macros_match_the_header() {
        assert_eq!(nl_type(cmd::RES_QP_GET), 5130);
        assert_eq!(nl_client(5130), 5);
        assert_eq!(nl_op(5130), 10);
    }

    #[test]
    fn decodes_a_qp_dump_message() {
        let part = parse_answer(&qp_answer(9), 9, cmd::RES_QP_GET, parse_qps).unwrap();
        assert!(!part.done);
        assert_eq!(
            part.items,
            vec![
                QpEntry {
                    dev_index: 7,
                    dev_name: "rxe0".into(),
                    port: Some(1),
                    lqpn: 17,
                    state: QpState::Rts,
                    qp_type: QpType::Rc,
                    pid: Some(4321),
                    kern_name: None,
                },
                QpEntry {
                    dev_index: 7,
                    dev_name: "rxe0".into(),
                    port: Some(1),
                    lqpn: 1,
                    state: QpState::Rts,
                    qp_type: QpType::Gsi,
                    pid: None,
                    kern_name: Some("ib_core".into()),
                },
            ]
        );
        assert_eq!(part.items[0].owner(), Owner::Pid(4321));
        assert_eq!(part.items[1].owner(), Owner::Kernel("ib_core".into()));
    }

    #[test]
    fn two_messages_then_done_in_one_datagram() {
        let mut buf = qp_answer(5);
        buf.extend(qp_answer(5));
        buf.extend(msg(3, 0x2, 5, &0i32.to_ne_bytes()));
        let part = parse_answer(&buf, 5, cmd::RES_QP_GET, parse_qps).unwrap();
        assert_eq!(part.items.len(), 4);
        assert!(part.done);
    }

    #[test]
    fn done_with_an_errno_and_nlmsg_error_are_errors() {
        let done = msg(3, 0x2, 5, &(-22i32).to_ne_bytes());
        assert_eq!(
            parse_answer(&done, 5, cmd::RES_QP_GET, parse_qps),
            Err(AnswerError::Errno(22))
        );
        let mut err = (-1i32).to_ne_bytes().to_vec();
        err.extend_from_slice(&[0u8; 16]); // the request's header
        let e = msg(2, 0, 5, &err);
        assert_eq!(
            parse_answer(&e, 5, cmd::RES_QP_GET, parse_qps),
            Err(AnswerError::Errno(1))
        );
        // An ACK is not the end of a dump; an empty NLMSG_DONE is.
        let mut ack = 0i32.to_ne_bytes().to_vec();
        ack.extend_from_slice(&[0u8; 16]);
        let part = parse_answer(&msg(2, 0, 5, &ack), 5, cmd::RES_QP_GET, parse_qps).unwrap();
        assert!(!part.done);
        assert!(
            parse_answer(&msg(3, 0, 5, &[]), 5, cmd::RES_QP_GET, parse_qps)
                .unwrap()
                .done
        );
    }

    #[test]
    fn other_sequence_numbers_and_commands_are_skipped() {
        let part = parse_answer(&qp_answer(4), 5, cmd::RES_QP_GET, parse_qps).unwrap();
        assert!(part.items.is_empty());
        let part = parse_answer(&qp_answer(5), 5, cmd::RES_MR_GET, parse_mrs).unwrap();
        assert!(part.items.is_empty());
    }

    #[test]
    fn nested_flag_and_pad_attributes_are_understood() {
        // STAT_GET answer, hwcounter tables with NLA_F_NESTED, u64 values after a PAD attribute.
        let entry = |n: &str, v: u64| {
            nest(
                81 | 0x8000,
                &[nla(82, &s(n)), nla(0, &[]), nla(83, &v.to_ne_bytes())],
            )
        };
        let body = [
            nla(1, &2u32.to_ne_bytes()),
            nla(2, &s("erdma_0")),
            nla(3, &1u32.to_ne_bytes()),
            nest(
                80 | 0x8000,
                &[entry("sent_pkts", 1000), entry("rcvd_pkts", 999)],
            ),
        ]
        .concat();
        let part = parse_answer(&msg(5 * 1024 + 17, 0, 1, &body), 1, cmd::STAT_GET, |b| {
            parse_port_counters(b).map(|c| vec![c])
        })
        .unwrap();
        let c = &part.items[0];
        assert_eq!(
            (c.dev_index, c.dev_name.as_str(), c.port),
            (2, "erdma_0", 1)
        );
        assert_eq!(c.counters["sent_pkts"], 1000);
        assert_eq!(c.counters["rcvd_pkts"], 999);
    }

    #[test]
    fn decodes_mr_cq_pd_device_and_summary_messages() {
        let mr = nest(
            41,
            &[
                nla(42, &0x1234u32.to_ne_bytes()),
                nla(43, &0x1234u32.to_ne_bytes()),
                nla(45, &(8u64 << 20).to_ne_bytes()),
                nla(62, &5u32.to_ne_bytes()),
                nla(60, &3u32.to_ne_bytes()),
                nla(28, &77u32.to_ne_bytes()),
            ],
        );
        let body = [
            nla(1, &0u32.to_ne_bytes()),
            nla(2, &s("rxe1")),
            nest(40, &[mr]),
        ]
        .concat();
        let mrs = parse_mrs(&body).unwrap();
        assert_eq!(
            mrs,
            vec![MrEntry {
                dev_index: 0,
                dev_name: "rxe1".into(),
                mrn: Some(5),
                mr_len: 8 << 20,
                pdn: Some(3),
                pid: Some(77),
                kern_name: None,
            }]
        );
        let cq = nest(
            36,
            &[
                nla(37, &255u32.to_ne_bytes()),
                nla(38, &2u64.to_ne_bytes()),
                nla(39, &[0]),
                nla(61, &4u32.to_ne_bytes()),
                nla(29, &s("ib_core")),
            ],
        );
        let body = [
            nla(1, &0u32.to_ne_bytes()),
            nla(2, &s("rxe1")),
            nest(35, &[cq]),
        ]
        .concat();
        let cqs = parse_cqs(&body).unwrap();
        assert_eq!(
            (cqs[0].cqn, cqs[0].cqe, cqs[0].users),
            (Some(4), Some(255), Some(2))
        );
        assert_eq!(cqs[0].kern_name.as_deref(), Some("ib_core"));
        // PID 0 (a zombie's) counts as none.
        let pd = nest(
            47,
            &[
                nla(38, &1u64.to_ne_bytes()),
                nla(60, &9u32.to_ne_bytes()),
                nla(28, &0u32.to_ne_bytes()),
            ],
        );
        let body = [
            nla(1, &0u32.to_ne_bytes()),
            nla(2, &s("rxe1")),
            nest(46, &[pd]),
        ]
        .concat();
        let pds = parse_pds(&body).unwrap();
        assert_eq!(
            (pds[0].pdn, pds[0].users, pds[0].owner()),
            (Some(9), Some(1), Owner::Unknown)
        );

        let dev = [
            nla(1, &3u32.to_ne_bytes()),
            nla(2, &s("erdma_1")),
            nla(3, &1u32.to_ne_bytes()),
            nla(4, &0u64.to_ne_bytes()),
        ]
        .concat();
        assert_eq!(
            parse_device(&dev).unwrap(),
            DeviceEntry {
                index: 3,
                name: "erdma_1".into(),
                ports: 1
            }
        );

        let entry = |n: &str, v: u64| nest(16, &[nla(17, &s(n)), nla(18, &v.to_ne_bytes())]);
        let body = [
            nla(1, &3u32.to_ne_bytes()),
            nla(2, &s("erdma_1")),
            nest(15, &[entry("qp", 4), entry("mr", 2)]),
        ]
        .concat();
        let sum = parse_res_summary(&body).unwrap();
        assert_eq!((sum.counts["qp"], sum.counts["mr"]), (4, 2));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = qp_answer(1);
        // nlmsg_len past the end
        let mut b = good.clone();
        b[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(matches!(
            parse_answer(&b, 1, cmd::RES_QP_GET, parse_qps),
            Err(AnswerError::Parse(ParseError::BadMessageLength { .. }))
        ));
        // a truncated datagram
        assert!(parse_answer(&good[..10], 1, cmd::RES_QP_GET, parse_qps).is_err());
        // an entry without its state
        let e = nest(20, &[nla(21, &1u32.to_ne_bytes()), nla(26, &[2])]);
        let body = [nla(1, &0u32.to_ne_bytes()), nla(2, &s("x")), nest(19, &[e])].concat();
        assert!(matches!(parse_qps(&body), Err(ParseError::Missing { .. })));
        // a u32 of the wrong size
        let e = nest(20, &[nla(21, &[1, 2]), nla(26, &[2]), nla(27, &[3])]);
        let body = [nla(1, &0u32.to_ne_bytes()), nla(2, &s("x")), nest(19, &[e])].concat();
        assert!(matches!(
            parse_qps(&body),
            Err(ParseError::BadSize {
                want: 4,
                got: 2,
                ..
            })
        ));
        // no device handle
        assert!(matches!(
            parse_qps(&nest(19, &[])),
            Err(ParseError::Missing { .. })
        ));
    }

    #[test]
    fn long_strings_are_cut() {
        let long = "x".repeat(1000);
        assert_eq!(get_string(long.as_bytes()).len(), MAX_NAME);
        assert_eq!(get_string(b"ab\0cd"), "ab");
    }

    #[test]
    fn encoder_layout() {
        let b = encode_dump(cmd::RES_MR_GET, 77, Some(3));
        assert_eq!(b.len(), 24);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 24);
        assert_eq!(
            u16::from_ne_bytes(b[4..6].try_into().unwrap()),
            5 * 1024 + 13
        );
        assert_eq!(u16::from_ne_bytes(b[6..8].try_into().unwrap()), 0x301);
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 77);
        assert_eq!(u16::from_ne_bytes(b[16..18].try_into().unwrap()), 8);
        assert_eq!(u16::from_ne_bytes(b[18..20].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(b[20..24].try_into().unwrap()), 3);
        let s = encode_port_stat(1, 2, 1);
        assert_eq!(u16::from_ne_bytes(s[6..8].try_into().unwrap()), 0x1);
        assert_eq!(s.len(), 32);
    }
}
