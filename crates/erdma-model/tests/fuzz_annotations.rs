//! Fuzzing the parsers of values users and other components write where a hostile or broken
//! node (or pod author) controls the text: pod annotations (`network.alibabacloud.com/erdma-smcr`,
//! `network.alibabacloud.com/erdma-rdma-max`), the kubelet's device IDs (slot IDs, foreign IDs),
//! socket file names in the device-plugin directory, `SMCR_PNET`, and the install values that
//! reach the agent as flags (`exposedLocalERIs`, memlock, installer version, SHA-256 pin, base
//! URL, jumbo MTU, instance IDs).
//!
//! Inputs: arbitrary Unicode, arbitrary bytes made text, and valid values mutated. Each parser
//! must return without panicking, agree with an oracle written here from the documented grammar,
//! and keep error texts bounded (the parsers that quote their input cut it, or quote it once).

use erdma_model::coexistence::{OtherPlugin, classify_socket, foreign_device_ids};
use erdma_model::installer::{InstallerVersion, Sha256Pin, check_base_url};
use erdma_model::names::{check_jumbo_mtu, is_instance_id, parse_smcr};
use erdma_model::rdma_limit::{Limit, Memlock, RdmaLimit};
use erdma_model::{EriSelector, PnetId, SlotId};
use proptest::prelude::*;
use proptest::sample::Index;
use std::collections::BTreeSet;

/// Text edits of valid values; positions relative to the current length.
#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, String),
    Delete(Index, usize),
    Duplicate(Index, usize),
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>().prop_map(|s| s.chars().take(4).collect()),
        prop::sample::select(vec![
            " ",
            "\t",
            "\n",
            "\0",
            "=",
            "/",
            ",",
            "#",
            "*",
            "-",
            "+",
            "0",
            "00",
            "max",
            "i-",
            "4294967296",
            "2147483648",
            "99999999999999999999",
            "é",
            "\u{200b}",
            "K",
            "T",
            ":",
        ])
        .prop_map(str::to_string),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), piece()).prop_map(|(i, p)| Edit::Insert(i, p)),
        (any::<Index>(), 0usize..6).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), 0usize..30).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ]
}

fn apply(s: &str, edits: &[Edit]) -> String {
    let mut c: Vec<char> = s.chars().collect();
    for e in edits {
        let at = |i: &Index, len: usize| i.index(len + 1);
        match e {
            Edit::Insert(i, p) => {
                let at = at(i, c.len());
                c.splice(at..at, p.chars());
            }
            Edit::Delete(i, n) => {
                let at = at(i, c.len());
                c.drain(at..(at + n).min(c.len()));
            }
            Edit::Duplicate(i, n) => {
                let at = at(i, c.len());
                let end = (at + n).min(c.len());
                let copy: Vec<char> = c[at..end].to_vec();
                c.splice(end..end, copy);
            }
        }
    }
    c.into_iter().collect()
}

/// Arbitrary text, or one of `valid` mutated.
fn text(valid: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        1 => prop::collection::vec(any::<u8>(), 0..80)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => prop::sample::select(valid).prop_map(str::to_string),
        4 => (prop::sample::select(valid), prop::collection::vec(edit(), 1..5))
            .prop_map(|(v, e)| apply(v, &e)),
    ]
}

/// Bound of an error text that quotes its input once with `{:?}` (at most 10 bytes per char,
/// `\u{10ffff}`) around a fixed explanation.
fn quoted_bound(input: &str) -> usize {
    600 + 10 * input.chars().count()
}

