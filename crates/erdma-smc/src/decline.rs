//! SMC CLC decline / fallback reason codes (`SMC_CLC_DECL_*`, `net/smc/smc_clc.h`) decoded into a
//! name and an eRDMA-oriented explanation.

use serde::Serialize;

/// A decoded reason code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decline {
    /// The raw code.
    pub code: u32,
    /// Short name (`NOSMCRDEV`), or `UNKNOWN`.
    pub name: &'static str,
    /// What it means and the usual cause.
    pub meaning: String,
}

impl Decline {
    /// The code as `smcss` prints it: `0x03030002`.
    pub fn hex(&self) -> String {
        format!("0x{:08x}", self.code)
    }
}

/// Known codes: (code, name, meaning).
const KNOWN: &[(u32, &str, &str)] = &[
    (0x0101_0000, "MEM", "not enough memory for SMC buffers"),
    (
        0x0201_0000,
        "TIMEOUT_CL",
        "timed out waiting for the confirm-link (RDMA link did not come up)",
    ),
    (0x0202_0000, "TIMEOUT_AL", "timed out waiting for add-link"),
    (0x0300_0000, "CNFERR", "configuration error"),
    (
        0x0301_0000,
        "PEERNOSMC",
        "peer did not offer SMC: enable SMC on the peer, or a middlebox stripped/replayed TCP options",
    ),
    (0x0302_0000, "IPSEC", "IPsec in use"),
    (
        0x0303_0000,
        "NOSMCDEV",
        "no SMC device (R or D) usable for this route",
    ),
    (
        0x0303_0002,
        "NOSMCRDEV",
        "no SMC-R device: pnet entry missing in the pod netns, or no RDMA device (e.g. ofed mode)",
    ),
    (0x0303_0004, "NOV2EXT", "peer sent no CLC v2 extension"),
    (0x0303_0006, "NOSEID", "peer sent no system EID"),
    (0x0303_0008, "NOUEID", "no common user EID with the peer"),
    (
        0x0303_0009,
        "RELEASEERR",
        "release-version negotiation failed",
    ),
    (
        0x0303_000a,
        "MAXCONNERR",
        "max-connections negotiation failed",
    ),
    (0x0303_000b, "MAXLINKERR", "max-links negotiation failed"),
    (0x0304_0000, "MODEUNSUPP", "SMC modes do not match (R vs D)"),
    (
        0x0306_0000,
        "OPTUNSUPP",
        "unsupported socket option (e.g. TCP fastopen)",
    ),
    (
        0x0307_0000,
        "DIFFPREFIX",
        "IP prefix/subnet mismatch (SMC-Rv1 needs the same subnet)",
    ),
    (
        0x030a_0000,
        "NOACTLINK",
        "no active SMC-R link in the link group",
    ),
    (
        0x030b_0000,
        "NOSRVLINK",
        "SMC-R link from the server not found",
    ),
    (0x030c_0000, "VERSMISMAT", "SMC version mismatch"),
    (0x030e_0000, "NOROUTE", "SMC-Rv2: no route to the peer"),
    (0x030f_0000, "NOINDIRECT", "indirect path not allowed"),
    (0x0400_0000, "SYNCERR", "synchronisation error"),
    (
        0x0500_0000,
        "PEERDECL",
        "peer declined during the handshake (see the peer diagnosis)",
    ),
    (0x0999_0000, "INTERR", "internal error"),
    (0x0999_0001, "ERR_RTOK", "internal error: rtoken handling"),
    (0x0999_0002, "ERR_RDYLNK", "internal error: ready link"),
    (
        0x0999_0003,
        "ERR_REGBUF",
        "internal error: buffer registration",
    ),
];

/// Decodes a reason code. The kernel ORs the peer's reason class into `PEERDECL`
/// (`0x0503_0000` = peer declined with a configuration error), so unknown codes are explained
/// by their class byte.
pub fn decode(code: u32) -> Decline {
    if let Some((_, name, meaning)) = KNOWN.iter().find(|(c, _, _)| *c == code) {
        return Decline {
            code,
            name,
            meaning: (*meaning).to_string(),
        };
    }
    let class = match code >> 24 {
        0x01 => "resources",
        0x02 => "timeout",
        0x03 => "configuration",
        0x04 => "synchronisation",
        0x05 => "peer declined",
        0x09 => "internal",
        _ => "unknown class",
    };
    let name = if code >> 24 == 0x05 {
        "PEERDECL"
    } else {
        "UNKNOWN"
    };
    Decline {
        code,
        name,
        meaning: format!("{class} (code 0x{code:08x} not in this table)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_codes() {
        let d = decode(0x0303_0002);
        assert_eq!(d.name, "NOSMCRDEV");
        assert!(d.meaning.contains("pnet"));
        assert_eq!(d.hex(), "0x03030002");
        assert_eq!(decode(0x0301_0000).name, "PEERNOSMC");
        let p = decode(0x0503_0000);
        assert_eq!(p.name, "PEERDECL");
        assert!(p.meaning.starts_with("peer declined"), "{}", p.meaning);
        let u = decode(0x7700_0001);
        assert_eq!(u.name, "UNKNOWN");
        assert!(u.meaning.contains("0x77000001"));
        for (c, _, _) in KNOWN {
            assert_eq!(decode(*c).code, *c);
        }
    }
}
