//! What the API server dropped of what the driver wrote. The API server silently drops the
//! fields of a feature whose gate is off (`dropDisabledFields` in
//! `pkg/registry/resource/resourceslice/strategy.go`): the slice is stored, without them. The
//! Create/Update response is the stored object, so comparing it with what was written shows
//! which gate is off, without another read.
//!
//! Checked here, as erdma writes them:
//! - device `taints` (an unhealthy device): `DRADeviceTaints` (alpha in 1.33 to 1.35, beta and
//!   on by default from 1.36). Without it an unhealthy device stays allocatable; the health
//!   stream still reports it to the pods that hold it, and a prepare on it is refused.
//! - device `allowMultipleAllocations` and capacity `requestPolicy`: `DRAConsumableCapacity`
//!   (alpha in 1.34 and 1.35, beta and on by default from 1.36). Without it a device is
//!   allocated to one claim at a time, whole.
//!
//! A field already stored is kept by the API server even with its gate off (the `…InUse`
//! ratchet of an update), so what is dropped is compared, not what the gates are.

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use serde::Serialize;
use std::collections::BTreeMap;

/// Feature gate of device taints.
pub const GATE_DEVICE_TAINTS: &str = "DRADeviceTaints";
/// Feature gate of consumable capacity.
pub const GATE_CONSUMABLE_CAPACITY: &str = "DRAConsumableCapacity";
/// Feature gate of a DeviceClass's `extendedResourceName`.
pub const GATE_EXTENDED_RESOURCE: &str = "DRAExtendedResource";

/// Device field `taints`.
pub const FIELD_TAINTS: &str = "taints";
/// Device field `allowMultipleAllocations`.
pub const FIELD_ALLOW_MULTIPLE_ALLOCATIONS: &str = "allowMultipleAllocations";
/// Device capacity field `requestPolicy`.
pub const FIELD_REQUEST_POLICY: &str = "capacity.requestPolicy";
/// DeviceClass field `extendedResourceName`.
pub const FIELD_EXTENDED_RESOURCE_NAME: &str = "extendedResourceName";

/// Every ResourceSlice field checked, with its feature gate.
pub const SLICE_FIELDS: &[(&str, &str)] = &[
    (FIELD_TAINTS, GATE_DEVICE_TAINTS),
    (FIELD_ALLOW_MULTIPLE_ALLOCATIONS, GATE_CONSUMABLE_CAPACITY),
    (FIELD_REQUEST_POLICY, GATE_CONSUMABLE_CAPACITY),
];

/// A field written and not stored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DroppedField {
    /// The field (`taints`, `allowMultipleAllocations`, `capacity.requestPolicy`).
    pub field: &'static str,
    /// The feature gate that is off.
    pub feature_gate: &'static str,
    /// The devices it was dropped from, sorted.
    pub devices: Vec<String>,
}

impl DroppedField {
    /// `taints (DRADeviceTaints) on erdma-1`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}) on {}",
            self.field,
            self.feature_gate,
            self.devices.join(", ")
        )
    }
}

/// The feature gates of `dropped`, each once, sorted.
pub fn gates(dropped: &[DroppedField]) -> Vec<&'static str> {
    let mut g: Vec<&'static str> = dropped.iter().map(|d| d.feature_gate).collect();
    g.sort_unstable();
    g.dedup();
    g
}

/// One line for logs, Events and conditions: which fields the API server dropped and the gates
/// to turn on.
pub fn summary(dropped: &[DroppedField]) -> String {
    let what: Vec<String> = dropped.iter().map(DroppedField::describe).collect();
    let g = gates(dropped);
    let gates = match g.as_slice() {
        [one] => format!("feature gate {one} is"),
        many => format!("feature gates {} are", many.join(", ")),
    };
    format!(
        "the API server dropped {} of this node's ResourceSlice: {gates} off on the API server",
        what.join("; ")
    )
}

fn has_taints(d: &Device) -> bool {
    d.taints.as_ref().is_some_and(|t| !t.is_empty())
}

fn policies(d: &Device) -> impl Iterator<Item = &String> {
    d.capacity
        .iter()
        .flatten()
        .filter(|(_, c)| c.request_policy.is_some())
        .map(|(k, _)| k)
}

