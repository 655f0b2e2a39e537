//! The kubelet's atomic writer (`pkg/volume/util/atomic_writer.go`), which lays out configMap,
//! secret, projected and downwardAPI volumes: the files go into a timestamped directory
//! `..<YYYY_MM_DD_HH_MM_SS>.<random>` (mode 0755), the symbolic link `..data` points at it, and
//! each top-level entry of the payload is a symbolic link `<name> -> ..data/<name>`; so a
//! reader of the volume sees a whole payload or none. Each file gets its projection's mode and,
//! with an `fs_user`, that owner (the service account token of a pod whose containers all run as
//! one user).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path};

/// One file of a volume's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// Its content.
    pub data: Vec<u8>,
    /// Its mode (`0o644`).
    pub mode: u32,
    /// Its owner, when set (`FsUser`).
    pub fs_user: Option<u32>,
}

/// The link that names the current payload directory.
pub const DATA_DIR_LINK: &str = "..data";

/// Checks a payload path as the atomic writer does: relative, not empty, no `..` element, not
/// starting with `..` (those names are the writer's own).
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return Err(format!("{path:?} must be a relative path"));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("{path:?} must not contain '..'"));
    }
    if path.starts_with("..") {
        return Err(format!("{path:?} must not start with '..'"));
    }
    Ok(())
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        // Unique enough for a directory of this pod's volume.
        return std::process::id();
    }
    u32::from_le_bytes(b)
}

/// Writes `payload` into the volume directory `dir` (which must exist) as the atomic writer's
/// first write does. Returns the name of the timestamped directory.
pub fn write_payload(
    dir: &Path,
    payload: &BTreeMap<String, FileProjection>,
) -> std::io::Result<String> {
    for p in payload.keys() {
        check_path(p).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S").to_string();
    let ts_name = format!("..{stamp}.{}", random_u32());
    let ts = dir.join(&ts_name);
    std::fs::DirBuilder::new().mode(0o755).create(&ts)?;
    std::fs::set_permissions(&ts, std::fs::Permissions::from_mode(0o755))?;
    for (rel, f) in payload {
        let full = ts.join(rel);
        if let Some(parent) = full.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        std::fs::write(&full, &f.data)?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(f.mode))?;
        if let Some(uid) = f.fs_user {
            std::os::unix::fs::chown(&full, Some(uid), None)?;
        }
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&ts_name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA_DIR_LINK))?;
    let mut top: Vec<&str> = payload.keys().filter_map(|p| p.split('/').next()).collect();
    top.dedup();
    for name in top {
        std::os::unix::fs::symlink(format!("{DATA_DIR_LINK}/{name}"), dir.join(name))?;
    }
    Ok(ts_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            fs_user: None,
        }
    }

    #[test]
    fn the_layout_of_a_written_volume() {
        let d = tempfile::tempdir().unwrap();
        let payload = BTreeMap::from([
            ("config.json".to_string(), file("{}", 0o644)),
            ("conf/a".to_string(), file("a", 0o600)),
            ("conf/b".to_string(), file("b", 0o440)),
        ]);
        let ts = write_payload(d.path(), &payload).unwrap();
        assert!(
            ts.starts_with("..20") && ts.len() > "..2026_01_01_00_00_00.".len(),
            "{ts}"
        );
        let link = |p: &str| {
            std::fs::read_link(d.path().join(p))
                .unwrap()
                .display()
                .to_string()
        };
        assert_eq!(link("..data"), ts);
        assert_eq!(link("config.json"), "..data/config.json");
        assert_eq!(link("conf"), "..data/conf");
        assert_eq!(
            std::fs::read_to_string(d.path().join("conf/a")).unwrap(),
            "a"
        );
        let mode = |p: &str| {
            std::fs::metadata(d.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("config.json"), 0o644);
        assert_eq!(mode("conf/a"), 0o600);
        assert_eq!(mode("conf/b"), 0o440);
        assert_eq!(mode(&ts), 0o755);
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [ts.as_str(), "..data", "conf", "config.json"]);

        // An empty payload still gets its directory and link.
        let e = tempfile::tempdir().unwrap();
        let ts = write_payload(e.path(), &BTreeMap::new()).unwrap();
        assert_eq!(
            std::fs::read_link(e.path().join("..data"))
                .unwrap()
                .display()
                .to_string(),
            ts
        );
    }

    #[test]
    fn payload_paths_are_checked() {
        assert!(check_path("a/b").is_ok());
        assert!(
            check_path("..a")
                .unwrap_err()
                .contains("must not start with '..'")
        );
        assert!(check_path("a/../b").unwrap_err().contains("'..'"));
        assert!(check_path("/etc/x").unwrap_err().contains("relative"));
        assert!(check_path("").is_err());
    }
}
