//! The names and value rules every erdma crate shares: the extended resource, the SMC-R pod
//! annotation, the `ERdmaDevice` labels, the bpffs pin directory, what an ECS instance ID looks
//! like and the jumbo-frame MTU range. The `exposedLocalERIs` grammar is
//! [`crate::EriSelector`]. The installer's validation and the agent's flag parsing both use these,
//! so that an install cannot accept what the agent then refuses.

use std::ops::RangeInclusive;

/// The extended resource the device plugin advertises (kept from the original).
pub const RESOURCE: &str = "aliyun/erdma";
/// The DRA driver's name, on a node where DRA serves the devices instead of the device plugin.
pub const DRA_DRIVER: &str = "erdma.alibabacloud.com";
/// The pod annotation that asks for SMC-R (kept from the original controller).
pub const SMCR_ANNOTATION: &str = "network.alibabacloud.com/erdma-smcr";

/// The spellings [`parse_smcr`] accepts, as its errors name them.
pub const SMCR_VALUES: &str = "true, false, or another spelling Go's strconv.ParseBool takes (1, t, T, TRUE, True, 0, f, F, FALSE, False)";

/// The one reading of the [`SMCR_ANNOTATION`] value, for the agent, the webhook, `doctor` and
/// `submit`: the original read it with Go's `strconv.ParseBool`, so erdma takes exactly those
/// spellings (surrounding blanks ignored); anything else is an error naming the value.
pub fn parse_smcr(value: &str) -> Result<bool, String> {
    match value.trim() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "{SMCR_ANNOTATION}={value:?} is not a boolean: use {SMCR_VALUES}"
        )),
    }
}
/// Label on an `ERdmaDevice`: the ECS instance ID.
pub const LABEL_INSTANCE_ID: &str = "alibabacloud.com/instance-id";
/// Label on an `ERdmaDevice`: the node name (the agent selects its object by it).
pub const LABEL_NODE_NAME: &str = "alibabacloud.com/nodename";
/// The bpffs directory where the SMC-R BPF socket policy is pinned (agent and `smcr-init`).
pub const BPF_PIN_DIR: &str = "/sys/fs/bpf/erdma-smc";

/// Jumbo-frame MTUs the agent may set on an ERI: at least 1280 (below that the kernel takes IPv6
/// off the interface) and at most 9000 (the largest jumbo frame an ECS interface carries; ECS's
/// own jumbo-frame MTU is 8500, the default).
pub const JUMBO_MTU: RangeInclusive<i64> = 1280..=9000;
/// The jumbo-frame MTU when none is given (the original's).
pub const DEFAULT_JUMBO_MTU: u32 = 8500;

/// Whether `id` looks like an ECS instance ID: `i-` and then letters, digits and `-`, at most 64
/// characters in all.
pub fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|rest| {
        !rest.is_empty()
            && id.len() <= 64
            && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    })
}

/// Checks a jumbo-frame MTU against [`JUMBO_MTU`]; the error says the range.
pub fn check_jumbo_mtu(mtu: i64) -> Result<u32, String> {
    if JUMBO_MTU.contains(&mtu) {
        Ok(mtu as u32)
    } else {
        Err(format!(
            "jumbo-frame MTU {mtu} is out of range ({}..={})",
            JUMBO_MTU.start(),
            JUMBO_MTU.end()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smcr_annotation_reads_as_go_parse_bool() {
        for v in ["1", "t", "T", "TRUE", "true", "True", " true "] {
            assert_eq!(parse_smcr(v), Ok(true), "{v:?}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_smcr(v), Ok(false), "{v:?}");
        }
        for v in ["", "yes", "tRUE", "on", "2", "truee"] {
            let e = parse_smcr(v).unwrap_err();
            assert!(
                e.contains(&format!("{v:?}")) && e.contains("strconv.ParseBool"),
                "{e}"
            );
        }
    }

    #[test]
    fn instance_ids() {
        for ok in ["i-bp1abc", "i-2ze0123456789abcdef", "i-a-b"] {
            assert!(is_instance_id(ok), "{ok}");
        }
        for bad in [
            "",
            "i-",
            "i-*",
            "bp1abc",
            "i-a_b",
            "i-a b",
            &format!("i-{}", "a".repeat(63)),
        ] {
            assert!(!is_instance_id(bad), "{bad}");
        }
    }

    #[test]
    fn jumbo_mtu_range() {
        assert_eq!(check_jumbo_mtu(8500), Ok(8500));
        assert_eq!(check_jumbo_mtu(1280), Ok(1280));
        assert_eq!(check_jumbo_mtu(9000), Ok(9000));
        for bad in [0, 576, 1279, 9001, 65_535, -1] {
            let e = check_jumbo_mtu(bad).unwrap_err();
            assert!(e.contains("1280..=9000"), "{e}");
        }
    }
}
