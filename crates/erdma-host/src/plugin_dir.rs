//! The kubelet's device-plugin directory (`/var/lib/kubelet/device-plugins`): which plugin sockets
//! are in it and which of them accept connections (a socket file outlives a crashed plugin).

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// One socket file in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSocket {
    /// File name (names that are not UTF-8 are skipped: no plugin uses them).
    pub file_name: String,
    /// Whether something listens on it now.
    pub live: bool,
}

/// Lists the sockets in `dir` (sorted by name) and checks each one with a connect, which a Unix
/// socket answers at once (refused when nobody listens). Other files are ignored.
pub fn sockets(dir: &Path) -> io::Result<Vec<PluginSocket>> {
    sockets_named(dir, |_| true)
}

/// [`sockets`], only those whose file name `wanted` accepts: the others are neither connected to
/// nor listed (a connect makes the plugin behind the socket accept and drop a connection).
pub fn sockets_named(dir: &Path, wanted: impl Fn(&str) -> bool) -> io::Result<Vec<PluginSocket>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(file_name) = entry.file_name().into_string() else {
            continue;
        };
        if !wanted(&file_name) {
            continue;
        }
        // A file removed between readdir and stat is simply gone.
        let Ok(ty) = entry.file_type() else { continue };
        if !ty.is_socket() {
            continue;
        }
        let live = UnixStream::connect(entry.path()).is_ok();
        out.push(PluginSocket { file_name, live });
    }
    out.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn lists_sockets_and_tells_live_from_stale() {
        let dir = tempfile::tempdir().unwrap();
        let _live = UnixListener::bind(dir.path().join("1700000000-erdma-eni.sock")).unwrap();
        drop(UnixListener::bind(dir.path().join("1600000000-erdma.sock")).unwrap());
        std::fs::write(dir.path().join("kubelet_internal_checkpoint"), "{}").unwrap();
        std::fs::create_dir(dir.path().join("sub.sock")).unwrap();
        let got = sockets(dir.path()).unwrap();
        assert_eq!(
            got,
            vec![
                PluginSocket {
                    file_name: "1600000000-erdma.sock".into(),
                    live: false
                },
                PluginSocket {
                    file_name: "1700000000-erdma-eni.sock".into(),
                    live: true
                },
            ]
        );
    }

    #[test]
    fn only_the_wanted_sockets_are_connected_to() {
        let dir = tempfile::tempdir().unwrap();
        let other = UnixListener::bind(dir.path().join("1700000000-erdma-eni.sock")).unwrap();
        let own = UnixListener::bind(dir.path().join("erdma-aliyun_erdma.sock")).unwrap();
        other.set_nonblocking(true).unwrap();
        own.set_nonblocking(true).unwrap();
        let got = sockets_named(dir.path(), |n| n.contains("eni")).unwrap();
        assert_eq!(
            got,
            vec![PluginSocket {
                file_name: "1700000000-erdma-eni.sock".into(),
                live: true
            }]
        );
        assert!(other.accept().is_ok(), "the wanted socket was connected to");
        let untouched = own.accept().unwrap_err();
        assert_eq!(
            untouched.kind(),
            io::ErrorKind::WouldBlock,
            "own socket left alone"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let err = sockets(&dir.path().join("absent")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
