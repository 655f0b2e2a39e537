//! What a pod will look like, decided before anything touches the host: its network
//! namespace, the nodes of its private `/dev`, its bind mounts, environment and command.
//! Building a plan validates every path and value of the Allocate response.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::allocation::{AllocatedDevice, AllocatedMount, Allocation};
use crate::cdi::CdiEdits;

/// Nodes every pod's `/dev` gets, as a container runtime creates them.
pub const STANDARD_DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// `PATH` for the pod when neither the allocation nor `--env` sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a pod cannot be planned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// The pod name cannot be a hostname.
    #[error(
        "pod name {0:?} is not a DNS-1123 label (lower-case letters, digits, '-', at most 63 characters)"
    )]
    BadName(String),
    /// The network namespace name is not a plain name under /run/netns.
    #[error("network namespace {0:?} is not a name under /run/netns (no '/', not '.' or '..')")]
    BadNetns(String),
    /// A container path is not absolute and normal.
    #[error(
        "{what} container path {path:?} must be absolute without '.', '..' or empty components"
    )]
    BadPath {
        /// Device or mount.
        what: &'static str,
        /// The path as given.
        path: String,
    },
    /// A device node outside `/dev`.
    #[error(
        "device {0:?} must live under /dev/ inside the pod; the device plugin returned a container_path outside it"
    )]
    DeviceOutsideDev(String),
    /// Permissions with letters other than r, w, m.
    #[error("device {path:?} has permissions {perms:?}; only the letters r, w and m are allowed")]
    BadPermissions {
        /// The device.
        path: String,
        /// The permissions as given.
        perms: String,
    },
    /// Two entries claim the same container path with different sources.
    #[error(
        "container path {path:?} is claimed twice, by {first:?} and by {second:?}; allocations must not overlap"
    )]
    Conflict {
        /// The container path.
        path: String,
        /// The first host path.
        first: String,
        /// The second host path.
        second: String,
    },
    /// An environment variable name that cannot be set.
    #[error("environment variable name {0:?} is empty or contains '=' or NUL")]
    BadEnv(String),
    /// Nothing to run.
    #[error("no command given; put it after `--`")]
    NoCommand,
}

/// Which network namespace the pod runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// An existing namespace, `/run/netns/<name>` (as `ip netns add` creates).
    Named(String),
    /// A new, empty namespace with only `lo` (brought up).
    New,
}

/// A node in the pod's `/dev`, copied (type and major:minor) from a node on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    /// Path inside the pod.
    pub container_path: PathBuf,
    /// Path on the node.
    pub host_path: PathBuf,
    /// Permission bits of the node (from the r/w letters).
    pub mode: u32,
}

/// A bind mount into the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindMount {
    /// Path inside the pod.
    pub container_path: PathBuf,
    /// Path on the node.
    pub host_path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A validated pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodPlan {
    /// Pod name; also its hostname.
    pub name: String,
    /// Network namespace.
    pub network: Network,
    /// Device (slot) IDs the pod was allocated, for the record.
    pub device_ids: Vec<String>,
    /// Nodes of the private `/dev` (standard ones first).
    pub devices: Vec<DeviceNode>,
    /// Bind mounts, in order.
    pub mounts: Vec<BindMount>,
    /// The complete environment of the command.
    pub env: BTreeMap<String, String>,
    /// Command and arguments.
    pub command: Vec<String>,
}

/// Everything a pod is made from.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Existing network namespace to join, or `None` for a new one.
    pub netns: Option<String>,
    /// Allocate responses (one per resource).
    pub allocations: Vec<Allocation>,
    /// Edits from resolved CDI devices.
    pub cdi: CdiEdits,
    /// Extra environment (`--env`), applied last.
    pub env: Vec<(String, String)>,
    /// Command and arguments.
    pub command: Vec<String>,
}

impl PodPlan {
    /// Validates a spec into a plan.
    pub fn build(spec: &PodSpec) -> Result<Self, PlanError> {
        if !is_dns_label(&spec.name) {
            return Err(PlanError::BadName(spec.name.clone()));
        }
        let network = match &spec.netns {
            None => Network::New,
            Some(n)
                if n.is_empty() || n.contains('/') || n == "." || n == ".." || n.contains('\0') =>
            {
                return Err(PlanError::BadNetns(n.clone()));
            }
            Some(n) => Network::Named(n.clone()),
        };
        if spec.command.is_empty() {
            return Err(PlanError::NoCommand);
        }

        let mut devices: Vec<DeviceNode> = STANDARD_DEVICES
            .iter()
            .map(|p| DeviceNode {
                container_path: p.into(),
                host_path: p.into(),
                mode: 0o666,
            })
            .collect();
        let granted = spec
            .allocations
            .iter()
            .flat_map(|a| a.devices.iter())
            .chain(spec.cdi.devices.iter());
        for d in granted {
            push_device(&mut devices, d)?;
        }
        let mut mounts: Vec<BindMount> = Vec::new();
        let all_mounts = spec
            .allocations
            .iter()
            .flat_map(|a| a.mounts.iter())
            .chain(spec.cdi.mounts.iter());
        for m in all_mounts {
            push_mount(&mut mounts, &devices, m)?;
        }

        let mut env = BTreeMap::new();
        env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
        env.insert("HOSTNAME".to_owned(), spec.name.clone());
        let sources = spec
            .allocations
            .iter()
            .flat_map(|a| a.envs.iter())
            .chain(spec.cdi.env.iter())
            .chain(spec.env.iter().map(|(k, v)| (k, v)));
        for (k, v) in sources {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(PlanError::BadEnv(k.clone()));
            }
            env.insert(k.clone(), v.clone());
        }

