//! The `exposedLocalERIs` allow-list (`--exposed-local-eris`, chart value `agent.exposedLocalERIs`).
//!
//! Each entry is `<instance> <device>[/<device>…]`, where `<instance>` is an ECS instance ID
//! (`i-bp1abc`) or `i-*`, and each device is an RDMA device name that may contain `*` wildcards.
//! Entries are separated by commas (flag form) or new lines (config-file form).
//!
//! Precedence is the original's: an entry for this exact instance wins; otherwise the **last** `i-*`
//! entry applies; an empty list exposes every device. Unlike the original, `i-* erdma_*` works (the
//! README promised it, the regex rejected it), any run of spaces or tabs separates the two fields
//! (a tab made the original panic), and every error names the entry number, the value and the form.

use serde::Serialize;

/// Which instances an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InstancePattern {
    /// One instance ID.
    Exact(String),
    /// `i-*`: every instance without an exact entry.
    Any,
}

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EriEntry {
    /// The instance part.
    pub instance: InstancePattern,
    /// Device-name patterns (may contain `*`).
    pub devices: Vec<String>,
}

/// A parsed allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EriSelector {
    entries: Vec<EriEntry>,
}

/// What the list exposes on one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposure<'a> {
    /// The list is empty: every device.
    All,
    /// Devices matching these patterns.
    Only(&'a [String]),
    /// The list has entries but none for this instance: no device (the original's behaviour; a
    /// chart default of `i-XXX …` therefore exposes nothing, which callers should warn about).
    Nothing,
}

/// Error for an invalid entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "exposedLocalERIs entry {entry} ({value:?}): {why}; expected \"<instance-id|i-*> <device>[/<device>...]\", e.g. \"i-bp1abc erdma_0/erdma_1\" or \"i-* erdma_*\""
)]
pub struct EriSelectorError {
    /// 1-based entry number (line or comma-separated position).
    pub entry: usize,
    /// The entry text.
    pub value: String,
    /// What is wrong.
    pub why: String,
}

fn is_device_pattern(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'*')
}

/// Matches `name` against a pattern where `*` stands for any run of characters.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

impl EriSelector {
    /// Parses a list whose entries are separated by commas and/or new lines. Blank entries and
    /// lines starting with `#` are ignored.
    pub fn parse(text: &str) -> Result<Self, EriSelectorError> {
        let items: Vec<&str> = text.split([',', '\n']).collect();
        Self::from_entries(items)
    }

