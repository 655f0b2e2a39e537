//! Which `rdma.max` a container holding RDMA devices gets, and who decides it.
//!
//! Only what the agent itself recorded or was told by the kubelet decides: a DRA claim's limit
//! is what the claim consumed, from the agent's DRA checkpoint, for the claims the kubelet's
//! pod-resources answer says the container uses; a device-plugin container's limit is the
//! operator's `--nri-rdma-max`. The pod annotation `network.alibabacloud.com/erdma-rdma-max` may
//! lower either; it raises the operator's limit only where the operator allowed it
//! (`--nri-allow-annotation-raise`), and a claim's never. The container's environment is never
//! read for a limit: a pod author writes any variable into the spec, the DRA driver's
//! `ERDMA_RDMA_MAX*` hand-off included; a value there that the records do not give is reported
//! and ignored.

use erdma_dra::checkpoint::{Checkpoint, Grant};
use erdma_kubelet::podresources::Holder;
use erdma_model::container::{ENV_RDMA_MAX, RDMA_MAX_SEPARATOR};
use erdma_model::rdma_limit::{Limit, RdmaLimit};
use erdma_nri::api;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What the agent knows of who holds what, for the limits of one container.
#[derive(Debug, Clone, Copy, Default)]
pub struct Records<'a> {
    /// The kubelet's pod-resources answer, when the agent can trust it (see
    /// `nri::trusted_holders`).
    pub holders: Option<&'a [Holder]>,
    /// The DRA claims this agent prepared (its checkpoint); `None` where it has none it can read.
    pub claims: Option<&'a Checkpoint>,
}

impl<'a> Records<'a> {
    /// The kubelet's answer alone (a device-plugin node).
    pub fn kubelet(holders: Option<&'a [Holder]>) -> Self {
        Records {
            holders,
            claims: None,
        }
    }
}

/// What the records say container `c` holds through DRA claims.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claimed {
    /// The grant on each ib device, the container's claims together.
    pub grants: BTreeMap<String, Grant>,
    /// The claims (`namespace/name`) the grants come from.
    pub from: Vec<String>,
    /// Each of these claims' own `rdma.max` lines, as the DRA driver handed them over in the
    /// claim's CDI spec (`ERDMA_RDMA_MAX_<claim>`): no disagreement when the container has them.
    pub hand_off: Vec<String>,
}

/// What the DRA claims give container `c` (see [`Claimed`]); `None` when the records name no
/// claim of this container.
///
/// The kubelet's answer names the container's claims and devices. Where it names none for this
/// container (it answers without DRA: `KubeletPodResourcesDynamicResources` off; no trusted
/// answer; or not yet), the claims prepared in the pod's namespace on the devices the container
/// holds stand in, and with several the lowest grant of each device applies: the agent cannot
/// tell which is the container's, and a ceiling must not grow by guessing. A container the
/// answer lists with device-plugin slots holds no claim: `None`.
pub fn claim_grants(
    pod: &api::PodSandbox,
    c: &api::Container,
    devices: &[String],
    records: Records<'_>,
) -> Option<Claimed> {
    let claims = records.claims?;
    let of_container: Vec<&Holder> = records
        .holders
        .unwrap_or_default()
        .iter()
        .filter(|h| h.namespace == pod.namespace && h.pod == pod.name && h.container == c.name)
        .collect();
    // (claim namespace, claim name) -> the ResourceSlice devices the container uses of it
    let mut used: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for d in of_container.iter().flat_map(|h| &h.claimed) {
        used.entry((&d.claim_namespace, &d.claim_name))
            .or_default()
            .insert(&d.device);
    }
    if used.is_empty() && of_container.iter().any(|h| !h.device_ids.is_empty()) {
        return None;
    }
    let mut grants: BTreeMap<String, Grant> = BTreeMap::new();
    let mut from: Vec<String> = Vec::new();
    let mut hand_off: Vec<String> = Vec::new();
    let mut handed = |claim: &erdma_dra::checkpoint::PreparedClaim| {
        for (ibdev, g) in claim.grants(|_| true) {
            if let Some(l) = limit_of(g) {
                hand_off.push(l.line(&ibdev));
            }
        }
    };
    if !used.is_empty() {
        for ((ns, name), slice_devices) in used {
            // one grant per claim name: a deleted claim of that name still prepared (its
            // unprepare not come yet) lowers it, never adds to it
            let mut of_name: Option<BTreeMap<String, Grant>> = None;
            for (_uid, claim) in claims.named(ns, name) {
                handed(claim);
                let g = claim.grants(|d| slice_devices.contains(d.device.as_str()));
                of_name = Some(match of_name {
                    None => g,
                    Some(have) => lowest_each(have, g),
                });
            }
            let Some(g) = of_name.filter(|g| !g.is_empty()) else {
                continue;
            };
            from.push(format!("{ns}/{name}"));
            for (ibdev, grant) in g {
                grants
                    .entry(ibdev)
                    .and_modify(|have| *have = have.plus(grant))
                    .or_insert(grant);
            }
        }
    } else {
        for claim in claims
            .claims
            .values()
            .filter(|cl| cl.namespace == pod.namespace)
        {
            let g = claim.grants(|d| devices.contains(&d.ibdev));
            if g.is_empty() {
                continue;
            }
            handed(claim);
            from.push(format!("{}/{}", claim.namespace, claim.name));
            grants = lowest_each(grants, g);
        }
    }
    (!grants.is_empty()).then_some(Claimed {
        grants,
        from,
        hand_off,
    })
}

