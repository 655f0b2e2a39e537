//! The SMC part of a pod's usage: its SMC sockets read with `smc_diag` inside its network
//! namespace (what `erdmactl smc status --netns` shows), summed up as
//! [`erdma_usage::report::SmcSummary`].
//!
//! Test hook: `ERDMA_AGENT_FAKE_SMC` names a file describing the sockets per namespace
//! ([`parse_fake`]) used instead of `smc_diag`.

use erdma_smc::decline;
use erdma_smc::diag::{self, DiagError, Fallback, Link, Mode, SmcSocket};
use erdma_smc::netns::NetnsError;
use erdma_usage::report::{SmcFallbackReason, SmcSummary};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The environment variable naming a fake `smc_diag` answer (tests).
pub const FAKE_SMC_ENV: &str = "ERDMA_AGENT_FAKE_SMC";

/// Why a namespace's SMC sockets could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The namespace is gone: the pod's sandbox was removed or recreated.
    Gone(String),
    /// Anything else (no SMC in the kernel, no permission, a malformed answer).
    Failed(String),
}

impl ReadError {
    /// The text the report carries.
    pub fn message(&self) -> &str {
        match self {
            ReadError::Gone(m) | ReadError::Failed(m) => m,
        }
    }
}

/// Reads the SMC sockets of a network namespace.
pub trait SmcReader: Send + Sync {
    /// The SMC sockets of the namespace at `netns` (a path such as `/var/run/netns/cni-…` or
    /// `/proc/<pid>/ns/net`). Blocking.
    fn sockets(&self, netns: &Path) -> Result<Vec<SmcSocket>, ReadError>;
}

/// `smc_diag` in the namespace, on a thread that joins it ([`erdma_smc::netns::run_in`]).
pub struct Diag;

impl SmcReader for Diag {
    fn sockets(&self, netns: &Path) -> Result<Vec<SmcSocket>, ReadError> {
        match erdma_smc::netns::run_in(netns, diag::dump) {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(ReadError::Failed(e.to_string())),
            Err(NetnsError::Gone { path }) => Err(ReadError::Gone(format!(
                "the pod's network namespace {} is gone (its sandbox was removed or recreated)",
                path.display()
            ))),
            Err(e) => Err(ReadError::Failed(e.to_string())),
        }
    }
}

/// The reader for this process: the fake of `ERDMA_AGENT_FAKE_SMC` when set, else [`Diag`].
pub fn from_env() -> std::sync::Arc<dyn SmcReader> {
    match std::env::var_os(FAKE_SMC_ENV) {
        Some(p) => std::sync::Arc::new(FakeFile(p.into())),
        None => std::sync::Arc::new(Diag),
    }
}

/// The summary of `sockets`: connections by mode (listening sockets apart, as
/// `erdmactl smc status` counts them), the fallback reasons, the RDMA devices of the SMC-R links.
pub fn summarise(sockets: &[SmcSocket]) -> SmcSummary {
    let mut s = SmcSummary::default();
    let mut reasons: BTreeMap<(u32, Option<u32>), SmcFallbackReason> = BTreeMap::new();
    let mut devices = BTreeSet::new();
    for k in sockets {
        if k.state == "LISTEN" {
            s.listening += 1;
            continue;
        }
        match k.mode {
            Mode::Smcr => {
                s.smcr += 1;
                if let Some(l) = &k.link
                    && !l.ibdev.is_empty()
                {
                    devices.insert(l.ibdev.clone());
                }
            }
            Mode::Smcd => s.smcd += 1,
            Mode::FallbackTcp => {
                s.fallback_tcp += 1;
                let (key, reason) = match &k.fallback {
                    Some(f) => (
                        (f.reason.code, f.peer_diagnosis.as_ref().map(|p| p.code)),
                        SmcFallbackReason {
                            code: f.reason.hex(),
                            name: f.reason.name.to_string(),
                            peer: f.peer_diagnosis.as_ref().map(|p| p.name.to_string()),
                            meaning: match &f.peer_diagnosis {
                                Some(p) => format!("{}; peer: {}", f.reason.meaning, p.meaning),
                                None => f.reason.meaning.clone(),
                            },
                            connections: 0,
                        },
                    ),
                    None => (
                        (0, None),
                        SmcFallbackReason {
                            code: "0x00000000".into(),
                            name: "UNKNOWN".into(),
                            peer: None,
                            meaning: "the kernel reported no reason".into(),
                            connections: 0,
                        },
                    ),
                };
                reasons.entry(key).or_insert(reason).connections += 1;
            }
            Mode::Unknown(_) => {}
        }
    }
    let mut reasons: Vec<SmcFallbackReason> = reasons.into_values().collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.connections));
    s.fallback_reasons = reasons;
    s.devices = devices.into_iter().collect();
    s
}

