//! The checkpoint of prepared claims: what NodePrepareResources answered for each claim UID and
//! what it consumed, so a repeated call (the kubelet retries and re-prepares after its own
//! restart) answers the same, and a restarted agent still knows which capacity is taken.
//!
//! The file is JSON lines: a snapshot of every prepared claim (`{"version":2,"claims":{…}}`),
//! then one [`Record`] per prepare or unprepare since, appended by [`crate::journal`] (a prepare
//! appends its claim instead of rewriting every claim: an append costs microseconds, a rewrite
//! by rename on the kubelet's ext4 disk hundreds of them and milliseconds at p99). Reading
//! replays the records over the snapshot. A version-1 file (one snapshot, perhaps
//! pretty-printed) is read too.

use crate::cdi::RdmaLimits;
use crate::error::{DraError, Result, io_err};
use erdma_host::atomic::{self, Durability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Format version of the snapshot written (2: snapshot and records; 1, read too: snapshot only).
pub const VERSION: u32 = 2;

/// One change after the snapshot, a line of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Record {
    /// A claim prepared (or prepared again after it lost its CDI spec).
    Prepared {
        /// Claim UID.
        uid: String,
        /// What was prepared.
        claim: PreparedClaim,
    },
    /// A claim unprepared.
    Unprepared {
        /// Claim UID.
        uid: String,
    },
}

impl Checkpoint {
    /// Applies one record.
    pub fn apply(&mut self, r: Record) {
        match r {
            Record::Prepared { uid, claim } => {
                self.claims.insert(uid, claim);
            }
            Record::Unprepared { uid } => {
                self.claims.remove(&uid);
            }
        }
    }

    /// Parses a checkpoint file's text: the snapshot, then the records replayed over it. A last
    /// line without its newline is an append the process did not finish (it died in the write,
    /// before it answered the kubelet, which prepares again): it is left out.
    pub fn parse(text: &[u8]) -> Result<Checkpoint, serde_json::Error> {
        if let Ok(cp) = serde_json::from_slice::<Checkpoint>(text) {
            return Ok(cp);
        }
        let complete = match text.iter().rposition(|&b| b == b'\n') {
            Some(end) if end + 1 < text.len() => {
                tracing::warn!(
                    bytes = text.len() - end - 1,
                    "the DRA checkpoint ends in an unfinished record; leaving it out"
                );
                &text[..=end]
            }
            _ => text,
        };
        let mut items =
            serde_json::Deserializer::from_slice(complete).into_iter::<serde_json::Value>();
        let first = match items.next() {
            Some(v) => v?,
            None => serde_json::from_slice::<serde_json::Value>(b"")?,
        };
        let mut cp: Checkpoint = serde_json::from_value(first)?;
        for item in items {
            cp.apply(serde_json::from_value(item?)?);
        }
        Ok(cp)
    }
}

/// One allocated device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's request this device serves.
    pub request: String,
    /// Pool name.
    pub pool: String,
    /// ResourceSlice device name (`erdma-0`).
    pub device: String,
    /// ib device name (`erdma_0`).
    pub ibdev: String,
    /// CDI IDs returned to the kubelet.
    pub cdi_ids: Vec<String>,
    /// The allocation's share ID (consumable capacity), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Shares consumed.
    pub shares: u64,
    /// rdma cgroup limits consumed (zero for admin access).
    pub limits: RdmaLimits,
    /// Prepared for admin access (`adminAccess: true`): no share consumed, no rdma limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

/// A prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Devices, in allocation order.
    pub devices: Vec<PreparedDevice>,
    /// The claim's CDI spec file.
    pub cdi_spec: PathBuf,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// Prepared claims by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// The snapshot as written, borrowing the claims.
#[derive(Serialize)]
struct Snapshot<'a> {
    version: u32,
    claims: &'a BTreeMap<String, PreparedClaim>,
}

/// What one device has given out, summed over prepared claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    /// Shares.
    pub shares: u64,
    /// `hca_handle`.
    pub hca_handle: u64,
    /// `hca_object`.
    pub hca_object: u64,
    /// Claims holding a part of the device.
    pub claims: usize,
}

impl Checkpoint {
    /// Reads the checkpoint; a missing file is an empty checkpoint, an unreadable or corrupt one
    /// an error (never silently forgotten: it would double-book capacity), except a corrupt one
    /// last written before this boot (see [`Checkpoint::load_since`]).
    pub fn load(path: &Path) -> Result<Checkpoint> {
        Self::load_since(path, boot_time())
    }

