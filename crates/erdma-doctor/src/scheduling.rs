//! Parsing the scheduler's `FailedScheduling` message
//! (`0/3 nodes are available: 1 Insufficient aliyun/erdma, 2 node(s) had untolerated taint {…}.
//! preemption: …`) into counted reasons.

use serde::Serialize;

/// What kept a group of nodes from fitting the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Reason {
    /// `Insufficient <resource>` (aliyun/erdma, nvidia.com/gpu, cpu, memory, …).
    Insufficient(String),
    /// `node(s) didn't match Pod's node affinity/selector`.
    Selector,
    /// A taint the pod does not tolerate (`{key: value}` as printed).
    Taint(String),
    /// `node(s) were unschedulable` (cordoned).
    Unschedulable,
    /// Unbound PersistentVolumeClaims.
    Volume(String),
    /// Anything else, verbatim.
    Other(String),
}

/// One reason and how many nodes it applies to (`None` when the scheduler gave no count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counted {
    /// Number of nodes.
    pub nodes: Option<u32>,
    /// The reason.
    pub reason: Reason,
}

/// The parsed message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unschedulable {
    /// Total nodes considered (`0/N`), when given.
    pub total: Option<u32>,
    /// The reasons.
    pub reasons: Vec<Counted>,
}

fn classify(text: &str) -> Reason {
    let t = text.trim().trim_end_matches('.');
    if let Some(r) = t.strip_prefix("Insufficient ") {
        return Reason::Insufficient(r.trim().to_string());
    }
    if t.contains("didn't match Pod's node affinity/selector")
        || t.contains("didn't match node selector")
    {
        return Reason::Selector;
    }
    if let Some(start) = t.find('{')
        && (t.contains("taint") || t.contains("didn't tolerate"))
    {
        let end = t[start..]
            .find('}')
            .map(|e| start + e + 1)
            .unwrap_or(t.len());
        return Reason::Taint(t[start..end].to_string());
    }
    if t.contains("were unschedulable") {
        return Reason::Unschedulable;
    }
    if t.contains("PersistentVolumeClaim") || t.contains("volume node affinity") {
        return Reason::Volume(t.to_string());
    }
    Reason::Other(t.to_string())
}

/// Parses a scheduler message; `None` when it is not a `nodes are available` message.
pub fn parse(message: &str) -> Option<Unschedulable> {
    let idx = message.find("nodes are available:")?;
    let head = message[..idx].trim();
    let total = head
        .split_once('/')
        .and_then(|(_, n)| n.trim().parse().ok());
    let mut body = &message[idx + "nodes are available:".len()..];
    if let Some(p) = body.find(" preemption:") {
        body = &body[..p];
    }
    let body = body.trim().trim_end_matches('.');
    // Items are ", "-separated and start with a count; older taint texts contain ", that the pod
    // didn't tolerate", so a piece that does not start with a digit continues the previous item.
    let mut items: Vec<String> = Vec::new();
    for piece in body.split(", ") {
        let starts_with_count = piece
            .split_once(' ')
            .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
        match items.last_mut() {
            Some(last) if !starts_with_count => {
                last.push_str(", ");
                last.push_str(piece);
            }
            _ => items.push(piece.to_string()),
        }
    }
    let reasons = items
        .iter()
        .filter(|i| !i.trim().is_empty())
        .map(|item| {
            let (nodes, rest) = match item.split_once(' ') {
                Some((n, rest)) if n.parse::<u32>().is_ok() => (n.parse().ok(), rest),
                _ => (None, item.as_str()),
            };
            Counted {
                nodes,
                reason: classify(rest),
            }
        })
        .collect();
    Some(Unschedulable { total, reasons })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn current_scheduler_wording() {
        let m = "0/4 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient aliyun/erdma. preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.";
        let u = parse(m).unwrap();
        assert_eq!(u.total, Some(4));
        assert_eq!(
            u.reasons,
            vec![
                Counted {
                    nodes: Some(1),
                    reason: Reason::Taint("{node-role.kubernetes.io/control-plane: }".into())
                },
                Counted {
                    nodes: Some(1),
                    reason: Reason::Selector
                },
                Counted {
                    nodes: Some(2),
                    reason: Reason::Insufficient("aliyun/erdma".into())
                },
            ]
        );
    }

    #[test]
    fn older_wording_and_pvc() {
        let m = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had taint {gpu: true}, that the pod didn't tolerate.";
        let u = parse(m).unwrap();
        assert_eq!(u.reasons[1].reason, Reason::Taint("{gpu: true}".into()));
        assert_eq!(u.reasons.len(), 2);
        let u = parse("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.").unwrap();
        assert_eq!(u.reasons.len(), 1);
        assert!(matches!(u.reasons[0].reason, Reason::Volume(_)));
        assert_eq!(u.reasons[0].nodes, None);
        assert!(parse("Back-off pulling image").is_none());
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = parse(&s);
            let _ = parse(&format!("0/3 nodes are available: {s}"));
        }
    }
}
