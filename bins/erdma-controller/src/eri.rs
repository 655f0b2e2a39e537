//! ERI selection (pure): which ENIs a node uses per network card, which to convert and which to
//! create, from `DescribeInstanceTypes` and `DescribeNetworkInterfaces` answers, following the
//! original's rules (`internal/controller/eri.go`).

use erdma_cloud::ecs::{InstanceType, NetworkInterface};
use erdma_k8s::labels::{TAG_CREATOR, TAG_CREATOR_VALUE, TAG_INSTANCE_ID, TAG_TERWAY_EXCLUDED};
use std::collections::BTreeMap;

/// What to do for one card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CardPlan {
    /// Use this ERI as it is.
    Reuse(NetworkInterface),
    /// Convert the primary ENI to `HighPerformance` with this many queue pairs (card 0).
    ConvertPrimary(NetworkInterface, i64),
    /// Use this detached ERI, created and tagged for this instance earlier by this controller
    /// (e.g. before a restart or a node re-registration); the device reconciler attaches it.
    Attach(NetworkInterface),
    /// Create a new ERI with this many queue pairs.
    Create(i64),
}

/// Why a node gets no ERIs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The instance type has no eRDMA.
    #[error(
        "instance type {0} does not support eRDMA (EriQuantity is 0 or absent): node not support erdma"
    )]
    NotSupported(String),
    /// Card 0 has no ERI and the instance has no primary ENI to convert.
    #[error("instance {0} has no primary ENI to convert for card 0")]
    NoPrimary(String),
    /// The ERIs already on the instance use its whole queue-pair budget and none of them can be
    /// used: nothing is created (as the original).
    #[error(
        "instance {instance}: its ERIs already use {used} of the {budget} queue pairs the instance type allows and none is usable here; nothing created. Fix: free an ERI (or set manageNonOwnedENIs: true to use the existing ones)"
    )]
    NoQueuePairs {
        /// The instance.
        instance: String,
        /// Queue pairs of the HighPerformance ENIs on it.
        used: i64,
        /// The type's budget.
        budget: i64,
    },
}

/// Number of cards to give an ERI: 1 when the type has < 2 cards, else min(cards, EriQuantity).
pub fn cards_for(t: &InstanceType) -> Result<i64, SelectError> {
    let eri = t.eri_quantity.unwrap_or(0);
    if eri <= 0 {
        return Err(SelectError::NotSupported(t.instance_type_id.clone()));
    }
    Ok(if t.network_card_quantity < 2 {
        1
    } else {
        t.network_card_quantity.min(eri)
    })
}

/// Whether the controller may use this HighPerformance ENI: created by it, tagged by it, the
/// primary ENI (converted by it), or any when `manage_non_owned`.
pub fn manageable(eni: &NetworkInterface, manage_non_owned: bool) -> bool {
    manage_non_owned
        || eni.is_primary()
        || eni.tags.get(TAG_CREATOR).map(String::as_str) == Some(TAG_CREATOR_VALUE)
        || eni.tags.get(TAG_TERWAY_EXCLUDED).map(String::as_str) == Some("true")
}

/// Whether `eni` is a detached ERI this controller created for `instance_id` (tags `creator` and
/// `instance-id`), so it may be attached again instead of creating another.
pub fn reusable_detached(eni: &NetworkInterface, instance_id: &str) -> bool {
    eni.status == "Available"
        && eni.instance_id.is_empty()
        && eni.is_high_performance()
        && eni.tags.get(TAG_CREATOR).map(String::as_str) == Some(TAG_CREATOR_VALUE)
        && eni.tags.get(TAG_INSTANCE_ID).map(String::as_str) == Some(instance_id)
}

