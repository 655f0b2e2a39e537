//! A pod's volumes on the node, as the kubelet's volume manager sets them up before the sandbox
//! (`pkg/volume/hostpath`, `pkg/volume/emptydir`): a hostPath volume's `type` is checked (and a
//! `DirectoryOrCreate` / `FileOrCreate` path made), an emptyDir is a fresh directory of the pod.

use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// `hostPath.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// Unset or `""`: no check.
    Unset,
    /// Made (0755) when missing, then must be a directory.
    DirectoryOrCreate,
    /// Must exist and be a directory.
    Directory,
    /// Made (empty, 0644) when missing, then must be a file.
    FileOrCreate,
    /// Must exist and not be a directory.
    File,
    /// Must be a Unix socket.
    Socket,
    /// Must be a character device.
    CharDevice,
    /// Must be a block device.
    BlockDevice,
}

impl HostPathType {
    /// The API's name (`""` for unset).
    pub fn as_str(self) -> &'static str {
        match self {
            HostPathType::Unset => "",
            HostPathType::DirectoryOrCreate => "DirectoryOrCreate",
            HostPathType::Directory => "Directory",
            HostPathType::FileOrCreate => "FileOrCreate",
            HostPathType::File => "File",
            HostPathType::Socket => "Socket",
            HostPathType::CharDevice => "CharDevice",
            HostPathType::BlockDevice => "BlockDevice",
        }
    }

    /// Parses the API's name; the error is the kubelet's.
    pub fn parse(s: Option<&str>) -> Result<HostPathType, String> {
        Ok(match s.unwrap_or("") {
            "" => HostPathType::Unset,
            "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
            "Directory" => HostPathType::Directory,
            "FileOrCreate" => HostPathType::FileOrCreate,
            "File" => HostPathType::File,
            "Socket" => HostPathType::Socket,
            "CharDevice" => HostPathType::CharDevice,
            "BlockDevice" => HostPathType::BlockDevice,
            other => return Err(format!("{other} is an invalid volume type")),
        })
    }
}

/// What the check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPathOutcome {
    /// No type: not checked.
    Unchecked,
    /// It was there and of the type.
    Exists,
    /// It was missing and was made.
    Created,
}

/// A path with a `..` element, which the kubelet refuses for hostPath volumes and subPaths.
pub fn has_backsteps(path: &str) -> bool {
    Path::new(path)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
}

/// The kubelet's hostPath type check of `path` (it follows symbolic links, as `stat` does). The
/// error is the kubelet's message (`hostPath type check failed: P is not a directory`).
pub fn check_host_path(path: &Path, ty: HostPathType) -> Result<HostPathOutcome, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).ok();
    let kind = meta.as_ref().map(|m| m.file_type());
    let is_dir = kind.is_some_and(|k| k.is_dir());
    let exists = kind.is_some();
    let fail = |what: &str| Err(format!("hostPath type check failed: {shown} is not {what}"));
    match ty {
        HostPathType::Unset => Ok(HostPathOutcome::Unchecked),
        HostPathType::DirectoryOrCreate if !exists => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)
                .map_err(|e| format!("mkdir {shown}: {e}"))?;
            Ok(HostPathOutcome::Created)
        }
        HostPathType::DirectoryOrCreate | HostPathType::Directory => {
            if is_dir {
                Ok(HostPathOutcome::Exists)
            } else {
                fail("a directory")
            }
        }
        HostPathType::FileOrCreate if !exists => {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(path)
                .map_err(|e| format!("open {shown}: {e}"))?;
            Ok(HostPathOutcome::Created)
        }
        HostPathType::FileOrCreate | HostPathType::File => {
            // The kubelet's "file" is anything that exists and is not a directory.
            if exists && !is_dir {
                Ok(HostPathOutcome::Exists)
            } else {
                fail("a file")
            }
        }
        HostPathType::Socket => match kind {
            Some(k) if k.is_socket() => Ok(HostPathOutcome::Exists),
            _ => fail("a socket file"),
        },
        HostPathType::CharDevice => match kind {
            Some(k) if k.is_char_device() => Ok(HostPathOutcome::Exists),
            _ => fail("a character device"),
        },
        HostPathType::BlockDevice => match kind {
            Some(k) if k.is_block_device() => Ok(HostPathOutcome::Exists),
            _ => fail("a block device"),
        },
    }
}

/// Where the lab kubelet keeps a pod's emptyDir volumes: `<dir>/pod-volumes/<uid>` (the
/// kubelet's `pods/<uid>/volumes/kubernetes.io~empty-dir`).
pub fn pod_volume_dir(dir: &Path, uid: &str) -> PathBuf {
    dir.join("pod-volumes").join(uid)
}

/// Makes emptyDir `name` of the pod whose volume directory is `pod_dir`: a new directory with
/// mode 0777, as the kubelet's emptyDir plugin leaves it (it chmods past the umask).
pub fn make_empty_dir(pod_dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    let path = pod_dir.join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o777)
        .create(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))?;
    Ok(path)
}

