//! Fuzzing what the DRA driver reads that a broken node or a hostile claim can hand it: its
//! checkpoint file (a snapshot line and the journal's records, left on the kubelet's disk by a
//! crash, a power loss, a full disk, or anyone who can write there) and the quantities of a
//! ResourceClaim's consumed capacity.
//!
//! - `Checkpoint::parse` over arbitrary bytes, over a real checkpoint (snapshot and records, as
//!   `save` and the journal write them) with bytes flipped, inserted, deleted and cut, and over
//!   well-formed checkpoints with hostile numbers; then what the driver computes from one
//!   (`used`, `claims_by_device`): no panic, and sums that saturate instead of overflowing
//!   (checked against sums made here in u128).
//! - `Checkpoint::load_since` over the same bytes in a file: a result, never a panic; a corrupt
//!   file is left in place unless it predates the boot.
//! - `quantity::parse` against an oracle of the grammar (digits and one of the suffixes).
//! - Claim UIDs (from NodePrepareResources) accepted by `cdi::valid_uid` name a spec file inside
//!   the CDI directory, never outside it.

use erdma_dra::cdi::RdmaLimits;
use erdma_dra::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice, Record, claims_by_device};
use erdma_model::quantity;
use proptest::prelude::*;
use proptest::sample::Index;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn device(device: &str, shares: u64, handle: u64, object: u64) -> PreparedDevice {
    PreparedDevice {
        request: "rdma".into(),
        pool: "node-a".into(),
        device: device.into(),
        ibdev: device.replace('-', "_"),
        cdi_ids: vec![format!("erdma.alibabacloud.com/claim=uid-{device}")],
        share_id: None,
        shares,
        limits: RdmaLimits {
            hca_handle: handle,
            hca_object: object,
        },
        admin: false,
    }
}

fn claim(name: &str, devices: Vec<PreparedDevice>) -> PreparedClaim {
    PreparedClaim {
        namespace: "team-a".into(),
        name: name.into(),
        devices,
        cdi_spec: PathBuf::from(format!(
            "/var/run/cdi/erdma.alibabacloud.com-claim_{name}.json"
        )),
    }
}

/// A checkpoint file as the driver leaves it: a snapshot, then journal records.
fn real_file() -> Vec<u8> {
    let cp = Checkpoint {
        version: 2,
        claims: BTreeMap::from([(
            "uid-a".to_string(),
            claim("a", vec![device("erdma-0", 1, 2, 1000)]),
        )]),
    };
    let mut text = serde_json::to_vec(&cp).expect("snapshot");
    text.push(b'\n');
    for r in [
        Record::Prepared {
            uid: "uid-b".into(),
            claim: claim(
                "b",
                vec![device("erdma-0", 3, 1, 10), device("erdma-1", 1, 1, 1)],
            ),
        },
        Record::Unprepared {
            uid: "uid-a".into(),
        },
    ] {
        text.extend(serde_json::to_vec(&r).expect("record"));
        text.push(b'\n');
    }
    text
}

fn mutated_file() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..4), 1..8).prop_map(|edits| {
        let mut b = real_file();
        for (i, byte, op) in edits {
            let p = i.index(b.len() + 1);
            match op {
                0 if p < b.len() => b[p] = byte,
                1 if p < b.len() => {
                    b.remove(p);
                }
                2 => b.truncate(p),
                _ => b.insert(p, byte),
            }
        }
        b
    })
}

fn big() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..10,
        Just(u64::MAX),
        Just(u64::MAX / 2 + 1),
        any::<u64>()
    ]
}

/// Well-formed checkpoints with hostile numbers and names, as a file.
fn hostile_file() -> impl Strategy<Value = (Vec<u8>, Checkpoint)> {
    let dev = (
        prop::sample::select(vec!["erdma-0", "erdma-1", "", "erdma-0 "]),
        big(),
        big(),
        big(),
    )
        .prop_map(|(d, s, h, o)| device(d, s, h, o));
    let claims = prop::collection::btree_map(
        prop::sample::select(vec!["uid-a", "uid-b", "uid-c", ""]).prop_map(str::to_string),
        (
            prop::sample::select(vec!["a", "b", ""]),
            prop::collection::vec(dev, 0..4),
        )
            .prop_map(|(n, d)| claim(n, d)),
        0..4,
    );
    (claims, prop_oneof![Just(1u32), Just(2u32), any::<u32>()]).prop_map(|(claims, version)| {
        let cp = Checkpoint { version, claims };
        let mut text = serde_json::to_vec(&cp).expect("snapshot");
        text.push(b'\n');
        (text, cp)
    })
}

