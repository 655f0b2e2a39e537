//! The pod annotation that turns SMC-R on: `network.alibabacloud.com/erdma-smcr: "true"`.

use serde::Serialize;
use std::collections::BTreeMap;

pub use erdma_model::names::SMCR_ANNOTATION;
/// The Docker-label spelling the original also read (`annotation.` prefix).
pub const SMCR_DOCKER_LABEL: &str = "annotation.network.alibabacloud.com/erdma-smcr";

/// What a pod asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "request", content = "value", rename_all = "snake_case")]
pub enum SmcRequest {
    /// No annotation.
    Absent,
    /// `"true"`.
    Enabled,
    /// `"false"`.
    Disabled,
    /// Anything else: reported, and treated as `false`.
    Invalid(String),
}

impl SmcRequest {
    /// Parses an annotation value with the one rule every erdma component uses
    /// ([`erdma_model::names::parse_smcr`]: Go's `strconv.ParseBool`, as the original agent);
    /// anything else is [`SmcRequest::Invalid`].
    pub fn parse(value: &str) -> SmcRequest {
        match erdma_model::names::parse_smcr(value) {
            Ok(true) => SmcRequest::Enabled,
            Ok(false) => SmcRequest::Disabled,
            Err(_) => SmcRequest::Invalid(value.to_string()),
        }
    }

    /// Reads the request from a pod's annotations (or the runtime's labels).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> SmcRequest {
        annotations
            .get(SMCR_ANNOTATION)
            .or_else(|| annotations.get(SMCR_DOCKER_LABEL))
            .map_or(SmcRequest::Absent, |v| SmcRequest::parse(v))
    }

    /// Whether SMC-R must be configured.
    pub fn enabled(&self) -> bool {
        matches!(self, SmcRequest::Enabled)
    }

    /// The problem to report (as an Event / log line) for an invalid value, naming the pod.
    pub fn problem(&self, pod: &str) -> Option<String> {
        match self {
            SmcRequest::Invalid(v) => Some(format!(
                "pod {pod}: annotation {SMCR_ANNOTATION}={v:?} is not a boolean; SMC-R stays off for this pod. Fix: set it to \"true\" or remove it (accepted: {})",
                erdma_model::names::SMCR_VALUES
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(SmcRequest::parse("true"), SmcRequest::Enabled);
        assert_eq!(SmcRequest::parse(" TRUE "), SmcRequest::Enabled);
        assert_eq!(SmcRequest::parse("false"), SmcRequest::Disabled);
        assert_eq!(SmcRequest::parse("False"), SmcRequest::Disabled);
        // Go's strconv.ParseBool spellings, as the original agent and the webhook read them.
        assert_eq!(SmcRequest::parse("1"), SmcRequest::Enabled);
        assert_eq!(SmcRequest::parse("t"), SmcRequest::Enabled);
        assert_eq!(SmcRequest::parse("0"), SmcRequest::Disabled);
        for bad in ["", "yes", "tRUE", "on", "true!", "tru e"] {
            let r = SmcRequest::parse(bad);
            assert_eq!(r, SmcRequest::Invalid(bad.to_string()));
            assert!(!r.enabled());
            let p = r.problem("default/web-0").unwrap();
            assert!(
                p.contains("default/web-0") && p.contains(&format!("{bad:?}")) && p.contains("Fix"),
                "{p}"
            );
        }
        assert!(SmcRequest::Enabled.problem("x").is_none());
    }

    #[test]
    fn from_annotations() {
        let mut a = BTreeMap::new();
        assert_eq!(SmcRequest::from_annotations(&a), SmcRequest::Absent);
        a.insert(SMCR_DOCKER_LABEL.to_string(), "true".to_string());
        assert_eq!(SmcRequest::from_annotations(&a), SmcRequest::Enabled);
        a.insert(SMCR_ANNOTATION.to_string(), "false".to_string());
        assert_eq!(SmcRequest::from_annotations(&a), SmcRequest::Disabled);
        assert_eq!(
            serde_json::to_string(&SmcRequest::Invalid("x".into())).unwrap(),
            r#"{"request":"invalid","value":"x"}"#
        );
    }
}
