//! SMC sockets of a network namespace through `smc_diag` (what `smcss` reads), without smc-tools.
//!
//! Transport: `NETLINK_SOCK_DIAG`, message type `SOCK_DIAG_BY_FAMILY`, `NLM_F_DUMP`, payload
//! `struct smc_diag_req` (`include/uapi/linux/smc_diag.h`). Each reply carries
//! `struct smc_diag_msg` (64 bytes) followed by `rtattr`s selected by `diag_ext`. Dumps only see the
//! sockets of the calling thread's network namespace: to inspect a pod, run inside its netns
//! (see [`crate::netns`]).

use crate::decline::{self, Decline};
use crate::genl::decode_attrs;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `AF_SMC`.
pub const AF_SMC: u8 = 43;
/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;
/// `SOCK_DIAG_BY_FAMILY`.
pub const SOCK_DIAG_BY_FAMILY: u16 = 20;

/// `SMC_DIAG_CONNINFO` extension / attribute.
pub const SMC_DIAG_CONNINFO: u16 = 1;
/// `SMC_DIAG_LGRINFO`.
pub const SMC_DIAG_LGRINFO: u16 = 2;
/// `SMC_DIAG_SHUTDOWN`.
pub const SMC_DIAG_SHUTDOWN: u16 = 3;
/// `SMC_DIAG_DMBINFO`.
pub const SMC_DIAG_DMBINFO: u16 = 4;
/// `SMC_DIAG_FALLBACK`.
pub const SMC_DIAG_FALLBACK: u16 = 5;

