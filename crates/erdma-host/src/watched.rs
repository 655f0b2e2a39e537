//! sysfs attribute reads with a time limit.
//!
//! Reading an attribute runs its driver's `show()`. A driver stuck on a lock or on a firmware
//! command never answers, and nothing can interrupt the read (the thread sleeps in the kernel,
//! often uninterruptibly). [`WatchedSysfs`] wraps a [`Sysfs`] and keeps a list of the attribute
//! reads in flight; [`WatchedSysfs::run`] runs a job made of such reads (an inventory scan) on a
//! thread of its own and watches it. A read in flight for longer than the limit is declared
//! *blocked*: the job's thread is left behind with it, and the job starts again on a fresh thread,
//! where that attribute, and every other attribute of its directory (one driver lock usually
//! guards them all), fails at once with [`SysfsError::NoAnswer`] or [`SysfsError::Skipped`]
//! instead of being read. A blocked read that answers at last is forgotten, and the attribute is
//! read again next time. At most [`MAX_BLOCKED`] threads are left behind; past that a job is given
//! up ([`Unanswered`]).
//!
//! Listing a directory, reading a link and `stat` are not watched: sysfs answers them from its
//! own tree without calling the driver. A FIFO in a captured tree blocks its reader as a stuck
//! attribute does, which is how the tests make one.

use crate::sysfs::{Sysfs, SysfsError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an attribute read may take before it is given up. Attributes answer in microseconds;
/// the slowest drivers (a firmware query behind a counter) in tens of milliseconds.
pub const DEFAULT_READ_LIMIT: Duration = Duration::from_secs(2);

/// Most reading threads left behind in blocked reads before a job is given up.
pub const MAX_BLOCKED: usize = 8;

/// A [`Sysfs`] whose attribute reads are watched (see the module documentation).
pub struct WatchedSysfs {
    inner: Arc<dyn Sysfs>,
    watch: Watch,
    /// The thread that runs jobs, between jobs (starting one per job doubled the cost of a
    /// refresh). It ends when this is dropped.
    idle: Mutex<Option<Worker>>,
}

type Task = Box<dyn FnOnce() + Send>;

/// A thread running the tasks sent to it, until its queue is closed.
struct Worker {
    tasks: std::sync::mpsc::Sender<Task>,
}

impl Worker {
    fn start() -> Option<Worker> {
        let (tasks, queue) = std::sync::mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name("sysfs-read".into())
            .spawn(move || {
                for task in queue {
                    task();
                }
            })
            .ok()?;
        Some(Worker { tasks })
    }
}

/// A read in flight, or left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRead {
    /// The attribute's full path (the root joined with the relative path).
    pub path: PathBuf,
    /// How long it has been waiting.
    pub waiting: Duration,
    /// Declared blocked: its thread was left behind.
    pub blocked: bool,
}

impl std::fmt::Display for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "read of {}, waiting {:.1} s",
            self.path.display(),
            self.waiting.as_secs_f64()
        )
    }
}

/// A job given up: more reads are blocked than threads may be left behind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("sysfs does not answer: {} attribute reads blocked for more than {limit:?} ({})", blocked.len(), list(blocked))]
pub struct Unanswered {
    /// The limit.
    pub limit: Duration,
    /// The blocked reads.
    pub blocked: Vec<PendingRead>,
}

fn list(reads: &[PendingRead]) -> String {
    reads
        .iter()
        .map(|r| r.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Debug)]
struct InFlight {
    id: u64,
    rel: PathBuf,
    started: Instant,
    blocked: bool,
}

struct Watch {
    limit: Duration,
    next_id: AtomicU64,
    /// Entries in `reads` with `blocked` set: reads check the list only when it is not zero.
    blocked: AtomicUsize,
    /// Reads declared blocked so far: a job that sees it move may be the one stuck.
    generation: AtomicU64,
    reads: Mutex<Vec<InFlight>>,
}

