//! Where a container's cgroup lies in a cgroup v1 controller hierarchy (`rdma`), from the
//! `linux.cgroupsPath` of its OCI spec as the runtime reports it (NRI's `cgroups_path`).
//!
//! Two forms, by the runtime's cgroup driver, as runc reads them:
//! - cgroupfs: an absolute path, `/kubepods/besteffort/pod<UID>/<id>`, taken below each
//!   hierarchy's mount point as it is.
//! - systemd: `slice:prefix:name`, `kubepods-besteffort-pod<UID>.slice:cri-containerd:<id>`. The
//!   slice name expands into its ancestors (`a-b-c.slice` lies in `a.slice/a-b.slice/`, `-.slice`
//!   is the root, an empty slice is `system.slice`) and the unit is the scope `<prefix>-<name>.scope`
//!   (or `name` itself when it is a slice). runc's systemd v1 driver creates that directory in
//!   every mounted hierarchy systemd does not manage, `rdma` among them.
//!
//! The text comes from the runtime, but a path that could leave the hierarchy (`..`, a relative
//! path, a separator inside a systemd name) is refused rather than cleaned.

use std::path::PathBuf;

/// A `cgroups_path` that names no cgroup inside a hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cgroups path {value:?}: {why}; expected the cgroupfs form `/kubepods/<qos>/pod<UID>/<id>` or the systemd form `<slice>.slice:<prefix>:<id>`"
)]
pub struct CgroupsPathError {
    /// The path as given (cut to 200 characters).
    pub value: String,
    /// What is wrong.
    pub why: String,
}

/// The directory of the cgroup named by `cgroups_path`, relative to a v1 hierarchy's mount point
/// (`kubepods/besteffort/pod1/abc`, no leading `/`).
pub fn hierarchy_path(cgroups_path: &str) -> Result<PathBuf, CgroupsPathError> {
    let err = |why: String| CgroupsPathError {
        value: cgroups_path.chars().take(200).collect(),
        why,
    };
    if cgroups_path.contains('\0') {
        return Err(err("it holds a NUL byte".into()));
    }
    let parts: Vec<String> = if cgroups_path.contains(':') {
        systemd_parts(cgroups_path).map_err(err)?
    } else {
        cgroupfs_parts(cgroups_path).map_err(err)?
    };
    if parts.is_empty() {
        return Err(err(
            "it names the hierarchy's root, not a container's cgroup".into(),
        ));
    }
    Ok(parts.iter().collect())
}

fn cgroupfs_parts(path: &str) -> Result<Vec<String>, String> {
    if !path.starts_with('/') {
        // runc would take it below its own cgroup, which the agent cannot know.
        return Err("it is not absolute".into());
    }
    let mut parts = Vec::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if part == "." || part == ".." {
            return Err(format!("it holds a `{part}` component"));
        }
        parts.push(part.to_string());
    }
    Ok(parts)
}

fn systemd_parts(path: &str) -> Result<Vec<String>, String> {
    let fields: Vec<&str> = path.split(':').collect();
    let [slice, prefix, name] = fields.as_slice() else {
        return Err(format!(
            "{} `:`-separated fields; the systemd form has three",
            fields.len()
        ));
    };
    for (what, v) in [("slice", slice), ("prefix", prefix), ("name", name)] {
        if v.contains('/') {
            return Err(format!("its {what} {v:?} holds a `/`"));
        }
    }
    if name.is_empty() {
        return Err("its name is empty".into());
    }
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let mut parts = expand_slice(slice)?;
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else {
        format!("{prefix}-{name}.scope")
    };
    parts.push(unit);
    Ok(parts)
}

