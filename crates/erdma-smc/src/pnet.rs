//! The kernel's SMC pnet table through the `SMC_PNETID` generic-netlink family (what `smc_pnet`
//! uses), without the `smc_pnet` binary.
//!
//! The table is per network namespace: a [`PnetClient`] acts on the namespace of the thread that
//! opened it. ib device ports can be mapped only in the initial namespace (the kernel ignores them
//! elsewhere); netdev entries work in any namespace, also for netdevs that do not exist yet.
//! Message layouts follow `include/uapi/linux/smc.h`; the generic-netlink codec is
//! [`crate::genl`].

use crate::genl::{
    Attrs, CTRL_ATTR_FAMILY_ID, Message, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attr_str,
    decode_messages, encode_get_family, encode_request, put_attr, put_str_attr, u16_at,
};
use erdma_model::PnetId;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};
use serde::Serialize;
use std::sync::atomic::{AtomicU32, Ordering};

/// Generic-netlink family name of the pnet table (`SMCR_GENL_FAMILY_NAME`).
pub const FAMILY_NAME: &str = "SMC_PNETID";
/// Family version (`SMCR_GENL_FAMILY_VERSION`).
pub const FAMILY_VERSION: u8 = 1;

/// `SMC_PNETID_GET`.
pub const CMD_GET: u8 = 1;
/// `SMC_PNETID_ADD`.
pub const CMD_ADD: u8 = 2;
/// `SMC_PNETID_DEL`.
pub const CMD_DEL: u8 = 3;
/// `SMC_PNETID_FLUSH`.
pub const CMD_FLUSH: u8 = 4;

/// `SMC_PNETID_NAME` (NUL-terminated string, ≤ 16 characters).
pub const ATTR_NAME: u16 = 1;
/// `SMC_PNETID_ETHNAME` (NUL-terminated interface name).
pub const ATTR_ETHNAME: u16 = 2;
/// `SMC_PNETID_IBNAME` (NUL-terminated ib device name).
pub const ATTR_IBNAME: u16 = 3;
/// `SMC_PNETID_IBPORT` (u8, 1..=2).
pub const ATTR_IBPORT: u16 = 4;

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;

/// Highest ib port number the pnet table accepts (`SMC_MAX_PORTS`).
pub const MAX_IB_PORT: u8 = 2;

/// One row of the pnet table (what `smc_pnet -s` prints: `<PNETID> <ethname|n/a> <ibname|n/a> <port|255>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PnetEntry {
    /// The PNET ID.
    pub pnetid: String,
    /// Netdev side, if set.
    pub ethname: Option<String>,
    /// ib device side, if set.
    pub ibname: Option<String>,
    /// ib port, if set.
    pub ibport: Option<u8>,
}

/// What a pnet entry binds a PNET ID to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PnetTarget {
    /// A netdev (`smc_pnet -a ID -I eth0`).
    Netdev(String),
    /// An ib device port (`smc_pnet -a ID -D erdma_0 -P 1`).
    IbPort {
        /// ib device name.
        ibdev: String,
        /// Port, 1..=2.
        port: u8,
    },
}

/// A pnet-table operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PnetError {
    /// The kernel has no SMC (`SMC_PNETID` family unknown): the `smc` module is not loaded or built.
    #[error(
        "SMC unavailable: the kernel has no {FAMILY_NAME} generic-netlink family. Fix: `modprobe smc` on the node (kernel with CONFIG_SMC); SMC-R is skipped until then"
    )]
    SmcUnavailable,
    /// The kernel rejected a request.
    #[error("{op}: kernel returned {errno} ({}). Fix: {fix}", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// The operation, e.g. `SMC_PNETID_ADD 00163E0A1B2C ib erdma_0/1`.
        op: String,
        /// Positive errno.
        errno: i32,
        /// What to do about it.
        fix: String,
    },
    /// Bad input, rejected before sending.
    #[error("{0}")]
    Invalid(String),
    /// The netlink socket failed.
    #[error(
        "{op}: netlink socket: {source}. Fix: run with CAP_NET_ADMIN in the intended network namespace"
    )]
    Io {
        /// The operation.
        op: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel answered something this code cannot parse.
    #[error("{op}: malformed reply: {detail}")]
    Malformed {
        /// The operation.
        op: String,
        /// What was wrong.
        detail: String,
    },
}

