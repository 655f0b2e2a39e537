//! The container contract: what a container holding eRDMA devices finds in its environment, and
//! who writes and reads it. The device plugin (Allocate `envs`) and the DRA driver (per-claim CDI
//! spec `env`) write it through [`container_env`]; the agent's NRI handler reads it back (the held
//! devices, the DRA claim's `rdma.max`).

use crate::device::RdmaDevice;
use std::collections::BTreeMap;

/// Env variable with the PNET ID of the container's first device (sorted by name) that has one,
/// as the original plugin set it for SMC-R.
pub const ENV_SMCR_PNET: &str = "SMCR_PNET";
/// Env variable listing the container's RDMA device names, comma-separated, sorted.
pub const ENV_ERDMA_DEVICES: &str = "ERDMA_DEVICES";
/// Env variable with the same names in NCCL_IB_HCA exact-match form (`=erdma_0,erdma_1`), so a
/// launcher can `export NCCL_IB_HCA="$ERDMA_NCCL_IB_HCA"`.
pub const ENV_ERDMA_NCCL_IB_HCA: &str = "ERDMA_NCCL_IB_HCA";
/// Env variable (DRA only) with the claim's rdma cgroup limits: `<ibdev> hca_handle=N
/// hca_object=M`, one entry per device, [`RDMA_MAX_SEPARATOR`]-separated (the `rdma.max` line
/// format); the NRI handler writes it into the container's `rdma.max`. A claim sets it under
/// [`claim_env_name`].
pub const ENV_RDMA_MAX: &str = "ERDMA_RDMA_MAX";
/// Env variable (DRA only) with the claim UID, so a container can tell which claim it runs under.
/// A claim sets it under [`claim_env_name`].
pub const ENV_CLAIM_UID: &str = "ERDMA_DRA_CLAIM_UID";
/// Separator of the entries of [`ENV_RDMA_MAX`].
pub const RDMA_MAX_SEPARATOR: &str = ";";
/// Annotation (on a DRA claim's CDI device) with the device's `rdma.max` line.
pub const ANNOTATION_RDMA_MAX: &str = "erdma.alibabacloud.com/rdma.max";

/// The fully qualified CDI name (`<vendor>/<class>=<name>`) by which a container gets device
/// `name` of CDI `kind`: what a device plugin's Allocate answers and a DRA driver's prepare
/// returns (the spec itself is [`crate::cdi::Spec`]).
pub fn cdi_device(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

/// What a DRA claim adds to the environment of its containers.
#[derive(Debug, Clone, Copy)]
pub struct ClaimEnv<'a> {
    /// The claim UID ([`ENV_CLAIM_UID`]).
    pub uid: &'a str,
    /// The `rdma.max` line of each device of the claim, in the claim's device order
    /// ([`ENV_RDMA_MAX`]).
    pub rdma_max: &'a [String],
}

/// The name under which a DRA claim sets variable `base`: `<base>_<UID>`, the claim UID upper-cased
/// with every character other than a letter or digit as `_`
/// (`ERDMA_DEVICES_0B1C6F5E_1F6B_4A57_9D0E_1A2B3C4D5E6F`). The runtime merges the env of all CDI
/// devices of a container and a later variable of the same name replaces an earlier one, so the
/// variables of two claims in one container must not share names: each claim's are whole under
/// its own names. API-server UIDs are UUIDs, so two claims never map to one name.
pub fn claim_env_name(base: &str, claim_uid: &str) -> String {
    let suffix: String = claim_uid
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{base}_{suffix}")
}

/// The environment a DRA claim adds to its containers: the variables of [`container_env`] for
/// the claim's devices and [`ClaimEnv`], each under [`claim_env_name`].
pub fn claim_env<'a>(
    devices: impl IntoIterator<Item = &'a RdmaDevice>,
    claim: ClaimEnv<'_>,
) -> BTreeMap<String, String> {
    container_env(devices, Some(claim))
        .into_iter()
        .map(|(k, v)| (claim_env_name(k, claim.uid), v))
        .collect()
}

