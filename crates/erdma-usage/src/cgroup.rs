//! Which pod and container a process belongs to, from its `/proc/<pid>/cgroup`.
//!
//! The kubelet names a pod's cgroup `pod<UID>` under its QoS parent (`pkg/kubelet/cm`:
//! `GetPodCgroupNameSuffix` is `"pod" + UID`; guaranteed pods sit right under `kubepods`,
//! burstable and best-effort ones under `kubepods/burstable` and `kubepods/besteffort`). With the
//! cgroupfs driver the path is those names joined by `/`
//! (`/kubepods/burstable/pod<UID>/<container id>`). With the systemd driver (`ToSystemd`) every
//! name has its `-` replaced by `_` (`escapeSystemdCgroupName`) and the names are joined into
//! nested slices (`ExpandSlice`): `/kubepods.slice/kubepods-burstable.slice/
//! kubepods-burstable-pod<UID with _>.slice`. The container's cgroup below it is the runtime's:
//! `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` (CRI-O), `docker-<id>.scope`
//! (cri-dockerd) with systemd, the bare `<id>` (containerd) or `crio-<id>` with cgroupfs. CRI-O's
//! `crio-conmon-<id>.scope` is its monitor, not a container. crun on cgroup v2 puts the process
//! one level lower (`<scope>/container`), as systemd in a container does with its own units: the
//! component right below the pod's is the container's either way.
//!
//! The parser looks for those two components anywhere in the path, so a kubelet `--cgroup-root`
//! (kind's `/kubelet.slice/kubelet-kubepods.slice/...`) and a reader in a cgroup namespace (paths
//! starting with `/..`) work too. cgroup v1 files have a line per hierarchy; the v2 line
//! (`0::`) is tried first, then the others in order.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// A pod's UID as the kubelet writes it (with `-`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct PodUid(pub String);

/// A container's runtime ID (hex).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ContainerId(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pod UID: a UUID, or a static pod's hash (hex); at most 64 characters, `[0-9a-zA-Z-]`.
fn valid_uid(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A container ID: 12 to 128 hex digits.
fn valid_container_id(s: &str) -> bool {
    (12..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod UID of one path component, if it is a pod's cgroup.
fn pod_component(c: &str) -> Option<PodUid> {
    if let Some(stem) = c.strip_suffix(".slice") {
        // systemd: the last `-`-separated name of the slice, `pod<UID with _>`.
        let last = stem.rsplit('-').next()?;
        let uid = last.strip_prefix("pod")?.replace('_', "-");
        return valid_uid(&uid).then_some(PodUid(uid));
    }
    let uid = c.strip_prefix("pod")?;
    valid_uid(uid).then(|| PodUid(uid.to_string()))
}

/// The container ID of the component below a pod's cgroup.
fn container_component(c: &str) -> Option<ContainerId> {
    let stem = c.strip_suffix(".scope").unwrap_or(c);
    if stem.starts_with("crio-conmon-") {
        return None;
    }
    let id = match stem.rsplit_once('-') {
        Some((prefix, id))
            if ["cri-containerd", "crio", "docker", "containerd"].contains(&prefix) =>
        {
            id
        }
        Some(_) => return None,
        None => stem,
    };
    valid_container_id(id).then(|| ContainerId(id.to_ascii_lowercase()))
}

/// Pod and container of one cgroup path.
pub fn parse_cgroup_path(path: &str) -> Option<(PodUid, ContainerId)> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).take(64).collect();
    // The innermost pod component wins; the container is the component right below it.
    let i = comps.iter().rposition(|c| pod_component(c).is_some())?;
    let pod = pod_component(comps[i])?;
    let container = container_component(comps.get(i + 1)?)?;
    Some((pod, container))
}

/// Pod and container of a process, from the contents of its `/proc/<pid>/cgroup`
/// (`hierarchy-ID:controller-list:cgroup-path` lines). `None` for host processes, a pod's own
/// cgroup without a container, and anything unreadable.
pub fn parse_proc_cgroup(contents: &str) -> Option<(PodUid, ContainerId)> {
    let paths = contents.lines().take(256).filter_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, _controllers, path) = (f.next()?, f.next()?, f.next()?);
        Some((id == "0", path))
    });
    let (v2, v1): (Vec<_>, Vec<_>) = paths.partition(|(is_v2, _)| *is_v2);
    v2.into_iter()
        .chain(v1)
        .find_map(|(_, p)| parse_cgroup_path(p))
}