    /// [`Checkpoint::load`] with the time this system booted (`None`: unknown). A corrupt file
    /// written before `booted` is what a power loss can leave of a checkpoint that was never
    /// flushed (see [`Checkpoint::save`]); the claims it described died with that boot (their
    /// containers and tmpfs CDI specs), so it is renamed to `*.corrupt` beside the original,
    /// logged, and the checkpoint starts empty: the kubelet prepares its claims again.
    pub fn load_since(path: &Path, booted: Option<std::time::SystemTime>) -> Result<Checkpoint> {
        match Self::read(path) {
            Err(e @ DraError::Json { .. }) => {
                let written = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                match (written, booted) {
                    (Some(w), Some(b)) if w < b => {
                        let aside = path.with_extension("json.corrupt");
                        let moved = std::fs::rename(path, &aside);
                        tracing::warn!(
                            checkpoint = %path.display(),
                            set_aside = %aside.display(),
                            moved = moved.is_ok(),
                            "the DRA checkpoint is corrupt ({e}) and was last written before this boot, so the claims it recorded ended with that boot; starting empty (the kubelet prepares its claims again)"
                        );
                        Ok(Checkpoint {
                            version: VERSION,
                            claims: BTreeMap::new(),
                        })
                    }
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// Reads the checkpoint as [`Checkpoint::load`] does, but never sets a corrupt file aside:
    /// for readers beside the driver (the agent's NRI plugin), which must not change its file.
    pub fn read_only(path: &Path) -> Result<Checkpoint> {
        Self::read(path)
    }

    fn read(path: &Path) -> Result<Checkpoint> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: VERSION,
                    claims: BTreeMap::new(),
                });
            }
            Err(e) => return Err(io_err("read checkpoint", path)(e)),
        };
        let cp = Checkpoint::parse(&text).map_err(|source| DraError::Json {
            what: "DRA checkpoint",
            path: path.to_path_buf(),
            source,
        })?;
        if !(1..=VERSION).contains(&cp.version) {
            return Err(DraError::Config(format!(
                "{} has checkpoint version {} (this agent reads 1 to {VERSION})",
                path.display(),
                cp.version
            )));
        }
        Ok(cp)
    }

    /// Writes the checkpoint atomically as one snapshot (version [`VERSION`], no records): a
    /// reader, and a restarted agent, sees the old file or the new one, never a part.
    ///
    /// No fsync ([`Durability::Boot`]), here and for the per-claim CDI specs: what these files
    /// describe lives for one boot only. The CDI specs sit on tmpfs (`/var/run/cdi`) and the
    /// checkpoint records claims of containers, both gone after a power loss or kernel crash, the
    /// only events an fsync guards against; the kubelet prepares every claim again after a
    /// reboot. The one thing such a crash could leave, a checkpoint cut short, is recognised by
    /// [`Checkpoint::load`] as written before this boot and set aside. An fsync on the kubelet's
    /// disk costs milliseconds at p99 on every prepare and unprepare, which the runtime waits for
    /// while it creates the container.
    pub fn save(&self, path: &Path) -> Result<()> {
        let snapshot = Snapshot {
            version: VERSION,
            claims: &self.claims,
        };
        let mut text = serde_json::to_vec(&snapshot).map_err(|source| DraError::Json {
            what: "DRA checkpoint",
            path: path.to_path_buf(),
            source,
        })?;
        text.push(b'\n');
        atomic::write(path, &text, Durability::Boot)?;
        Ok(())
    }

    /// What each ResourceSlice device has given out, over every claim except `except_uid`
    /// (sums saturate at `u64::MAX`).
    pub fn used(&self, except_uid: Option<&str>) -> BTreeMap<String, Used> {
        let mut out: BTreeMap<String, Used> = BTreeMap::new();
        for (uid, c) in &self.claims {
            if Some(uid.as_str()) == except_uid {
                continue;
            }
            let mut counted = std::collections::BTreeSet::new();
            for d in &c.devices {
                let u = out.entry(d.device.clone()).or_default();
                // Saturating: the file is read from disk, and a corrupt or hostile one must not
                // wrap a device's holdings round to little (or panic).
                u.shares = u.shares.saturating_add(d.shares);
                u.hca_handle = u.hca_handle.saturating_add(d.limits.hca_handle);
                u.hca_object = u.hca_object.saturating_add(d.limits.hca_object);
                if counted.insert(d.device.clone()) {
                    u.claims += 1;
                }
            }
        }
        out
    }
}