/// Each device's lower grant; a device in one map only keeps its grant.
fn lowest_each(
    mut a: BTreeMap<String, Grant>,
    b: BTreeMap<String, Grant>,
) -> BTreeMap<String, Grant> {
    for (ibdev, g) in b {
        a.entry(ibdev)
            .and_modify(|have| *have = have.lowest(g))
            .or_insert(g);
    }
    a
}

/// A claim's limits as `rdma.max` limits: counts past the kernel's `int` are no limit.
pub fn limit_of(grant: Grant) -> Option<RdmaLimit> {
    let count = |n: u64| {
        u32::try_from(n)
            .ok()
            .filter(|n| *n <= i32::MAX as u32)
            .map_or(Limit::Max, Limit::Count)
    };
    match grant {
        Grant::Unrestricted => None,
        Grant::Limits(l) => Some(RdmaLimit {
            hca_handle: Some(count(l.hca_handle)),
            hca_object: Some(count(l.hca_object)),
        }),
    }
}

/// The lower of two values of one key (`None`: this side sets no limit).
fn lower(a: Option<Limit>, b: Option<Limit>) -> Option<Limit> {
    match (a, b) {
        (Some(Limit::Count(x)), Some(Limit::Count(y))) => Some(Limit::Count(x.min(y))),
        (Some(Limit::Count(x)), _) | (_, Some(Limit::Count(x))) => Some(Limit::Count(x)),
        (Some(Limit::Max), _) | (_, Some(Limit::Max)) => Some(Limit::Max),
        (None, None) => None,
    }
}

/// Whether `asked` is above `ceiling` in any key the ceiling limits.
fn above(asked: &RdmaLimit, ceiling: &RdmaLimit) -> bool {
    let over = |a: Option<Limit>, c: Option<Limit>| match (a, c) {
        (None, _) | (_, None | Some(Limit::Max)) => false,
        (Some(Limit::Max), Some(Limit::Count(_))) => true,
        (Some(Limit::Count(x)), Some(Limit::Count(y))) => x > y,
    };
    over(asked.hca_handle, ceiling.hca_handle) || over(asked.hca_object, ceiling.hca_object)
}

/// `ceiling` lowered by `asked`, key by key; and whether `asked` was above it somewhere.
pub fn capped(ceiling: &RdmaLimit, asked: &RdmaLimit) -> (RdmaLimit, bool) {
    (
        RdmaLimit {
            hca_handle: lower(ceiling.hca_handle, asked.hca_handle),
            hca_object: lower(ceiling.hca_object, asked.hca_object),
        },
        above(asked, ceiling),
    )
}

/// The `ERDMA_RDMA_MAX*` entries of the container's environment that none of `given` is: what
/// the container says its limit is beside what the records give it (the DRA driver's hand-off
/// of each claim, and the line applied).
pub fn env_not_given(c: &api::Container, given: &[String]) -> Vec<String> {
    let per_claim = format!("{ENV_RDMA_MAX}_");
    let mut out = Vec::new();
    for (k, v) in c.env.iter().filter_map(|e| e.split_once('=')) {
        if k != ENV_RDMA_MAX && !k.starts_with(&per_claim) {
            continue;
        }
        for entry in v
            .split(RDMA_MAX_SEPARATOR)
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            if !given.iter().any(|g| g.trim() == entry) {
                out.push(format!("{k}={entry}"));
            }
        }
    }
    out
}

