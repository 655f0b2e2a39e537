//! Where usage comes from: the [`UsageSource`] door, its real implementation over an RDMA netlink
//! socket ([`NetlinkSource`]) and a fake built from plain values ([`FakeSource`]).
//!
//! The real source asks as iproute2's `rdma resource show` does (`rdma/res.c`, `_res_send_msg`):
//! the devices with a `RDMA_NLDEV_CMD_GET` dump, then per device a `RES_*_GET` dump keyed by
//! `RDMA_NLDEV_ATTR_DEV_INDEX`. It opens one socket per request (so a late answer to a request that
//! timed out can never be read as the next one's), sets `SO_RCVTIMEO` so a kernel that never
//! answers costs at most the timeout per receive, and bounds how much one dump may return.

use crate::nldev::{
    self, AnswerError, CqEntry, DeviceEntry, MrEntry, PdEntry, PortCounters, QpEntry,
};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Why usage could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The kernel has no RDMA netlink (`socket(AF_NETLINK, .., NETLINK_RDMA)` failed with
    /// `EPROTONOSUPPORT`): the RDMA core (`ib_core`) is not loaded, so there is no RDMA device.
    #[error("no RDMA netlink in this kernel (ib_core not loaded?): {0}")]
    Unavailable(io::Error),
    /// A socket call failed.
    #[error("{command}: netlink socket {call}: {source}")]
    Socket {
        /// The nldev command (`RDMA_NLDEV_CMD_...`).
        command: &'static str,
        /// The system call.
        call: &'static str,
        /// Its error.
        source: io::Error,
    },
    /// The kernel refused the request.
    #[error("{command}{}: the kernel answered {} (errno {errno}: {})", dev_suffix(.dev_index), errno_name(*.errno), io::Error::from_raw_os_error(*.errno))]
    Kernel {
        /// The nldev command.
        command: &'static str,
        /// The device asked about, if any.
        dev_index: Option<u32>,
        /// The errno (positive).
        errno: i32,
    },
    /// No answer within the receive timeout.
    #[error("{command}{}: no answer from the kernel within {timeout:?}", dev_suffix(.dev_index))]
    Timeout {
        /// The nldev command.
        command: &'static str,
        /// The device asked about, if any.
        dev_index: Option<u32>,
        /// The receive timeout.
        timeout: Duration,
    },
    /// The answer was malformed.
    #[error("{command}{}: malformed answer: {error}", dev_suffix(.dev_index))]
    Parse {
        /// The nldev command.
        command: &'static str,
        /// The device asked about, if any.
        dev_index: Option<u32>,
        /// What was wrong.
        error: nldev::ParseError,
    },
    /// The answer exceeded the bounds ([`MAX_ANSWER_BYTES`], [`MAX_ENTRIES`]).
    #[error("{command}{}: answer larger than {limit}", dev_suffix(.dev_index))]
    TooLarge {
        /// The nldev command.
        command: &'static str,
        /// The device asked about, if any.
        dev_index: Option<u32>,
        /// Which bound, in words.
        limit: String,
    },
    /// No device of that name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
}

fn dev_suffix(dev: &Option<u32>) -> String {
    dev.map(|d| format!(" (device index {d})"))
        .unwrap_or_default()
}

/// The symbolic name of the errnos the RDMA netlink answers with.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EAGAIN => "EAGAIN",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOBUFS => "ENOBUFS",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => "an error",
    }
}

/// The door: what usage readers ask. All entries are of every device the reader's network
/// namespace sees; PIDs are in the reader's PID namespace.
pub trait UsageSource {
    /// The RDMA devices.
    fn devices(&self) -> Result<Vec<DeviceEntry>, UsageError>;
    /// Every QP.
    fn qps(&self) -> Result<Vec<QpEntry>, UsageError>;
    /// Every MR.
    fn mrs(&self) -> Result<Vec<MrEntry>, UsageError>;
    /// Every CQ.
    fn cqs(&self) -> Result<Vec<CqEntry>, UsageError>;
    /// Every PD.
    fn pds(&self) -> Result<Vec<PdEntry>, UsageError>;
    /// One port's hardware counters.
    fn port_counters(&self, dev: &str, port: u32) -> Result<PortCounters, UsageError>;
}