/// The fields of `written` (the devices the driver wrote) missing from `stored` (the devices of
/// the slice as stored), by device name; a device missing from `stored` altogether is not
/// counted (the API server drops no devices).
pub fn dropped_devices(written: &[Device], stored: &[Device]) -> Vec<DroppedField> {
    let stored: BTreeMap<&str, &Device> = stored.iter().map(|d| (d.name.as_str(), d)).collect();
    let mut by_field: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for w in written {
        let Some(s) = stored.get(w.name.as_str()) else {
            continue;
        };
        if has_taints(w) && !has_taints(s) {
            by_field
                .entry(FIELD_TAINTS)
                .or_default()
                .push(w.name.clone());
        }
        if w.allow_multiple_allocations.is_some() && s.allow_multiple_allocations.is_none() {
            by_field
                .entry(FIELD_ALLOW_MULTIPLE_ALLOCATIONS)
                .or_default()
                .push(w.name.clone());
        }
        let kept: Vec<&String> = policies(s).collect();
        if policies(w).any(|k| !kept.contains(&k)) {
            by_field
                .entry(FIELD_REQUEST_POLICY)
                .or_default()
                .push(w.name.clone());
        }
    }
    SLICE_FIELDS
        .iter()
        .filter_map(|(field, gate)| {
            let mut devices = by_field.remove(field)?;
            devices.sort();
            Some(DroppedField {
                field,
                feature_gate: gate,
                devices,
            })
        })
        .collect()
}

/// [`dropped_devices`] of two slices.
pub fn dropped(written: &ResourceSlice, stored: &ResourceSlice) -> Vec<DroppedField> {
    dropped_devices(
        written.spec.devices.as_deref().unwrap_or_default(),
        stored.spec.devices.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, DeviceCapacity, DeviceTaint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn device(name: &str, taint: bool, multiple: bool, policy: bool) -> Device {
        Device {
            name: name.into(),
            taints: taint.then(|| {
                vec![DeviceTaint {
                    key: "k".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            allow_multiple_allocations: multiple.then_some(true),
            capacity: Some(BTreeMap::from([(
                "shares".to_string(),
                DeviceCapacity {
                    value: Quantity("2".into()),
                    request_policy: policy.then(CapacityRequestPolicy::default),
                },
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn nothing_dropped_when_stored_as_written() {
        let w = [
            device("a", true, true, true),
            device("b", false, true, true),
        ];
        assert_eq!(dropped_devices(&w, &w), []);
    }

    #[test]
    fn each_dropped_field_names_its_gate_and_devices() {
        let written = [device("b", true, true, true), device("a", true, true, true)];
        let stored = [
            device("a", false, false, false),
            device("b", true, false, false),
        ];
        let d = dropped_devices(&written, &stored);
        assert_eq!(
            d,
            [
                DroppedField {
                    field: "taints",
                    feature_gate: "DRADeviceTaints",
                    devices: vec!["a".into()],
                },
                DroppedField {
                    field: "allowMultipleAllocations",
                    feature_gate: "DRAConsumableCapacity",
                    devices: vec!["a".into(), "b".into()],
                },
                DroppedField {
                    field: "capacity.requestPolicy",
                    feature_gate: "DRAConsumableCapacity",
                    devices: vec!["a".into(), "b".into()],
                },
            ]
        );
        assert_eq!(gates(&d), ["DRAConsumableCapacity", "DRADeviceTaints"]);
        assert_eq!(
            summary(&d[..1]),
            "the API server dropped taints (DRADeviceTaints) on a of this node's ResourceSlice: feature gate DRADeviceTaints is off on the API server"
        );
        assert!(
            summary(&d).ends_with(
                "feature gates DRAConsumableCapacity, DRADeviceTaints are off on the API server"
            ),
            "{}",
            summary(&d)
        );
    }

    #[test]
    fn a_device_without_the_field_written_is_not_a_drop() {
        // An untainted device stored untainted; no policy written, none stored.
        let w = [device("a", false, false, false)];
        assert_eq!(dropped_devices(&w, &w), []);
        // A device the server did not return (never happens) is not reported.
        assert_eq!(dropped_devices(&[device("x", true, true, true)], &[]), []);
    }
}