    /// Parses already split entries (a YAML/JSON list).
    pub fn from_entries<I, S>(items: I) -> Result<Self, EriSelectorError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut entries = Vec::new();
        for (i, raw) in items.into_iter().enumerate() {
            let value = raw.as_ref().trim();
            if value.is_empty() || value.starts_with('#') {
                continue;
            }
            let err = |why: &str| EriSelectorError {
                entry: i + 1,
                value: value.to_string(),
                why: why.to_string(),
            };
            let mut fields = value.split_whitespace();
            let (Some(inst), Some(devs)) = (fields.next(), fields.next()) else {
                return Err(err(
                    "needs an instance and a device list separated by white space",
                ));
            };
            if fields.next().is_some() {
                return Err(err(
                    "has more than two fields (separate devices with '/', entries with ',')",
                ));
            }
            let instance = match inst.strip_prefix("i-") {
                Some("*") => InstancePattern::Any,
                Some(_) if crate::names::is_instance_id(inst) => {
                    InstancePattern::Exact(inst.to_string())
                }
                _ => {
                    return Err(err(&format!(
                        "instance {inst:?} is neither an ECS instance ID (i-...) nor i-*"
                    )));
                }
            };
            let devices: Vec<String> = devs.split('/').map(str::to_string).collect();
            if let Some(bad) = devices.iter().find(|d| !is_device_pattern(d)) {
                return Err(err(&format!(
                    "device {bad:?} is not an RDMA device name or pattern (letters, digits, '_', '-', '*')"
                )));
            }
            entries.push(EriEntry { instance, devices });
        }
        Ok(EriSelector { entries })
    }

    /// The parsed entries.
    pub fn entries(&self) -> &[EriEntry] {
        &self.entries
    }

    /// True when the list has no entries (expose everything).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the list exposes on `instance_id`.
    pub fn exposure(&self, instance_id: &str) -> Exposure<'_> {
        if self.entries.is_empty() {
            return Exposure::All;
        }
        let exact = self
            .entries
            .iter()
            .rev()
            .find(|e| matches!(&e.instance, InstancePattern::Exact(id) if id == instance_id));
        let any = || {
            self.entries
                .iter()
                .rev()
                .find(|e| e.instance == InstancePattern::Any)
        };
        match exact.or_else(any) {
            Some(e) => Exposure::Only(&e.devices),
            None => Exposure::Nothing,
        }
    }

    /// Whether `device` is exposed on `instance_id`.
    pub fn selects(&self, instance_id: &str, device: &str) -> bool {
        match self.exposure(instance_id) {
            Exposure::All => true,
            Exposure::Only(patterns) => patterns.iter().any(|p| glob_match(p, device)),
            Exposure::Nothing => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_instance_wins_over_wildcard() {
        let s = EriSelector::parse("i-* erdma_0, i-bp1abc erdma_0/erdma_1").unwrap();
        assert!(s.selects("i-bp1abc", "erdma_1"));
        assert!(!s.selects("i-other", "erdma_1"));
        assert!(s.selects("i-other", "erdma_0"));
    }

    #[test]
    fn last_wildcard_entry_applies() {
        let s = EriSelector::parse("i-* erdma_0\ni-* erdma_1").unwrap();
        assert!(!s.selects("i-x", "erdma_0"));
        assert!(s.selects("i-x", "erdma_1"));
    }

    #[test]
    fn wildcard_devices_work() {
        let s = EriSelector::parse("i-* erdma_*").unwrap();
        assert!(s.selects("i-x", "erdma_0"));
        assert!(s.selects("i-x", "erdma_12"));
        assert!(!s.selects("i-x", "mlx5_0"));
    }

    #[test]
    fn empty_list_exposes_all_and_unmatched_exposes_nothing() {
        assert!(EriSelector::parse("").unwrap().selects("i-x", "anything"));
        assert!(EriSelector::parse(" , # comment").unwrap().is_empty());
        let chart_default = EriSelector::parse("i-XXX erdma_0/erdma_1").unwrap();
        assert_eq!(chart_default.exposure("i-real"), Exposure::Nothing);
    }

    #[test]
    fn tab_separator_is_accepted() {
        let s = EriSelector::parse("i-bp1abc\terdma_0").unwrap();
        assert!(s.selects("i-bp1abc", "erdma_0"));
    }

    #[test]
    fn errors_name_entry_value_and_form() {
        let e = EriSelector::parse("i-* erdma_0, i-bp1abc erdma_0/").unwrap_err();
        assert_eq!(e.entry, 2);
        assert_eq!(e.value, "i-bp1abc erdma_0/");
        assert!(e.to_string().contains("expected"));
        assert!(EriSelector::parse("bp1abc erdma_0").is_err());
        assert!(EriSelector::parse("i-abc").is_err());
        assert!(EriSelector::parse("i-abc erdma_0 erdma_1").is_err());
        assert!(EriSelector::parse("i-abc erdma.0").is_err());
    }

    #[test]
    fn glob_semantics() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*c", "abbbc"));
        assert!(!glob_match("a*c", "abbb"));
        assert!(glob_match("erdma_*_x", "erdma_1_x"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,120}") {
            let _ = EriSelector::parse(&s);
        }

        #[test]
        fn literal_pattern_matches_only_itself(a in "[a-z0-9_]{1,10}", b in "[a-z0-9_]{1,10}") {
            prop_assert_eq!(glob_match(&a, &b), a == b);
        }
    }
}