/// Most bytes read of one `/proc/<pid>/cgroup`.
pub const MAX_CGROUP_FILE: u64 = 64 << 10;

/// For each PID, its pod and container, reading `<proc_root>/<pid>/cgroup` (at most
/// [`MAX_CGROUP_FILE`] bytes each). PIDs that are gone or belong to no pod are left out. A cgroup
/// name may be any bytes, so the file is read as bytes and odd ones replaced: a line that is not
/// UTF-8 names no pod, and the other lines still count.
pub fn read_pid_pods(
    proc_root: &Path,
    pids: &BTreeSet<u32>,
) -> BTreeMap<u32, (PodUid, ContainerId)> {
    use std::io::Read;
    let mut out = BTreeMap::new();
    for &pid in pids {
        let Ok(f) = std::fs::File::open(proc_root.join(pid.to_string()).join("cgroup")) else {
            continue;
        };
        let mut raw = Vec::new();
        if f.take(MAX_CGROUP_FILE).read_to_end(&mut raw).is_err() {
            continue;
        }
        if let Some(pc) = parse_proc_cgroup(&String::from_utf8_lossy(&raw)) {
            out.insert(pid, pc);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6a0b2c3d-1e2f-4a5b-8c7d-9e0f1a2b3c4d";
    const UID_: &str = "6a0b2c3d_1e2f_4a5b_8c7d_9e0f1a2b3c4d";
    const CID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa99887766554433221100";

    fn want() -> Option<(PodUid, ContainerId)> {
        Some((PodUid(UID.into()), ContainerId(CID.into())))
    }

    #[test]
    fn kubelet_and_runtime_layouts() {
        let table: Vec<(String, Option<(PodUid, ContainerId)>)> = vec![
            // cgroup v2, systemd driver, containerd: burstable, best-effort, guaranteed.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
                want(),
            ),
            (
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
                want(),
            ),
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"),
                want(),
            ),
            // CRI-O and cri-dockerd scopes.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n"
                ),
                want(),
            ),
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n"),
                want(),
            ),
            // CRI-O's conmon is not a container.
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n"),
                None,
            ),
            // cgroupfs driver: burstable, best-effort, guaranteed; CRI-O with cgroupfs.
            (format!("0::/kubepods/burstable/pod{UID}/{CID}\n"), want()),
            (format!("0::/kubepods/besteffort/pod{UID}/{CID}\n"), want()),
            (format!("0::/kubepods/pod{UID}/{CID}\n"), want()),
            (format!("0::/kubepods/pod{UID}/crio-{CID}\n"), want()),
            // A process inside a sub-cgroup of the container (systemd in a container).
            (
                format!(
                    "0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope\n"
                ),
                want(),
            ),
            // kind: the kubelet's --cgroup-root.
            (
                format!(
                    "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
                want(),
            ),
            // Read from inside a cgroup namespace.
            (
                format!(
                    "0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
                ),
                want(),
            ),
            // cgroup v1, several lines; the systemd named hierarchy and the controllers agree.
            (
                format!(
                    "12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
                ),
                want(),
            ),
            (
                format!(
                    "11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n1:name=systemd:/system.slice/containerd.service\n0::/\n"
                ),
                want(),
            ),
            // A static pod's UID is a hex hash without dashes.
            (
                format!(
                    "0::/kubepods.slice/kubepods-pod0123456789abcdef0123456789abcdef.slice/cri-containerd-{CID}.scope\n"
                ),
                Some((
                    PodUid("0123456789abcdef0123456789abcdef".into()),
                    ContainerId(CID.into()),
                )),
            ),
            // Host processes, the pod's own cgroup, nonsense.
            ("0::/system.slice/sshd.service\n".into(), None),
            (
                "0::/user.slice/user-1000.slice/session-3.scope\n".into(),
                None,
            ),
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice\n"),
                None,
            ),
            (format!("0::/kubepods/pod{UID}\n"), None),
            ("0::/\n".into(), None),
            ("".into(), None),
            ("garbage without colons".into(), None),
            (format!("0::/kubepods/pod{UID}/not-a-container-id\n"), None),
            (format!("0::/kubepods/pod{UID}/{}\n", &CID[..8]), None),
        ];
        for (contents, expected) in table {
            assert_eq!(parse_proc_cgroup(&contents), expected, "{contents}");
        }
    }

    /// A cgroup name is any bytes but `/` and NUL; one hierarchy's odd name must not hide the
    /// container the other lines name.
    #[test]
    fn a_non_utf8_cgroup_name_in_one_hierarchy_leaves_the_others_readable() {
        let dir = std::env::temp_dir().join(format!("erdma-usage-odd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let container = format!("/kubepods/besteffort/pod{UID}/{CID}\n");
        let mut contents = format!("12:devices:{container}").into_bytes();
        contents.extend_from_slice(b"11:net_cls,net_prio:/shaped/caf\xe9\n");
        contents.extend_from_slice(format!("1:name=systemd:{container}").as_bytes());
        std::fs::create_dir_all(dir.join("20")).unwrap();
        std::fs::write(dir.join("20/cgroup"), contents).unwrap();

        let m = read_pid_pods(&dir, &[20].into_iter().collect());
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(m.get(&20).cloned(), want());
    }

    #[test]
    fn reads_proc_files() {
        let dir = std::env::temp_dir().join(format!("erdma-usage-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (pid, c) in [
            (10u32, format!("0::/kubepods/pod{UID}/{CID}\n")),
            (11, "0::/system.slice/x.service\n".to_string()),
        ] {
            std::fs::create_dir_all(dir.join(pid.to_string())).unwrap();
            std::fs::write(dir.join(pid.to_string()).join("cgroup"), c).unwrap();
        }
        let m = read_pid_pods(&dir, &[10, 11, 12].into_iter().collect());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(Some(m[&10].clone()), want());
    }

    /// The pod's cgroup path components as the kubelet names them, written here from the
    /// kubelet's rules (`pkg/kubelet/cm`), not with the parser: the name is `[cgroup root..]
    /// kubepods [burstable|besteffort] pod<UID>`; cgroupfs joins it with `/`; systemd replaces
    /// each name's `-` by `_`, joins the names with `-` into one slice and expands the slice into
    /// its parents (`a.slice/a-b.slice/a-b-c.slice`).
    fn kubelet_pod_cgroup(systemd: bool, root: &[String], qos: u8, uid: &str) -> Vec<String> {
        let mut names: Vec<String> = root.to_vec();
        names.push("kubepods".into());
        match qos {
            0 => {}
            1 => names.push("burstable".into()),
            _ => names.push("besteffort".into()),
        }
        names.push(format!("pod{uid}"));
        if !systemd {
            return names;
        }
        let escaped: Vec<String> = names.iter().map(|n| n.replace('-', "_")).collect();
        (1..=escaped.len())
            .map(|i| format!("{}.slice", escaped[..i].join("-")))
            .collect()
    }

    /// The container's cgroup below the pod's: containerd, CRI-O, cri-dockerd.
    fn runtime_container_cgroup(systemd: bool, runtime: u8, cid: &str) -> String {
        match (systemd, runtime) {
            (true, 0) => format!("cri-containerd-{cid}.scope"),
            (true, 1) => format!("crio-{cid}.scope"),
            (true, _) => format!("docker-{cid}.scope"),
            (false, 1) => format!("crio-{cid}"),
            (false, _) => cid.to_string(),
        }
    }

    /// How the reader sees a cgroup path: from the host's cgroup namespace (`ups == 0`), or from
    /// a namespace rooted `ups` levels below the first `shared` components of the path.
    fn as_seen(components: &[String], shared: usize, ups: usize) -> String {
        if ups == 0 {
            return format!("/{}", components.join("/"));
        }
        let mut parts: Vec<&str> = vec![".."; ups];
        parts.extend(components[shared..].iter().map(String::as_str));
        format!("/{}", parts.join("/"))
    }

    /// cgroup v1 hierarchies as `/proc/<pid>/cgroup` lists them (highest ID first).
    const V1_HIERARCHIES: &[&str] = &[
        "rdma",
        "misc",
        "pids",
        "hugetlb",
        "net_cls,net_prio",
        "perf_event",
        "cpuset",
        "freezer",
        "memory",
        "devices",
        "cpu,cpuacct",
        "blkio",
        "name=systemd",
    ];

    proptest::proptest! {
        /// Any pod UID (a UUID, or a static pod's hash), any container ID, QoS class, cgroup
        /// driver, runtime, kubelet cgroup root, sub-cgroup in the container, cgroup namespace
        /// of the reader and cgroup layout (v2, v1, v1 hybrid) parses back to that pod and
        /// container.
        #[test]
        fn every_kubelet_layout_parses_back(
            uid in "([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})",
            cid in "[0-9a-f]{64}",
            qos in 0u8..3,
            systemd in proptest::bool::ANY,
            runtime in 0u8..3,
            root in proptest::collection::vec("[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,4})?", 0..3),
            sub in proptest::sample::select(vec!["", "container", "init.scope"]),
            shared_pick in 0usize..8,
            ups in 0usize..4,
            layout in 0u8..3,
            hybrid_unified in 0u8..3,
            v1_count in 1usize..=V1_HIERARCHIES.len(),
        ) {
            let mut components = kubelet_pod_cgroup(systemd, &root, qos, &uid);
            let pod_at = components.len() - 1;
            components.push(runtime_container_cgroup(systemd, runtime, &cid));
            if !sub.is_empty() {
                components.push(sub.to_string());
            }
            // A namespaced reader shares at most the pod's parents with the process.
            let path = as_seen(&components, shared_pick % (pod_at + 1), ups);
            let v1_lines: Vec<String> = V1_HIERARCHIES[V1_HIERARCHIES.len() - v1_count..]
                .iter()
                .enumerate()
                .map(|(i, h)| format!("{}:{h}:{path}", v1_count - i))
                .collect();
            let contents = match layout {
                0 => format!("0::{path}\n"),
                1 => format!("{}\n", v1_lines.join("\n")),
                _ => {
                    let unified = match hybrid_unified {
                        0 => path.clone(),
                        1 => "/".to_string(),
                        _ => "/system.slice/containerd.service".to_string(),
                    };
                    format!("{}\n0::{unified}\n", v1_lines.join("\n"))
                }
            };
            proptest::prop_assert_eq!(
                parse_proc_cgroup(&contents),
                Some((PodUid(uid.clone()), ContainerId(cid.clone()))),
                "{}",
                contents
            );
        }

        #[test]
        fn never_panics(s in ".{0,400}") {
            let _ = parse_proc_cgroup(&s);
        }

        #[test]
        fn never_panics_on_near_misses(
            prefix in "[a-z./_-]{0,40}",
            uid in "[0-9a-f_-]{0,70}",
            id in "[0-9a-fA-F-]{0,140}",
            sep in "(\\.slice/|/|-)",
        ) {
            let _ = parse_proc_cgroup(&format!("0::/{prefix}pod{uid}{sep}cri-containerd-{id}.scope"));
            let _ = parse_proc_cgroup(&format!("1:x:/{prefix}/pod{uid}/{id}\n0::{prefix}"));
        }
    }
}
