//! Watching the fake kubelet's state file (`fake-kubelet-state.json`, rewritten atomically on
//! every ListAndWatch message) for a condition, and timing how long it takes to hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The condition did not hold in time.
    #[error("{condition} did not hold within {timeout_ms} ms; last seen: {last}")]
    Timeout {
        /// The condition, in words.
        condition: String,
        /// The limit.
        timeout_ms: u128,
        /// What the state file said last.
        last: String,
    },
    /// The state file could not be read.
    #[error(
        "cannot read fake kubelet state {path}: {cause}; is `erdma-fake-kubelet run --dir` running?"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
}

/// One advertised device (slot) as the fake kubelet recorded it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct SlotState {
    /// Device ID, `<ibdev>/<n>`.
    pub id: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    /// NUMA nodes of its topology.
    #[serde(default)]
    pub numa: Vec<i64>,
}

/// One registered resource.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct ResourceState {
    /// Devices of the latest ListAndWatch message.
    #[serde(default)]
    pub devices: Vec<SlotState>,
    /// Whether the ListAndWatch stream is open.
    #[serde(default)]
    pub connected: bool,
    /// When the fake kubelet received the latest ListAndWatch message (µs of
    /// `CLOCK_MONOTONIC`; 0 from a fake kubelet that does not say).
    #[serde(default)]
    pub received_monotonic_us: u64,
}

/// The parts of `fake-kubelet-state.json` the lab reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct KubeletState {
    /// Registered resources by name.
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceState>,
    /// Successful registrations since the fake kubelet started.
    #[serde(default)]
    pub registrations: u64,
}

impl KubeletState {
    /// Reads the state file; `None` while it does not exist or is being replaced.
    pub fn read(path: &Path) -> Result<Option<Self>, ProbeError> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(cause) => Err(ProbeError::Read {
                path: path.to_owned(),
                cause,
            }),
        }
    }
}

/// What must hold: every slot of one RDMA device has a given health (and there is at least one),
/// the stream is connected, and at least `min_registrations` registrations happened.
#[derive(Debug, Clone)]
pub struct Condition {
    /// Resource name, e.g. `aliyun/erdma`.
    pub resource: String,
    /// RDMA device whose slots are looked at, e.g. `rxe0`.
    pub ibdev: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    /// Registrations needed (counts re-registrations after kubelet restarts).
    pub min_registrations: u64,
}

impl Condition {
    /// Whether the condition holds in `state`.
    pub fn holds(&self, state: &KubeletState) -> bool {
        let Some(res) = state.resources.get(&self.resource) else {
            return false;
        };
        let slots = self.slots(res);
        res.connected
            && state.registrations >= self.min_registrations
            && !slots.is_empty()
            && slots.iter().all(|s| s.health == self.health)
    }

    fn slots<'a>(&self, res: &'a ResourceState) -> Vec<&'a SlotState> {
        let prefix = format!("{}/", self.ibdev);
        res.devices
            .iter()
            .filter(|d| d.id.starts_with(&prefix))
            .collect()
    }

    /// A one-line summary of what `state` says about this condition.
    pub fn describe(&self, state: Option<&KubeletState>) -> String {
        let Some(state) = state else {
            return "no state file yet".to_owned();
        };
        let Some(res) = state.resources.get(&self.resource) else {
            return format!(
                "{} not registered (registrations {})",
                self.resource, state.registrations
            );
        };
        let slots = self.slots(res);
        let healthy = slots.iter().filter(|s| s.health == "Healthy").count();
        format!(
            "{} slots of {}: {} healthy, {} not; connected {}; registrations {}",
            slots.len(),
            self.ibdev,
            healthy,
            slots.len() - healthy,
            res.connected,
            state.registrations
        )
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all {} slots of {} {}",
            self.resource, self.ibdev, self.health
        )?;
        if self.min_registrations > 0 {
            write!(f, " after {} registrations", self.min_registrations)?;
        }
        Ok(())
    }
}

/// Waits until `cond` holds in the state file at `path`; returns the time elapsed since `start`.
///
/// The fake kubelet replaces the file by a rename, so the directory is watched with inotify and
/// the file is read only when an event names it (no busy polling, and no re-read for the other
/// files of the directory, that would steal CPU from the agent under measurement). It is also
/// re-read every `fallback` in case an event is lost or inotify is unavailable.
pub fn wait_for(
    path: &Path,
    cond: &Condition,
    start: Instant,
    timeout: Duration,
    fallback: Duration,
) -> Result<Duration, ProbeError> {
    wait_for_state(path, cond, start, timeout, fallback).map(|(elapsed, _)| elapsed)
}

