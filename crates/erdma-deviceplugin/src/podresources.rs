//! Slots in use: a pure count over the kubelet's pod-resources holders.

use erdma_kubelet::podresources::Holder;
use erdma_model::SlotId;
use std::collections::{BTreeMap, BTreeSet};

/// Counts, per device, the distinct slots that `holders` (of one resource) hold; device IDs
/// that are not slot IDs are not counted.
pub fn used_slots(holders: &[Holder]) -> BTreeMap<String, u32> {
    let slots: BTreeSet<SlotId> = holders
        .iter()
        .flat_map(|h| h.device_ids.iter())
        .filter_map(|id| SlotId::parse(id).ok())
        .collect();
    let mut out = BTreeMap::new();
    for s in slots {
        *out.entry(s.device).or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pod: &str, ids: &[&str]) -> Holder {
        Holder::of_ids(
            "default",
            pod,
            "c",
            ids.iter().map(|s| s.to_string()).collect(),
        )
    }

    #[test]
    fn counts_distinct_slots_per_device() {
        let used = used_slots(&[
            holder("a", &["erdma_0/1", "erdma_0/2"]),
            holder("b", &["erdma_0/2", "erdma_1/0", "not-a-slot"]),
        ]);
        assert_eq!(
            used,
            BTreeMap::from([("erdma_0".to_string(), 2), ("erdma_1".to_string(), 1)])
        );
        assert!(used_slots(&[]).is_empty());
    }
}
