//! Another device plugin serving the same extended resource on this node, and what to do about it.
//!
//! Terway's eRDMA ENI mode registers `aliyun/erdma` too (socket `<unix-ts>-erdma-eni.sock`), and an
//! unfinished upgrade can leave the original Go agent running (socket `<unix-ts>-erdma.sock`). The
//! kubelet keeps one endpoint per resource name, the one registered last, lets every open
//! `ListAndWatch` stream overwrite the resource's device list, and marks the whole resource unhealthy
//! (allocatable 0) when any of those streams ends. Two plugins on one resource therefore never work:
//! erdma reports the conflict (node condition, Event, `/healthz`, metric, `erdmactl doctor`) and does
//! not re-register to win it back, which would only make the two plugins take turns.
//!
//! This module holds the pure part: recognising another plugin's socket, the evidence, a debounce
//! for evidence that can be a passing state, and the texts users see.

use crate::SlotId;
use serde::Serialize;
use std::collections::BTreeSet;

/// Node condition type: `True` while another device plugin serves the agent's resource.
pub const CONDITION_TYPE: &str = "ERdmaDevicePluginConflict";
/// Condition reason while another plugin is seen.
pub const REASON_CONFLICT: &str = "AnotherDevicePlugin";
/// Condition reason while erdma is the only plugin seen.
pub const REASON_ALONE: &str = "NoOtherDevicePlugin";
/// Event reason when a conflict starts (type Warning).
pub const EVENT_CONFLICT: &str = "ERdmaDevicePluginConflict";
/// Event reason when a conflict ends (type Normal).
pub const EVENT_RESOLVED: &str = "ERdmaDevicePluginConflictResolved";

/// Which other plugin a socket belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OtherPlugin {
    /// Terway's eRDMA ENI device plugin (`enable_erdma` in terway's `eni_conf`).
    Terway,
    /// The original `alibabacloud-erdma-agent` (Go), e.g. left by an unfinished upgrade.
    OriginalAgent,
}

impl OtherPlugin {
    /// What users call it.
    pub fn describe(self) -> &'static str {
        match self {
            OtherPlugin::Terway => "terway's eRDMA ENI device plugin",
            OtherPlugin::OriginalAgent => "the original alibabacloud-erdma-agent",
        }
    }

    /// How to make it stop serving the resource.
    pub fn fix(self) -> &'static str {
        match self {
            OtherPlugin::Terway => {
                "disable terway's eRDMA device plugin: set \"enable_erdma\": false in eni_conf of ConfigMap kube-system/eni-config and restart the terway pod on this node; or, where terway runs in its multi-IP (centralized IPAM) mode, keep it off erdma's ERIs with the ECS tag terway.alibabacloud.com/excluded=true (erdma-controller tags the ERIs it creates)"
            }
            OtherPlugin::OriginalAgent => {
                "finish the upgrade from alibabacloud-erdma-controller (helm upgrade alibaba-erdma-controller deploy/helm -n kube-system, see docs/operations.md) or delete the original agent's DaemonSet, so that one agent serves the node"
            }
        }
    }
}

/// Recognises another plugin's socket in the device-plugin directory from its file name; `own`
/// is erdma's own socket file name. Only names that are known to register `aliyun/erdma` match.
pub fn classify_socket(file_name: &str, own: &str) -> Option<OtherPlugin> {
    if file_name == own {
        return None;
    }
    let timestamp = |prefix: &str| !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_digit());
    if let Some(prefix) = file_name.strip_suffix("-erdma-eni.sock") {
        return timestamp(prefix).then_some(OtherPlugin::Terway);
    }
    if let Some(prefix) = file_name.strip_suffix("-erdma.sock") {
        return timestamp(prefix).then_some(OtherPlugin::OriginalAgent);
    }
    None
}

/// One observation that another plugin serves the resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Evidence {
    /// A socket of a known other plugin that accepts connections.
    Socket {
        /// Socket file name in the device-plugin directory.
        file: String,
        /// Whose it is.
        plugin: OtherPlugin,
    },
    /// The kubelet (pod-resources `GetAllocatableResources`) holds devices of the resource that
    /// erdma does not advertise: its device list came from another plugin.
    KubeletDevices {
        /// How many such device IDs.
        foreign: usize,
        /// One of them.
        example: String,
    },
}

impl Evidence {
    /// One line for logs, the condition and Events.
    pub fn describe(&self) -> String {
        match self {
            Evidence::Socket { file, plugin } => {
                format!(
                    "{} is running (socket {file} accepts connections)",
                    plugin.describe()
                )
            }
            Evidence::KubeletDevices { foreign, example } => format!(
                "the kubelet holds {foreign} device(s) of the resource that erdma does not advertise (e.g. {example:?}): its device list comes from another plugin"
            ),
        }
    }