/// [`wait_for`], with the state in which the condition held.
pub fn wait_for_state(
    path: &Path,
    cond: &Condition,
    start: Instant,
    timeout: Duration,
    fallback: Duration,
) -> Result<(Duration, KubeletState), ProbeError> {
    let watch = DirWatch::new(path);
    let mut state = None;
    let mut reread = true;
    loop {
        if reread {
            state = KubeletState::read(path)?;
            if let Some(s) = state.as_ref().filter(|s| cond.holds(s)) {
                return Ok((start.elapsed(), s.clone()));
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(ProbeError::Timeout {
                condition: cond.to_string(),
                timeout_ms: timeout.as_millis(),
                last: cond.describe(state.as_ref()),
            });
        }
        reread = match &watch {
            Some(w) => w.wait(left.min(fallback)),
            None => {
                std::thread::sleep(left.min(fallback));
                true
            }
        };
    }
}

/// An inotify watch on the directory of the state file.
struct DirWatch {
    inotify: nix::sys::inotify::Inotify,
    /// The state file's name in the directory.
    name: std::ffi::OsString,
}

impl DirWatch {
    fn new(file: &Path) -> Option<Self> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = file.file_name()?.to_owned();
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_CREATE,
            )
            .ok()?;
        Some(Self { inotify, name })
    }

    /// Waits until an event names the state file (`true`) or `max` passed (`true`: time for the
    /// safety re-read); `false` when only other files of the directory changed.
    fn wait(&self, max: Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let timeout = PollTimeout::try_from(max).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {
                let mut named = false;
                while let Ok(events) = self.inotify.read_events() {
                    if events.is_empty() {
                        break;
                    }
                    named |= events
                        .iter()
                        .any(|e| e.name.as_deref() == Some(self.name.as_os_str()));
                }
                named
            }
            // Timed out, or interrupted: re-read.
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(json: &str) -> KubeletState {
        serde_json::from_str(json).expect("state json")
    }

    const TWO: &str = r#"{"resources": {"aliyun/erdma": {"endpoint": "erdma.sock", "options": {},
        "connected": true, "updates": 3,
        "devices": [{"id": "rxe0/0", "health": "Unhealthy", "numa": [0]}, {"id": "rxe0/1", "health": "Unhealthy", "numa": [0]},
                    {"id": "rxe1/0", "health": "Healthy", "numa": [1]}, {"id": "rxe10/0", "health": "Healthy", "numa": [1]}]}},
        "allocations": [], "registrations": 2, "kubelet_restarts": 1}"#;

    fn cond(ibdev: &str, health: &str, regs: u64) -> Condition {
        Condition {
            resource: "aliyun/erdma".into(),
            ibdev: ibdev.into(),
            health: health.into(),
            min_registrations: regs,
        }
    }

    #[test]
    fn holds_per_device_and_not_by_prefix_accident() {
        let s = state(TWO);
        assert!(cond("rxe0", "Unhealthy", 0).holds(&s));
        assert!(!cond("rxe0", "Healthy", 0).holds(&s));
        assert!(
            cond("rxe1", "Healthy", 2).holds(&s),
            "rxe10 must not count as rxe1"
        );
        assert!(
            !cond("rxe1", "Healthy", 3).holds(&s),
            "needs a third registration"
        );
        assert!(
            !cond("rxe7", "Healthy", 0).holds(&s),
            "no slots is not healthy"
        );
        assert_eq!(
            cond("rxe0", "Healthy", 0).describe(Some(&s)),
            "2 slots of rxe0: 0 healthy, 2 not; connected true; registrations 2"
        );
    }

    #[test]
    fn a_disconnected_stream_never_satisfies() {
        let s = state(&TWO.replace("\"connected\": true", "\"connected\": false"));
        assert!(!cond("rxe1", "Healthy", 0).holds(&s));
    }

    #[test]
    fn waiting_wakes_up_when_the_file_is_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fake-kubelet-state.json");
        std::fs::write(&path, TWO).expect("write");
        let writer_path = path.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let tmp = writer_path.with_extension("json.tmp");
            std::fs::write(&tmp, TWO.replace("Unhealthy", "Healthy")).expect("write tmp");
            std::fs::rename(&tmp, &writer_path).expect("rename");
        });
        // No re-read fallback before the wait's own limit: the state can only be seen again
        // through the inotify wake-up (or, with inotify broken, at the limit, which fails below).
        let limit = Duration::from_secs(600);
        let took = wait_for(
            &path,
            &cond("rxe0", "Healthy", 0),
            Instant::now(),
            limit,
            Duration::MAX,
        )
        .expect("holds after the rename");
        writer.join().expect("writer");
        assert!(took < limit, "woken by the wait's limit, not by inotify");
    }

    #[test]
    fn other_files_of_the_directory_do_not_make_a_reread_but_the_state_file_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fake-kubelet-state.json");
        std::fs::write(&path, TWO).expect("write");
        let w = DirWatch::new(&path).expect("inotify");
        std::fs::write(dir.path().join("fake-kubelet.lock"), b"").expect("write lock file");
        let long = Duration::from_secs(30);
        assert!(!w.wait(long), "another file changed: no re-read");
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, TWO).expect("write tmp");
        std::fs::rename(&tmp, &path).expect("rename");
        // The tmp file's events and the rename's may come in one read or two.
        let named = w.wait(long) || w.wait(long);
        assert!(named, "the rename onto the state file names it");
    }

    #[test]
    fn waiting_times_out_with_what_was_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fake-kubelet-state.json");
        std::fs::write(&path, TWO).expect("write");
        let start = Instant::now();
        let ok = wait_for(
            &path,
            &cond("rxe1", "Healthy", 0),
            start,
            Duration::from_secs(10),
            Duration::from_millis(5),
        );
        assert!(ok.is_ok(), "a condition that holds at once: {ok:?}");
        let err = wait_for(
            &path,
            &cond("rxe0", "Healthy", 0),
            Instant::now(),
            Duration::from_millis(30),
            Duration::from_millis(5),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("within 30 ms") && err.contains("0 healthy, 2 not"),
            "{err}"
        );
        let missing = dir.path().join("none.json");
        let err = wait_for(
            &missing,
            &cond("rxe0", "Healthy", 0),
            Instant::now(),
            Duration::from_millis(10),
            Duration::from_millis(5),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("no state file yet"), "{err}");
    }
}