impl Watch {
    fn reads(&self) -> std::sync::MutexGuard<'_, Vec<InFlight>> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares the reads in flight for longer than the limit blocked.
    fn sweep(&self) {
        let now = Instant::now();
        let mut reads = self.reads();
        for r in reads.iter_mut() {
            if !r.blocked && now.duration_since(r.started) >= self.limit {
                r.blocked = true;
                self.blocked.fetch_add(1, Ordering::SeqCst);
                self.generation.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl WatchedSysfs {
    /// Watches `inner`'s attribute reads, each given `limit`.
    pub fn new(inner: Arc<dyn Sysfs>, limit: Duration) -> Self {
        WatchedSysfs {
            inner,
            watch: Watch {
                limit,
                next_id: AtomicU64::new(0),
                blocked: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                reads: Mutex::new(Vec::new()),
            },
            idle: Mutex::new(None),
        }
    }

    /// The time limit of one read.
    pub fn limit(&self) -> Duration {
        self.watch.limit
    }

    fn display(&self, rel: &Path) -> PathBuf {
        Path::new(&self.inner.describe()).join(rel)
    }

    /// The attribute reads in flight now, blocked ones included, the longest waiting first.
    pub fn pending(&self) -> Vec<PendingRead> {
        let now = Instant::now();
        let mut out: Vec<PendingRead> = self
            .watch
            .reads()
            .iter()
            .map(|r| PendingRead {
                path: self.display(&r.rel),
                waiting: now.duration_since(r.started),
                blocked: r.blocked,
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.waiting));
        out
    }

    /// Runs `job` on a thread of its own and returns its result. When one of its reads (or any
    /// read through this sysfs) takes longer than the limit, the thread is left behind and `job`
    /// runs again on a fresh one, where the blocked attribute and its directory fail at once. A
    /// panic in `job` is resumed here. [`Unanswered`] when more than [`MAX_BLOCKED`] reads are
    /// blocked. Without a thread (the system refused one), `job` runs here, unwatched.
    pub fn run<T, F>(&self, job: F) -> Result<T, Unanswered>
    where
        T: Send + 'static,
        F: Fn() -> T + Send + Sync + 'static,
    {
        let job = Arc::new(job);
        // Checked often enough that a blocked read is found soon after the limit.
        let tick = (self.watch.limit / 4).max(Duration::from_millis(5));
        loop {
            let generation = self.watch.generation.load(Ordering::SeqCst);
            let idle = self.idle().take();
            let Some(worker) = idle.or_else(Worker::start) else {
                return Ok(job());
            };
            let (tx, rx) = sync_channel(1);
            let own = job.clone();
            let task: Task = Box::new(move || {
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || own(),
                )));
            });
            if worker.tasks.send(task).is_err() {
                // Its thread is gone (it never ends while it has a sender): a new one.
                continue;
            }
            loop {
                match rx.recv_timeout(tick) {
                    Ok(answer) => {
                        let mut idle = self.idle();
                        if idle.is_none() {
                            *idle = Some(worker);
                        }
                        drop(idle);
                        return Ok(answer.unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {
                        self.watch.sweep();
                        if self.watch.generation.load(Ordering::SeqCst) == generation {
                            continue;
                        }
                        let blocked: Vec<PendingRead> =
                            self.pending().into_iter().filter(|r| r.blocked).collect();
                        if blocked.len() > MAX_BLOCKED {
                            return Err(Unanswered {
                                limit: self.watch.limit,
                                blocked,
                            });
                        }
                        // Start again on a new thread; this one stays behind in its read, and
                        // ends when the read does (dropping `worker` closes its queue).
                        break;
                    }
                }
            }
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Option<Worker>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why `rel` is not read: it, or an attribute of its directory, is blocked.
    fn refused(&self, rel: &Path) -> Option<SysfsError> {
        if self.watch.blocked.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let reads = self.watch.reads();
        let mut sibling = None;
        for r in reads.iter().filter(|r| r.blocked) {
            if r.rel == rel {
                return Some(SysfsError::NoAnswer {
                    path: self.display(rel),
                    limit: self.watch.limit,
                });
            }
            if sibling.is_none() && r.rel.parent() == rel.parent() {
                sibling = Some(SysfsError::Skipped {
                    path: self.display(rel),
                    blocked: self.display(&r.rel),
                    limit: self.watch.limit,
                });
            }
        }
        sibling
    }

    fn watched<T>(
        &self,
        rel: &Path,
        read: impl FnOnce() -> Result<T, SysfsError>,
    ) -> Result<T, SysfsError> {
        if let Some(e) = self.refused(rel) {
            return Err(e);
        }
        let id = self.watch.next_id.fetch_add(1, Ordering::Relaxed);
        self.watch.reads().push(InFlight {
            id,
            rel: rel.to_path_buf(),
            started: Instant::now(),
            blocked: false,
        });
        let result = read();
        let mut reads = self.watch.reads();
        if let Some(at) = reads.iter().position(|r| r.id == id)
            && reads.swap_remove(at).blocked
        {
            self.watch.blocked.fetch_sub(1, Ordering::SeqCst);
        }
        result
    }
}

impl Sysfs for WatchedSysfs {
    fn read_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        self.watched(rel, || self.inner.read_attr(rel))
    }

    fn reread_attr(&self, rel: &Path) -> Result<String, SysfsError> {
        self.watched(rel, || self.inner.reread_attr(rel))
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        self.inner.read_link(rel)
    }

    fn list_dir(&self, rel: &Path) -> Result<Vec<String>, SysfsError> {
        self.inner.list_dir(rel)
    }

    fn canonical(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        self.inner.canonical(rel)
    }

    fn exists(&self, rel: &Path) -> bool {
        self.inner.exists(rel)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn refresh(&self) {
        self.inner.refresh()
    }

    fn close_rereads(&self) {
        self.inner.close_rereads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RootedSysfs;
    use std::fs;

    fn fifo(path: &Path) {
        nix::unistd::mkfifo(
            path,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .expect("mkfifo");
    }

    /// Opens a FIFO's write end without waiting for a reader (`ENXIO` when there is none).
    fn writer(path: &Path) -> std::io::Result<fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
    }

    /// A tree with `ports/1/{state,rate}`, `other/value`, and `state` a FIFO (a read never ends).
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("ports/1")).unwrap();
        fs::create_dir_all(dir.path().join("other")).unwrap();
        fs::write(dir.path().join("ports/1/rate"), "25 Gb/sec\n").unwrap();
        fs::write(dir.path().join("other/value"), "7\n").unwrap();
        fifo(&dir.path().join("ports/1/state"));
        dir
    }

    fn read_all(s: &dyn Sysfs) -> Vec<Result<String, String>> {
        ["ports/1/state", "ports/1/rate", "other/value"]
            .iter()
            .map(|p| s.read_attr(Path::new(p)).map_err(|e| e.to_string()))
            .collect()
    }

    /// Generous: the limit is 200 ms, the job restarts once; a loaded machine may be slow to
    /// schedule the threads, so only a hang (the bug) can miss it.
    const HANG: Duration = Duration::from_secs(20);

    #[test]
    fn a_blocked_read_is_given_up_and_its_directory_skipped_while_the_rest_is_read() {
        let dir = tree();
        let watched = Arc::new(WatchedSysfs::new(
            Arc::new(RootedSysfs::new(dir.path())),
            Duration::from_millis(200),
        ));
        let w = watched.clone();
        let started = Instant::now();
        let got = watched.run(move || read_all(w.as_ref())).expect("answered");
        assert!(started.elapsed() < HANG, "took {:?}", started.elapsed());
        let state = dir.path().join("ports/1/state");
        let want_state = format!(
            "{}: no answer within 200ms: the read is still blocked (a driver stuck in this attribute?)",
            state.display()
        );
        assert_eq!(got[0], Err(want_state));
        assert_eq!(
            got[1],
            Err(format!(
                "{}: not read: {} in the same directory has not answered within 200ms",
                dir.path().join("ports/1/rate").display(),
                state.display()
            ))
        );
        assert_eq!(got[2], Ok("7".to_string()));
        // The thread left behind is still in its read, and is reported.
        let pending = watched.pending();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].path, state);
        assert!(pending[0].blocked);
        // The next job fails the blocked attribute at once, without waiting for the limit again.
        let w = watched.clone();
        let again = watched.run(move || read_all(w.as_ref())).expect("answered");
        assert_eq!(again, got);
        assert_eq!(watched.pending().len(), 1, "no second thread left behind");

        // The attribute answers at last (a writer opens and closes the FIFO: end of file): it is
        // forgotten, and read again.
        drop(writer(&state).expect("the left-behind reader has the FIFO open"));
        let deadline = Instant::now() + HANG;
        while !watched.pending().is_empty() {
            assert!(Instant::now() < deadline, "the blocked read never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        fs::remove_file(&state).unwrap();
        fs::write(&state, "4: ACTIVE\n").unwrap();
        let w = watched.clone();
        let now = watched.run(move || read_all(w.as_ref())).expect("answered");
        assert_eq!(now[0], Ok("4: ACTIVE".to_string()));
        assert_eq!(now[1], Ok("25 Gb/sec".to_string()));
    }

    #[test]
    fn more_blocked_reads_than_threads_may_be_left_behind_give_the_job_up() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..=MAX_BLOCKED {
            fs::create_dir_all(dir.path().join(format!("d{i}"))).unwrap();
            fifo(&dir.path().join(format!("d{i}/a")));
        }
        let watched = Arc::new(WatchedSysfs::new(
            Arc::new(RootedSysfs::new(dir.path())),
            Duration::from_millis(50),
        ));
        let w = watched.clone();
        let err = watched
            .run(move || {
                for i in 0..=MAX_BLOCKED {
                    let _ = w.read_attr(Path::new(&format!("d{i}/a")));
                }
            })
            .expect_err("given up");
        assert_eq!(err.blocked.len(), MAX_BLOCKED + 1, "{err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("sysfs does not answer: 9 attribute reads blocked for more than 50ms"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("{}", dir.path().join("d0/a").display())),
            "{msg}"
        );
        // The FIFOs' readers are released so that the threads end with the test.
        for i in 0..=MAX_BLOCKED {
            drop(writer(&dir.path().join(format!("d{i}/a"))));
        }
    }

    #[test]
    fn a_panic_in_the_job_is_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let watched = WatchedSysfs::new(
            Arc::new(RootedSysfs::new(dir.path())),
            Duration::from_secs(5),
        );
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = watched.run(|| -> u32 { panic!("scan bug") });
        }));
        let payload = caught.expect_err("resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"scan bug"));
    }
}