    fn is_socket(&self) -> bool {
        matches!(self, Evidence::Socket { .. })
    }
}

/// Device IDs the kubelet holds for the resource that are not erdma's: not a slot ID, or a slot of
/// a device erdma does not serve. `served` are the RDMA device names erdma advertises now.
pub fn foreign_device_ids<'a>(
    kubelet_ids: impl IntoIterator<Item = &'a str>,
    served: &BTreeSet<String>,
) -> Vec<String> {
    kubelet_ids
        .into_iter()
        .filter(|id| SlotId::parse(id).map_or(true, |s| !served.contains(&s.device)))
        .map(str::to_string)
        .collect()
}

/// The verdict: the evidence that another plugin serves the resource (empty: none seen).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// What was seen, sorted.
    pub evidence: Vec<Evidence>,
}

impl Conflict {
    /// Whether another plugin serves the resource.
    pub fn is_conflict(&self) -> bool {
        !self.evidence.is_empty()
    }

    /// The other plugins recognised by their sockets.
    pub fn plugins(&self) -> BTreeSet<OtherPlugin> {
        self.evidence
            .iter()
            .filter_map(|e| match e {
                Evidence::Socket { plugin, .. } => Some(*plugin),
                Evidence::KubeletDevices { .. } => None,
            })
            .collect()
    }

    /// What is wrong, for the condition message, the Event and logs.
    pub fn message(&self, resource: &str) -> String {
        if !self.is_conflict() {
            return format!("erdma is the only device plugin serving {resource} on this node");
        }
        let seen: Vec<String> = self.evidence.iter().map(Evidence::describe).collect();
        format!(
            "another device plugin serves {resource} on this node: {}. The kubelet keeps the plugin that registered last and drops allocatable {resource} to 0 when either stops; erdma does not re-register to take it back",
            seen.join("; ")
        )
    }

    /// How to resolve it.
    pub fn fix(&self, resource: &str) -> String {
        let plugins = self.plugins();
        if plugins.is_empty() {
            return format!(
                "find the other plugin registered for {resource}: list the sockets in the kubelet's device-plugins directory and the DaemonSets on this node (terway with \"enable_erdma\": true is the usual one), then let only one serve {resource}"
            );
        }
        plugins
            .into_iter()
            .map(OtherPlugin::fix)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The node condition: `(type, status, reason, message)`.
    pub fn condition(&self, resource: &str) -> (&'static str, &'static str, &'static str, String) {
        if self.is_conflict() {
            (
                CONDITION_TYPE,
                "True",
                REASON_CONFLICT,
                format!("{} Fix: {}", self.message(resource), self.fix(resource)),
            )
        } else {
            (
                CONDITION_TYPE,
                "False",
                REASON_ALONE,
                self.message(resource),
            )
        }
    }
}

/// Turns raw observations into a verdict. A live socket counts at once; the kubelet's device list
/// counts only when seen in two consecutive observations, because it lags erdma's own updates
/// (a device erdma just started serving is briefly unknown to the kubelet, and the reverse).
///
/// It also says when to register again: once, after a recognised other plugin was seen running and
/// is gone. The kubelet is then left pointing at the departed plugin (when it registered last) or
/// with every device of the resource marked unhealthy (when its stream ended), so allocatable
/// stays 0 until some plugin registers. Never while another plugin runs, and never for an
/// unrecognised one: erdma does not fight for the registration.
#[derive(Debug, Default)]
pub struct Debounce {
    previous_kubelet: bool,
    other_was_live: bool,
}

/// What one observation concluded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The conflict now.
    pub conflict: Conflict,
    /// Register again now (the other plugin left the kubelet pointing at it).
    pub reclaim: bool,
}

impl Debounce {
    /// Whether the last observation found devices in the kubelet's list that erdma does not
    /// advertise: the next look confirms or clears them, so it should come soon.
    pub fn kubelet_list_in_question(&self) -> bool {
        self.previous_kubelet
    }