/// The plan per card index (0..cards).
///
/// `enis` are the instance's ENIs; `detached` the ENIs tagged `creator` + `instance-id` for it
/// (any state; only [`reusable_detached`] ones are used, for cards other than 0, before creating).
/// Queue pairs, as the original: the budget is the type's `QueuePairNumber` (times the cards on
/// GPU types); every HighPerformance ENI on the instance counts against it (ours or not); what
/// is left is split over the cards still missing an ERI; when nothing is left, nothing is
/// converted or created ([`SelectError::NoQueuePairs`] when no card has an ERI at all).
pub fn plan(
    instance_id: &str,
    t: &InstanceType,
    enis: &[NetworkInterface],
    detached: &[NetworkInterface],
    manage_non_owned: bool,
) -> Result<BTreeMap<i64, CardPlan>, SelectError> {
    let cards = cards_for(t)?;
    let budget = if t.gpu_amount > 0 {
        t.queue_pair_number * cards
    } else {
        t.queue_pair_number
    };
    let used: i64 = enis
        .iter()
        .filter(|e| e.is_high_performance() && e.instance_id == instance_id)
        .map(|e| e.queue_pair_number.unwrap_or(0))
        .sum();
    let mut out = BTreeMap::new();
    for card in 0..cards {
        let existing = enis
            .iter()
            .filter(|e| {
                e.is_high_performance()
                    && e.network_card_index == card
                    && e.instance_id == instance_id
            })
            .filter(|e| manageable(e, manage_non_owned))
            .min_by(|a, b| (!a.is_primary(), &a.id).cmp(&(!b.is_primary(), &b.id)));
        if let Some(e) = existing {
            out.insert(card, CardPlan::Reuse(e.clone()));
        }
    }
    let missing: Vec<i64> = (0..cards).filter(|c| !out.contains_key(c)).collect();
    if missing.is_empty() {
        return Ok(out);
    }
    let per_card = (budget - used) / missing.len() as i64;
    if per_card <= 0 {
        if out.is_empty() {
            return Err(SelectError::NoQueuePairs {
                instance: instance_id.to_string(),
                used,
                budget,
            });
        }
        return Ok(out);
    }
    let mut spare: Vec<&NetworkInterface> = detached
        .iter()
        .filter(|e| reusable_detached(e, instance_id))
        .collect();
    spare.sort_by(|a, b| a.id.cmp(&b.id));
    let mut spare = spare.into_iter();
    for card in missing {
        if card == 0 {
            let primary = enis
                .iter()
                .find(|e| e.is_primary() && e.instance_id == instance_id)
                .ok_or_else(|| SelectError::NoPrimary(instance_id.to_string()))?;
            out.insert(0, CardPlan::ConvertPrimary(primary.clone(), per_card));
        } else if let Some(e) = spare.next() {
            out.insert(card, CardPlan::Attach(e.clone()));
        } else {
            out.insert(card, CardPlan::Create(per_card));
        }
    }
    Ok(out)
}

/// Whether the plan creates an ERI (then the detached ones are worth looking up first).
pub fn creates(plan: &BTreeMap<i64, CardPlan>) -> bool {
    plan.values().any(|p| matches!(p, CardPlan::Create(_)))
}

/// Tags set on a created ERI.
pub fn creation_tags(instance_id: &str) -> BTreeMap<String, String> {
    let mut t = terway_tags(instance_id);
    t.insert(TAG_CREATOR.into(), TAG_CREATOR_VALUE.into());
    t
}

/// Tags set (best-effort) on every selected ERI: `excluded` + `instance-id`, never `creator`.
pub fn terway_tags(instance_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TAG_TERWAY_EXCLUDED.to_string(), "true".to_string()),
        (TAG_INSTANCE_ID.to_string(), instance_id.to_string()),
    ])
}

/// The name of a created ERI.
pub fn eri_name(instance_id: &str, card: i64) -> String {
    format!("eri-{instance_id}-{card}")
}

