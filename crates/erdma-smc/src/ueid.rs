//! SMC-Rv2 user-defined EIDs (`smcr ueid`) through the `SMC_GEN_NETLINK` family. SMC-Rv2 is
//! only proposed when both peers share a UEID; the kernel table is global (not per namespace).
//! Messages are built with the generic-netlink codec of [`crate::genl`].

use crate::genl::{
    Attrs, CTRL_ATTR_FAMILY_ID, Message, decode_messages, encode_get_family, encode_request,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

/// Family name (`SMC_GENL_FAMILY_NAME`).
pub const FAMILY_NAME: &str = "SMC_GEN_NETLINK";
/// Family version.
pub const FAMILY_VERSION: u8 = 1;
/// `SMC_NETLINK_DUMP_UEID`.
pub const CMD_DUMP_UEID: u8 = 9;
/// `SMC_NETLINK_ADD_UEID`.
pub const CMD_ADD_UEID: u8 = 10;
/// `SMC_NETLINK_REMOVE_UEID`.
pub const CMD_REMOVE_UEID: u8 = 11;
/// `SMC_NLA_EID_TABLE_ENTRY` (string: 32 characters, blank padded, NUL terminated).
pub const ATTR_EID_TABLE_ENTRY: u16 = 1;
/// `SMC_MAX_EID_LEN`.
pub const EID_LEN: usize = 32;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;

/// A UEID operation failed.
#[derive(Debug, thiserror::Error)]
pub enum UeidError {
    /// The kernel has no SMC generic-netlink family.
    #[error(
        "SMC unsupported: the kernel has no {FAMILY_NAME} generic-netlink family. Fix: `modprobe smc` (Linux 5.16+ for UEIDs)"
    )]
    Unsupported,
    /// Bad EID.
    #[error(
        "UEID {0:?} is not valid: 1-32 characters A-Z, 0-9, '.' or '-', starting with a letter or digit"
    )]
    Invalid(String),
    /// The kernel refused.
    #[error("{op}: kernel returned {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// Operation.
        op: &'static str,
        /// Positive errno.
        errno: i32,
    },
    /// Socket error or malformed reply.
    #[error("{op}: {detail}")]
    Io {
        /// Operation.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
}

/// The kernel form of `eid`: upper case, blank padded to 32 characters.
pub fn normalize(eid: &str) -> Result<String, UeidError> {
    let e = eid.trim_end().to_ascii_uppercase();
    let ok = !e.is_empty()
        && e.len() <= EID_LEN
        && e.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && e.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if !ok {
        return Err(UeidError::Invalid(eid.to_string()));
    }
    Ok(format!("{e:<EID_LEN$}"))
}

/// `SMC_NETLINK_ADD_UEID` / `REMOVE_UEID` for `eid` (already normalised).
pub fn encode_entry(family: u16, seq: u32, cmd: u8, normalized: &str) -> Vec<u8> {
    let mut payload = normalized.as_bytes().to_vec();
    payload.push(0);
    let mut attrs = Vec::new();
    let len = 4 + payload.len();
    attrs.extend_from_slice(&(len as u16).to_ne_bytes());
    attrs.extend_from_slice(&ATTR_EID_TABLE_ENTRY.to_ne_bytes());
    attrs.extend_from_slice(&payload);
    attrs.resize(attrs.len() + ((len + 3) & !3) - len, 0);
    encode_request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        cmd,
        FAMILY_VERSION,
        &attrs,
    )
}

/// A client of the UEID table.
pub struct UeidClient {
    socket: Socket,
    family: u16,
}

impl UeidClient {
    /// Opens a socket and resolves the family.
    pub fn open() -> Result<Self, UeidError> {
        let io = |op: &'static str| {
            move |e: std::io::Error| UeidError::Io {
                op,
                detail: e.to_string(),
            }
        };
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(io("open NETLINK_GENERIC"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connect"))?;
        let mut c = UeidClient { socket, family: 0 };
        let rows = match c.transact(
            "resolve SMC_GEN_NETLINK",
            &encode_get_family(1, FAMILY_NAME),
        ) {
            Err(UeidError::Kernel { errno: 2, .. }) => return Err(UeidError::Unsupported),
            r => r?,
        };
        c.family = rows
            .iter()
            .flatten()
            .find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID)
            .and_then(|(_, v)| v.get(..2))
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .ok_or(UeidError::Io {
                op: "resolve SMC_GEN_NETLINK",
                detail: "no family id in the reply".into(),
            })?;
        Ok(c)
    }