    /// Feeds one observation and returns the verdict.
    pub fn observe(&mut self, mut raw: Vec<Evidence>) -> Verdict {
        let kubelet_now = raw.iter().any(|e| !e.is_socket());
        let socket_now = raw.iter().any(Evidence::is_socket);
        if socket_now {
            self.other_was_live = true;
        }
        let reclaim = !socket_now && self.other_was_live;
        if reclaim {
            self.other_was_live = false;
        }
        if !self.previous_kubelet {
            raw.retain(Evidence::is_socket);
        }
        self.previous_kubelet = kubelet_now;
        raw.sort();
        raw.dedup();
        Verdict {
            conflict: Conflict { evidence: raw },
            reclaim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OWN: &str = "erdma-aliyun_erdma-erdma.sock";

    #[test]
    fn known_sockets_are_recognised() {
        assert_eq!(
            classify_socket("1700000000-erdma-eni.sock", OWN),
            Some(OtherPlugin::Terway)
        );
        assert_eq!(
            classify_socket("1699999999-erdma.sock", OWN),
            Some(OtherPlugin::OriginalAgent)
        );
        for other in [
            OWN,
            "kubelet.sock",
            "nvidia-gpu.sock",
            "1700000000-eni.sock",
            "1700000000-member-eni.sock",
            "x1-erdma.sock",
            "-erdma-eni.sock",
            "erdma-example_com_rdma-erdma.sock",
        ] {
            assert_eq!(classify_socket(other, OWN), None, "{other}");
        }
    }

    #[test]
    fn foreign_ids_are_the_ones_erdma_does_not_advertise() {
        let served: BTreeSet<String> = ["erdma_0".to_string()].into();
        let ids = ["erdma_0/0", "erdma_0/199", "erdma_1/0", "eni-3", "7"];
        assert_eq!(
            foreign_device_ids(ids, &served),
            vec!["erdma_1/0", "eni-3", "7"]
        );
        assert!(foreign_device_ids(["erdma_0/5"], &served).is_empty());
    }

    fn sock() -> Evidence {
        Evidence::Socket {
            file: "1-erdma-eni.sock".into(),
            plugin: OtherPlugin::Terway,
        }
    }

    fn kube() -> Evidence {
        Evidence::KubeletDevices {
            foreign: 2,
            example: "eni-0".into(),
        }
    }

    #[test]
    fn a_socket_counts_at_once_the_kubelet_list_on_the_second_sight() {
        let mut d = Debounce::default();
        assert_eq!(d.observe(vec![kube()]), Verdict::default());
        assert_eq!(d.observe(vec![kube()]).conflict.evidence, vec![kube()]);
        assert_eq!(d.observe(vec![]), Verdict::default());
        let v = d.observe(vec![kube(), sock()]);
        assert_eq!(v.conflict.evidence, vec![sock()]);
        assert!(v.conflict.is_conflict());
        assert!(!v.reclaim);
    }

    #[test]
    fn reclaims_once_only_after_a_recognised_plugin_left() {
        let mut d = Debounce::default();
        // An unrecognised plugin: reported, never reclaimed.
        for _ in 0..3 {
            assert!(!d.observe(vec![kube()]).reclaim);
        }
        assert!(!d.observe(vec![]).reclaim);
        // Terway runs: reported, not reclaimed.
        assert!(!d.observe(vec![sock(), kube()]).reclaim);
        assert!(!d.observe(vec![sock(), kube()]).reclaim);
        // Terway gone (the kubelet marked the resource unhealthy, or still holds its devices):
        // reclaim, once.
        let v = d.observe(vec![kube()]);
        assert!(v.reclaim);
        assert!(
            v.conflict.is_conflict(),
            "still a conflict until the kubelet has erdma's list"
        );
        assert!(!d.observe(vec![kube()]).reclaim);
        assert_eq!(d.observe(vec![]), Verdict::default());
        // It comes back and leaves again: one more reclaim.
        assert!(!d.observe(vec![sock()]).reclaim);
        assert!(d.observe(vec![]).reclaim);
        assert!(!d.observe(vec![]).reclaim);
    }

    #[test]
    fn texts_name_the_plugin_and_the_fix() {
        let c = Conflict {
            evidence: vec![Evidence::Socket {
                file: "1700000000-erdma-eni.sock".into(),
                plugin: OtherPlugin::Terway,
            }],
        };
        let (ty, st, reason, msg) = c.condition("aliyun/erdma");
        assert_eq!((ty, st, reason), (CONDITION_TYPE, "True", REASON_CONFLICT));
        assert!(msg.contains("terway's eRDMA ENI device plugin"), "{msg}");
        assert!(msg.contains("1700000000-erdma-eni.sock"), "{msg}");
        assert!(msg.contains("enable_erdma"), "{msg}");
        assert!(
            msg.contains("terway.alibabacloud.com/excluded=true"),
            "{msg}"
        );
        let (_, st, reason, _) = Conflict::default().condition("aliyun/erdma");
        assert_eq!((st, reason), ("False", REASON_ALONE));
    }

    proptest! {
        #[test]
        fn classify_never_panics_and_own_never_matches(name in ".{0,80}") {
            let _ = classify_socket(&name, OWN);
            prop_assert_eq!(classify_socket(&name, &name), None);
        }
    }
}