/// The oracle's unsigned decimal: ASCII digits only, saturating at 2^80 (so that a K/M/G/T shift stays
/// inside u128).
fn digits(s: &str) -> Option<u128> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| {
        s.bytes()
            .fold(0u128, |a, d| (a * 10 + u128::from(d - b'0')).min(1 << 80))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// `network.alibabacloud.com/erdma-smcr`: exactly Go's ParseBool spellings, blanks around.
    #[test]
    fn smcr_annotation(v in text(&["true", "false", "1", "0", "True", "FALSE", "t", "F"])) {
        let yes = ["1", "t", "T", "TRUE", "true", "True"];
        let no = ["0", "f", "F", "FALSE", "false", "False"];
        match parse_smcr(&v) {
            Ok(b) => prop_assert!(if b { yes.contains(&v.trim()) } else { no.contains(&v.trim()) }, "{:?}", v),
            Err(e) => {
                prop_assert!(!yes.contains(&v.trim()) && !no.contains(&v.trim()));
                prop_assert!(e.len() <= quoted_bound(&v));
            }
        }
    }

    /// `network.alibabacloud.com/erdma-rdma-max`: key=value pairs, each key once, values a count
    /// up to i32::MAX without leading zeros, or max.
    #[test]
    fn rdma_max_annotation(v in text(&["hca_handle=2 hca_object=2000", "hca_handle=max", "hca_object=0", " hca_object=max  hca_handle=1 "])) {
        match RdmaLimit::parse(&v) {
            Ok(l) => {
                prop_assert!(l.hca_handle.is_some() || l.hca_object.is_some());
                let parts: Vec<&str> = v.split_ascii_whitespace().collect();
                prop_assert!(parts.len() <= 2);
                for p in parts {
                    let (k, val) = p.split_once('=').expect("key=value");
                    prop_assert!(k == "hca_handle" || k == "hca_object");
                    let n = digits(val);
                    prop_assert!(val == "max" || n.is_some_and(|n| n <= i32::MAX as u128 && (val.len() == 1 || !val.starts_with('0'))), "{:?}", v);
                }
                for lim in [l.hca_handle, l.hca_object].into_iter().flatten() {
                    if let Limit::Count(n) = lim {
                        prop_assert!(n <= i32::MAX as u32);
                    }
                }
                // What the agent writes to rdma.max reads back as the same limit.
                let line = l.line("erdma_0");
                let back = line.strip_prefix("erdma_0").expect("device first");
                prop_assert_eq!(RdmaLimit::parse(back), Ok(l));
            }
            Err(e) => {
                // The value is quoted cut to 120 characters.
                prop_assert!(e.value.chars().count() <= 120);
                prop_assert!(e.to_string().len() <= 600 + 10 * 120 + quoted_bound(&e.why));
            }
        }
    }

    /// `--nri-memlock` / install value: off, unlimited, or bytes with an optional K/M/G/T.
    #[test]
    fn memlock(v in text(&["off", "unlimited", "64G", "1024", "8k", "16T"])) {
        let t = v.trim();
        let expected: Option<Option<u128>> = match t {
            "off" => Some(None),
            "unlimited" => Some(Some(u64::MAX as u128)),
            _ => {
                let (num, shift) = match t.chars().last() {
                    Some('K' | 'k') => (&t[..t.len() - 1], 10),
                    Some('M' | 'm') => (&t[..t.len() - 1], 20),
                    Some('G' | 'g') => (&t[..t.len() - 1], 30),
                    Some('T' | 't') => (&t[..t.len() - 1], 40),
                    _ => (t, 0),
                };
                digits(num).map(|n| n << shift).filter(|n| *n <= u64::MAX as u128).map(Some)
            }
        };
        match Memlock::parse(&v) {
            Ok(m) => prop_assert_eq!(Some(m.value().map(u128::from)), expected, "{:?}", v),
            Err(e) => {
                prop_assert_eq!(expected, None, "{:?}", v);
                prop_assert!(e.len() <= quoted_bound(&v));
            }
        }
    }

    /// Device IDs from the kubelet (Allocate, pod-resources): `<device>/<index>`.
    #[test]
    fn slot_id(v in text(&["erdma_0/0", "erdma_1/15", "rxe0/3", "mlx5_0/99"])) {
        match SlotId::parse(&v) {
            Ok(s) => {
                prop_assert!(v.len() <= 63);
                prop_assert_eq!(s.to_string(), v);
            }
            Err(e) => prop_assert!(e.id.chars().count() <= 80),
        }
    }

    /// IDs the kubelet holds that are not erdma's: never more than it holds, each one of them.
    #[test]
    fn foreign_ids(ids in prop::collection::vec(text(&["erdma_0/0", "erdma_1/2", "other-1", "erdma_9/1"]), 0..20)) {
        let served: BTreeSet<String> = ["erdma_0".to_string(), "erdma_1".to_string()].into();
        let foreign = foreign_device_ids(ids.iter().map(String::as_str), &served);
        prop_assert!(foreign.len() <= ids.len());
        for f in &foreign {
            prop_assert!(ids.contains(f));
        }
    }

    /// `SMCR_PNET` and PNET IDs from the API: 1-16 ASCII letters or digits, upper-cased.
    #[test]
    fn pnet_id(v in text(&["00163E0A1B2C", "abc", "0123456789abcdef"])) {
        let t = v.trim();
        let valid = (1..=16).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric());
        match PnetId::parse(&v) {
            Ok(p) => {
                prop_assert!(valid);
                prop_assert_eq!(p.as_str(), t.to_ascii_uppercase());
            }
            Err(_) => prop_assert!(!valid),
        }
    }

    /// `exposedLocalERIs` (values file, flag): entries of an instance and device patterns; a
    /// parsed selector answers any question without panicking.
    #[test]
    fn eri_selector(v in text(&["i-abc erdma_0/erdma_1", "i-* erdma_*", "# comment\ni-x1 *,i-y2 erdma_0", ""]),
                    instance in text(&["i-abc", "i-x1"]), device in text(&["erdma_0", "erdma_1"])) {
        if let Ok(sel) = EriSelector::parse(&v) {
            let separators = v.matches([',', '\n']).count();
            prop_assert!(sel.entries().len() <= separators + 1);
            let _ = sel.selects(&instance, &device);
            let _ = sel.exposure(&instance);
        }
    }

    #[test]
    fn instance_id(v in text(&["i-2ze0abcdefghijk", "i-x"])) {
        let valid = v.len() <= 64
            && v.strip_prefix("i-").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        prop_assert_eq!(is_instance_id(&v), valid);
    }

    #[test]
    fn installer_values(version in text(&["1.5.9", "1.4.3.1"]), pin in text(&["sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"]),
                        url in text(&["https://mirrors.cloud.aliyuncs.com/erdma", "http://x"]), insecure in any::<bool>()) {
        let v_ok = !version.is_empty() && version.split('.').all(|p| (1..=6).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
        prop_assert_eq!(InstallerVersion::parse(&version).is_ok(), v_ok);
        let t = pin.trim();
        let hex = t.strip_prefix("sha256:").unwrap_or(t);
        prop_assert_eq!(Sha256Pin::parse(&pin).is_ok(), hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        if check_base_url(&url, insecure).is_ok() {
            prop_assert!(url.starts_with("https://") || (insecure && url.starts_with("http://")));
            prop_assert!(!url.chars().any(char::is_whitespace));
        }
    }

    #[test]
    fn jumbo_mtu(mtu in any::<i64>()) {
        match check_jumbo_mtu(mtu) {
            Ok(m) => prop_assert!((1280..=9000).contains(&mtu) && i64::from(m) == mtu),
            Err(_) => prop_assert!(!(1280..=9000).contains(&mtu)),
        }
    }

    /// File names in the device-plugin directory: only `<digits>-erdma.sock` and
    /// `<digits>-erdma-eni.sock` are another plugin's.
    #[test]
    fn plugin_socket_names(name in text(&["1700000000-erdma.sock", "1700000000-erdma-eni.sock", "kubelet.sock", "erdma-aliyun_erdma-erdma.sock"])) {
        let own = "erdma-aliyun_erdma-erdma.sock";
        let stamped = |suffix: &str| name.strip_suffix(suffix).and_then(digits).is_some();
        match classify_socket(&name, own) {
            Some(OtherPlugin::Terway) => prop_assert!(stamped("-erdma-eni.sock")),
            Some(OtherPlugin::OriginalAgent) => prop_assert!(stamped("-erdma.sock")),
            None => prop_assert!(name == own || (!stamped("-erdma-eni.sock") && !stamped("-erdma.sock"))),
        }
    }
}