/// Most bytes one dump may answer (the kernel's dump messages are at most 32 KiB each).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Most entries one dump may answer.
pub const MAX_ENTRIES: usize = 1 << 20;
/// The receive buffer; larger datagrams (which the kernel does not send) are an error.
const RECV_BUF: usize = 64 << 10;

/// The real source: RDMA netlink.
#[derive(Debug, Clone)]
pub struct NetlinkSource {
    timeout: Duration,
}

impl Default for NetlinkSource {
    fn default() -> Self {
        Self::new()
    }
}

impl NetlinkSource {
    /// Receive timeout 2 s.
    pub fn new() -> Self {
        Self::with_timeout(Duration::from_secs(2))
    }

    /// With another receive timeout (at least 1 ms).
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout: timeout.max(Duration::from_millis(1)),
        }
    }

    /// Sends `req` (command `op`, sequence `seq`) and parses datagrams until the answer ends: at
    /// `NLMSG_DONE` for a dump, at the first item for a plain request.
    fn exchange<T>(
        &self,
        op: u16,
        dev_index: Option<u32>,
        req: &[u8],
        seq: u32,
        dump: bool,
        mut parse: impl FnMut(&[u8]) -> Result<Vec<T>, nldev::ParseError>,
    ) -> Result<Vec<T>, UsageError> {
        let command = nldev::command_name(op);
        let sock = NlSocket::open(command, self.timeout)?;
        sock.send(command, req)?;
        let mut buf = vec![0u8; RECV_BUF];
        let mut out = Vec::new();
        let mut total = 0usize;
        // Bounded also in time: a kernel that keeps sending unrelated messages does not hold us.
        let deadline = Instant::now() + self.timeout.saturating_mul(4).max(Duration::from_secs(10));
        loop {
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return Err(UsageError::Timeout {
                        command,
                        dev_index,
                        timeout: self.timeout,
                    });
                }
                Err(source) => {
                    return Err(UsageError::Socket {
                        command,
                        call: "recvfrom",
                        source,
                    });
                }
            };
            if n > buf.len() {
                let limit = format!("a {n}-byte datagram (buffer {RECV_BUF})");
                return Err(UsageError::TooLarge {
                    command,
                    dev_index,
                    limit,
                });
            }
            total = total.saturating_add(n);
            if total > MAX_ANSWER_BYTES {
                let limit = format!("{MAX_ANSWER_BYTES} bytes");
                return Err(UsageError::TooLarge {
                    command,
                    dev_index,
                    limit,
                });
            }
            let part =
                nldev::parse_answer(&buf[..n], seq, op, &mut parse).map_err(|e| match e {
                    AnswerError::Parse(error) => UsageError::Parse {
                        command,
                        dev_index,
                        error,
                    },
                    AnswerError::Errno(errno) => UsageError::Kernel {
                        command,
                        dev_index,
                        errno,
                    },
                })?;
            out.extend(part.items);
            if out.len() > MAX_ENTRIES {
                let limit = format!("{MAX_ENTRIES} entries");
                return Err(UsageError::TooLarge {
                    command,
                    dev_index,
                    limit,
                });
            }
            if part.done || (!dump && !out.is_empty()) {
                return Ok(out);
            }
            if Instant::now() > deadline {
                return Err(UsageError::Timeout {
                    command,
                    dev_index,
                    timeout: self.timeout,
                });
            }
        }
    }

    fn dump<T>(
        &self,
        op: u16,
        dev_index: Option<u32>,
        parse: impl FnMut(&[u8]) -> Result<Vec<T>, nldev::ParseError>,
    ) -> Result<Vec<T>, UsageError> {
        let seq = next_seq();
        self.exchange(
            op,
            dev_index,
            &nldev::encode_dump(op, seq, dev_index),
            seq,
            true,
            parse,
        )
    }

    /// One resource dump per device, concatenated.
    fn per_device<T>(
        &self,
        op: u16,
        parse: fn(&[u8]) -> Result<Vec<T>, nldev::ParseError>,
    ) -> Result<Vec<T>, UsageError> {
        let mut out = Vec::new();
        for d in self.devices()? {
            match self.dump(op, Some(d.index), parse) {
                Ok(v) => out.extend(v),
                // The device went away between the two dumps.
                Err(UsageError::Kernel {
                    errno: libc::EINVAL | libc::ENODEV,
                    ..
                }) if !self.devices()?.iter().any(|x| x.index == d.index) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The per-device resource summary (`RDMA_NLDEV_CMD_RES_GET` dump): object counts by kind.
    pub fn summaries(&self) -> Result<Vec<nldev::ResSummary>, UsageError> {
        self.dump(nldev::cmd::RES_GET, None, |b| {
            nldev::parse_res_summary(b).map(|s| vec![s])
        })
    }
}

impl UsageSource for NetlinkSource {
    fn devices(&self) -> Result<Vec<DeviceEntry>, UsageError> {
        self.dump(nldev::cmd::GET, None, |b| {
            nldev::parse_device(b).map(|d| vec![d])
        })
    }

    fn qps(&self) -> Result<Vec<QpEntry>, UsageError> {
        self.per_device(nldev::cmd::RES_QP_GET, nldev::parse_qps)
    }

    fn mrs(&self) -> Result<Vec<MrEntry>, UsageError> {
        self.per_device(nldev::cmd::RES_MR_GET, nldev::parse_mrs)
    }

    fn cqs(&self) -> Result<Vec<CqEntry>, UsageError> {
        self.per_device(nldev::cmd::RES_CQ_GET, nldev::parse_cqs)
    }

    fn pds(&self) -> Result<Vec<PdEntry>, UsageError> {
        self.per_device(nldev::cmd::RES_PD_GET, nldev::parse_pds)
    }

    fn port_counters(&self, dev: &str, port: u32) -> Result<PortCounters, UsageError> {
        let d = self
            .devices()?
            .into_iter()
            .find(|d| d.name == dev)
            .ok_or_else(|| UsageError::NoSuchDevice(dev.to_string()))?;
        let seq = next_seq();
        let op = nldev::cmd::STAT_GET;
        let req = nldev::encode_port_stat(seq, d.index, port);
        let mut v = self.exchange(op, Some(d.index), &req, seq, false, |b| {
            nldev::parse_port_counters(b).map(|c| vec![c])
        })?;
        Ok(v.swap_remove(0))
    }
}

fn next_seq() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1);
    base.wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed))
}

