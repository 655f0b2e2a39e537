//! Preferred allocation of device-plugin slots: the pure policy behind `GetPreferredAllocation`.
//!
//! The kubelet offers a container a set of free slot IDs (`"<device>/<n>"`), some that must be part
//! of the answer, and a count. The policy answers with slots that:
//!
//! 1. include every `must_include` slot;
//! 2. keep the container on as few RDMA devices as possible;
//! 3. stay on one NUMA node: the node of the `must_include` slots, or else the node with the most
//!    free slots (ties: the lower node number);
//! 4. spread containers across the devices of that node: among devices that can serve the rest
//!    of the request alone, the least-used one wins.
//!
//! Everything is deterministic: the order of the input lists does not change the answer.

use crate::device::NumaNode;
use crate::slot::SlotId;
use std::collections::{BTreeMap, BTreeSet};

/// What the policy knows about one device besides the offered slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLoad {
    /// RDMA device name (`erdma_0`).
    pub device: String,
    /// NUMA node of the device.
    pub numa: NumaNode,
    /// Slots of this device already given to containers.
    pub used: u32,
}

/// One container's preferred-allocation question.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreferenceRequest {
    /// Slots the kubelet may choose from.
    pub available: Vec<SlotId>,
    /// Slots that must be in the answer.
    pub must_include: Vec<SlotId>,
    /// How many slots to return.
    pub size: usize,
}

#[derive(Debug)]
struct Candidate {
    device: String,
    numa: NumaNode,
    used: u32,
    free: Vec<u32>,
}

/// Chooses `request.size` slots (fewer only when fewer are offered). `loads` gives NUMA node and
/// current use per device; a device missing from it counts as unused with unknown NUMA.
pub fn preferred_allocation(request: &PreferenceRequest, loads: &[DeviceLoad]) -> Vec<SlotId> {
    let load_of = |dev: &str| loads.iter().find(|l| l.device == dev);
    let must: BTreeSet<&SlotId> = request.must_include.iter().collect();
    let mut chosen: Vec<SlotId> = must
        .iter()
        .take(request.size)
        .map(|s| (*s).clone())
        .collect();
    let mut remaining = request.size.saturating_sub(chosen.len());

    // Free slots per device, minus the must-include ones.
    let mut by_device: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for s in &request.available {
        if !must.contains(s) {
            by_device
                .entry(s.device.as_str())
                .or_default()
                .insert(s.index);
        }
    }
    let mut candidates: Vec<Candidate> = by_device
        .into_iter()
        .map(|(dev, free)| {
            let (numa, used) = load_of(dev)
                .map(|l| (l.numa, l.used))
                .unwrap_or((NumaNode::UNKNOWN, 0));
            Candidate {
                device: dev.to_string(),
                numa,
                used,
                free: free.into_iter().collect(),
            }
        })
        .collect();

    let must_devices: BTreeSet<&str> = must.iter().map(|s| s.device.as_str()).collect();
    let target = target_numa(&must_devices, &candidates, &load_of);

    // Devices already holding must-include slots first (fewest devices), then the target node.
    let rank = |c: &Candidate| -> u8 {
        match (
            must_devices.contains(c.device.as_str()),
            target == Some(c.numa),
        ) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => 2,
        }
    };
    while remaining > 0 && !candidates.is_empty() {
        let best_rank = candidates.iter().map(rank).min().unwrap_or(2);
        let group: Vec<usize> = (0..candidates.len())
            .filter(|&i| rank(&candidates[i]) == best_rank)
            .collect();
        let pick = pick_device(&candidates, &group, remaining);
        let c = candidates.swap_remove(pick);
        let take = remaining.min(c.free.len());
        chosen.extend(
            c.free
                .iter()
                .take(take)
                .map(|&i| SlotId::new(c.device.clone(), i)),
        );
        remaining -= take;
    }
    chosen
}

/// Among `group`, a device that can serve `remaining` alone (the least used, then by name), else
/// the one with the most free slots (then the least used, then by name).
fn pick_device(candidates: &[Candidate], group: &[usize], remaining: usize) -> usize {
    let whole = group
        .iter()
        .copied()
        .filter(|&i| candidates[i].free.len() >= remaining)
        .min_by(|&a, &b| {
            let (ca, cb) = (&candidates[a], &candidates[b]);
            ca.used.cmp(&cb.used).then(ca.device.cmp(&cb.device))
        });
    whole.unwrap_or_else(|| {
        group
            .iter()
            .copied()
            .min_by(|&a, &b| {
                let (ca, cb) = (&candidates[a], &candidates[b]);
                cb.free
                    .len()
                    .cmp(&ca.free.len())
                    .then(ca.used.cmp(&cb.used))
                    .then(ca.device.cmp(&cb.device))
            })
            .unwrap_or(group[0])
    })
}