/// The environment of a container holding `devices` (through the device plugin, or through a DRA
/// `claim`): [`ENV_ERDMA_DEVICES`] and [`ENV_ERDMA_NCCL_IB_HCA`] with the device names sorted (kept
/// even when there are none), [`ENV_SMCR_PNET`] with the PNET ID of the first of them that has
/// one, and for a claim [`ENV_CLAIM_UID`] and [`ENV_RDMA_MAX`]. Keyed by variable name.
pub fn container_env<'a>(
    devices: impl IntoIterator<Item = &'a RdmaDevice>,
    claim: Option<ClaimEnv<'_>>,
) -> BTreeMap<&'static str, String> {
    let mut devices: Vec<&RdmaDevice> = devices.into_iter().collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    let names = devices
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut env = BTreeMap::new();
    env.insert(ENV_ERDMA_NCCL_IB_HCA, format!("={names}"));
    env.insert(ENV_ERDMA_DEVICES, names);
    if let Some(pnet) = devices.iter().find_map(|d| d.pnet_id.as_ref()) {
        env.insert(ENV_SMCR_PNET, pnet.as_str().to_string());
    }
    if let Some(claim) = claim {
        env.insert(ENV_CLAIM_UID, claim.uid.to_string());
        env.insert(ENV_RDMA_MAX, claim.rdma_max.join(RDMA_MAX_SEPARATOR));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceKind, PnetId};

    fn dev(name: &str, pnet: Option<&str>) -> RdmaDevice {
        let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
        d.pnet_id = pnet.map(|p| PnetId::parse(p).expect("pnet"));
        d
    }

    #[test]
    fn container_env_table() {
        let lines = ["erdma_0 hca_handle=4 hca_object=8000".to_string()];
        let two = ["a h".to_string(), "b h".to_string()];
        #[allow(clippy::type_complexity)]
        let cases: Vec<(
            &str,
            Vec<RdmaDevice>,
            Option<ClaimEnv<'_>>,
            Vec<(&str, &str)>,
        )> = vec![
            (
                "no devices: the lists are kept, empty",
                vec![],
                None,
                vec![(ENV_ERDMA_DEVICES, ""), (ENV_ERDMA_NCCL_IB_HCA, "=")],
            ),
            (
                "one device without PNET ID",
                vec![dev("erdma_0", None)],
                None,
                vec![
                    (ENV_ERDMA_DEVICES, "erdma_0"),
                    (ENV_ERDMA_NCCL_IB_HCA, "=erdma_0"),
                ],
            ),
            (
                "names sorted; PNET of the first device (by name) that has one",
                vec![
                    dev("erdma_2", Some("PNETB")),
                    dev("erdma_0", None),
                    dev("erdma_1", Some("PNETA")),
                ],
                None,
                vec![
                    (ENV_ERDMA_DEVICES, "erdma_0,erdma_1,erdma_2"),
                    (ENV_ERDMA_NCCL_IB_HCA, "=erdma_0,erdma_1,erdma_2"),
                    (ENV_SMCR_PNET, "PNETA"),
                ],
            ),
            (
                "a DRA claim adds its UID and rdma.max",
                vec![dev("erdma_0", None)],
                Some(ClaimEnv {
                    uid: "uid-1",
                    rdma_max: &lines,
                }),
                vec![
                    (ENV_ERDMA_DEVICES, "erdma_0"),
                    (ENV_ERDMA_NCCL_IB_HCA, "=erdma_0"),
                    (ENV_CLAIM_UID, "uid-1"),
                    (ENV_RDMA_MAX, "erdma_0 hca_handle=4 hca_object=8000"),
                ],
            ),
            (
                "rdma.max entries joined with ';'",
                vec![dev("a", None), dev("b", None)],
                Some(ClaimEnv {
                    uid: "u",
                    rdma_max: &two,
                }),
                vec![
                    (ENV_ERDMA_DEVICES, "a,b"),
                    (ENV_ERDMA_NCCL_IB_HCA, "=a,b"),
                    (ENV_CLAIM_UID, "u"),
                    (ENV_RDMA_MAX, "a h;b h"),
                ],
            ),
        ];
        for (what, devices, claim, want) in cases {
            if let Some(c) = claim {
                let named: BTreeMap<String, String> = claim_env(&devices, c);
                let want: BTreeMap<String, String> = want
                    .iter()
                    .map(|(k, v)| (claim_env_name(k, c.uid), v.to_string()))
                    .collect();
                assert_eq!(named, want, "{what}, under the claim's names");
            }
            let got = container_env(&devices, claim);
            let want: BTreeMap<&str, String> =
                want.into_iter().map(|(k, v)| (k, v.to_string())).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn claim_names_are_env_names_and_differ_per_claim() {
        assert_eq!(
            claim_env_name(ENV_ERDMA_DEVICES, "0b1c6f5e-1f6b-4a57-9d0e-1a2b3c4d5e6f"),
            "ERDMA_DEVICES_0B1C6F5E_1F6B_4A57_9D0E_1A2B3C4D5E6F"
        );
        assert_eq!(
            claim_env_name(ENV_RDMA_MAX, "uid-1"),
            "ERDMA_RDMA_MAX_UID_1"
        );
        assert_ne!(
            claim_env_name(ENV_RDMA_MAX, "uid-1"),
            claim_env_name(ENV_RDMA_MAX, "uid-2")
        );
    }
}
