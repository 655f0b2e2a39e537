//! Which inventoried devices a resource serves: by driver (`--rdma-driver`) and by the
//! `exposedLocalERIs` allow-list for this instance.

use crate::eri_selector::{EriSelector, Exposure};
use crate::node::NodeDevices;
use serde::Serialize;

/// The selection rules of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSelection {
    /// Driver keys served (`erdma`, `rxe`, `siw`, or a kernel driver name such as `mlx5_core`).
    pub drivers: Vec<String>,
    /// The `exposedLocalERIs` allow-list (empty = everything).
    pub eris: EriSelector,
    /// This node's ECS instance ID, when known. With a non-empty allow-list and no instance ID,
    /// only `i-*` entries can apply.
    pub instance_id: Option<String>,
}

/// A device left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excluded {
    /// Device name.
    pub device: String,
    /// Why it is not served.
    pub reason: String,
}

impl Default for DeviceSelection {
    /// eRDMA devices only, no allow-list: what `aliyun/erdma` serves by default.
    fn default() -> Self {
        DeviceSelection {
            drivers: vec!["erdma".into()],
            eris: EriSelector::default(),
            instance_id: None,
        }
    }
}

impl DeviceSelection {
    /// Splits `node` into the served snapshot and the excluded devices with reasons.
    pub fn apply(&self, node: &NodeDevices) -> (NodeDevices, Vec<Excluded>) {
        let instance = self.instance_id.as_deref().unwrap_or("");
        let mut served = node.clone();
        let mut excluded = Vec::new();
        served.devices.retain(|d| {
            let key = d.driver_key();
            let driver_ok = self
                .drivers
                .iter()
                .any(|w| w == key || Some(w.as_str()) == d.driver.as_deref());
            if !driver_ok {
                excluded.push(Excluded {
                    device: d.name.clone(),
                    reason: format!(
                        "driver {key} is not served (served: {})",
                        self.drivers.join(",")
                    ),
                });
                return false;
            }
            if !self.eris.selects(instance, &d.name) {
                let shown = if instance.is_empty() {
                    "<unknown: only i-* entries apply>"
                } else {
                    instance
                };
                let why = match self.eris.exposure(instance) {
                    Exposure::Nothing => format!(
                        "exposedLocalERIs has no entry for instance {shown} and no i-* entry"
                    ),
                    _ => format!("not in exposedLocalERIs for instance {shown}"),
                };
                excluded.push(Excluded {
                    device: d.name.clone(),
                    reason: why,
                });
                return false;
            }
            true
        });
        (served, excluded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceKind, RdmaDevice};

    fn node() -> NodeDevices {
        let mut n = NodeDevices::empty();
        n.devices = vec![
            RdmaDevice::named("erdma_0", DeviceKind::Erdma),
            RdmaDevice::named("erdma_1", DeviceKind::Erdma),
            RdmaDevice::named("rxe0", DeviceKind::Rxe),
        ];
        n
    }

    fn names(n: &NodeDevices) -> Vec<&str> {
        n.devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn default_serves_erdma_only() {
        let (served, excluded) = DeviceSelection::default().apply(&node());
        assert_eq!(names(&served), ["erdma_0", "erdma_1"]);
        assert_eq!(excluded.len(), 1);
        assert!(excluded[0].reason.contains("driver rxe is not served"));
    }

    #[test]
    fn allow_list_for_this_instance() {
        let sel = DeviceSelection {
            drivers: vec!["erdma".into(), "rxe".into()],
            eris: EriSelector::parse("i-abc erdma_1, i-* rxe*").unwrap(),
            instance_id: Some("i-abc".into()),
        };
        let (served, excluded) = sel.apply(&node());
        assert_eq!(names(&served), ["erdma_1"]);
        assert_eq!(excluded.len(), 2);
        let other = DeviceSelection {
            instance_id: Some("i-zzz".into()),
            ..sel.clone()
        };
        assert_eq!(names(&other.apply(&node()).0), ["rxe0"]);
    }

    #[test]
    fn unmatched_allow_list_explains_itself() {
        let sel = DeviceSelection {
            eris: EriSelector::parse("i-XXX erdma_0/erdma_1").unwrap(),
            instance_id: Some("i-real".into()),
            ..DeviceSelection::default()
        };
        let (served, excluded) = sel.apply(&node());
        assert!(served.devices.is_empty());
        assert!(
            excluded
                .iter()
                .any(|e| e.reason.contains("no entry for instance i-real"))
        );
        let unknown = DeviceSelection {
            instance_id: None,
            ..sel
        };
        let (_, excluded) = unknown.apply(&node());
        assert!(
            excluded
                .iter()
                .filter(|e| e.device.starts_with("erdma"))
                .all(|e| e.reason.contains("<unknown: only i-* entries apply>")),
            "{excluded:?}"
        );
    }
}