/// The ClientToken of the creation of the ERI of `card`: stable across retries and restarts,
/// so a creation whose answer was lost is not repeated.
pub fn client_token(instance_id: &str, card: i64) -> String {
    let mut t = format!("erdma-{instance_id}-{card}");
    t.truncate(64);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(eri: Option<i64>, cards: i64, qp: i64, gpus: i64) -> InstanceType {
        InstanceType {
            instance_type_id: "ecs.x".into(),
            eri_quantity: eri,
            network_card_quantity: cards,
            queue_pair_number: qp,
            gpu_amount: gpus,
        }
    }

    fn eni(
        id: &str,
        kind: &str,
        mode: &str,
        card: i64,
        qp: Option<i64>,
        tags: &[(&str, &str)],
    ) -> NetworkInterface {
        NetworkInterface {
            id: id.into(),
            status: "InUse".into(),
            kind: kind.into(),
            mac: format!("00:16:3e:00:00:{}", &id[id.len() - 2..]),
            instance_id: "i-1".into(),
            traffic_mode: mode.into(),
            queue_pair_number: qp,
            network_card_index: card,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            name: String::new(),
        }
    }

    #[test]
    fn card_count_follows_the_original() {
        assert_eq!(cards_for(&t(Some(1), 1, 8, 0)), Ok(1));
        assert_eq!(cards_for(&t(Some(2), 0, 8, 0)), Ok(1));
        assert_eq!(cards_for(&t(Some(2), 4, 8, 0)), Ok(2));
        assert_eq!(cards_for(&t(Some(8), 2, 8, 8)), Ok(2));
        assert!(matches!(
            cards_for(&t(None, 2, 8, 0)),
            Err(SelectError::NotSupported(_))
        ));
        assert!(matches!(
            cards_for(&t(Some(0), 2, 8, 0)),
            Err(SelectError::NotSupported(_))
        ));
    }

    #[test]
    fn fresh_single_card_instance_converts_the_primary() {
        let enis = [eni("eni-01", "Primary", "Standard", 0, None, &[])];
        let p = plan("i-1", &t(Some(1), 1, 8, 0), &enis, &[], true).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[&0], CardPlan::ConvertPrimary(enis[0].clone(), 8));
    }

    #[test]
    fn gpu_types_get_the_budget_per_card_and_create_other_cards() {
        let enis = [eni("eni-01", "Primary", "Standard", 0, None, &[])];
        let p = plan("i-1", &t(Some(2), 2, 16, 8), &enis, &[], true).unwrap();
        assert_eq!(p[&0], CardPlan::ConvertPrimary(enis[0].clone(), 16));
        assert_eq!(p[&1], CardPlan::Create(16));
    }

    #[test]
    fn existing_eris_are_reused_and_the_rest_of_the_budget_split() {
        let enis = [
            eni("eni-01", "Primary", "Standard", 0, None, &[]),
            eni(
                "eni-02",
                "Secondary",
                "HighPerformance",
                0,
                Some(10),
                &[(TAG_CREATOR, TAG_CREATOR_VALUE)],
            ),
        ];
        let p = plan("i-1", &t(Some(2), 2, 16, 8), &enis, &[], false).unwrap();
        assert_eq!(p[&0], CardPlan::Reuse(enis[1].clone()));
        assert_eq!(
            p[&1],
            CardPlan::Create(22),
            "32 - 10 left for the one missing card"
        );
    }

    #[test]
    fn non_owned_eris_are_adopted_only_when_allowed() {
        let enis = [
            eni("eni-01", "Primary", "Standard", 0, None, &[]),
            eni(
                "eni-03",
                "Secondary",
                "HighPerformance",
                0,
                Some(8),
                &[("owner", "someone")],
            ),
        ];
        assert_eq!(
            plan("i-1", &t(Some(1), 1, 8, 0), &enis, &[], true).unwrap()[&0],
            CardPlan::Reuse(enis[1].clone())
        );
        // Not ours and not allowed: it still holds the instance's 8 queue pairs, so there is
        // nothing left to convert the primary with (the original creates nothing either).
        assert_eq!(
            plan("i-1", &t(Some(1), 1, 8, 0), &enis, &[], false),
            Err(SelectError::NoQueuePairs {
                instance: "i-1".into(),
                used: 8,
                budget: 8
            })
        );
    }

    #[test]
    fn a_used_up_budget_creates_nothing_but_keeps_what_is_there() {
        // GPU type, 2 cards x 16 = 32; card 0's ERI holds 20 and a non-owned one 12.
        let enis = [
            eni("eni-01", "Primary", "Standard", 0, None, &[]),
            eni(
                "eni-02",
                "Secondary",
                "HighPerformance",
                0,
                Some(20),
                &[(TAG_CREATOR, TAG_CREATOR_VALUE)],
            ),
            eni(
                "eni-03",
                "Secondary",
                "HighPerformance",
                1,
                Some(12),
                &[("owner", "someone")],
            ),
        ];
        let p = plan("i-1", &t(Some(2), 2, 16, 8), &enis, &[], false).unwrap();
        assert_eq!(p.len(), 1, "card 1 gets nothing: {p:?}");
        assert_eq!(p[&0], CardPlan::Reuse(enis[1].clone()));
        assert!(!creates(&p));
    }

    fn detached(id: &str, instance: &str, qp: i64) -> NetworkInterface {
        let mut e = eni(
            id,
            "Secondary",
            "HighPerformance",
            0,
            Some(qp),
            &[
                (TAG_CREATOR, TAG_CREATOR_VALUE),
                (TAG_INSTANCE_ID, instance),
            ],
        );
        e.status = "Available".into();
        e.instance_id = String::new();
        e
    }

    #[test]
    fn detached_eris_created_for_this_instance_are_attached_instead_of_creating() {
        let enis = [eni("eni-01", "Primary", "Standard", 0, None, &[])];
        let mine = detached("eni-09", "i-1", 16);
        let other = detached("eni-08", "i-2", 16);
        let mut in_use_elsewhere = detached("eni-07", "i-1", 16);
        in_use_elsewhere.status = "InUse".into();
        in_use_elsewhere.instance_id = "i-3".into();
        let mut untagged = detached("eni-06", "i-1", 16);
        untagged.tags.remove(TAG_CREATOR);
        let p = plan(
            "i-1",
            &t(Some(2), 2, 16, 8),
            &enis,
            &[other, in_use_elsewhere, untagged, mine.clone()],
            false,
        )
        .unwrap();
        assert_eq!(p[&0], CardPlan::ConvertPrimary(enis[0].clone(), 16));
        assert_eq!(p[&1], CardPlan::Attach(mine));
        assert!(!creates(&p));
        // Without one, card 1 is created.
        let p = plan("i-1", &t(Some(2), 2, 16, 8), &enis, &[], false).unwrap();
        assert_eq!(p[&1], CardPlan::Create(16));
    }

    #[test]
    fn no_primary_is_an_error_naming_the_instance() {
        let e = plan("i-1", &t(Some(1), 1, 8, 0), &[], &[], true).unwrap_err();
        assert!(e.to_string().contains("i-1"));
    }

    #[test]
    fn tags_and_tokens() {
        let c = creation_tags("i-1");
        assert_eq!(
            c.get("creator").map(String::as_str),
            Some("alibabacloud-erdma-controller")
        );
        assert_eq!(
            c.get("terway.alibabacloud.com/excluded")
                .map(String::as_str),
            Some("true")
        );
        assert!(!terway_tags("i-1").contains_key("creator"));
        assert_eq!(eri_name("i-1", 2), "eri-i-1-2");
        assert!(client_token(&"i".repeat(80), 1).len() <= 64);
    }
}
