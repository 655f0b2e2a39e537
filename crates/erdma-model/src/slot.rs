//! Device-plugin slot IDs: `"<ibdev>/<index>"`, the form the original plugin advertises.

use serde::Serialize;
use std::fmt;

/// Longest device ID the kubelet accepts.
pub const MAX_DEVICE_ID_LEN: usize = 63;

/// One shared slot of an RDMA device, advertised to the kubelet as `"<device>/<index>"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SlotId {
    /// The RDMA device name (`erdma_0`).
    pub device: String,
    /// The slot index, `0..slots_per_device`.
    pub index: u32,
}

/// Error for a device ID that is not a valid slot ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "device ID {id:?} is not a slot ID: {why} (expected \"<rdma device>/<index>\", e.g. \"erdma_0/3\")"
)]
pub struct SlotIdError {
    /// The rejected ID (truncated to 80 characters).
    pub id: String,
    /// Why it was rejected.
    pub why: &'static str,
}

impl SlotId {
    /// Creates a slot ID.
    pub fn new(device: impl Into<String>, index: u32) -> Self {
        SlotId {
            device: device.into(),
            index,
        }
    }

    /// Parses `"<device>/<index>"` strictly: one `/`, a non-empty device name of printable
    /// non-space ASCII, a decimal index without sign or leading zeros, at most 63 characters.
    pub fn parse(id: &str) -> Result<Self, SlotIdError> {
        let err = |why| SlotIdError {
            id: id.chars().take(80).collect(),
            why,
        };
        if id.len() > MAX_DEVICE_ID_LEN {
            return Err(err("longer than 63 characters"));
        }
        let (device, index) = id.rsplit_once('/').ok_or_else(|| err("no '/'"))?;
        if device.is_empty() {
            return Err(err("empty device name"));
        }
        if !device.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
            return Err(err("device name has spaces, '/' or non-ASCII characters"));
        }
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("index is not a decimal number"));
        }
        if index.len() > 1 && index.starts_with('0') {
            return Err(err("index has leading zeros"));
        }
        let index = index.parse().map_err(|_| err("index out of range"))?;
        Ok(SlotId {
            device: device.to_string(),
            index,
        })
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.device, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_original_form() {
        assert_eq!(
            SlotId::parse("erdma_0/199").unwrap(),
            SlotId::new("erdma_0", 199)
        );
        assert_eq!(SlotId::parse("rxe0/0").unwrap(), SlotId::new("rxe0", 0));
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in [
            "",
            "erdma_0",
            "/1",
            "erdma_0/",
            "erdma_0/01",
            "erdma_0/-1",
            "erdma 0/1",
            "a/b/c",
            "erdma_0/99999999999",
        ] {
            let e = SlotId::parse(bad).unwrap_err();
            assert!(e.to_string().contains("expected"), "{bad}: {e}");
        }
        assert!(SlotId::parse(&format!("{}/1", "x".repeat(70))).is_err());
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(dev in "[a-z][a-z0-9_]{0,20}", index in 0u32..100_000) {
            let s = SlotId::new(dev, index);
            prop_assert_eq!(SlotId::parse(&s.to_string()).unwrap(), s);
        }

        #[test]
        fn parse_never_panics(s in ".{0,80}") {
            let _ = SlotId::parse(&s);
        }
    }
}