/// `diag_ext` asking for every extension we decode (`1 << (ext - 1)` each).
pub const ALL_EXTENSIONS: u8 = (1 << (SMC_DIAG_CONNINFO - 1))
    | (1 << (SMC_DIAG_LGRINFO - 1))
    | (1 << (SMC_DIAG_SHUTDOWN - 1))
    | (1 << (SMC_DIAG_DMBINFO - 1))
    | (1 << (SMC_DIAG_FALLBACK - 1));

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct inet_diag_sockid)`.
const SOCKID_LEN: usize = 48;
/// `sizeof(struct smc_diag_req)`.
pub const REQ_LEN: usize = 4 + SOCKID_LEN;
/// `sizeof(struct smc_diag_msg)` (`diag_inode` is 8-byte aligned, so no tail padding).
pub const MSG_LEN: usize = 4 + SOCKID_LEN + 4 + 8;
/// `IB_DEVICE_NAME_MAX`.
const IB_DEVICE_NAME_MAX: usize = 64;
/// `sizeof(struct smc_diag_lgrinfo)`: link id, ibname, ibport, gid[40], peer_gid[40], role.
const LGRINFO_LEN: usize = 1 + IB_DEVICE_NAME_MAX + 1 + 40 + 40 + 1;
/// `sizeof(struct smc_diag_conninfo)`.
const CONNINFO_LEN: usize = 16 + 4 * 8 + 4 + 3 * 8;

/// `smc_diag` failed.
#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    /// The kernel has no SMC socket diagnostics.
    #[error(
        "SMC unsupported: the kernel has no smc_diag handler for AF_SMC ({AF_SMC}). Fix: `modprobe smc smc_diag` on the node (kernel with CONFIG_SMC and CONFIG_SMC_DIAG)"
    )]
    Unsupported,
    /// The kernel answered with an error.
    #[error("smc_diag dump: kernel returned {errno} ({}). Fix: run as root (CAP_NET_ADMIN) in the namespace to inspect", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// Positive errno.
        errno: i32,
    },
    /// The netlink socket failed.
    #[error("smc_diag dump: netlink socket: {0}")]
    Io(#[from] std::io::Error),
    /// The reply could not be parsed.
    #[error("smc_diag dump: malformed reply: {0}")]
    Malformed(String),
}

/// `SMC_DIAG_MODE_*`: how a connection runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// SMC over RDMA (`SMC_DIAG_MODE_SMCR`).
    #[serde(rename = "SMCR")]
    Smcr,
    /// Fell back to plain TCP (`SMC_DIAG_MODE_FALLBACK_TCP`).
    #[serde(rename = "TCP")]
    FallbackTcp,
    /// SMC-D (ISM / loopback).
    #[serde(rename = "SMCD")]
    Smcd,
    /// A value this code does not know.
    #[serde(rename = "UNKNOWN")]
    Unknown(u8),
}

impl Mode {
    /// Decodes `diag_mode`.
    pub fn from_raw(v: u8) -> Mode {
        match v {
            0 => Mode::Smcr,
            1 => Mode::FallbackTcp,
            2 => Mode::Smcd,
            n => Mode::Unknown(n),
        }
    }

    /// The `smcss` spelling (`SMCR`, `TCP`, `SMCD`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Smcr => "SMCR",
            Mode::FallbackTcp => "TCP",
            Mode::Smcd => "SMCD",
            Mode::Unknown(_) => "UNKNOWN",
        }
    }
}

/// The `smcss` name of an SMC socket state (`net/smc/smc.h`), or `None` for unknown values.
pub fn state_name(state: u8) -> Option<&'static str> {
    Some(match state {
        1 => "ACTIVE",
        2 => "INIT",
        7 => "CLOSED",
        10 => "LISTEN",
        20 => "PEERCLOSEWAIT1",
        21 => "PEERCLOSEWAIT2",
        22 => "APPCLOSEWAIT1",
        23 => "APPCLOSEWAIT2",
        24 => "APPFINCLOSEWAIT",
        25 => "PEERFINCLOSEWAIT",
        26 => "PEERABORTWAIT",
        27 => "PROCESSABORT",
        _ => return None,
    })
}

/// Why a connection is TCP (`SMC_DIAG_FALLBACK`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    /// Our decline reason.
    pub reason: Decline,
    /// What the peer reported, when it sent a diagnosis.
    pub peer_diagnosis: Option<Decline>,
}

/// The SMC-R link of a connection (`SMC_DIAG_LGRINFO`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    /// Link id within the link group.
    pub link_id: u8,
    /// RDMA device.
    pub ibdev: String,
    /// RDMA port.
    pub ibport: u8,
    /// Local GID (text as the kernel formats it).
    pub gid: String,
    /// Peer GID.
    pub peer_gid: String,
    /// Link-group role: `CLIENT` or `SERVER`.
    pub role: &'static str,
}

/// Buffer sizes of a connection (`SMC_DIAG_CONNINFO`, the fields `smcss -d` shows first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConnInfo {
    /// Connection token.
    pub token: u32,
    /// Send buffer size.
    pub sndbuf_size: u32,
    /// Receive buffer (RMB element) size.
    pub rmbe_size: u32,
    /// Peer's RMB element size.
    pub peer_rmbe_size: u32,
}

/// One SMC socket as `smc_diag` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SmcSocket {
    /// Address family of the reply (`43` AF_SMC, `2` for IPPROTO_SMC sockets on 6.11+).
    pub family: u8,
    /// State name (`ACTIVE`, `LISTEN`, …; `UNKNOWN(n)` for values this code does not know).
    pub state: String,
    /// Raw state value.
    pub state_code: u8,
    /// Mode.
    pub mode: Mode,
    /// Local address and port.
    pub local: String,
    /// Peer address and port.
    pub peer: String,
    /// Interface index from the socket id.
    pub ifindex: u32,
    /// Owner uid.
    pub uid: u32,
    /// Socket inode.
    pub inode: u64,
    /// Shutdown bits (`1` receive, `2` send).
    pub shutdown: u8,
    /// Fallback reason (TCP mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// SMC-R link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
    /// Buffer sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conn: Option<ConnInfo>,
}

impl SmcSocket {
    /// The `Mode` column as `smcss` prints it: `SMCR`, `SMCD`, or `TCP 0x<reason>[/0x<peer>]`.
    pub fn mode_text(&self) -> String {
        match (&self.mode, &self.fallback) {
            (Mode::FallbackTcp, Some(f)) => match &f.peer_diagnosis {
                Some(p) => format!("TCP {}/{}", f.reason.hex(), p.hex()),
                None => format!("TCP {}", f.reason.hex()),
            },
            (m, _) => m.as_str().to_string(),
        }
    }
}

/// Encodes the dump request: `nlmsghdr` + `smc_diag_req` (all ports, all addresses).
pub fn encode_request(seq: u32, ext: u8) -> Vec<u8> {
    let len = NLMSG_HDRLEN + REQ_LEN;
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(AF_SMC); // diag_family
    buf.extend_from_slice(&[0, 0]); // pad
    buf.push(ext); // diag_ext
    buf.resize(len, 0); // inet_diag_sockid: zero = every socket
    buf
}

fn u16_ne(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u16_be(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_ne(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_ne(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Formats `addr:port`. The address words are network order; IPv6 when the family says so or
/// (for AF_SMC, whose replies do not say) when the upper words are set.
fn endpoint(family: u8, addr: &[u8], port: u16) -> String {
    let v6 = family == AF_INET6 || (family == AF_SMC && addr[4..16].iter().any(|&b| b != 0));
    if v6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&addr[..16]);
        format!("[{}]:{port}", IpAddr::V6(Ipv6Addr::from(a)))
    } else {
        format!(
            "{}:{port}",
            Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3])
        )
    }
}

/// Decodes one `smc_diag_msg` plus its attributes. Errors say which field is short.
pub fn decode_socket(body: &[u8]) -> Result<SmcSocket, String> {
    if body.len() < MSG_LEN {
        return Err(format!(
            "smc_diag_msg of {} bytes, expected at least {MSG_LEN}",
            body.len()
        ));
    }
    let family = body[0];
    let state_code = body[1];
    let id = &body[4..4 + SOCKID_LEN];
    let sport = u16_be(id, 0).ok_or("sockid")?;
    let dport = u16_be(id, 2).ok_or("sockid")?;
    let mut sock = SmcSocket {
        family,
        state: state_name(state_code)
            .map(str::to_string)
            .unwrap_or_else(|| format!("UNKNOWN({state_code})")),
        state_code,
        mode: Mode::from_raw(body[2]),
        local: endpoint(family, &id[4..20], sport),
        peer: endpoint(family, &id[20..36], dport),
        ifindex: u32_ne(id, 36).ok_or("sockid")?,
        uid: u32_ne(body, 52).ok_or("uid")?,
        inode: u64_ne(body, 56).ok_or("inode")?,
        shutdown: body[3],
        fallback: None,
        link: None,
        conn: None,
    };
    let attrs = decode_attrs(&body[MSG_LEN..]).ok_or("attribute overruns its message")?;
    for (kind, p) in attrs {
        match kind {
            SMC_DIAG_FALLBACK => {
                let reason = u32_ne(&p, 0).ok_or("short SMC_DIAG_FALLBACK")?;
                let peer = u32_ne(&p, 4).ok_or("short SMC_DIAG_FALLBACK")?;
                sock.fallback = Some(Fallback {
                    reason: decline::decode(reason),
                    peer_diagnosis: (peer != 0).then(|| decline::decode(peer)),
                });
            }
            SMC_DIAG_LGRINFO => {
                if p.len() < LGRINFO_LEN {
                    return Err(format!(
                        "SMC_DIAG_LGRINFO of {} bytes, expected {LGRINFO_LEN}",
                        p.len()
                    ));
                }
                let ib_end = 1 + IB_DEVICE_NAME_MAX;
                sock.link = Some(Link {
                    link_id: p[0],
                    ibdev: c_string(&p[1..ib_end]),
                    ibport: p[ib_end],
                    gid: c_string(&p[ib_end + 1..ib_end + 41]),
                    peer_gid: c_string(&p[ib_end + 41..ib_end + 81]),
                    role: if p[ib_end + 81] == 0 {
                        "CLIENT"
                    } else {
                        "SERVER"
                    },
                });
            }
            SMC_DIAG_CONNINFO => {
                if p.len() < CONNINFO_LEN {
                    return Err(format!(
                        "SMC_DIAG_CONNINFO of {} bytes, expected {CONNINFO_LEN}",
                        p.len()
                    ));
                }
                sock.conn = Some(ConnInfo {
                    token: u32_ne(&p, 0).ok_or("conninfo")?,
                    sndbuf_size: u32_ne(&p, 4).ok_or("conninfo")?,
                    rmbe_size: u32_ne(&p, 8).ok_or("conninfo")?,
                    peer_rmbe_size: u32_ne(&p, 12).ok_or("conninfo")?,
                });
            }
            SMC_DIAG_SHUTDOWN => {
                if let Some(&s) = p.first() {
                    sock.shutdown = s;
                }
            }
            _ => {} // DMBINFO (SMC-D internals) and future attributes
        }
    }
    Ok(sock)
}

/// What one reply datagram held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Sockets (possibly none) and whether the dump is finished.
    Sockets {
        /// Decoded sockets.
        sockets: Vec<SmcSocket>,
        /// `NLMSG_DONE` seen.
        done: bool,
    },
    /// `NLMSG_ERROR` with a negative errno.
    Error(i32),
}

/// Decodes one reply datagram of the dump.
pub fn decode_reply(mut b: &[u8]) -> Result<Reply, String> {
    let mut sockets = Vec::new();
    while !b.is_empty() {
        let len = u32_ne(b, 0).ok_or("truncated nlmsghdr")? as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(format!("nlmsg_len {len} with {} bytes left", b.len()));
        }
        let kind = u16_ne(b, 4).ok_or("truncated nlmsghdr")?;
        let body = &b[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => {
                return Ok(Reply::Sockets {
                    sockets,
                    done: true,
                });
            }
            NLMSG_ERROR => {
                let e = u32_ne(body, 0).ok_or("truncated nlmsgerr")? as i32;
                if e != 0 {
                    return Ok(Reply::Error(e));
                }
            }
            SOCK_DIAG_BY_FAMILY => sockets.push(decode_socket(body)?),
            _ => {} // NLMSG_NOOP and friends
        }
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    Ok(Reply::Sockets {
        sockets,
        done: false,
    })
}

/// Dumps the SMC sockets of the calling thread's network namespace.
pub fn dump() -> Result<Vec<SmcSocket>, DiagError> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(&encode_request(1, ALL_EXTENSIONS), 0)?;
    let mut out = Vec::new();
    loop {
        let (buf, _) = socket.recv_from_full()?;
        match decode_reply(&buf).map_err(DiagError::Malformed)? {
            Reply::Error(e) if -e == 2 => return Err(DiagError::Unsupported),
            Reply::Error(e) => return Err(DiagError::Kernel { errno: -e }),
            Reply::Sockets { sockets, done } => {
                out.extend(sockets);
                if done {
                    return Ok(out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_is_byte_exact() {
        let got = encode_request(7, ALL_EXTENSIONS);
        let mut want = Vec::new();
        want.extend(68u32.to_ne_bytes()); // 16 + sizeof(smc_diag_req) = 16 + 52
        want.extend(20u16.to_ne_bytes()); // SOCK_DIAG_BY_FAMILY
        want.extend(0x301u16.to_ne_bytes()); // NLM_F_REQUEST | NLM_F_DUMP
        want.extend(7u32.to_ne_bytes());
        want.extend(0u32.to_ne_bytes());
        want.extend([43, 0, 0, 0b1_1111]); // AF_SMC, pad[2], CONNINFO..FALLBACK bits
        want.extend([0u8; 48]); // inet_diag_sockid
        assert_eq!(got, want);
        assert_eq!(REQ_LEN, 52);
        assert_eq!(MSG_LEN, 64);
        assert_eq!(LGRINFO_LEN, 147);
        assert_eq!(CONNINFO_LEN, 76);
    }

    /// Builds a reply the way `net/smc/smc_diag.c` does (`__smc_diag_dump`).
    pub(crate) struct MsgBuilder {
        pub(crate) body: Vec<u8>,
    }

    impl MsgBuilder {
        pub(crate) fn new(family: u8, state: u8, mode: u8, src: [u8; 16], dst: [u8; 16]) -> Self {
            let mut body = vec![family, state, mode, 0];
            body.extend(8080u16.to_be_bytes()); // idiag_sport
            body.extend(40000u16.to_be_bytes()); // idiag_dport
            body.extend(src);
            body.extend(dst);
            body.extend(3u32.to_ne_bytes()); // idiag_if
            body.extend([0u8; 8]); // cookie
            body.extend(1000u32.to_ne_bytes()); // diag_uid
            body.extend(123456u64.to_ne_bytes()); // diag_inode
            MsgBuilder { body }
        }
        pub(crate) fn attr(mut self, kind: u16, payload: &[u8]) -> Self {
            let len = 4 + payload.len();
            self.body.extend((len as u16).to_ne_bytes());
            self.body.extend(kind.to_ne_bytes());
            self.body.extend(payload);
            self.body
                .resize(self.body.len() + ((len + 3) & !3) - len, 0);
            self
        }
        pub(crate) fn nlmsg(self) -> Vec<u8> {
            let mut m = Vec::new();
            m.extend(((16 + self.body.len()) as u32).to_ne_bytes());
            m.extend(20u16.to_ne_bytes());
            m.extend(2u16.to_ne_bytes()); // NLM_F_MULTI
            m.extend(1u32.to_ne_bytes());
            m.extend(0u32.to_ne_bytes());
            m.extend(self.body);
            m
        }
    }

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut x = [0u8; 16];
        x[..4].copy_from_slice(&a);
        x
    }

    fn done() -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(20u32.to_ne_bytes());
        m.extend(3u16.to_ne_bytes());
        m.extend(2u16.to_ne_bytes());
        m.extend(1u32.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m
    }

    fn lgrinfo(ib: &str, gid: &str, peer: &str, role: u8) -> Vec<u8> {
        let mut p = vec![1u8];
        let mut name = [0u8; 64];
        name[..ib.len()].copy_from_slice(ib.as_bytes());
        p.extend(name);
        p.push(1);
        let mut g = [0u8; 40];
        g[..gid.len()].copy_from_slice(gid.as_bytes());
        p.extend(g);
        let mut g = [0u8; 40];
        g[..peer.len()].copy_from_slice(peer.as_bytes());
        p.extend(g);
        p.push(role);
        p
    }

    #[test]
    fn decodes_an_smcr_and_a_fallback_socket_and_done() {
        let gid = "0000:0000:0000:0000:0000:ffff:c0a8:4f02";
        let peer = "0000:0000:0000:0000:0000:ffff:c0a8:4f01";
        let mut conn = Vec::new();
        for v in [77u32, 65536, 65536, 131072] {
            conn.extend(v.to_ne_bytes());
        }
        conn.resize(CONNINFO_LEN, 0);
        let mut buf = MsgBuilder::new(AF_SMC, 1, 0, v4([192, 168, 79, 2]), v4([192, 168, 79, 1]))
            .attr(SMC_DIAG_CONNINFO, &conn)
            .attr(SMC_DIAG_LGRINFO, &lgrinfo("rxe0", gid, peer, 0))
            .attr(SMC_DIAG_SHUTDOWN, &[0])
            .nlmsg();
        let mut fb = Vec::new();
        fb.extend(0x0503_0000u32.to_ne_bytes());
        fb.extend(0x0201_0000u32.to_ne_bytes());
        buf.extend(
            MsgBuilder::new(AF_SMC, 7, 1, v4([10, 0, 0, 1]), v4([10, 0, 0, 2]))
                .attr(SMC_DIAG_SHUTDOWN, &[3])
                .attr(SMC_DIAG_FALLBACK, &fb)
                .nlmsg(),
        );
        buf.extend(done());
        let Reply::Sockets { sockets, done } = decode_reply(&buf).unwrap() else {
            panic!("sockets expected")
        };
        assert!(done);
        assert_eq!(sockets.len(), 2);
        let s = &sockets[0];
        assert_eq!(s.state, "ACTIVE");
        assert_eq!(s.mode, Mode::Smcr);
        assert_eq!(s.mode_text(), "SMCR");
        assert_eq!(s.local, "192.168.79.2:8080");
        assert_eq!(s.peer, "192.168.79.1:40000");
        assert_eq!((s.ifindex, s.uid, s.inode), (3, 1000, 123456));
        assert_eq!(
            s.link,
            Some(Link {
                link_id: 1,
                ibdev: "rxe0".into(),
                ibport: 1,
                gid: gid.into(),
                peer_gid: peer.into(),
                role: "CLIENT"
            })
        );
        assert_eq!(
            s.conn,
            Some(ConnInfo {
                token: 77,
                sndbuf_size: 65536,
                rmbe_size: 65536,
                peer_rmbe_size: 131072
            })
        );
        let t = &sockets[1];
        assert_eq!(t.state, "CLOSED");
        assert_eq!(t.shutdown, 3);
        assert_eq!(t.mode_text(), "TCP 0x05030000/0x02010000");
        let f = t.fallback.as_ref().unwrap();
        assert_eq!(f.reason.name, "PEERDECL");
        assert_eq!(f.peer_diagnosis.as_ref().unwrap().name, "TIMEOUT_CL");
    }

    #[test]
    fn ipv6_and_ipproto_smc_addresses() {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = 1;
        let s = decode_socket(&MsgBuilder::new(AF_SMC, 10, 0, a, [0; 16]).body).unwrap();
        assert_eq!(s.local, "[fd00::1]:8080");
        assert_eq!(s.state, "LISTEN");
        // IPPROTO_SMC sockets report family AF_INET and (on 6.12) zero addresses.
        let s = decode_socket(&MsgBuilder::new(AF_INET, 1, 1, [0; 16], [0; 16]).body).unwrap();
        assert_eq!(s.local, "0.0.0.0:8080");
        assert_eq!(s.family, 2);
        assert_eq!(s.mode_text(), "TCP");
        let s = decode_socket(&MsgBuilder::new(AF_INET6, 99, 9, a, a).body).unwrap();
        assert_eq!(s.state, "UNKNOWN(99)");
        assert_eq!(s.mode, Mode::Unknown(9));
        assert_eq!(s.peer, "[fd00::1]:40000");
    }

    #[test]
    fn errors_and_garbage() {
        let mut err = Vec::new();
        err.extend(36u32.to_ne_bytes());
        err.extend(2u16.to_ne_bytes());
        err.extend(0u16.to_ne_bytes());
        err.extend(1u32.to_ne_bytes());
        err.extend(0u32.to_ne_bytes());
        err.extend((-2i32).to_ne_bytes());
        err.extend([0u8; 16]);
        assert_eq!(decode_reply(&err).unwrap(), Reply::Error(-2));
        assert!(decode_reply(&err[..8]).is_err());
        let short = MsgBuilder::new(AF_SMC, 1, 0, [0; 16], [0; 16]).nlmsg();
        let e = decode_reply(&short[..16 + 40]);
        assert!(e.is_err());
        let mut fixed = short[..16 + 40].to_vec();
        fixed[0..4].copy_from_slice(&56u32.to_ne_bytes());
        assert!(
            decode_reply(&fixed)
                .unwrap_err()
                .contains("smc_diag_msg of 40 bytes")
        );
        let bad_lgr = MsgBuilder::new(AF_SMC, 1, 0, [0; 16], [0; 16])
            .attr(SMC_DIAG_LGRINFO, &[1, 2, 3])
            .nlmsg();
        assert!(
            decode_reply(&bad_lgr)
                .unwrap_err()
                .contains("SMC_DIAG_LGRINFO")
        );
        assert!(
            DiagError::Unsupported
                .to_string()
                .starts_with("SMC unsupported: ")
        );
    }

    /// Real kernel: here (no SMC) the dump says "SMC unsupported"; with SMC it lists (possibly
    /// nothing) in a private netns.
    #[test]
    fn real_kernel_dump_or_unsupported() {
        let r = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            dump()
        })
        .join()
        .expect("no panic");
        let smc = std::path::Path::new("/sys/module/smc_diag").exists();
        match r {
            Err(DiagError::Unsupported) => assert!(!smc, "smc_diag loaded but unsupported"),
            Ok(sockets) => assert!(sockets.is_empty(), "fresh netns: {sockets:?}"),
            Err(e) => panic!("{e}"),
        }
    }

    proptest! {
        // No regression files: the lab runs this binary outside the source tree.
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_reply(&b);
            let _ = decode_socket(&b);
        }

        #[test]
        fn decoding_mutated_replies_never_panics(
            flips in proptest::collection::vec((0usize..400, any::<u8>()), 0..8),
            cut in 0usize..400,
        ) {
            let mut b = MsgBuilder::new(AF_SMC, 1, 1, [1; 16], [2; 16])
                .attr(SMC_DIAG_LGRINFO, &lgrinfo("erdma_0", "a", "b", 1))
                .attr(SMC_DIAG_FALLBACK, &[1, 2, 3, 4, 5, 6, 7, 8])
                .nlmsg();
            b.extend(done());
            for (i, v) in flips { if let Some(x) = b.get_mut(i) { *x = v; } }
            b.truncate(cut.max(1));
            let _ = decode_reply(&b);
        }
    }
}
