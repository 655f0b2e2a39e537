//! The inotify watch on the device-plugin directory: our socket removed or replaced, the
//! kubelet's socket created, and whether the watch still works. A watch dies with its directory
//! (removed or moved away); until it is armed again on the directory made anew, the plugin
//! checks both sockets every second instead of every [`PluginConfig::safety_poll`].

use crate::config::PluginConfig;
use erdma_model::Backoff;
use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often the plugin checks its own socket and the kubelet's while no watch is live.
pub(crate) const POLL: Duration = Duration::from_secs(1);
const WAIT_START: Duration = Duration::from_millis(50);
const WAIT_MAX: Duration = Duration::from_secs(5);

/// What happened in the device-plugin directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirEvent {
    /// Our socket path was removed or replaced.
    OwnSocketRemoved,
    KubeletSocketCreated,
    /// Events may have been lost (queue overflow, a broken or vanished watch): look now.
    Rescan,
}

/// State the watcher's thread and the lifecycle share.
#[derive(Default)]
struct Flags {
    /// A watch is armed and has not reported its end.
    live: AtomicBool,
    /// A [`DirEvent::Rescan`] is queued and not yet taken: more are not sent, so a watch that
    /// fails again and again cannot flood the channel.
    rescan_pending: AtomicBool,
}

impl Flags {
    fn rescan(&self, tx: &mpsc::UnboundedSender<DirEvent>) {
        if !self.rescan_pending.swap(true, Ordering::AcqRel) {
            let _ = tx.send(DirEvent::Rescan);
        }
    }
}

/// The watch and what the lifecycle asks of it.
pub(crate) struct DirWatch {
    /// The directory, absolute: inotify reports absolute paths.
    dir: PathBuf,
    own: PathBuf,
    kubelet: PathBuf,
    tx: mpsc::UnboundedSender<DirEvent>,
    flags: Arc<Flags>,
    watcher: Option<notify::RecommendedWatcher>,
    safety_poll: Duration,
    /// The last attempt to arm failed and was logged: later failures are not.
    failed_quietly: bool,
}

impl DirWatch {
    /// Waits for the directory to exist, then watches it. `None` when cancelled first.
    pub(crate) async fn start(
        cfg: &PluginConfig,
        cancel: &CancellationToken,
    ) -> Option<(Self, mpsc::UnboundedReceiver<DirEvent>)> {
        let mut wait = Backoff::new(WAIT_START, WAIT_MAX);
        while !cfg.kubelet_dir.is_dir() {
            tracing::warn!(dir = %cfg.kubelet_dir.display(), "device-plugin directory does not exist yet; waiting for the kubelet");
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(wait.next_delay()) => {}
            }
        }
        let dir = std::path::absolute(&cfg.kubelet_dir).unwrap_or_else(|_| cfg.kubelet_dir.clone());
        let (tx, rx) = mpsc::unbounded_channel();
        let mut w = DirWatch {
            own: dir.join(cfg.socket_name()),
            kubelet: dir.join(erdma_kubelet::deviceplugin::v1beta1::KUBELET_SOCKET_NAME),
            dir,
            tx,
            flags: Arc::default(),
            watcher: None,
            safety_poll: cfg.safety_poll,
            failed_quietly: false,
        };
        w.arm();
        Some((w, rx))
    }

    /// How long until the next check of both sockets: the safety poll while the watch is live,
    /// [`POLL`] otherwise.
    pub(crate) fn poll_period(&self) -> Duration {
        if self.flags.live.load(Ordering::Acquire) {
            self.safety_poll
        } else {
            POLL
        }
    }

    /// A [`DirEvent::Rescan`] was taken off the channel (or dropped with it): the next one may
    /// be sent.
    pub(crate) fn rescan_taken(&self) {
        self.flags.rescan_pending.store(false, Ordering::Release);
    }

    /// Arms the watch again when it is not live and the directory exists (it was removed and
    /// made again).
    pub(crate) fn rearm(&mut self) {
        if !self.flags.live.load(Ordering::Acquire) && self.dir.is_dir() {
            let lost = self.watcher.is_some();
            self.arm();
            if lost && self.flags.live.load(Ordering::Acquire) {
                tracing::info!(dir = %self.dir.display(), "watching the device-plugin directory again");
            }
        }
    }

    fn arm(&mut self) {
        // The old watcher's thread ends with it.
        self.watcher = None;
        let handler = Handler {
            dir: self.dir.clone(),
            own: self.own.clone(),
            kubelet: self.kubelet.clone(),
            tx: self.tx.clone(),
            flags: self.flags.clone(),
        };
        let mut w = match notify::recommended_watcher(move |res| handler.handle(res)) {
            Ok(w) => w,
            Err(e) => return self.failed(format!("inotify unavailable ({e})")),
        };
        // Live before the watch starts: if the directory goes at once, the watcher's thread
        // reports it after this store, and its `false` wins.
        self.flags.live.store(true, Ordering::Release);
        match w.watch(&self.dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                self.watcher = Some(w);
                self.failed_quietly = false;
            }
            Err(e) => {
                self.flags.live.store(false, Ordering::Release);
                self.failed(format!("inotify watch failed ({e})"));
            }
        }
    }

    fn failed(&mut self, why: String) {
        if !self.failed_quietly {
            tracing::warn!(dir = %self.dir.display(), "{why}; checking the sockets every {POLL:?}");
            self.failed_quietly = true;
        }
    }
}

/// What the watcher's thread does with each event.
struct Handler {
    dir: PathBuf,
    own: PathBuf,
    kubelet: PathBuf,
    tx: mpsc::UnboundedSender<DirEvent>,
    flags: Arc<Flags>,
}

impl Handler {
    fn handle(&self, res: notify::Result<notify::Event>) {
        let ev = match res {
            Ok(ev) => ev,
            Err(e) => {
                // A broken watch: the poll takes over and arms a new one. Reported once.
                if self.flags.live.swap(false, Ordering::AcqRel) {
                    tracing::warn!(dir = %self.dir.display(), "inotify watch error ({e}); checking the sockets every {POLL:?}");
                    self.flags.rescan(&self.tx);
                }
                return;
            }
        };
        if ev.need_rescan() {
            self.flags.rescan(&self.tx);
            return;
        }
        let renamed_or_removed = matches!(
            ev.kind,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        );
        if renamed_or_removed && ev.paths.contains(&self.dir) {
            if self.flags.live.swap(false, Ordering::AcqRel) {
                tracing::warn!(dir = %self.dir.display(), "the device-plugin directory was removed or moved; checking the sockets every {POLL:?} until it is back");
            }
            self.flags.rescan(&self.tx);
            return;
        }
        for p in &ev.paths {
            let e = match ev.kind {
                // Removed, or replaced by a rename over it.
                EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) if *p == self.own => {
                    Some(DirEvent::OwnSocketRemoved)
                }
                EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_))
                    if *p == self.kubelet =>
                {
                    Some(DirEvent::KubeletSocketCreated)
                }
                _ => None,
            };
            if let Some(e) = e {
                let _ = self.tx.send(e);
            }
        }
    }
}