    fn transact(&self, op: &'static str, req: &[u8]) -> Result<Vec<Attrs>, UeidError> {
        let io = |e: std::io::Error| UeidError::Io {
            op,
            detail: e.to_string(),
        };
        self.socket.send(req, 0).map_err(io)?;
        let dump = u16::from_ne_bytes([req[6], req[7]]) & NLM_F_DUMP == NLM_F_DUMP;
        let mut rows = Vec::new();
        loop {
            let (buf, _) = self.socket.recv_from_full().map_err(io)?;
            for m in decode_messages(&buf).map_err(|detail| UeidError::Io { op, detail })? {
                match m {
                    Message::Error(0) if !dump => return Ok(rows),
                    Message::Error(0) => {}
                    Message::Error(e) => return Err(UeidError::Kernel { op, errno: -e }),
                    Message::Done => return Ok(rows),
                    Message::Genl { attrs, .. } => rows.push(attrs),
                }
            }
        }
    }

    /// Adds `eid`; false when it was already there.
    pub fn add(&self, eid: &str) -> Result<bool, UeidError> {
        let n = normalize(eid)?;
        match self.transact(
            "SMC_NETLINK_ADD_UEID",
            &encode_entry(self.family, 2, CMD_ADD_UEID, &n),
        ) {
            Ok(_) => Ok(true),
            Err(UeidError::Kernel { errno: 17, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes `eid`.
    pub fn remove(&self, eid: &str) -> Result<(), UeidError> {
        let n = normalize(eid)?;
        self.transact(
            "SMC_NETLINK_REMOVE_UEID",
            &encode_entry(self.family, 3, CMD_REMOVE_UEID, &n),
        )
        .map(|_| ())
    }

    /// The configured UEIDs (trailing blanks removed).
    pub fn list(&self) -> Result<Vec<String>, UeidError> {
        let req = encode_request(
            self.family,
            NLM_F_REQUEST | NLM_F_DUMP,
            4,
            CMD_DUMP_UEID,
            FAMILY_VERSION,
            &[],
        );
        let rows = self.transact("SMC_NETLINK_DUMP_UEID", &req)?;
        Ok(rows
            .iter()
            .flatten()
            .filter(|(k, _)| *k == ATTR_EID_TABLE_ENTRY)
            .map(|(_, v)| {
                let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
                String::from_utf8_lossy(&v[..end]).trim_end().to_string()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation() {
        assert_eq!(
            normalize("klab-test-eid").unwrap(),
            format!("{:<32}", "KLAB-TEST-EID")
        );
        assert_eq!(normalize("A").unwrap().len(), 32);
        for bad in ["", "-x", "has space", "ümlaut", &"X".repeat(33)] {
            assert!(
                matches!(normalize(bad), Err(UeidError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn add_is_byte_exact() {
        let n = normalize("ERDMA-EID").unwrap();
        let got = encode_entry(0x1c, 5, CMD_ADD_UEID, &n);
        let mut want = Vec::new();
        want.extend(((16 + 4 + 4 + 36) as u32).to_ne_bytes()); // 33-byte string padded to 36
        want.extend(0x1cu16.to_ne_bytes());
        want.extend(0x5u16.to_ne_bytes());
        want.extend(5u32.to_ne_bytes());
        want.extend(0u32.to_ne_bytes());
        want.extend([10, 1, 0, 0]); // SMC_NETLINK_ADD_UEID, version 1
        want.extend(37u16.to_ne_bytes()); // 4 + 33
        want.extend(1u16.to_ne_bytes()); // SMC_NLA_EID_TABLE_ENTRY
        want.extend(b"ERDMA-EID                       \0");
        want.extend([0, 0, 0]);
        assert_eq!(got, want);
    }

    #[test]
    fn real_kernel_unsupported_or_lists() {
        match UeidClient::open() {
            Err(UeidError::Unsupported) => {
                assert!(!std::path::Path::new("/sys/module/smc").exists());
                assert!(
                    UeidError::Unsupported
                        .to_string()
                        .starts_with("SMC unsupported: ")
                );
            }
            Ok(c) => {
                c.list().expect("dump UEIDs");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
