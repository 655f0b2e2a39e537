//! The shutdown contract of the real `erdma-agent` binary: SIGTERM or SIGINT ends it within 5 s
//! with status 0, whatever it is waiting on, and it logs what it abandoned (`abandoned: ...`).
//!
//! What it waits on here: a sysfs read that never answers, as an attribute of a stuck driver
//! does. A FIFO stands in for erdma_0's port state: opening it for reading waits for a writer,
//! and reading it, while a writer holds it open, waits for data that never comes.

use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use nix::sys::signal::Signal;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The contract's 5 s, with slack for a loaded CI machine (two cores shared with other builds):
/// the agent itself exits ~0.5 s after the signal here; before the fix it never exited.
const EXIT_BOUND: Duration = Duration::from_secs(10);
/// How long a test waits for something that must happen (generous, for the same reason).
const DEADLINE: Duration = Duration::from_secs(30);

/// The fixture port whose `state` is a FIFO.
const STATE: &str = "class/infiniband/erdma_0/ports/1/state";

struct Agent {
    child: Child,
    /// Stderr lines, as they come.
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Reads stderr until a line satisfies `want`; panics with everything seen after `DEADLINE`.
    fn wait_for_line(&mut self, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no such line within {DEADLINE:?}:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Sends `signal`, waits up to [`EXIT_BOUND`]; the exit status and every stderr line.
    fn stop(&mut self, signal: Signal) -> (std::process::ExitStatus, Duration, Vec<String>) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let sent = Instant::now();
        nix::sys::signal::kill(pid, signal).expect("signal the agent");
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait for the agent") {
                break st;
            }
            assert!(
                sent.elapsed() < EXIT_BOUND,
                "the agent did not exit within {EXIT_BOUND:?} of {signal}; its logs:\n{}",
                self.rest().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = sent.elapsed();
        (status, took, self.rest())
    }

    /// Every line seen, and the rest of stderr (the process has exited or is killed).
    fn rest(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

/// The erdma-iwarp fixture with erdma_0's port state a FIFO.
fn tree_with_fifo() -> (NodeTree, PathBuf) {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let state = tree.sys().join(STATE);
    std::fs::remove_file(&state).expect("the fixture has the state file");
    nix::unistd::mkfifo(
        &state,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .expect("mkfifo");
    (tree, state)
}

fn spawn_agent(tree: &NodeTree, kubelet_dir: &Path) -> Agent {
    let mut child = Command::new(env!("CARGO_BIN_EXE_erdma-agent"))
        .arg("--sysfs-root")
        .arg(tree.sys())
        .arg("--dev-root")
        .arg(tree.dev())
        .arg("--kubelet-dir")
        .arg(kubelet_dir)
        .args(["--local-eri-discovery", "--prefer-driver", "none"])
        .args(["--metrics-addr", "off", "--log-format", "text"])
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn erdma-agent");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::channel();
    // Ends when the agent's stderr closes (the agent exited or was killed by Drop).
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Agent {
        child,
        lines,
        seen: Vec::new(),
    }
}

/// Opens the FIFO's write end once the agent has it open for reading (before that, a
/// non-blocking open fails with ENXIO). Held open, it keeps the agent's read waiting for data.
fn writer_once_the_agent_reads(state: &Path, agent: &mut Agent) -> std::fs::File {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(state);
        match opened {
            Ok(w) => return w,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {}
            Err(e) => panic!("open {}: {e}", state.display()),
        }
        if let Ok(Some(st)) = agent.child.try_wait() {
            panic!(
                "the agent exited ({st}) before reading sysfs:\n{}",
                agent.rest().join("\n")
            );
        }
        assert!(
            Instant::now() < deadline,
            "the agent never opened {}",
            state.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The initial inventory blocks on a sysfs read; SIGTERM (and SIGINT, the same) ends the agent
/// within the bound with status 0, and the log names the read it abandoned (and the initial scan,
/// when the signal came before the read's own 2 s limit gave it up, as it does here unless the
/// machine stalls).
#[test]
fn a_signal_during_a_blocked_initial_inventory_ends_the_agent_naming_the_read() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let (tree, state) = tree_with_fifo();
        let dir = tempfile::tempdir().unwrap();
        let mut agent = spawn_agent(&tree, dir.path());
        let _writer = writer_once_the_agent_reads(&state, &mut agent);
        let (status, took, lines) = agent.stop(signal);
        let logs = lines.join("\n");
        assert_eq!(status.code(), Some(0), "{signal}: {status}\n{logs}");
        assert!(took < EXIT_BOUND, "{signal}: {took:?}");
        let abandoned_read = lines.iter().find(|l| {
            l.contains(" WARN ") && l.contains("abandoned: sysfs read of ") && l.contains(STATE)
        });
        assert!(
            abandoned_read.is_some(),
            "{signal}: no abandoned read logged:\n{logs}"
        );
        let scan_abandoned = lines
            .iter()
            .any(|l| l.contains("abandoned: the initial inventory scan"));
        let scan_done = lines.iter().any(|l| l.contains("initial inventory"));
        assert!(scan_abandoned || scan_done, "{signal}:\n{logs}");
    }
}

/// The read's time limit gives the blocked attribute up: the agent starts, erdma_0 unhealthy
/// (its port state unreadable) and erdma_1 served; a SIGTERM then still ends it within the bound,
/// and the thread left behind in the read is logged as abandoned.
#[test]
fn a_read_given_up_at_start_leaves_the_agent_serving_and_stoppable() {
    let (tree, state) = tree_with_fifo();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = spawn_agent(&tree, dir.path());
    let _writer = writer_once_the_agent_reads(&state, &mut agent);
    let inventory = agent.wait_for_line(|l| l.contains("initial inventory"));
    assert!(
        inventory.contains(r#"("erdma_0", false)"#) && inventory.contains(r#"("erdma_1", true)"#),
        "{inventory}"
    );
    agent.wait_for_line(|l| l.contains("served device set"));
    let (status, took, lines) = agent.stop(Signal::SIGTERM);
    let logs = lines.join("\n");
    assert_eq!(status.code(), Some(0), "{status}\n{logs}");
    assert!(took < EXIT_BOUND, "{took:?}");
    assert!(
        lines.iter().any(|l| l.contains("abandoned: sysfs read of ")
            && l.contains(STATE)
            && l.contains("blocked, its thread left behind")),
        "{logs}"
    );
    assert!(
        lines.iter().any(|l| l.contains("erdma-agent stopped")),
        "{logs}"
    );
}