/// A volume as the pod got it (in the pod record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The volume's name.
    pub name: String,
    /// `hostPath` or `emptyDir`.
    pub kind: String,
    /// The directory or file on the node.
    pub host_path: PathBuf,
    /// `hostPath.type` (`""`: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_path_type: String,
    /// What the type check found (hostPath).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<HostPathOutcome>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_passes_on_its_kind_and_fails_on_another() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let sock = d.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let missing = d.path().join("missing");
        let dev_null = Path::new("/dev/null");
        use HostPathOutcome::*;
        use HostPathType::*;

        assert_eq!(check_host_path(&missing, Unset), Ok(Unchecked));
        assert_eq!(check_host_path(&dir, Directory), Ok(Exists));
        assert_eq!(
            check_host_path(&file, Directory),
            Err(format!(
                "hostPath type check failed: {} is not a directory",
                file.display()
            ))
        );
        assert!(check_host_path(&missing, Directory).is_err());
        assert_eq!(check_host_path(&file, File), Ok(Exists));
        assert_eq!(
            check_host_path(&sock, File),
            Ok(Exists),
            "a socket is a file"
        );
        assert_eq!(
            check_host_path(&dir, File),
            Err(format!(
                "hostPath type check failed: {} is not a file",
                dir.display()
            ))
        );
        assert!(check_host_path(&missing, File).is_err());
        assert_eq!(check_host_path(&sock, Socket), Ok(Exists));
        assert_eq!(
            check_host_path(&file, Socket),
            Err(format!(
                "hostPath type check failed: {} is not a socket file",
                file.display()
            ))
        );
        assert_eq!(check_host_path(dev_null, CharDevice), Ok(Exists));
        assert_eq!(
            check_host_path(&file, CharDevice),
            Err(format!(
                "hostPath type check failed: {} is not a character device",
                file.display()
            ))
        );
        assert_eq!(
            check_host_path(dev_null, BlockDevice),
            Err("hostPath type check failed: /dev/null is not a block device".to_string())
        );

        // The OrCreate types make what is missing, with the kubelet's modes, and check what is
        // there.
        let made = d.path().join("a/b/c");
        assert_eq!(check_host_path(&made, DirectoryOrCreate), Ok(Created));
        assert!(made.is_dir());
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o755, 0, "at most 0755 (umask applies): {mode:o}");
        assert_eq!(check_host_path(&made, DirectoryOrCreate), Ok(Exists));
        assert!(check_host_path(&file, DirectoryOrCreate).is_err());
        let f = d.path().join("new-file");
        assert_eq!(check_host_path(&f, FileOrCreate), Ok(Created));
        assert!(f.is_file());
        assert_eq!(std::fs::read(&f).unwrap(), b"");
        assert_eq!(check_host_path(&file, FileOrCreate), Ok(Exists));
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"x",
            "an existing file is kept"
        );
        assert!(check_host_path(&dir, FileOrCreate).is_err());
        // FileOrCreate does not make parent directories (the kubelet's open(O_CREAT)).
        assert!(check_host_path(&d.path().join("no/such/file"), FileOrCreate).is_err());

        // Symbolic links are followed.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(check_host_path(&link, Directory), Ok(Exists));
    }

    #[test]
    fn type_names_and_backsteps() {
        assert_eq!(HostPathType::parse(None), Ok(HostPathType::Unset));
        assert_eq!(HostPathType::parse(Some("")), Ok(HostPathType::Unset));
        assert_eq!(
            HostPathType::parse(Some("Socket")),
            Ok(HostPathType::Socket)
        );
        assert_eq!(
            HostPathType::parse(Some("directory")),
            Err("directory is an invalid volume type".to_string())
        );
        assert!(has_backsteps("/var/../etc"));
        assert!(has_backsteps("a/.."));
        assert!(!has_backsteps("/var/lib/kubelet"));
        assert!(!has_backsteps("/var/..hidden"));
    }

    #[test]
    fn empty_dirs_are_world_writable() {
        let d = tempfile::tempdir().unwrap();
        let pod = pod_volume_dir(d.path(), "uid-1");
        assert_eq!(pod, d.path().join("pod-volumes/uid-1"));
        let p = make_empty_dir(&pod, "scratch").unwrap();
        assert_eq!(p, d.path().join("pod-volumes/uid-1/scratch"));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o777);
    }

    #[test]
    #[ignore = "needs root (mknod of a block device node); run with --ignored by scripts/test.sh"]
    fn a_block_device_passes_block_device() {
        let d = tempfile::tempdir().unwrap();
        let node = d.path().join("loop");
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(7, 0),
        )
        .expect("mknod a block device node (root)");
        assert_eq!(
            check_host_path(&node, HostPathType::BlockDevice),
            Ok(HostPathOutcome::Exists)
        );
        assert!(check_host_path(&node, HostPathType::CharDevice).is_err());
        assert_eq!(
            check_host_path(&node, HostPathType::File),
            Ok(HostPathOutcome::Exists)
        );
    }
}