/// The NUMA node to keep the container on: the most common known node of the must-include
/// devices, else the known node with the most free slots; `None` when no node is known.
fn target_numa<'a>(
    must_devices: &BTreeSet<&str>,
    candidates: &[Candidate],
    load_of: &dyn Fn(&str) -> Option<&'a DeviceLoad>,
) -> Option<NumaNode> {
    let mut must_numa: BTreeMap<NumaNode, usize> = BTreeMap::new();
    for d in must_devices {
        if let Some(l) = load_of(d)
            && l.numa.0.is_some()
        {
            *must_numa.entry(l.numa).or_default() += 1;
        }
    }
    if let Some((n, _)) = must_numa
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
    {
        return Some(*n);
    }
    let mut free: BTreeMap<NumaNode, usize> = BTreeMap::new();
    for c in candidates.iter().filter(|c| c.numa.0.is_some()) {
        *free.entry(c.numa).or_default() += c.free.len();
    }
    free.iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn slots(dev: &str, r: std::ops::Range<u32>) -> Vec<SlotId> {
        r.map(|i| SlotId::new(dev, i)).collect()
    }

    fn load(dev: &str, numa: Option<u32>, used: u32) -> DeviceLoad {
        DeviceLoad {
            device: dev.into(),
            numa: NumaNode(numa),
            used,
        }
    }

    #[test]
    fn one_slot_goes_to_the_least_used_device_of_the_numa_node_with_most_free_slots() {
        let mut available = slots("erdma_0", 0..10);
        available.extend(slots("erdma_1", 0..10));
        available.extend(slots("erdma_2", 0..4));
        available.extend(slots("erdma_3", 0..5));
        let loads = [
            load("erdma_0", Some(0), 5),
            load("erdma_1", Some(0), 2),
            load("erdma_2", Some(1), 0),
            load("erdma_3", Some(1), 0),
        ];
        let got = preferred_allocation(
            &PreferenceRequest {
                available,
                must_include: vec![],
                size: 1,
            },
            &loads,
        );
        // Node 0 has 20 free slots, node 1 has 9: node 0; erdma_1 is less used than erdma_0.
        assert_eq!(got, vec![SlotId::new("erdma_1", 0)]);
    }

    #[test]
    fn must_include_pins_the_numa_node_and_the_device() {
        let mut available = slots("erdma_0", 0..10);
        available.extend(slots("erdma_1", 0..10));
        available.extend(slots("erdma_2", 0..50));
        let loads = [
            load("erdma_0", Some(0), 0),
            load("erdma_1", Some(1), 0),
            load("erdma_2", Some(0), 0),
        ];
        let req = PreferenceRequest {
            available,
            must_include: vec![SlotId::new("erdma_1", 3)],
            size: 3,
        };
        let got = preferred_allocation(&req, &loads);
        assert_eq!(
            got,
            vec![
                SlotId::new("erdma_1", 3),
                SlotId::new("erdma_1", 0),
                SlotId::new("erdma_1", 1)
            ]
        );
    }

    #[test]
    fn spills_to_other_devices_only_when_needed() {
        let mut available = slots("a", 0..2);
        available.extend(slots("b", 0..3));
        let loads = [load("a", Some(0), 0), load("b", Some(0), 9)];
        let got = preferred_allocation(
            &PreferenceRequest {
                available,
                must_include: vec![],
                size: 4,
            },
            &loads,
        );
        assert_eq!(got.len(), 4);
        // No single device has 4 free: take the larger one first (b), then a.
        assert_eq!(&got[..3], &slots("b", 0..3)[..]);
    }

    #[test]
    fn unknown_numa_is_never_treated_as_node_zero() {
        let mut available = slots("x", 0..3);
        available.extend(slots("y", 0..1));
        let loads = [load("x", None, 0), load("y", Some(0), 0)];
        let got = preferred_allocation(
            &PreferenceRequest {
                available,
                must_include: vec![],
                size: 1,
            },
            &loads,
        );
        assert_eq!(
            got,
            vec![SlotId::new("y", 0)],
            "the only known node is preferred"
        );
    }

    #[test]
    fn empty_offer_gives_empty_answer() {
        let got = preferred_allocation(
            &PreferenceRequest {
                available: vec![],
                must_include: vec![],
                size: 2,
            },
            &[],
        );
        assert!(got.is_empty());
    }

    fn arb_case() -> impl Strategy<Value = (PreferenceRequest, Vec<DeviceLoad>)> {
        let dev = prop::collection::vec((prop::option::of(0u32..3), 0u32..20, 0u32..12), 1..6);
        (dev, 0usize..15, any::<prop::sample::Index>(), any::<u64>()).prop_map(
            |(devs, size, must_pick, seed)| {
                let mut available = Vec::new();
                let mut loads = Vec::new();
                for (i, (numa, used, free)) in devs.iter().enumerate() {
                    let name = format!("erdma_{i}");
                    available.extend(slots(&name, 0..*free));
                    loads.push(load(&name, *numa, *used));
                }
                let mut must = Vec::new();
                if !available.is_empty() && seed % 3 == 0 {
                    must.push(available[must_pick.index(available.len())].clone());
                }
                let size = size.max(must.len());
                (
                    PreferenceRequest {
                        available,
                        must_include: must,
                        size,
                    },
                    loads,
                )
            },
        )
    }

    fn devices_of(s: &[SlotId]) -> BTreeSet<String> {
        s.iter().map(|s| s.device.clone()).collect()
    }

    proptest! {
        #[test]
        fn answer_is_valid((req, loads) in arb_case()) {
            let got = preferred_allocation(&req, &loads);
            let offered: BTreeSet<&SlotId> = req.available.iter().chain(&req.must_include).collect();
            prop_assert_eq!(got.len(), req.size.min(offered.len()));
            let uniq: BTreeSet<&SlotId> = got.iter().collect();
            prop_assert_eq!(uniq.len(), got.len(), "no duplicates");
            prop_assert!(got.iter().all(|s| offered.contains(s)));
            prop_assert!(req.must_include.iter().all(|m| got.contains(m)));
        }

        #[test]
        fn order_of_offers_does_not_matter((req, loads) in arb_case()) {
            let mut rev = req.clone();
            rev.available.reverse();
            let mut rloads = loads.clone();
            rloads.reverse();
            prop_assert_eq!(preferred_allocation(&req, &loads), preferred_allocation(&rev, &rloads));
        }

        #[test]
        fn one_device_when_one_device_suffices((req, loads) in arb_case()) {
            prop_assume!(req.must_include.is_empty() && req.size > 0);
            let got = preferred_allocation(&req, &loads);
            let mut per_dev: BTreeMap<&str, usize> = BTreeMap::new();
            for s in &req.available { *per_dev.entry(s.device.as_str()).or_default() += 1; }
            if per_dev.values().any(|&n| n >= req.size) {
                // Some device can take it alone; the answer may still cross devices only if the
                // target NUMA node has no such device, so check that case precisely.
                let target = target_numa_for_test(&req, &loads);
                let fits_on_target = per_dev.iter().any(|(d, &n)| n >= req.size && target.is_none_or(|t| loads.iter().any(|l| l.device == *d && l.numa == t)));
                if fits_on_target {
                    prop_assert_eq!(devices_of(&got).len(), 1);
                }
            }
        }

        #[test]
        fn stays_on_the_target_node_when_it_has_room((req, loads) in arb_case()) {
            prop_assume!(req.must_include.is_empty());
            let Some(target) = target_numa_for_test(&req, &loads) else { return Ok(()) };
            let numa_of = |d: &str| loads.iter().find(|l| l.device == d).map(|l| l.numa).unwrap_or_default();
            let room = req.available.iter().filter(|s| numa_of(&s.device) == target).count();
            if room >= req.size {
                let got = preferred_allocation(&req, &loads);
                prop_assert!(got.iter().all(|s| numa_of(&s.device) == target));
            }
        }

        #[test]
        fn single_slot_goes_to_a_least_used_device_of_the_target_node((req, loads) in arb_case()) {
            prop_assume!(req.must_include.is_empty());
            let req = PreferenceRequest { size: 1, ..req };
            let got = preferred_allocation(&req, &loads);
            let Some(first) = got.first() else { return Ok(()) };
            let target = target_numa_for_test(&req, &loads);
            let offered: BTreeSet<&str> = req.available.iter().map(|s| s.device.as_str()).collect();
            let eligible: Vec<&DeviceLoad> = loads.iter().filter(|l| offered.contains(l.device.as_str()) && target.is_none_or(|t| l.numa == t)).collect();
            let min_used = eligible.iter().map(|l| l.used).min().unwrap_or(0);
            let chosen = loads.iter().find(|l| l.device == first.device).unwrap();
            prop_assert_eq!(chosen.used, min_used);
        }
    }

    /// Independent restatement of the target-node rule for the properties: the known node with
    /// the most offered slots, ties to the lower node.
    fn target_numa_for_test(req: &PreferenceRequest, loads: &[DeviceLoad]) -> Option<NumaNode> {
        let mut count: BTreeMap<u32, usize> = BTreeMap::new();
        for s in &req.available {
            if let Some(n) = loads
                .iter()
                .find(|l| l.device == s.device)
                .and_then(|l| l.numa.0)
            {
                *count.entry(n).or_default() += 1;
            }
        }
        let best = count.values().copied().max()?;
        count
            .iter()
            .find(|(_, c)| **c == best)
            .map(|(n, _)| NumaNode(Some(*n)))
    }
}