fn validate_name(kind: &str, s: &str, max: usize) -> Result<(), PnetError> {
    if s.is_empty()
        || s.len() > max
        || s.bytes()
            .any(|b| b == 0 || b == b'/' || b.is_ascii_whitespace())
    {
        return Err(PnetError::Invalid(format!(
            "{kind} {s:?} is not valid (1-{max} characters, no whitespace, '/' or NUL)"
        )));
    }
    Ok(())
}

/// `SMC_PNETID_ADD`: bind `pnetid` to `target`.
pub fn encode_add(
    family: u16,
    seq: u32,
    pnetid: &PnetId,
    target: &PnetTarget,
) -> Result<Vec<u8>, PnetError> {
    let mut attrs = Vec::new();
    put_str_attr(&mut attrs, ATTR_NAME, pnetid.as_str());
    match target {
        PnetTarget::Netdev(ifname) => {
            validate_name("interface name", ifname, 15)?;
            put_str_attr(&mut attrs, ATTR_ETHNAME, ifname);
        }
        PnetTarget::IbPort { ibdev, port } => {
            validate_name("ib device name", ibdev, 63)?;
            if !(1..=MAX_IB_PORT).contains(port) {
                return Err(PnetError::Invalid(format!(
                    "ib port {port} of {ibdev} is out of range (1-{MAX_IB_PORT}); eRDMA devices use port 1"
                )));
            }
            put_str_attr(&mut attrs, ATTR_IBNAME, ibdev);
            put_attr(&mut attrs, ATTR_IBPORT, &[*port]);
        }
    }
    Ok(encode_request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CMD_ADD,
        FAMILY_VERSION,
        &attrs,
    ))
}

/// `SMC_PNETID_GET` with `NLM_F_DUMP`: every entry.
pub fn encode_dump(family: u16, seq: u32) -> Vec<u8> {
    encode_request(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        CMD_GET,
        FAMILY_VERSION,
        &[],
    )
}

/// `SMC_PNETID_DEL`: every entry with `pnetid`.
pub fn encode_del(family: u16, seq: u32, pnetid: &PnetId) -> Vec<u8> {
    let mut attrs = Vec::new();
    put_str_attr(&mut attrs, ATTR_NAME, pnetid.as_str());
    encode_request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CMD_DEL,
        FAMILY_VERSION,
        &attrs,
    )
}

/// `SMC_PNETID_FLUSH`: the whole table of this namespace.
pub fn encode_flush(family: u16, seq: u32) -> Vec<u8> {
    encode_request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CMD_FLUSH,
        FAMILY_VERSION,
        &[],
    )
}

/// Decodes one pnet-table row from its attributes (`n/a` and port `0xff` mean "unset").
pub fn decode_entry(attrs: &[(u16, Vec<u8>)]) -> Option<PnetEntry> {
    let mut e = PnetEntry {
        pnetid: String::new(),
        ethname: None,
        ibname: None,
        ibport: None,
    };
    let set = |s: String| (!s.is_empty() && s != "n/a").then_some(s);
    for (kind, payload) in attrs {
        match *kind {
            ATTR_NAME => e.pnetid = attr_str(payload),
            ATTR_ETHNAME => e.ethname = set(attr_str(payload)),
            ATTR_IBNAME => e.ibname = set(attr_str(payload)),
            ATTR_IBPORT => e.ibport = payload.first().copied().filter(|&p| p != 0xff && p != 0),
            _ => {}
        }
    }
    (!e.pnetid.is_empty()).then_some(e)
}

/// A client of the `SMC_PNETID` family in the calling thread's network namespace.
pub struct PnetClient {
    socket: Socket,
    family: u16,
    seq: AtomicU32,
}