/// A `NETLINK_RDMA` socket with a receive timeout.
struct NlSocket(OwnedFd);

impl NlSocket {
    fn open(command: &'static str, timeout: Duration) -> Result<Self, UsageError> {
        Self::open_protocol(command, timeout, nldev::NETLINK_RDMA)
    }

    fn open_protocol(
        command: &'static str,
        timeout: Duration,
        protocol: i32,
    ) -> Result<Self, UsageError> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) {
                return Err(UsageError::Unavailable(e));
            }
            return Err(UsageError::Socket {
                command,
                call: "socket",
                source: e,
            });
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let s = NlSocket(unsafe { OwnedFd::from_raw_fd(fd) });
        let tv = libc::timeval {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: tv outlives the call; the length is its size.
        let rc = unsafe {
            libc::setsockopt(
                s.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            let source = io::Error::last_os_error();
            return Err(UsageError::Socket {
                command,
                call: "setsockopt(SO_RCVTIMEO)",
                source,
            });
        }
        let addr = kernel_addr();
        // SAFETY: addr is a valid sockaddr_nl (pid 0: the kernel assigns ours).
        let rc = unsafe {
            libc::bind(
                s.0.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            let source = io::Error::last_os_error();
            return Err(UsageError::Socket {
                command,
                call: "bind",
                source,
            });
        }
        Ok(s)
    }

    fn send(&self, command: &'static str, req: &[u8]) -> Result<(), UsageError> {
        let addr = kernel_addr();
        // SAFETY: req and addr outlive the call.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            let source = io::Error::last_os_error();
            return Err(UsageError::Socket {
                command,
                call: "sendto",
                source,
            });
        }
        Ok(())
    }

    /// One datagram from the kernel (port 0). With `MSG_TRUNC` netlink returns the datagram's real
    /// length, so a result above `buf.len()` means it was cut.
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut skipped = 0u32;
        loop {
            // SAFETY: zeroed sockaddr_nl is a valid out-parameter.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: buf, from and len are valid for the call.
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_nl).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if from.nl_pid != 0 {
                // Not from the kernel (another process wrote to our port): skip, a bounded
                // number of times.
                skipped += 1;
                if skipped > 1024 {
                    return Err(io::Error::other(
                        "more than 1024 datagrams not from the kernel",
                    ));
                }
                continue;
            }
            return Ok(n as usize);
        }
    }
}

