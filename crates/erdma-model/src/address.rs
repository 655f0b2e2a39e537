//! Link-layer addresses: MAC addresses and RDMA node GUIDs, and the eRDMA rule that ties them.

use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Error parsing an address from its text form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// The text is not a MAC address of the form `aa:bb:cc:dd:ee:ff`.
    #[error(
        "{0:?} is not a MAC address (expected six hex bytes separated by ':', e.g. 00:16:3e:0a:1b:2c)"
    )]
    Mac(String),
    /// The text is not a node GUID of the form `0216:3eff:fe0a:1b2c`.
    #[error(
        "{0:?} is not a node GUID (expected four groups of four hex digits, e.g. 0216:3eff:fe0a:1b2c)"
    )]
    Guid(String),
}

/// A 48-bit Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The all-zero address, which sysfs reports for interfaces without a MAC.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || AddressError::Mac(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.trim().split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(err)?;
            // from_str_radix alone would also take a sign (`+a`).
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A 64-bit RDMA node GUID, held in network byte order as sysfs prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeGuid(pub [u8; 8]);

impl NodeGuid {
    /// The EUI-64 GUID the eRDMA driver derives from its netdev's MAC (`addrconf_addr_eui48`):
    /// `ff:fe` inserted after byte 2 and the universal/local bit of byte 0 flipped.
    pub fn from_mac_eui64(mac: MacAddr) -> Self {
        let m = mac.0;
        NodeGuid([m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
    }

    /// The MAC this GUID was derived from by the EUI-64 rule, or `None` when the middle bytes are
    /// not `ff:fe` (then the GUID was not built from a MAC and pairing by MAC must not be trusted).
    pub fn to_mac_eui64(&self) -> Option<MacAddr> {
        let g = self.0;
        if g[3] != 0xff || g[4] != 0xfe {
            return None;
        }
        Some(MacAddr([g[0] ^ 0x02, g[1], g[2], g[5], g[6], g[7]]))
    }

    /// True for the all-zero GUID of an unconfigured device.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 8]
    }
}

impl fmt::Display for NodeGuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.0;
        write!(
            f,
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
        )
    }
}

impl FromStr for NodeGuid {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || AddressError::Guid(s.to_string());
        let mut out = [0u8; 8];
        let mut groups = s.trim().split(':');
        for pair in out.chunks_mut(2) {
            let group = groups.next().ok_or_else(err)?;
            // from_str_radix alone would also take a sign (`+eff`).
            if group.len() != 4 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            let v = u16::from_str_radix(group, 16).map_err(|_| err())?;
            pair.copy_from_slice(&v.to_be_bytes());
        }
        if groups.next().is_some() {
            return Err(err());
        }
        Ok(NodeGuid(out))
    }
}

impl Serialize for NodeGuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn worked_example_from_the_driver_reference() {
        // ENI MAC 00:16:3e:0a:1b:2c gives node_guid 0216:3eff:fe0a:1b2c (erdma-device.md §2).
        let mac: MacAddr = "00:16:3e:0a:1b:2c".parse().unwrap();
        let guid = NodeGuid::from_mac_eui64(mac);
        assert_eq!(guid.to_string(), "0216:3eff:fe0a:1b2c");
        let parsed: NodeGuid = "0216:3eff:fe0a:1b2c".parse().unwrap();
        assert_eq!(parsed.to_mac_eui64(), Some(mac));
    }

    #[test]
    fn guid_without_fffe_is_not_a_mac() {
        let g: NodeGuid = "0216:3e00:000a:1b2c".parse().unwrap();
        assert_eq!(g.to_mac_eui64(), None);
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "00:16:3e:0a:1b",
            "00:16:3e:0a:1b:2c:00",
            "0:16:3e:0a:1b:2c",
            "zz:16:3e:0a:1b:2c",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
        for bad in [
            "",
            "0216:3eff:fe0a",
            "0216:3eff:fe0a:1b2c:0000",
            "216:3eff:fe0a:1b2c",
            "xxxx:3eff:fe0a:1b2c",
        ] {
            assert!(bad.parse::<NodeGuid>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn mac_guid_round_trip(bytes in any::<[u8; 6]>()) {
            let mac = MacAddr(bytes);
            prop_assert_eq!(mac.to_string().parse::<MacAddr>().unwrap(), mac);
            let guid = NodeGuid::from_mac_eui64(mac);
            prop_assert_eq!(guid.to_string().parse::<NodeGuid>().unwrap(), guid);
            prop_assert_eq!(guid.to_mac_eui64(), Some(mac));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(s in ".{0,40}") {
            let _ = s.parse::<MacAddr>();
            let _ = s.parse::<NodeGuid>();
        }
    }
}
