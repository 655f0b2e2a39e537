//! SMC-R PNET IDs.

use crate::address::MacAddr;
use serde::Serialize;
use std::fmt;

/// An SMC physical-network identifier. erdma derives it from the ERI's MAC exactly as the original
/// controller does: upper-case hex digits without separators (`00:16:3e:0a:1b:2c` → `00163E0A1B2C`).
/// The kernel accepts at most 16 characters (`SMC_MAX_PNETID_LEN`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct PnetId(String);

/// Longest PNET ID the kernel's SMC pnet table accepts.
pub const MAX_PNETID_LEN: usize = 16;

impl PnetId {
    /// The PNET ID of an ERI with this MAC.
    pub fn from_mac(mac: MacAddr) -> Self {
        PnetId(mac.to_string().replace(':', "").to_ascii_uppercase())
    }

    /// Validates an externally supplied PNET ID (e.g. `SMCR_PNET`): 1 to 16 ASCII letters or digits;
    /// lower-case letters are upper-cased as the kernel does.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.is_empty() || t.len() > MAX_PNETID_LEN || !t.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(format!(
                "{s:?} is not a PNET ID (expected 1-{MAX_PNETID_LEN} ASCII letters or digits, e.g. 00163E0A1B2C)"
            ));
        }
        Ok(PnetId(t.to_ascii_uppercase()))
    }

    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PnetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seed_rule() {
        let mac: MacAddr = "00:16:3e:0a:1b:2c".parse().unwrap();
        assert_eq!(PnetId::from_mac(mac).as_str(), "00163E0A1B2C");
    }

    #[test]
    fn parse_validates() {
        assert_eq!(
            PnetId::parse("00163e0a1b2c").unwrap().as_str(),
            "00163E0A1B2C"
        );
        assert!(PnetId::parse("").is_err());
        assert!(PnetId::parse("00:16:3e").is_err());
        assert!(PnetId::parse("ABCDEFGHIJKLMNOPQ").is_err());
    }

    proptest! {
        #[test]
        fn from_mac_is_always_a_valid_pnetid(bytes in any::<[u8; 6]>()) {
            let id = PnetId::from_mac(MacAddr(bytes));
            prop_assert_eq!(id.as_str().len(), 12);
            prop_assert_eq!(PnetId::parse(id.as_str()).unwrap(), id);
        }
    }
}