/// The directories of systemd slice `slice` below the root: `a-b.slice` is
/// `["a.slice", "a-b.slice"]`, `-.slice` is the root itself.
fn expand_slice(slice: &str) -> Result<Vec<String>, String> {
    let bad = || format!("its slice {slice:?} is not a systemd slice name");
    let stem = slice.strip_suffix(".slice").ok_or_else(bad)?;
    if stem.is_empty() {
        return Err(bad());
    }
    if stem == "-" {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    let mut prefix = String::new();
    for component in stem.split('-') {
        if component.is_empty() {
            return Err(bad());
        }
        parts.push(format!("{prefix}{component}.slice"));
        prefix.push_str(component);
        prefix.push('-');
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::{Component, Path};

    #[test]
    fn kubelet_paths_of_both_drivers_map_to_runcs_directories() {
        // Written out by hand from runc's rules (fs: mount point + path; systemd v1:
        // mount point + ExpandSlice(parent) + "<prefix>-<name>.scope").
        let table = [
            (
                "/kubepods/besteffort/pod0a1b/4f2e",
                "kubepods/besteffort/pod0a1b/4f2e",
            ),
            ("/kubepods/pod0a1b/4f2e", "kubepods/pod0a1b/4f2e"),
            ("//kubepods//burstable/pod1/c/", "kubepods/burstable/pod1/c"),
            (
                "kubepods-besteffort-pod0a1b_22.slice:cri-containerd:4f2e",
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b_22.slice/cri-containerd-4f2e.scope",
            ),
            (
                "kubepods-pod9.slice:crio:77",
                "kubepods.slice/kubepods-pod9.slice/crio-77.scope",
            ),
            (":runc:c1", "system.slice/runc-c1.scope"),
            ("-.slice:runc:c1", "runc-c1.scope"),
            ("user.slice:x:my.slice", "user.slice/my.slice"),
        ];
        for (given, want) in table {
            assert_eq!(
                hierarchy_path(given).as_deref(),
                Ok(Path::new(want)),
                "{given}"
            );
        }
    }

    #[test]
    fn paths_that_could_leave_the_hierarchy_or_name_nothing_are_refused() {
        for (given, why) in [
            ("/kubepods/../../etc", "`..`"),
            ("/kubepods/./x", "`.`"),
            ("kubepods/besteffort/pod1/c", "not absolute"),
            ("/", "root"),
            ("", "not absolute"),
            ("a.slice:p:../x", "`/`"),
            ("a.slice:p/../..:x", "`/`"),
            ("../a.slice:p:x", "`/`"),
            ("a.slice:p:", "name is empty"),
            ("a--b.slice:p:x", "not a systemd slice"),
            ("-a.slice:p:x", "not a systemd slice"),
            (".slice:p:x", "not a systemd slice"),
            ("kubepods:p:x", "not a systemd slice"),
            ("a.slice:p", "2 `:`-separated"),
            ("a.slice:p:x:y", "4 `:`-separated"),
            ("/kube\0pods/c", "NUL"),
        ] {
            let e = hierarchy_path(given).expect_err(given);
            assert!(e.why.contains(why), "{given}: {e}");
            assert!(e.to_string().contains("systemd form"), "{e}");
        }
    }

    proptest! {
        /// Whatever the text, a mapped path stays below the hierarchy: relative, without `..`,
        /// `.` or a root, and non-empty.
        #[test]
        fn a_mapped_path_never_leaves_the_hierarchy(s in "[a-z0-9./:_-]{0,40}") {
            if let Ok(p) = hierarchy_path(&s) {
                prop_assert!(p.components().next().is_some());
                prop_assert!(p.components().all(|c| matches!(c, Component::Normal(_))), "{p:?}");
            }
        }

        /// A cgroupfs path of plain names maps to those names, in order.
        #[test]
        fn cgroupfs_names_are_kept(names in prop::collection::vec("[a-z0-9_]{1,12}", 1..6)) {
            let given = format!("/{}", names.join("/"));
            let p = hierarchy_path(&given).unwrap();
            let got: Vec<String> = p.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            prop_assert_eq!(got, names);
        }

        /// A systemd slice of n dash-separated words lies n directories deep, each one named by the
        /// words so far; the scope is the last directory.
        #[test]
        fn systemd_slices_expand_into_their_ancestors(
            words in prop::collection::vec("[a-z0-9_]{1,8}", 1..5),
            id in "[a-f0-9]{1,16}",
        ) {
            let given = format!("{}.slice:cri-containerd:{id}", words.join("-"));
            let p = hierarchy_path(&given).unwrap();
            let got: Vec<String> = p.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            prop_assert_eq!(got.len(), words.len() + 1);
            for (i, dir) in got[..words.len()].iter().enumerate() {
                prop_assert_eq!(dir, &format!("{}.slice", words[..=i].join("-")));
            }
            prop_assert_eq!(&got[words.len()], &format!("cri-containerd-{id}.scope"));
        }
    }
}