/// A fake `smc_diag` answer, read again at each call (tests: `ERDMA_AGENT_FAKE_SMC`).
struct FakeFile(PathBuf);

impl SmcReader for FakeFile {
    fn sockets(&self, netns: &Path) -> Result<Vec<SmcSocket>, ReadError> {
        parse_fake(&std::fs::read_to_string(&self.0).unwrap_or_default(), netns)
    }
}

/// The sockets of namespace `netns` in a fake answer, one socket a line (blank lines and `#`
/// comments skipped):
///
/// ```text
/// <netns> <state: ACTIVE|LISTEN|CLOSED|…> SMCR [<rdma device>]
/// <netns> <state> SMCD
/// <netns> <state> TCP [<reason, hex>[/<peer's reason, hex>]]
/// <netns> unsupported          # the kernel has no smc_diag
/// <netns> gone                 # the namespace is gone
/// ```
///
/// Lines that do not parse are skipped; a namespace the text does not name has no socket.
pub fn parse_fake(text: &str, netns: &Path) -> Result<Vec<SmcSocket>, ReadError> {
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first()
            .is_none_or(|p| p.starts_with('#') || Path::new(p) != netns)
        {
            continue;
        }
        let socket = |state: &str, mode: Mode| SmcSocket {
            family: diag::AF_SMC,
            state: state.to_string(),
            state_code: 0,
            mode,
            local: "0.0.0.0:0".into(),
            peer: "0.0.0.0:0".into(),
            ifindex: 0,
            uid: 0,
            inode: 0,
            shutdown: 0,
            fallback: None,
            link: None,
            conn: None,
        };
        match &w[1..] {
            ["unsupported"] => return Err(ReadError::Failed(DiagError::Unsupported.to_string())),
            ["gone"] => {
                return Err(ReadError::Gone(format!(
                    "the pod's network namespace {} is gone",
                    netns.display()
                )));
            }
            [state, "SMCR", rest @ ..] => {
                let mut s = socket(state, Mode::Smcr);
                s.link = rest.first().map(|d| Link {
                    link_id: 1,
                    ibdev: d.to_string(),
                    ibport: 1,
                    gid: String::new(),
                    peer_gid: String::new(),
                    role: "CLIENT",
                });
                out.push(s);
            }
            [state, "SMCD"] => out.push(socket(state, Mode::Smcd)),
            [state, "TCP", rest @ ..] => {
                let mut s = socket(state, Mode::FallbackTcp);
                if let Some(r) = rest.first() {
                    let (ours, peer) = match r.split_once('/') {
                        Some((a, b)) => (hex(a), hex(b)),
                        None => (hex(r), None),
                    };
                    s.fallback = ours.map(|c| Fallback {
                        reason: decline::decode(c),
                        peer_diagnosis: peer.map(decline::decode),
                    });
                }
                out.push(s);
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "/proc/4242/ns/net";

    fn sockets(text: &str) -> Vec<SmcSocket> {
        parse_fake(text, Path::new(NS)).unwrap()
    }

    /// Each row: the namespace's sockets (fake `smc_diag` lines) and the summary expected.
    #[test]
    fn summaries_of_decoded_sockets() {
        let rows: &[(&str, SmcSummary)] = &[
            ("", SmcSummary::default()),
            (
                "LISTEN SMCR\nACTIVE SMCR erdma_1\nACTIVE SMCR erdma_0\nACTIVE SMCR erdma_0",
                SmcSummary {
                    smcr: 3,
                    listening: 1,
                    devices: vec!["erdma_0".into(), "erdma_1".into()],
                    ..Default::default()
                },
            ),
            (
                "ACTIVE SMCR erdma_0\nACTIVE TCP 0x03010000\nACTIVE TCP 0x03010000\n\
                 CLOSED TCP 0x05030000/0x02010000\nACTIVE SMCD\nACTIVE TCP",
                SmcSummary {
                    smcr: 1,
                    smcd: 1,
                    fallback_tcp: 4,
                    devices: vec!["erdma_0".into()],
                    fallback_reasons: vec![
                        SmcFallbackReason {
                            code: "0x03010000".into(),
                            name: "PEERNOSMC".into(),
                            peer: None,
                            meaning: "peer did not offer SMC: enable SMC on the peer, or a middlebox stripped/replayed TCP options".into(),
                            connections: 2,
                        },
                        SmcFallbackReason {
                            code: "0x00000000".into(),
                            name: "UNKNOWN".into(),
                            peer: None,
                            meaning: "the kernel reported no reason".into(),
                            connections: 1,
                        },
                        SmcFallbackReason {
                            code: "0x05030000".into(),
                            name: "PEERDECL".into(),
                            peer: Some("TIMEOUT_CL".into()),
                            meaning: "peer declined (code 0x05030000 not in this table); peer: timed out waiting for the confirm-link (RDMA link did not come up)".into(),
                            connections: 1,
                        },
                    ],
                    ..Default::default()
                },
            ),
        ];
        for (text, want) in rows {
            let text: String = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| format!("{NS} {}\n", l.trim()))
                .collect();
            assert_eq!(&summarise(&sockets(&text)), want, "{text}");
        }
    }

    #[test]
    fn other_namespaces_and_errors() {
        let text = format!(
            "/proc/1/ns/net ACTIVE SMCR erdma_0\n# a comment\n{NS} ACTIVE\n{NS} ACTIVE TCP 0x03030002\n"
        );
        let s = summarise(&sockets(&text));
        assert_eq!((s.smcr, s.fallback_tcp), (0, 1));
        assert_eq!(s.fallback_reasons[0].name, "NOSMCRDEV");
        assert!(s.fallback_reasons[0].meaning.contains("pnet"));
        let e = parse_fake(&format!("{NS} unsupported\n"), Path::new(NS)).unwrap_err();
        assert!(e.message().starts_with("SMC unsupported"), "{e:?}");
        assert!(matches!(
            parse_fake(&format!("{NS} gone\n"), Path::new(NS)),
            Err(ReadError::Gone(_))
        ));
    }

    /// The real `smc_diag` in a namespace of its own: no socket, or no SMC in this kernel named
    /// with its fix; never a panic.
    #[test]
    #[ignore = "needs root and the smc module"]
    fn real_kernel_a_fresh_namespace_has_no_smc_socket() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, parked) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let tid = nix::unistd::gettid();
            tx.send(PathBuf::from(format!("/proc/self/task/{tid}/ns/net")))
                .expect("send");
            let _ = parked.recv();
        });
        let ns = rx.recv().expect("the namespace");
        let r = Diag.sockets(&ns);
        drop(stop);
        // Both outcomes are the kernel's: with SMC (the lab's 6.12, where erdma-smc's diag and
        // netns tests also run), no socket; without it (7.3, most CI hosts), the absence named
        // with its fix. Anything else (a panic, another error, a socket) fails.
        match r {
            Ok(s) => assert_eq!(summarise(&s), SmcSummary::default()),
            Err(ReadError::Failed(m)) if m.starts_with("SMC unsupported") => {
                assert!(m.contains("modprobe smc smc_diag"), "{m}")
            }
            Err(e) => panic!("{}", e.message()),
        }
        let gone = Diag.sockets(Path::new("/proc/self/task/999999999/ns/net"));
        assert!(matches!(gone, Err(ReadError::Gone(_))), "{gone:?}");
    }
}