impl PnetClient {
    /// Opens a generic-netlink socket and resolves the family. Returns [`PnetError::SmcUnavailable`]
    /// when the kernel has no SMC.
    pub fn open() -> Result<Self, PnetError> {
        let io = |op: &str| {
            let op = op.to_string();
            move |source| PnetError::Io { op, source }
        };
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(io("open NETLINK_GENERIC"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connect"))?;
        let mut client = PnetClient {
            socket,
            family: 0,
            seq: AtomicU32::new(1),
        };
        client.family = client.resolve_family()?;
        Ok(client)
    }

    /// The resolved family id.
    pub fn family_id(&self) -> u16 {
        self.family
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and collects the replies until the ACK / `NLMSG_DONE`.
    fn transact(&self, op: &str, req: &[u8], dump: bool) -> Result<Vec<Attrs>, PnetError> {
        self.socket.send(req, 0).map_err(|source| PnetError::Io {
            op: op.to_string(),
            source,
        })?;
        let mut rows = Vec::new();
        loop {
            let (buf, _) = self
                .socket
                .recv_from_full()
                .map_err(|source| PnetError::Io {
                    op: op.to_string(),
                    source,
                })?;
            let msgs = decode_messages(&buf).map_err(|detail| PnetError::Malformed {
                op: op.to_string(),
                detail,
            })?;
            for m in msgs {
                match m {
                    Message::Error(0) if !dump => return Ok(rows),
                    Message::Error(0) => {}
                    Message::Error(e) => {
                        return Err(PnetError::Kernel {
                            op: op.to_string(),
                            errno: -e,
                            fix: fix_for(-e),
                        });
                    }
                    Message::Done => return Ok(rows),
                    Message::Genl { attrs, .. } => rows.push(attrs),
                }
            }
        }
    }

    fn resolve_family(&self) -> Result<u16, PnetError> {
        let req = encode_get_family(self.next_seq(), FAMILY_NAME);
        let rows = match self.transact("resolve SMC_PNETID", &req, false) {
            Err(PnetError::Kernel { errno: ENOENT, .. }) => return Err(PnetError::SmcUnavailable),
            r => r?,
        };
        rows.iter()
            .flat_map(|attrs| attrs.iter())
            .find(|(k, p)| *k == CTRL_ATTR_FAMILY_ID && p.len() >= 2)
            .and_then(|(_, p)| u16_at(p, 0))
            .ok_or_else(|| PnetError::Malformed {
                op: "resolve SMC_PNETID".to_string(),
                detail: "no CTRL_ATTR_FAMILY_ID in the reply".to_string(),
            })
    }

    /// All entries of this namespace's table.
    pub fn list(&self) -> Result<Vec<PnetEntry>, PnetError> {
        let req = encode_dump(self.family, self.next_seq());
        Ok(self
            .transact("SMC_PNETID_GET (dump)", &req, true)?
            .iter()
            .filter_map(|a| decode_entry(a))
            .collect())
    }

    /// Adds an entry. Returns `false` when the kernel already had it (`EEXIST`).
    pub fn add(&self, pnetid: &PnetId, target: &PnetTarget) -> Result<bool, PnetError> {
        let op = match target {
            PnetTarget::Netdev(n) => format!("SMC_PNETID_ADD {pnetid} netdev {n}"),
            PnetTarget::IbPort { ibdev, port } => {
                format!("SMC_PNETID_ADD {pnetid} ib {ibdev}/{port}")
            }
        };
        let req = encode_add(self.family, self.next_seq(), pnetid, target)?;
        match self.transact(&op, &req, false) {
            Ok(_) => Ok(true),
            Err(PnetError::Kernel { errno: EEXIST, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes every entry with `pnetid`.
    pub fn delete(&self, pnetid: &PnetId) -> Result<(), PnetError> {
        let req = encode_del(self.family, self.next_seq(), pnetid);
        self.transact(&format!("SMC_PNETID_DEL {pnetid}"), &req, false)
            .map(|_| ())
    }

    /// Removes every entry of this namespace's table.
    pub fn flush(&self) -> Result<(), PnetError> {
        let req = encode_flush(self.family, self.next_seq());
        self.transact("SMC_PNETID_FLUSH", &req, false).map(|_| ())
    }

    /// Makes sure `pnetid` maps to `target`; returns whether it changed anything. An entry that binds
    /// the same target to another PNET ID is an error (the kernel allows one ID per port/netdev).
    pub fn ensure(&self, pnetid: &PnetId, target: &PnetTarget) -> Result<bool, PnetError> {
        let existing = self.list()?;
        if let Some(other) = existing.iter().find(|e| matches_target(e, target)) {
            if other.pnetid == pnetid.as_str() {
                return Ok(false);
            }
            return Err(PnetError::Invalid(format!(
                "{target:?} already has PNET ID {} (wanted {pnetid}); remove it with `smc_pnet -r {}` if it is stale",
                other.pnetid, other.pnetid
            )));
        }
        let added = self.add(pnetid, target)?;
        if !added && matches!(target, PnetTarget::IbPort { .. }) {
            // EEXIST without an entry: outside the initial network namespace the kernel ignores ib
            // ports (smc_pnet_enter stops after the netdev part there).
            if !self.list()?.iter().any(|e| matches_target(e, target)) {
                return Err(PnetError::Invalid(format!(
                    "{target:?}: the kernel ignored the entry; ib device ports can only be mapped in the initial network namespace (run the host pnet setup with hostNetwork)"
                )));
            }
        }
        Ok(added)
    }
}

/// What [`ensure_ib_ports`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct HostPnetReport {
    /// Entries added, as `PNETID ibdev/port`.
    pub added: Vec<String>,
    /// Entries that were already right.
    pub unchanged: Vec<String>,
    /// Per-entry or global problems (SMC unavailable, conflicts, kernel errors).
    pub warnings: Vec<String>,
}

/// Best-effort host setup (seed §6 step 4): map each PNET ID to its ib device port in the calling
/// thread's network namespace. Never fails: problems become warnings (logged), so a node without
/// SMC keeps serving RDMA devices.
pub fn ensure_ib_ports(wanted: &[(PnetId, String, u8)]) -> HostPnetReport {
    let mut report = HostPnetReport::default();
    let client = match PnetClient::open() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "smc: host pnet setup skipped");
            report.warnings.push(e.to_string());
            return report;
        }
    };
    for (id, ibdev, port) in wanted {
        let label = format!("{id} {ibdev}/{port}");
        match client.ensure(
            id,
            &PnetTarget::IbPort {
                ibdev: ibdev.clone(),
                port: *port,
            },
        ) {
            Ok(true) => {
                tracing::info!(entry = %label, "smc: pnet entry added");
                report.added.push(label);
            }
            Ok(false) => report.unchanged.push(label),
            Err(e) => {
                tracing::warn!(entry = %label, error = %e, "smc: pnet entry not set");
                report.warnings.push(e.to_string());
            }
        }
    }
    report
}

fn matches_target(e: &PnetEntry, target: &PnetTarget) -> bool {
    match target {
        PnetTarget::Netdev(n) => e.ethname.as_deref() == Some(n.as_str()),
        PnetTarget::IbPort { ibdev, port } => {
            e.ibname.as_deref() == Some(ibdev.as_str()) && e.ibport == Some(*port)
        }
    }
}

fn fix_for(errno: i32) -> String {
    match errno {
        1 | 13 => "run with CAP_NET_ADMIN".to_string(),
        19 => "check that the netdev / ib device exists in this network namespace (`ip link`, `rdma link`)".to_string(),
        22 => "check the PNET ID (1-16 letters/digits) and the port (1-2)".to_string(),
        _ => "see `dmesg` and `smc_pnet -s`".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genl::*;

    const NLM_F_MULTI: u16 = 0x2;

    /// Native-endian u16/u32 helpers for the expected bytes, spelled out per field.
    fn u16b(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }
    fn u32b(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    #[test]
    fn add_ib_port_is_byte_exact() {
        let id = PnetId::parse("00163E0A1B2C").unwrap();
        let target = PnetTarget::IbPort {
            ibdev: "erdma_0".into(),
            port: 1,
        };
        let got = encode_add(0x1a, 7, &id, &target).unwrap();
        let mut want = Vec::new();
        want.extend(u32b(60)); // nlmsg_len: 16 + 4 + 20 + 12 + 8
        want.extend(u16b(0x1a)); // nlmsg_type: family id
        want.extend(u16b(0x5)); // NLM_F_REQUEST | NLM_F_ACK
        want.extend(u32b(7)); // seq
        want.extend(u32b(0)); // pid
        want.extend([2, 1, 0, 0]); // SMC_PNETID_ADD, version 1, reserved
        want.extend(u16b(17)); // nla_len: 4 + "00163E0A1B2C\0"
        want.extend(u16b(1)); // SMC_PNETID_NAME
        want.extend(b"00163E0A1B2C\0\0\0\0"); // 13 bytes + 3 padding
        want.extend(u16b(12)); // 4 + "erdma_0\0"
        want.extend(u16b(3)); // SMC_PNETID_IBNAME
        want.extend(b"erdma_0\0");
        want.extend(u16b(5)); // 4 + u8
        want.extend(u16b(4)); // SMC_PNETID_IBPORT
        want.extend([1, 0, 0, 0]);
        assert_eq!(got, want);
    }

    #[test]
    fn add_netdev_dump_del_flush_are_byte_exact() {
        let id = PnetId::parse("abc").unwrap();
        let got = encode_add(0x20, 1, &id, &PnetTarget::Netdev("eth0".into())).unwrap();
        let mut want = Vec::new();
        want.extend(u32b(16 + 4 + 8 + 12));
        want.extend(u16b(0x20));
        want.extend(u16b(0x5));
        want.extend(u32b(1));
        want.extend(u32b(0));
        want.extend([2, 1, 0, 0]);
        want.extend(u16b(8));
        want.extend(u16b(1));
        want.extend(b"ABC\0"); // upper-cased by PnetId, as the kernel would
        want.extend(u16b(9));
        want.extend(u16b(2)); // SMC_PNETID_ETHNAME
        want.extend(b"eth0\0\0\0\0");
        assert_eq!(got, want);

        let dump = encode_dump(0x20, 2);
        let mut want = Vec::new();
        want.extend(u32b(20));
        want.extend(u16b(0x20));
        want.extend(u16b(0x301)); // NLM_F_REQUEST | NLM_F_DUMP
        want.extend(u32b(2));
        want.extend(u32b(0));
        want.extend([1, 1, 0, 0]); // SMC_PNETID_GET
        assert_eq!(dump, want);

        let del = encode_del(0x20, 3, &id);
        assert_eq!(&del[16..20], &[3, 1, 0, 0]);
        let mut want_attr = Vec::new();
        want_attr.extend(u16b(8));
        want_attr.extend(u16b(1));
        want_attr.extend(b"ABC\0");
        assert_eq!(&del[20..], &want_attr[..]);
        assert_eq!(u32::from_ne_bytes([del[0], del[1], del[2], del[3]]), 28);
        let flush = encode_flush(0x20, 4);
        assert_eq!(flush.len(), 20);
        assert_eq!(&flush[16..20], &[4, 1, 0, 0]);
        assert_eq!(u16::from_ne_bytes([flush[6], flush[7]]), 0x5);
    }

    #[test]
    fn get_family_is_byte_exact() {
        let got = encode_get_family(9, "SMC_PNETID");
        let mut want = Vec::new();
        want.extend(u32b(16 + 4 + 16));
        want.extend(u16b(0x10)); // GENL_ID_CTRL
        want.extend(u16b(0x5));
        want.extend(u32b(9));
        want.extend(u32b(0));
        want.extend([3, 1, 0, 0]); // CTRL_CMD_GETFAMILY, version 1
        want.extend(u16b(15)); // 4 + "SMC_PNETID\0"
        want.extend(u16b(2)); // CTRL_ATTR_FAMILY_NAME
        want.extend(b"SMC_PNETID\0\0");
        assert_eq!(got, want);
    }

    #[test]
    fn bad_input_is_rejected_before_sending() {
        let id = PnetId::parse("X").unwrap();
        let e = encode_add(
            1,
            1,
            &id,
            &PnetTarget::IbPort {
                ibdev: "erdma_0".into(),
                port: 3,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("port 3 of erdma_0"), "{e}");
        let e =
            encode_add(1, 1, &id, &PnetTarget::Netdev("a very long ifname".into())).unwrap_err();
        assert!(e.to_string().contains("interface name"), "{e}");
        assert!(encode_add(1, 1, &id, &PnetTarget::Netdev(String::new())).is_err());
    }

    /// A dump reply as the kernel builds it (`smc_pnet_set_nla`): NAME, ETHNAME, IBNAME, IBPORT in
    /// one NLM_F_MULTI message per entry, then NLMSG_DONE.
    fn reply_entry(seq: u32, name: &str, eth: &str, ib: &str, port: u8) -> Vec<u8> {
        let mut attrs = Vec::new();
        put_str_attr(&mut attrs, ATTR_NAME, name);
        put_str_attr(&mut attrs, ATTR_ETHNAME, eth);
        put_str_attr(&mut attrs, ATTR_IBNAME, ib);
        put_attr(&mut attrs, ATTR_IBPORT, &[port]);
        let mut m = encode_request(0x1a, NLM_F_MULTI, seq, CMD_GET, 1, &attrs);
        m[6..8].copy_from_slice(&NLM_F_MULTI.to_ne_bytes());
        m
    }

    #[test]
    fn decodes_a_dump_with_unset_fields() {
        let mut buf = reply_entry(5, "00163E0A1B2C", "n/a", "erdma_0", 1);
        buf.extend(reply_entry(5, "00163E0A1B2D", "eth1", "n/a", 0xff));
        let mut done = Vec::new();
        done.extend(u32b(20));
        done.extend(u16b(NLMSG_DONE));
        done.extend(u16b(NLM_F_MULTI));
        done.extend(u32b(5));
        done.extend(u32b(0));
        done.extend(u32b(0));
        buf.extend(done);
        let msgs = decode_messages(&buf).unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2], Message::Done);
        let entries: Vec<PnetEntry> = msgs
            .iter()
            .filter_map(|m| match m {
                Message::Genl { attrs, .. } => decode_entry(attrs),
                _ => None,
            })
            .collect();
        assert_eq!(
            entries,
            [
                PnetEntry {
                    pnetid: "00163E0A1B2C".into(),
                    ethname: None,
                    ibname: Some("erdma_0".into()),
                    ibport: Some(1)
                },
                PnetEntry {
                    pnetid: "00163E0A1B2D".into(),
                    ethname: Some("eth1".into()),
                    ibname: None,
                    ibport: None
                },
            ]
        );
    }

    #[test]
    fn decodes_errors_and_rejects_garbage() {
        let mut err = Vec::new();
        err.extend(u32b(36));
        err.extend(u16b(NLMSG_ERROR));
        err.extend(u16b(0));
        err.extend(u32b(1));
        err.extend(u32b(0));
        err.extend((-17i32).to_ne_bytes());
        err.extend([0u8; 16]); // the echoed request header
        assert_eq!(decode_messages(&err).unwrap(), [Message::Error(-17)]);
        assert!(decode_messages(&err[..10]).is_err());
        let mut bad = err.clone();
        bad[0..4].copy_from_slice(&u32b(400));
        assert!(decode_messages(&bad).unwrap_err().contains("nlmsg_len 400"));
        // An attribute claiming more bytes than its message has.
        let mut m = reply_entry(1, "A", "n/a", "n/a", 1);
        m[20..22].copy_from_slice(&u16b(200));
        assert!(decode_messages(&m).is_err());
    }

    #[test]
    fn kernel_errors_name_the_operation_and_fix() {
        let e = PnetError::Kernel {
            op: "SMC_PNETID_ADD X ib erdma_0/1".into(),
            errno: 19,
            fix: fix_for(19),
        };
        let t = e.to_string();
        assert!(
            t.contains("SMC_PNETID_ADD X ib erdma_0/1")
                && t.contains("19")
                && t.contains("rdma link"),
            "{t}"
        );
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(msgs) = decode_messages(&bytes) {
                for m in msgs {
                    if let Message::Genl { attrs, .. } = m {
                        let _ = decode_entry(&attrs);
                    }
                }
            }
        }

        #[test]
        fn encoded_adds_decode_to_the_same_entry(
            id in "[A-Z0-9]{1,16}",
            ib in "[a-z][a-z0-9_]{0,20}",
            port in 1u8..=2,
            seq in proptest::prelude::any::<u32>(),
        ) {
            let pnetid = PnetId::parse(&id).unwrap();
            let req = encode_add(0x1a, seq, &pnetid, &PnetTarget::IbPort { ibdev: ib.clone(), port }).unwrap();
            let msgs = decode_messages(&req).unwrap();
            proptest::prop_assert_eq!(msgs.len(), 1);
            let Message::Genl { seq: got_seq, cmd, attrs } = &msgs[0] else { panic!("not genl") };
            proptest::prop_assert_eq!((*got_seq, *cmd), (seq, CMD_ADD));
            proptest::prop_assert_eq!(
                decode_entry(attrs),
                Some(PnetEntry { pnetid: id, ethname: None, ibname: Some(ib), ibport: Some(port) })
            );
        }
    }

    /// Tests that need a kernel with SMC (and, for the ib port, a disposable host): `#[ignore]`d,
    /// run with `--ignored` in the 6.12 lab VM (`crates/erdma-smc/lab/run-pnet.sh`).
    mod lab {
        use super::*;

        /// Real kernel with SMC: add, duplicate add, dump, ensure, delete and flush in a private
        /// network namespace, so the host's table is never touched.
        #[test]
        #[ignore = "needs root and a kernel with SMC; run with --ignored by crates/erdma-smc/lab/run-pnet.sh in the 6.12 VM"]
        fn real_kernel_round_trip_in_a_private_netns() {
            let outcome =
                std::thread::spawn(|| -> Result<Vec<PnetEntry>, String> {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("unshare: {e}"))?;
                    let c = PnetClient::open()
                        .map_err(|e| format!("needs a kernel with SMC (modprobe smc): {e}"))?;
                    let id = PnetId::parse("ERDMATEST1").map_err(|e| e.to_string())?;
                    let lo = PnetTarget::Netdev("lo".into());
                    c.flush().map_err(|e| e.to_string())?;
                    assert!(c.list().map_err(|e| e.to_string())?.is_empty());
                    assert!(
                        c.add(&id, &lo).map_err(|e| e.to_string())?,
                        "first add adds"
                    );
                    assert!(
                        !c.add(&id, &lo).map_err(|e| e.to_string())?,
                        "second add: EEXIST"
                    );
                    assert!(
                        !c.ensure(&id, &lo).map_err(|e| e.to_string())?,
                        "ensure: already there"
                    );
                    let listed = c.list().map_err(|e| e.to_string())?;
                    let other = PnetId::parse("ERDMATEST2").map_err(|e| e.to_string())?;
                    let conflict = c.ensure(&other, &lo).unwrap_err().to_string();
                    assert!(
                        conflict.contains("already has PNET ID ERDMATEST1"),
                        "{conflict}"
                    );
                    // The kernel keeps entries for netdevs that do not exist (yet): they attach
                    // when the netdev appears.
                    let pending = PnetTarget::Netdev("nosuchdev0".into());
                    assert!(c.add(&other, &pending).map_err(|e| e.to_string())?);
                    let with_pending = c.list().map_err(|e| e.to_string())?;
                    assert!(
                        with_pending.iter().any(|e| e.pnetid == "ERDMATEST2"
                            && e.ethname.as_deref() == Some("nosuchdev0")),
                        "{with_pending:?}"
                    );
                    c.delete(&other).map_err(|e| e.to_string())?;
                    // ib ports cannot be mapped outside the initial namespace: the kernel
                    // ignores them.
                    let ib = PnetTarget::IbPort {
                        ibdev: "rxe0".into(),
                        port: 1,
                    };
                    let ignored = c.ensure(&other, &ib).unwrap_err().to_string();
                    assert!(ignored.contains("initial network namespace"), "{ignored}");
                    c.delete(&id).map_err(|e| e.to_string())?;
                    assert!(c.list().map_err(|e| e.to_string())?.is_empty());
                    c.add(&id, &lo).map_err(|e| e.to_string())?;
                    c.flush().map_err(|e| e.to_string())?;
                    assert!(c.list().map_err(|e| e.to_string())?.is_empty());
                    Ok(listed)
                })
                .join()
                .expect("no panic");
            match outcome {
                Ok(listed) => assert_eq!(
                    listed,
                    [PnetEntry {
                        pnetid: "ERDMATEST1".into(),
                        ethname: Some("lo".into()),
                        ibname: None,
                        ibport: None
                    }]
                ),
                Err(e) => panic!("{e}"),
            }
        }

        /// Real kernel with SMC and an RDMA device named by `ERDMA_LAB_IBDEV` (the lab VM sets it
        /// to a Soft-RoCE device): the host setup maps a PNET ID to the ib port, idempotently, in
        /// the initial network namespace. Only in the disposable lab VM: it changes the host's own table.
        #[test]
        #[ignore = "needs a kernel with SMC, an RDMA device named by ERDMA_LAB_IBDEV and a disposable host (it edits the initial namespace's pnet table); run with --ignored by crates/erdma-smc/lab/run-pnet.sh in the 6.12 VM"]
        fn real_kernel_ib_port_entry() {
            let ibdev = std::env::var("ERDMA_LAB_IBDEV").expect(
            "needs ERDMA_LAB_IBDEV naming an RDMA device on a disposable host with SMC (the lab VM sets it)",
        );
            // ib ports are mapped in the initial network namespace only (the lab VM is disposable).
            let report = std::thread::spawn(move || {
                let id = PnetId::parse("ERDMALAB1").unwrap();
                let first = ensure_ib_ports(&[(id.clone(), ibdev.clone(), 1)]);
                let second = ensure_ib_ports(&[(id.clone(), ibdev.clone(), 1)]);
                let c = PnetClient::open().expect("SMC present");
                let listed = c.list().expect("dump");
                c.delete(&id).expect("delete");
                let after = c.list().expect("dump");
                (ibdev, first, second, listed, after)
            })
            .join()
            .expect("no panic");
            let (ibdev, first, second, listed, after) = report;
            assert_eq!(first.added, [format!("ERDMALAB1 {ibdev}/1")], "{first:?}");
            assert!(first.warnings.is_empty(), "{first:?}");
            assert_eq!(
                second.unchanged,
                [format!("ERDMALAB1 {ibdev}/1")],
                "{second:?}"
            );
            assert!(second.added.is_empty());
            assert!(
                listed.contains(&PnetEntry {
                    pnetid: "ERDMALAB1".into(),
                    ethname: None,
                    ibname: Some(ibdev),
                    ibport: Some(1)
                }),
                "{listed:?}"
            );
            assert!(after.is_empty(), "{after:?}");
        }
    }

    /// Real kernel: on a machine without SMC the family cannot be resolved and the client says so;
    /// with SMC the table can be listed.
    #[test]
    fn real_kernel_reports_smc_unavailable_or_lists() {
        let smc_loaded = std::path::Path::new("/sys/module/smc").exists();
        match PnetClient::open() {
            Err(PnetError::SmcUnavailable) => {
                assert!(!smc_loaded, "smc is loaded but the family was not found");
                let t = PnetError::SmcUnavailable.to_string();
                assert!(
                    t.starts_with("SMC unavailable") && t.contains("modprobe smc"),
                    "{t}"
                );
            }
            Ok(c) => {
                assert!(c.family_id() >= GENL_ID_CTRL);
                c.list().expect("dump the pnet table");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        let report =
            ensure_ib_ports(&[(PnetId::parse("00163E0A1B2C").unwrap(), "erdma_0".into(), 1)]);
        if !smc_loaded {
            assert!(report.added.is_empty() && report.unchanged.is_empty());
            assert_eq!(report.warnings.len(), 1);
            assert!(
                report.warnings[0].starts_with("SMC unavailable"),
                "{:?}",
                report.warnings
            );
        }
    }
}