/// What a prepared claim grants a container on one ib device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Admin access (`adminAccess: true`): no rdma limit.
    Unrestricted,
    /// The rdma cgroup limits the claim's requests consumed on the device, summed.
    Limits(RdmaLimits),
}

impl Grant {
    /// Both grants together (two requests, or two claims, on one device): the limits summed
    /// (saturating: the file is read from disk); unrestricted when either is.
    pub fn plus(self, other: Grant) -> Grant {
        match (self, other) {
            (Grant::Limits(a), Grant::Limits(b)) => Grant::Limits(RdmaLimits {
                hca_handle: a.hca_handle.saturating_add(b.hca_handle),
                hca_object: a.hca_object.saturating_add(b.hca_object),
            }),
            _ => Grant::Unrestricted,
        }
    }

    /// The lower of two grants, key by key (unrestricted is the highest).
    pub fn lowest(self, other: Grant) -> Grant {
        match (self, other) {
            (Grant::Limits(a), Grant::Limits(b)) => Grant::Limits(RdmaLimits {
                hca_handle: a.hca_handle.min(b.hca_handle),
                hca_object: a.hca_object.min(b.hca_object),
            }),
            (Grant::Unrestricted, g) | (g, Grant::Unrestricted) => g,
        }
    }
}

impl PreparedClaim {
    /// What this claim grants per ib device, over its devices for which `counts` holds (the
    /// ResourceSlice devices a container uses, when it uses some of the claim's requests only).
    pub fn grants(&self, counts: impl Fn(&PreparedDevice) -> bool) -> BTreeMap<String, Grant> {
        let mut out: BTreeMap<String, Grant> = BTreeMap::new();
        for d in self.devices.iter().filter(|d| counts(d)) {
            let g = if d.admin {
                Grant::Unrestricted
            } else {
                Grant::Limits(d.limits)
            };
            out.entry(d.ibdev.clone())
                .and_modify(|have| *have = have.plus(g))
                .or_insert(g);
        }
        out
    }
}

impl Checkpoint {
    /// The prepared claims named `namespace`/`name` with their UIDs: one, or more while a
    /// deleted claim of that name waits for its unprepare.
    pub fn named<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a PreparedClaim)> + 'a {
        self.claims
            .iter()
            .filter(move |(_, c)| c.namespace == namespace && c.name == name)
            .map(|(uid, c)| (uid.as_str(), c))
    }
}

