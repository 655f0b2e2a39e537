//! Notice when a Unix socket is created in its directory (a daemon that restarted binds it
//! again): inotify through `notify`, so a client reconnects then instead of at the end of its
//! back-off or safety timer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Notify;

/// Watches the directory of one socket path for that name being created (or renamed into place).
/// Without a watchable directory (it does not exist yet) nothing is noticed, and the watch is
/// tried again at the next [`SocketWatch::created`].
pub struct SocketWatch {
    socket: PathBuf,
    what: &'static str,
    armed: Option<Armed>,
}

struct Armed {
    _watcher: notify::RecommendedWatcher,
    created: Arc<Notify>,
}

impl SocketWatch {
    /// A watch of `socket`; `what` names it in the debug log when it cannot be set up.
    pub fn new(socket: &Path, what: &'static str) -> Self {
        let mut w = SocketWatch {
            socket: socket.to_path_buf(),
            what,
            armed: None,
        };
        w.arm();
        w
    }

    /// Resolves when the socket is created; never while its directory cannot be watched.
    pub async fn created(&mut self) {
        self.arm();
        match &self.armed {
            Some(a) => a.created.notified().await,
            None => std::future::pending().await,
        }
    }

    fn arm(&mut self) {
        if self.armed.is_none() {
            self.armed = Armed::new(&self.socket, self.what);
        }
    }
}

impl Armed {
    fn new(socket: &Path, what: &str) -> Option<Self> {
        use notify::{EventKind, RecursiveMode, Watcher, event::ModifyKind};
        let dir = socket.parent().filter(|d| d.is_dir())?;
        let name = socket.file_name()?.to_os_string();
        let created = Arc::new(Notify::new());
        let wake = created.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            let made = matches!(
                ev.kind,
                EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_))
            );
            if made
                && ev
                    .paths
                    .iter()
                    .any(|p| p.file_name() == Some(name.as_os_str()))
            {
                wake.notify_one();
            }
        })
        .map_err(|e| tracing::debug!("{what} watch unavailable: {e}"))
        .ok()?;
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| tracing::debug!(dir = %dir.display(), "{what} watch failed: {e}"))
            .ok()?;
        Some(Armed {
            _watcher: watcher,
            created,
        })
    }
}