        Ok(PodPlan {
            name: spec.name.clone(),
            network,
            device_ids: spec
                .allocations
                .iter()
                .flat_map(|a| a.device_ids.iter().cloned())
                .collect(),
            devices,
            mounts,
            env,
            command: spec.command.clone(),
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(ok_char)
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn normal_absolute(what: &'static str, path: &str) -> Result<PathBuf, PlanError> {
    let p = Path::new(path);
    let bad = || PlanError::BadPath {
        what,
        path: path.to_owned(),
    };
    if !p.is_absolute() || path.contains("//") || path.contains('\0') {
        return Err(bad());
    }
    let mut count = 0;
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(_) => count += 1,
            _ => return Err(bad()),
        }
    }
    // components() hides "." in the middle ("a/./b"); reject it textually too
    if count == 0 || path.split('/').any(|s| s == "." || s == "..") {
        return Err(bad());
    }
    Ok(p.to_path_buf())
}

fn mode_of(path: &str, perms: &str) -> Result<u32, PlanError> {
    if !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(PlanError::BadPermissions {
            path: path.to_owned(),
            perms: perms.to_owned(),
        });
    }
    let (r, w) = (perms.contains('r'), perms.contains('w'));
    Ok(match (r, w) {
        (false, false) if perms.is_empty() => 0o666,
        (true, true) => 0o666,
        (true, false) => 0o444,
        (false, true) => 0o222,
        (false, false) => 0o000,
    })
}

fn push_device(devices: &mut Vec<DeviceNode>, d: &AllocatedDevice) -> Result<(), PlanError> {
    let container_path = normal_absolute("device", &d.container_path)?;
    let host_path = normal_absolute("device host", &d.host_path)?;
    if !container_path.starts_with("/dev") || container_path == Path::new("/dev") {
        return Err(PlanError::DeviceOutsideDev(d.container_path.clone()));
    }
    let mode = mode_of(&d.container_path, &d.permissions)?;
    if let Some(prev) = devices
        .iter_mut()
        .find(|x| x.container_path == container_path)
    {
        if prev.host_path != host_path {
            return Err(PlanError::Conflict {
                path: d.container_path.clone(),
                first: prev.host_path.display().to_string(),
                second: d.host_path.clone(),
            });
        }
        prev.mode |= mode;
        return Ok(());
    }
    devices.push(DeviceNode {
        container_path,
        host_path,
        mode,
    });
    Ok(())
}

