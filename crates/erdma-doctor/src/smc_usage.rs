//! `pod.smcr.connections`: is a pod that asks for SMC-R on SMC-R? The node agent's `/usage`
//! carries, for such a pod, its SMC sockets by mode as `smc_diag` reports them in the pod's
//! network namespace (what `erdmactl smc status --netns` shows on the node), and the kernel's
//! `smc` queue pairs on each RDMA device (the link groups' RDMA usage).

use crate::check::Check;
use erdma_model::names::SMCR_ANNOTATION;
use std::collections::BTreeMap;

/// The check's id.
pub const ID: &str = "pod.smcr.connections";

/// One reason connections fell back to TCP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reason {
    /// `NAME` or `NAME (peer: PEER)`.
    pub label: String,
    /// The reason's name (`PEERNOSMC`).
    pub name: String,
    /// The peer's reason, when it sent one.
    pub peer: Option<String>,
    /// What it means.
    pub meaning: String,
    /// Connections that fell back for it.
    pub connections: u64,
}

/// What the agent reports of a pod's SMC sockets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmcView {
    /// Why the agent could not read them.
    pub error: Option<String>,
    /// Connections on SMC-R.
    pub smcr: u64,
    /// Connections on SMC-D.
    pub smcd: u64,
    /// Connections that fell back to TCP.
    pub fallback_tcp: u64,
    /// Listening sockets.
    pub listening: u64,
    /// Why connections fell back, most first.
    pub reasons: Vec<Reason>,
    /// RDMA devices of the SMC-R links.
    pub devices: Vec<String>,
    /// Per device of the links: the kernel's `smc` queue pairs by state.
    pub link_groups: BTreeMap<String, BTreeMap<String, u64>>,
}

/// What the agent answered for the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The agent does not list the pod.
    NotListed,
    /// It lists the pod without an SMC summary (an agent older than the summary, or one that
    /// has not looked the pod's sandbox up yet).
    NoSummary,
    /// The summary.
    Summary(SmcView),
}

/// What the check judges.
#[derive(Debug, Clone)]
pub struct Evidence<'a> {
    /// `namespace/name`.
    pub pod: &'a str,
    /// The pod's node.
    pub node: &'a str,
    /// The agent's answer, or why it could not be read.
    pub usage: Result<Answer, String>,
}

/// The fix for connections that fell back for `r`.
pub fn hint_for(r: &Reason) -> String {
    let peer_hint = |p: &str| match p {
        "TIMEOUT_CL" | "TIMEOUT_AL" => Some(
            "the RDMA link between the two nodes did not come up: check that both eRDMA devices are healthy (erdmactl doctor --node) and that the security groups let the nodes' RDMA traffic through",
        ),
        "NOSMCRDEV" | "NOSMCDEV" => Some(
            "the peer found no SMC-R device for the route: check the peer pod's pnet entry (erdmactl smc pnet --netns on its node) and that it holds aliyun/erdma",
        ),
        _ => None,
    };
    let h = match r.name.as_str() {
        "PEERNOSMC" => format!("the peer did not offer SMC: annotate the peer pod with {SMCR_ANNOTATION}: \"true\" (doctor --peer checks it), or run the peer's program under SMC (smc_run); a middlebox that strips TCP options also causes this"),
        "NOSMCRDEV" | "NOSMCDEV" => "no SMC-R device for the connection's route: the pod's pnet table has no entry mapping its interface to the eRDMA device (erdmactl smc pnet --netns /proc/<pid>/ns/net on the node; the agent writes it when the pod starts: see its SMC-R Event), or the node's driver mode (ofed) has no SMC-R".into(),
        "DIFFPREFIX" => "SMC-Rv1 needs both ends in the same IP subnet: put the pods in one vSwitch subnet or use SMC-Rv2 (kernel 5.10+ on both ends)".into(),
        "TIMEOUT_CL" | "TIMEOUT_AL" => peer_hint("TIMEOUT_CL").unwrap_or_default().to_string(),
        "PEERDECL" => match r.peer.as_deref().and_then(peer_hint) {
            Some(h) => h.to_string(),
            None => format!("the peer declined ({}): run erdmactl smc status on the peer's node for its side", r.meaning),
        },
        "IPSEC" | "OPTUNSUPP" => format!("{}: SMC cannot carry such connections; they stay on TCP", r.meaning),
        _ => format!("{} (erdmactl smc status --netns /proc/<pid>/ns/net on the node lists each connection)", r.meaning),
    };
    format!("{}: {h}", r.label)
}