/// The agent's DRA checkpoint as the NRI plugin reads it: from the file the DRA driver writes
/// (read only, never set aside), parsed again only when the file changed.
#[derive(Debug, Default)]
pub struct ClaimRecords {
    path: Option<PathBuf>,
    last: Mutex<Option<(FileStamp, Arc<Checkpoint>)>>,
}

/// What tells one version of the checkpoint file from another: the journal appends (length,
/// modification time) and the compaction renames a new file in (inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl ClaimRecords {
    /// No DRA records (a node without the DRA driver's checkpoint).
    pub fn none() -> Self {
        ClaimRecords::default()
    }

    /// The checkpoint at `path` (`erdma_dra::checkpoint::path_under`).
    pub fn at(path: PathBuf) -> Self {
        ClaimRecords {
            path: Some(path),
            last: Mutex::new(None),
        }
    }

    /// The prepared claims now; `None` without a file, or when it cannot be read (logged: the
    /// containers then get the operator's limit).
    pub fn current(&self) -> Option<Arc<Checkpoint>> {
        use std::os::unix::fs::MetadataExt;
        let path = self.path.as_ref()?;
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(checkpoint = %path.display(), "reading the DRA checkpoint for container limits: {e}");
                return None;
            }
        };
        let stamp = FileStamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, cp)) = last.as_ref()
            && *seen == stamp
        {
            return Some(cp.clone());
        }
        match Checkpoint::read_only(path) {
            Ok(cp) => {
                let cp = Arc::new(cp);
                *last = Some((stamp, cp.clone()));
                Some(cp)
            }
            Err(e) => {
                tracing::warn!(
                    "{e}; DRA claims' limits are not known until the DRA driver rewrites its checkpoint: their containers get the operator's limit (--nri-rdma-max)"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> RdmaLimit {
        RdmaLimit::parse(s).unwrap()
    }

    /// The ceiling lowered key by key; a key the annotation leaves out keeps the ceiling's, one
    /// the ceiling leaves out takes the annotation's; `max` or a larger count is capped.
    #[test]
    fn an_annotation_lowers_a_ceiling_and_never_raises_it() {
        let ceiling = l("hca_handle=4 hca_object=1000");
        for (asked, want, raised) in [
            ("hca_handle=2", "x hca_handle=2 hca_object=1000", false),
            (
                "hca_handle=max hca_object=10",
                "x hca_handle=4 hca_object=10",
                true,
            ),
            ("hca_object=5000", "x hca_handle=4 hca_object=1000", true),
            (
                "hca_handle=4 hca_object=1000",
                "x hca_handle=4 hca_object=1000",
                false,
            ),
        ] {
            let (got, over) = capped(&ceiling, &l(asked));
            assert_eq!((got.line("x").as_str(), over), (want, raised), "{asked}");
        }
        let (got, over) = capped(&l("hca_handle=4"), &l("hca_object=7"));
        assert_eq!(got.line("x"), "x hca_handle=4 hca_object=7");
        assert!(!over, "the ceiling sets no hca_object");
        let (got, over) = capped(&l("hca_handle=max"), &l("hca_handle=3"));
        assert_eq!((got.line("x").as_str(), over), ("x hca_handle=3", false));
    }

    #[test]
    fn a_claims_counts_beyond_the_kernels_int_are_no_limit() {
        let g = Grant::Limits(erdma_dra::cdi::RdmaLimits {
            hca_handle: 3,
            hca_object: u64::from(u32::MAX),
        });
        assert_eq!(
            limit_of(g).unwrap().line("d"),
            "d hca_handle=3 hca_object=max"
        );
        assert_eq!(limit_of(Grant::Unrestricted), None);
    }

    #[test]
    fn env_entries_the_records_do_not_give_are_found() {
        let c = api::Container {
            env: vec![
                "PATH=/bin".into(),
                "ERDMA_RDMA_MAX_U1=d hca_handle=4 hca_object=8".into(),
                "ERDMA_RDMA_MAX=d hca_handle=max;d hca_handle=4 hca_object=8".into(),
                "ERDMA_RDMA_MAXIMUM=not ours".into(),
            ],
            ..Default::default()
        };
        assert_eq!(
            env_not_given(&c, &["d hca_handle=4 hca_object=8".into()]),
            ["ERDMA_RDMA_MAX=d hca_handle=max"]
        );
    }
}