fn push_mount(
    mounts: &mut Vec<BindMount>,
    devices: &[DeviceNode],
    m: &AllocatedMount,
) -> Result<(), PlanError> {
    let container_path = normal_absolute("mount", &m.container_path)?;
    let host_path = normal_absolute("mount host", &m.host_path)?;
    if let Some(dev) = devices.iter().find(|d| d.container_path == container_path) {
        return Err(PlanError::Conflict {
            path: m.container_path.clone(),
            first: dev.host_path.display().to_string(),
            second: m.host_path.clone(),
        });
    }
    if let Some(prev) = mounts
        .iter_mut()
        .find(|x| x.container_path == container_path)
    {
        if prev.host_path != host_path {
            return Err(PlanError::Conflict {
                path: m.container_path.clone(),
                first: prev.host_path.display().to_string(),
                second: m.host_path.clone(),
            });
        }
        prev.read_only &= m.read_only;
        return Ok(());
    }
    mounts.push(BindMount {
        container_path,
        host_path,
        read_only: m.read_only,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(c: &str, h: &str, p: &str) -> AllocatedDevice {
        AllocatedDevice {
            container_path: c.into(),
            host_path: h.into(),
            permissions: p.into(),
        }
    }

    fn spec(devices: Vec<AllocatedDevice>) -> PodSpec {
        PodSpec {
            name: "pod-a".into(),
            netns: Some("pod-a".into()),
            allocations: vec![Allocation {
                pod: "lab/pod-a".into(),
                device_ids: vec!["rxe0/1".into()],
                envs: [("ERDMA_DEVICES".to_owned(), "rxe0".to_owned())].into(),
                devices,
                mounts: vec![AllocatedMount {
                    container_path: "/run/erdma".into(),
                    host_path: "/run/x".into(),
                    read_only: true,
                }],
                ..Allocation::default()
            }],
            env: vec![("EXTRA".into(), "1".into())],
            command: vec!["ibv_devices".into()],
            ..PodSpec::default()
        }
    }

    #[test]
    fn plan_has_standard_nodes_granted_nodes_mounts_and_env() {
        let plan = PodPlan::build(&spec(vec![
            dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rw"),
            dev("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "r"),
        ]))
        .expect("valid");
        assert_eq!(plan.network, Network::Named("pod-a".into()));
        let paths: Vec<String> = plan
            .devices
            .iter()
            .map(|d| d.container_path.display().to_string())
            .collect();
        assert_eq!(&paths[..6], STANDARD_DEVICES);
        assert_eq!(paths[6], "/dev/infiniband/uverbs0");
        assert_eq!(plan.devices[6].mode, 0o666);
        assert_eq!(plan.devices[7].mode, 0o444);
        assert_eq!(plan.mounts.len(), 1);
        assert!(plan.mounts[0].read_only);
        assert_eq!(plan.env["ERDMA_DEVICES"], "rxe0");
        assert_eq!(plan.env["EXTRA"], "1");
        assert_eq!(plan.env["HOSTNAME"], "pod-a");
        assert_eq!(plan.device_ids, ["rxe0/1"]);
    }

    #[test]
    fn no_allocation_means_only_standard_nodes_and_a_new_netns() {
        let s = PodSpec {
            name: "pod-c".into(),
            command: vec!["true".into()],
            ..PodSpec::default()
        };
        let plan = PodPlan::build(&s).expect("valid");
        assert_eq!(plan.devices.len(), STANDARD_DEVICES.len());
        assert_eq!(plan.network, Network::New);
    }

    #[test]
    fn duplicates_merge_and_conflicts_are_refused() {
        let plan = PodPlan::build(&spec(vec![
            dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "r"),
            dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "w"),
        ]))
        .expect("same node twice is fine");
        assert_eq!(plan.devices.len(), 7);
        assert_eq!(plan.devices[6].mode, 0o666);
        let err = PodPlan::build(&spec(vec![
            dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rw"),
            dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1", "rw"),
        ]))
        .unwrap_err();
        assert!(matches!(err, PlanError::Conflict { .. }), "{err}");
    }

    #[test]
    fn bad_values_are_refused_with_the_value_named() {
        let cases = [
            (
                dev("infiniband/uverbs0", "/dev/infiniband/uverbs0", "rw"),
                "infiniband/uverbs0",
            ),
            (
                dev("/dev/../etc/passwd", "/dev/null", "rw"),
                "/dev/../etc/passwd",
            ),
            (dev("/dev/./x", "/dev/null", "rw"), "/dev/./x"),
            (
                dev("/etc/uverbs0", "/dev/infiniband/uverbs0", "rw"),
                "/etc/uverbs0",
            ),
            (dev("/dev", "/dev/null", "rw"), "/dev"),
            (
                dev("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs0", "rwx"),
                "rwx",
            ),
        ];
        for (d, needle) in cases {
            let err = PodPlan::build(&spec(vec![d])).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let mut s = spec(vec![]);
        s.name = "Pod_A".into();
        assert_eq!(
            PodPlan::build(&s).unwrap_err(),
            PlanError::BadName("Pod_A".into())
        );
        let mut s = spec(vec![]);
        s.netns = Some("../x".into());
        assert!(matches!(
            PodPlan::build(&s).unwrap_err(),
            PlanError::BadNetns(_)
        ));
        let mut s = spec(vec![]);
        s.command.clear();
        assert_eq!(PodPlan::build(&s).unwrap_err(), PlanError::NoCommand);
        let mut s = spec(vec![]);
        s.env.push(("A=B".into(), "x".into()));
        assert!(matches!(
            PodPlan::build(&s).unwrap_err(),
            PlanError::BadEnv(_)
        ));
    }

    #[test]
    fn a_mount_over_a_device_node_is_a_conflict() {
        let mut s = spec(vec![dev(
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/uverbs0",
            "rw",
        )]);
        s.allocations[0].mounts.push(AllocatedMount {
            container_path: "/dev/infiniband/uverbs0".into(),
            host_path: "/tmp/x".into(),
            read_only: false,
        });
        assert!(matches!(
            PodPlan::build(&s).unwrap_err(),
            PlanError::Conflict { .. }
        ));
    }
}