fn reasons_text(v: &SmcView) -> String {
    v.reasons
        .iter()
        .map(|r| format!("{} ×{}", r.label, r.connections))
        .collect::<Vec<_>>()
        .join(", ")
}

fn link_groups_text(v: &SmcView) -> String {
    let per: Vec<String> = v
        .devices
        .iter()
        .map(|d| match v.link_groups.get(d) {
            Some(states) if !states.is_empty() => {
                let n: u64 = states.values().sum();
                let by: Vec<String> = states.iter().map(|(s, k)| format!("{k} {s}")).collect();
                format!("{d}: {n} smc QPs ({})", by.join(", "))
            }
            _ => format!("{d}: no smc QP seen"),
        })
        .collect();
    format!("link group RDMA usage {}", per.join("; "))
}

/// `pod.smcr.connections`, for a pod that asks for SMC-R.
pub fn check(e: &Evidence<'_>) -> Check {
    let (pod, node) = (e.pod, e.node);
    let v = match &e.usage {
        Err(reason) => {
            return Check::warn(
                ID,
                format!(
                    "cannot read the SMC connections of {pod} from the agent on node {node}: {reason}"
                ),
                "the agent serves /usage on its metrics port (erdma-agent with usage collection on); doctor reads it through the API server's pod proxy: allow get on pods/proxy to your user. On the node, erdmactl smc status --netns /proc/<pid>/ns/net shows the connections",
            );
        }
        Ok(Answer::NotListed) => {
            return Check::warn(
                ID,
                format!(
                    "the agent on node {node} does not list {pod}, so it reports no SMC connections of it"
                ),
                "the agent lists pods that hold an eRDMA device: check pod.resources above, and that the agent runs with usage collection on",
            );
        }
        Ok(Answer::NoSummary) => {
            return Check::warn(
                ID,
                format!("the agent on node {node} reports no SMC connections of {pod}"),
                "an agent older than this erdmactl does not report them: upgrade the agent; a new agent looks a pod up within a few seconds of its start: check again. On the node, erdmactl smc status --netns /proc/<pid>/ns/net shows them",
            );
        }
        Ok(Answer::Summary(v)) => v,
    };
    if let Some(err) = &v.error {
        return Check::warn(
            ID,
            format!("the agent on node {node} could not read the SMC sockets of {pod}: {err}"),
            "SMC-R needs the smc and smc_diag modules on the node (erdmactl doctor --node) and the agent's access to the pod's network namespace (hostPID, CAP_SYS_ADMIN)",
        );
    }
    let conns = v.smcr + v.smcd + v.fallback_tcp;
    if conns == 0 {
        return Check::info(
            ID,
            format!(
                "{pod} has no SMC connection yet ({} listening SMC socket(s))",
                v.listening
            ),
            "SMC-R applies to TCP connections the pod opens after it started with SMC-R on: check again while it talks to its peer",
        );
    }
    let fell = if v.fallback_tcp == 0 {
        "none fell back to TCP".to_string()
    } else {
        format!(
            "{} fell back to TCP (reason: {})",
            v.fallback_tcp,
            reasons_text(v)
        )
    };
    if v.smcr + v.smcd == 0 {
        return Check::warn(
            ID,
            format!(
                "{pod}: all {conns} SMC connections fell back to TCP (reason: {})",
                reasons_text(v)
            ),
            v.reasons
                .iter()
                .map(hint_for)
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    let over = if v.devices.is_empty() {
        "an RDMA device".to_string()
    } else {
        v.devices.join(", ")
    };
    let smcd = if v.smcd > 0 {
        format!(" and {} on SMC-D", v.smcd)
    } else {
        String::new()
    };
    Check::pass(
        ID,
        format!(
            "{pod}: {} connections on SMC-R over {over}{smcd}, {fell}; {}",
            v.smcr,
            link_groups_text(v)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    fn reason(name: &str, peer: Option<&str>, meaning: &str, n: u64) -> Reason {
        Reason {
            label: match peer {
                Some(p) => format!("{name} (peer: {p})"),
                None => name.into(),
            },
            name: name.into(),
            peer: peer.map(Into::into),
            meaning: meaning.into(),
            connections: n,
        }
    }

    fn verdict(usage: Result<Answer, String>) -> Check {
        check(&Evidence {
            pod: "ml/web-0",
            node: "node-a",
            usage,
        })
    }

    fn lg(dev: &str, states: &[(&str, u64)]) -> BTreeMap<String, BTreeMap<String, u64>> {
        [(
            dev.to_string(),
            states.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
        )]
        .into_iter()
        .collect()
    }

    /// Each row: the agent's answer, the status, the message and (for warnings) a part of the
    /// hint, all written out by hand.
    #[test]
    fn verdicts_from_the_agents_answer() {
        let rows: Vec<(Result<Answer, String>, Status, &str, &str)> = vec![
            (
                Ok(Answer::Summary(SmcView {
                    smcr: 3,
                    fallback_tcp: 1,
                    listening: 1,
                    reasons: vec![reason("PEERNOSMC", None, "peer did not offer SMC", 1)],
                    devices: vec!["erdma_0".into()],
                    link_groups: lg("erdma_0", &[("RTS", 2)]),
                    ..Default::default()
                })),
                Status::Pass,
                "ml/web-0: 3 connections on SMC-R over erdma_0, 1 fell back to TCP (reason: PEERNOSMC ×1); link group RDMA usage erdma_0: 2 smc QPs (2 RTS)",
                "",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    smcr: 2,
                    devices: vec!["erdma_0".into(), "erdma_1".into()],
                    link_groups: lg("erdma_0", &[("RTS", 1), ("ERR", 1)]),
                    ..Default::default()
                })),
                Status::Pass,
                "ml/web-0: 2 connections on SMC-R over erdma_0, erdma_1, none fell back to TCP; link group RDMA usage erdma_0: 2 smc QPs (1 ERR, 1 RTS); erdma_1: no smc QP seen",
                "",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    fallback_tcp: 3,
                    reasons: vec![
                        reason("NOSMCRDEV", None, "no SMC-R device", 2),
                        reason("PEERNOSMC", None, "peer did not offer SMC", 1),
                    ],
                    ..Default::default()
                })),
                Status::Warn,
                "ml/web-0: all 3 SMC connections fell back to TCP (reason: NOSMCRDEV ×2, PEERNOSMC ×1)",
                "NOSMCRDEV: no SMC-R device for the connection's route: the pod's pnet table",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    fallback_tcp: 1,
                    reasons: vec![reason("PEERDECL", Some("TIMEOUT_CL"), "peer declined", 1)],
                    ..Default::default()
                })),
                Status::Warn,
                "ml/web-0: all 1 SMC connections fell back to TCP (reason: PEERDECL (peer: TIMEOUT_CL) ×1)",
                "PEERDECL (peer: TIMEOUT_CL): the RDMA link between the two nodes did not come up",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    fallback_tcp: 1,
                    reasons: vec![reason("PEERNOSMC", None, "peer did not offer SMC", 1)],
                    ..Default::default()
                })),
                Status::Warn,
                "ml/web-0: all 1 SMC connections fell back to TCP (reason: PEERNOSMC ×1)",
                "PEERNOSMC: the peer did not offer SMC: annotate the peer pod with network.alibabacloud.com/erdma-smcr: \"true\"",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    listening: 2,
                    ..Default::default()
                })),
                Status::Info,
                "ml/web-0 has no SMC connection yet (2 listening SMC socket(s))",
                "check again while it talks to its peer",
            ),
            (
                Ok(Answer::Summary(SmcView {
                    error: Some("SMC unsupported: the kernel has no smc_diag handler".into()),
                    ..Default::default()
                })),
                Status::Warn,
                "the agent on node node-a could not read the SMC sockets of ml/web-0: SMC unsupported: the kernel has no smc_diag handler",
                "smc_diag modules",
            ),
            (
                Ok(Answer::NoSummary),
                Status::Warn,
                "the agent on node node-a reports no SMC connections of ml/web-0",
                "upgrade the agent",
            ),
            (
                Ok(Answer::NotListed),
                Status::Warn,
                "the agent on node node-a does not list ml/web-0, so it reports no SMC connections of it",
                "pod.resources",
            ),
            (
                Err("connection refused".into()),
                Status::Warn,
                "cannot read the SMC connections of ml/web-0 from the agent on node node-a: connection refused",
                "pods/proxy",
            ),
        ];
        for (usage, status, message, hint) in rows {
            let c = verdict(usage);
            assert_eq!(c.id, ID);
            assert_eq!((c.status, c.message.as_str()), (status, message), "{c:?}");
            if !hint.is_empty() {
                assert!(c.hint.as_deref().unwrap_or("").contains(hint), "{c:?}");
            } else {
                assert_eq!(c.hint, None);
            }
        }
    }
}