fn kernel_addr() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data; all-zero is valid.
    let mut a: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    a.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    a
}

/// A source built from plain values, for the tests of whatever reads usage.
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    /// Devices.
    pub devices: Vec<DeviceEntry>,
    /// QPs.
    pub qps: Vec<QpEntry>,
    /// MRs.
    pub mrs: Vec<MrEntry>,
    /// CQs.
    pub cqs: Vec<CqEntry>,
    /// PDs.
    pub pds: Vec<PdEntry>,
    /// Port counters (looked up by device name and port).
    pub port_counters: Vec<PortCounters>,
    /// When set, every call fails with this errno, as the kernel would answer it.
    pub fail_errno: Option<i32>,
}

impl FakeSource {
    fn answer<T: Clone>(&self, op: u16, v: &[T]) -> Result<Vec<T>, UsageError> {
        match self.fail_errno {
            Some(errno) => Err(UsageError::Kernel {
                command: nldev::command_name(op),
                dev_index: None,
                errno,
            }),
            None => Ok(v.to_vec()),
        }
    }
}

impl UsageSource for FakeSource {
    fn devices(&self) -> Result<Vec<DeviceEntry>, UsageError> {
        self.answer(nldev::cmd::GET, &self.devices)
    }
    fn qps(&self) -> Result<Vec<QpEntry>, UsageError> {
        self.answer(nldev::cmd::RES_QP_GET, &self.qps)
    }
    fn mrs(&self) -> Result<Vec<MrEntry>, UsageError> {
        self.answer(nldev::cmd::RES_MR_GET, &self.mrs)
    }
    fn cqs(&self) -> Result<Vec<CqEntry>, UsageError> {
        self.answer(nldev::cmd::RES_CQ_GET, &self.cqs)
    }
    fn pds(&self) -> Result<Vec<PdEntry>, UsageError> {
        self.answer(nldev::cmd::RES_PD_GET, &self.pds)
    }
    fn port_counters(&self, dev: &str, port: u32) -> Result<PortCounters, UsageError> {
        let all = self.answer(nldev::cmd::STAT_GET, &self.port_counters)?;
        all.into_iter()
            .find(|c| c.dev_name == dev && c.port == port)
            .ok_or_else(|| UsageError::Kernel {
                command: nldev::command_name(nldev::cmd::STAT_GET),
                dev_index: None,
                errno: libc::EINVAL,
            })
    }
}

/// Everything a source says at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Devices.
    pub devices: Vec<DeviceEntry>,
    /// QPs.
    pub qps: Vec<QpEntry>,
    /// MRs.
    pub mrs: Vec<MrEntry>,
    /// CQs.
    pub cqs: Vec<CqEntry>,
    /// PDs.
    pub pds: Vec<PdEntry>,
    /// Counters of every port that has them.
    pub port_counters: Vec<PortCounters>,
    /// `device/port` of the ports without hardware counters (the kernel answered `EINVAL` or
    /// `EOPNOTSUPP`: the driver has no `alloc_hw_port_stats`).
    pub ports_without_counters: Vec<String>,
}