/// Prepared claims (`namespace/name`) per ib device, for `erdmactl devices` and `doctor`.
pub fn claims_by_device(cp: &Checkpoint) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in cp.claims.values() {
        let who = format!("{}/{}", c.namespace, c.name);
        for d in &c.devices {
            let v = out.entry(d.ibdev.clone()).or_default();
            if !v.contains(&who) {
                v.push(who.clone());
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// When this system booted: `btime` of `/proc/stat` (seconds since the epoch).
pub fn boot_time() -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// Where the checkpoint of `driver` lives under a kubelet root directory.
pub fn path_under(kubelet_root: &Path, driver: &str) -> PathBuf {
    kubelet_root
        .join("plugins")
        .join(driver)
        .join("checkpoint.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_empty_corrupt_is_an_error() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        assert!(Checkpoint::load(&p).expect("missing").claims.is_empty());
        std::fs::write(&p, "{not json").expect("write");
        assert!(Checkpoint::load(&p).is_err());
        assert!(
            p.exists(),
            "a corrupt checkpoint of this boot is left in place"
        );
    }

    #[test]
    fn a_corrupt_checkpoint_from_before_this_boot_is_set_aside() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        // What a power loss can leave of a checkpoint that was not flushed: nothing, or a part.
        for left in ["", "{\"version\":1,\"claims\":{\"a\":{\"namesp"] {
            std::fs::write(&p, left).expect("write");
            let written = std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .expect("mtime");
            let later = written + std::time::Duration::from_secs(60);
            let earlier = written - std::time::Duration::from_secs(60);
            // Written during this boot (booted earlier): an error, the file kept.
            assert!(
                Checkpoint::load_since(&p, Some(earlier)).is_err(),
                "{left:?}"
            );
            assert!(
                Checkpoint::load_since(&p, None).is_err(),
                "{left:?}: boot time unknown"
            );
            assert!(p.exists());
            // Written before this boot: empty, the file renamed beside it.
            let cp = Checkpoint::load_since(&p, Some(later)).expect("set aside");
            assert!(cp.claims.is_empty());
            assert_eq!(cp.version, VERSION);
            assert!(!p.exists());
            assert_eq!(
                std::fs::read_to_string(dir.path().join("checkpoint.json.corrupt")).expect("kept"),
                left
            );
        }
    }

    #[test]
    fn boot_time_is_in_the_past() {
        let b = boot_time().expect("/proc/stat has btime");
        assert!(b < std::time::SystemTime::now());
        assert!(b > std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000));
    }

    #[test]
    fn round_trip_and_usage() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("sub/checkpoint.json");
        let dev = |shares| PreparedDevice {
            request: "rdma".into(),
            pool: "n".into(),
            device: "erdma-0".into(),
            ibdev: "erdma_0".into(),
            cdi_ids: vec!["x/claim=a".into()],
            share_id: None,
            shares,
            limits: RdmaLimits {
                hca_handle: 4,
                hca_object: 10,
            },
            admin: false,
        };
        let mut cp = Checkpoint {
            version: VERSION,
            ..Default::default()
        };
        for (uid, shares) in [("a", 1), ("b", 3)] {
            cp.claims.insert(
                uid.into(),
                PreparedClaim {
                    namespace: "ns".into(),
                    name: uid.into(),
                    devices: vec![dev(shares)],
                    cdi_spec: PathBuf::from("/x"),
                },
            );
        }
        cp.save(&p).expect("save");
        let back = Checkpoint::load(&p).expect("load");
        assert_eq!(back, cp);
        let all = back.used(None);
        assert_eq!(all["erdma-0"].shares, 4);
        assert_eq!(all["erdma-0"].hca_handle, 8);
        assert_eq!(all["erdma-0"].claims, 2);
        assert_eq!(back.used(Some("b"))["erdma-0"].shares, 1);
        assert_eq!(
            claims_by_device(&back)["erdma_0"],
            ["ns/a".to_string(), "ns/b".to_string()]
        );
    }

    /// A claim's grant per ib device: two requests on one device sum, admin access is
    /// unrestricted (also beside a regular request there), and the devices a container does not
    /// use are left out; claims are found by name; a corrupt file read beside the driver stays.
    #[test]
    fn grants_per_device_and_claims_by_name() {
        let dev =
            |request: &str, device: &str, ibdev: &str, handle: u64, admin: bool| PreparedDevice {
                request: request.into(),
                pool: "n".into(),
                device: device.into(),
                ibdev: ibdev.into(),
                cdi_ids: vec![],
                share_id: None,
                shares: 1,
                limits: RdmaLimits {
                    hca_handle: handle,
                    hca_object: 100,
                },
                admin,
            };
        let claim = PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            devices: vec![
                dev("a", "erdma-0", "erdma_0", 2, false),
                dev("b", "erdma-0", "erdma_0", 3, false),
                dev("c", "erdma-1", "erdma_1", 4, false),
                dev("d", "erdma-1", "erdma_1", 0, true),
            ],
            cdi_spec: PathBuf::from("/x"),
        };
        let all = claim.grants(|_| true);
        assert_eq!(
            all["erdma_0"],
            Grant::Limits(RdmaLimits {
                hca_handle: 5,
                hca_object: 200
            })
        );
        assert_eq!(all["erdma_1"], Grant::Unrestricted);
        let only_a = claim.grants(|d| d.request == "a");
        assert_eq!(only_a.len(), 1);
        assert_eq!(
            only_a["erdma_0"],
            Grant::Limits(RdmaLimits {
                hca_handle: 2,
                hca_object: 100
            })
        );
        let l = |h, o| {
            Grant::Limits(RdmaLimits {
                hca_handle: h,
                hca_object: o,
            })
        };
        assert_eq!(l(2, 9).lowest(l(3, 1)), l(2, 1));
        assert_eq!(Grant::Unrestricted.lowest(l(3, 1)), l(3, 1));
        assert_eq!(l(u64::MAX, 1).plus(l(1, 1)), l(u64::MAX, 2));
        assert_eq!(l(1, 1).plus(Grant::Unrestricted), Grant::Unrestricted);

        let mut cp = Checkpoint::default();
        cp.claims.insert("u1".into(), claim.clone());
        let mut other = claim.clone();
        other.name = "d".into();
        cp.claims.insert("u2".into(), other);
        let named: Vec<&str> = cp.named("ns", "c").map(|(uid, _)| uid).collect();
        assert_eq!(named, ["u1"]);
        assert_eq!(cp.named("other", "c").count(), 0);

        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("checkpoint.json");
        std::fs::write(&p, "{not json").expect("write");
        assert!(Checkpoint::read_only(&p).is_err());
        assert!(p.exists());
    }
}