/// What the driver computes from a parsed checkpoint, checked against u128 sums.
fn check_use(cp: &Checkpoint) -> Result<(), TestCaseError> {
    for except in [None, cp.claims.keys().next().map(String::as_str)] {
        let used = cp.used(except);
        for (dev, u) in &used {
            let (mut s, mut h, mut o, mut n) = (0u128, 0u128, 0u128, 0usize);
            for (uid, c) in &cp.claims {
                if Some(uid.as_str()) == except {
                    continue;
                }
                let mine: Vec<&PreparedDevice> =
                    c.devices.iter().filter(|d| &d.device == dev).collect();
                for d in &mine {
                    s += u128::from(d.shares);
                    h += u128::from(d.limits.hca_handle);
                    o += u128::from(d.limits.hca_object);
                }
                n += usize::from(!mine.is_empty());
            }
            let sat = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
            prop_assert_eq!(u.shares, sat(s), "shares of {}", dev);
            prop_assert_eq!(u.hca_handle, sat(h));
            prop_assert_eq!(u.hca_object, sat(o));
            prop_assert_eq!(u.claims, n);
        }
    }
    for holders in claims_by_device(cp).values() {
        let mut sorted = holders.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(&sorted, holders);
    }
    Ok(())
}

/// Parses, uses, and loads `text` from a file.
fn check_file(text: &[u8]) -> Result<Option<Checkpoint>, TestCaseError> {
    let parsed = Checkpoint::parse(text).ok();
    if let Some(cp) = &parsed {
        check_use(cp)?;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("checkpoint.json");
    std::fs::write(&path, text).expect("write");
    // Unknown boot time: a corrupt file is an error and stays where it is.
    match Checkpoint::load_since(&path, None) {
        Ok(cp) => {
            prop_assert!(parsed.is_some());
            prop_assert!((1..=2).contains(&cp.version));
        }
        Err(_) => prop_assert_eq!(std::fs::read(&path).expect("still there"), text),
    }
    Ok(parsed)
}

/// The oracle's quantity: digits, then nothing or one suffix; the value in u128.
fn expected_quantity(q: &str) -> Option<u64> {
    let t = q.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let mult: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    let n = digits.bytes().try_fold(0u128, |a, d| {
        a.checked_mul(10)?.checked_add(u128::from(d - b'0'))
    })?;
    u64::try_from(n.checked_mul(mult)?).ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_from_arbitrary_bytes(text in prop::collection::vec(any::<u8>(), 0..512)) {
        check_file(&text)?;
    }

    #[test]
    fn checkpoint_mutated(text in mutated_file()) {
        check_file(&text)?;
    }

    /// Well-formed files with hostile numbers parse to exactly what was written.
    #[test]
    fn checkpoint_with_hostile_numbers((text, cp) in hostile_file()) {
        let parsed = check_file(&text)?;
        prop_assert_eq!(parsed.as_ref(), Some(&cp));
    }

    /// Claim UIDs from the kubelet's NodePrepareResources become file and CDI device names: an
    /// accepted UID keeps the spec file directly inside the CDI directory.
    #[test]
    fn claim_uids_stay_file_names(uid in prop_oneof![any::<String>(), "[a-zA-Z0-9._/-]{0,12}", Just("..".to_string()), Just("a/../../etc".to_string())]) {
        let dir = std::path::Path::new("/var/run/cdi");
        if erdma_dra::cdi::valid_uid(&uid) {
            prop_assert!(!uid.contains('/') && uid.len() <= 128);
            let p = erdma_dra::cdi::spec_path(dir, "erdma.alibabacloud.com", &uid);
            prop_assert_eq!(p.parent(), Some(dir));
            prop_assert!(p.components().all(|c| !matches!(c, std::path::Component::ParentDir)));
        }
    }

    #[test]
    fn quantities(q in prop_oneof![
        any::<String>(),
        "[0-9]{0,22}(k|M|G|T|Ki|Mi|Gi|Ti|m|Ei|)",
        "[ ]?[0-9]{1,5}[a-zA-Z]{0,2}[ ]?",
    ]) {
        prop_assert_eq!(quantity::parse(&q).ok(), expected_quantity(&q), "{:?}", q);
    }
}

#[test]
fn the_real_file_reads_with_its_records_applied() {
    let cp = Checkpoint::parse(&real_file()).expect("parses");
    assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["uid-b"]);
    let used = cp.used(None);
    assert_eq!(used["erdma-0"].shares, 3);
}

/// Found by `checkpoint_with_hostile_numbers`: two claims whose shares (or limits) add up past
/// u64::MAX overflowed in `used` (a panic in debug builds; in release a wrapped, small sum, so
/// capacity held by prepared claims read as free). The sums now saturate.
#[test]
fn huge_holdings_saturate() {
    let cp = Checkpoint {
        version: 2,
        claims: BTreeMap::from([
            (
                "a".to_string(),
                claim("a", vec![device("erdma-0", u64::MAX, u64::MAX, 1)]),
            ),
            (
                "b".to_string(),
                claim("b", vec![device("erdma-0", 2, 2, u64::MAX)]),
            ),
        ]),
    };
    let u = cp.used(None)["erdma-0"];
    assert_eq!(
        (u.shares, u.hca_handle, u.hca_object),
        (u64::MAX, u64::MAX, u64::MAX)
    );
}