impl Snapshot {
    /// Reads everything. A port without counters is noted, any other error ends it.
    pub fn read(src: &dyn UsageSource) -> Result<Self, UsageError> {
        let devices = src.devices()?;
        let mut s = Snapshot {
            qps: src.qps()?,
            mrs: src.mrs()?,
            cqs: src.cqs()?,
            pds: src.pds()?,
            ..Default::default()
        };
        for d in &devices {
            for port in 1..=d.ports.min(64) {
                match src.port_counters(&d.name, port) {
                    Ok(c) => s.port_counters.push(c),
                    Err(UsageError::Kernel {
                        errno: libc::EINVAL | libc::EOPNOTSUPP,
                        ..
                    }) => s.ports_without_counters.push(format!("{}/{port}", d.name)),
                    Err(e) => return Err(e),
                }
            }
        }
        s.devices = devices;
        Ok(s)
    }

    /// The PIDs that own something (for the `/proc/<pid>/cgroup` lookups).
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        use crate::nldev::Resource;
        let mut out = std::collections::BTreeSet::new();
        out.extend(self.qps.iter().filter_map(|e| e.pid()));
        out.extend(self.mrs.iter().filter_map(|e| e.pid()));
        out.extend(self.cqs.iter().filter_map(|e| e.pid()));
        out.extend(self.pds.iter().filter_map(|e| e.pid()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nldev::{QpState, QpType};

    fn dev(index: u32, name: &str) -> DeviceEntry {
        DeviceEntry {
            index,
            name: name.into(),
            ports: 1,
        }
    }

    #[test]
    fn the_fake_answers_its_values_and_its_errors() {
        let mut f = FakeSource {
            devices: vec![
                dev(0, "rxe0"),
                DeviceEntry {
                    index: 1,
                    name: "siw0".into(),
                    ports: 1,
                },
            ],
            qps: vec![QpEntry {
                dev_index: 0,
                dev_name: "rxe0".into(),
                port: Some(1),
                lqpn: 17,
                state: QpState::Rts,
                qp_type: QpType::Rc,
                pid: Some(10),
                kern_name: None,
            }],
            port_counters: vec![PortCounters {
                dev_index: 0,
                dev_name: "rxe0".into(),
                port: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = Snapshot::read(&f).unwrap();
        assert_eq!(s.qps.len(), 1);
        assert_eq!(s.port_counters.len(), 1);
        assert_eq!(s.ports_without_counters, vec!["siw0/1".to_string()]);
        assert_eq!(s.pids().into_iter().collect::<Vec<_>>(), vec![10]);
        f.fail_errno = Some(libc::EPERM);
        let e = Snapshot::read(&f).unwrap_err().to_string();
        assert!(
            e.contains("RDMA_NLDEV_CMD_GET") && e.contains("EPERM") && e.contains("errno 1"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_command_the_device_and_the_errno() {
        let e = UsageError::Kernel {
            command: "RDMA_NLDEV_CMD_RES_QP_GET",
            dev_index: Some(3),
            errno: libc::EINVAL,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "RDMA_NLDEV_CMD_RES_QP_GET (device index 3): the kernel answered EINVAL (errno 22: {})",
                io::Error::from_raw_os_error(22)
            )
        );
        let t = UsageError::Timeout {
            command: "RDMA_NLDEV_CMD_GET",
            dev_index: None,
            timeout: Duration::from_millis(5),
        };
        assert_eq!(
            t.to_string(),
            "RDMA_NLDEV_CMD_GET: no answer from the kernel within 5ms"
        );
    }

    /// The receive timeout is set: a socket nobody answers returns `WouldBlock` after it (on
    /// `NETLINK_ROUTE`, which every Linux has; nothing is sent, so nothing comes).
    #[test]
    fn a_silent_kernel_costs_the_timeout_only() {
        let s = NlSocket::open_protocol("test", Duration::from_millis(100), libc::NETLINK_ROUTE)
            .unwrap();
        let t = Instant::now();
        let e = s.recv(&mut [0u8; 64]).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(80) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }

    /// On any host: either RDMA netlink answers a device list, or the error says why there is none.
    #[test]
    fn the_real_source_answers_or_says_why_not() {
        match NetlinkSource::with_timeout(Duration::from_secs(2)).devices() {
            Ok(devs) => {
                for d in devs {
                    assert!(!d.name.is_empty());
                }
            }
            Err(UsageError::Unavailable(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPROTONOSUPPORT))
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
}
