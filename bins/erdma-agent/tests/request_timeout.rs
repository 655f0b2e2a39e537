//! The agent's Kubernetes API deadline (`--request-timeout`, issue 30, item 3): against an API
//! server that accepts connections and never answers, each call fails with an error naming the
//! deadline instead of hanging, and the agent goes on serving its devices (the real binary with
//! the fake kubelet and a fixture node tree). `GUARD` only keeps a
//! regression from hanging the test run; nothing here measures how fast anything is.

use erdma_agent::cluster;
use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Far beyond every deadline below: reaching it means something hung.
const GUARD: Duration = Duration::from_secs(90);

/// An API server that accepts every connection and holds it without a byte of answer; a
/// kubeconfig for it in `dir`.
fn silent_api_server(dir: &Path) -> (String, PathBuf) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\nusers: [{{name: u, user: {{}}}}]\n"
        ),
    )
    .expect("write kubeconfig");
    (url, kubeconfig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_api_server_fails_each_call_naming_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, kubeconfig) = silent_api_server(dir.path());
    let c = cluster::detect(Some("n1"), Some(&kubeconfig), Some(Duration::from_secs(1)))
        .await
        .expect("config read")
        .expect("a node name was given");
    let e = tokio::time::timeout(GUARD, c.event("Normal", "Probe", "hello"))
        .await
        .expect("the call ends at its deadline instead of hanging")
        .expect_err("nothing was answered");
    assert!(e.contains("create Event Probe for node n1"), "{e}");
    assert!(
        e.contains("did not answer within 1s") && e.contains(&url),
        "{e}"
    );
    // The next call is not stuck behind the first one.
    let e = tokio::time::timeout(GUARD, c.dra_event("Warning", "Again", "x"))
        .await
        .expect("the second call ends too")
        .expect_err("nothing was answered");
    assert!(e.contains("within 1s"), "{e}");
}

/// The real agent with `NODE_NAME`, a kubeconfig for `url`, `--request-timeout 1s` and `extra`;
/// its stderr is collected in the returned buffer.
struct Agent {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    fn spawn(tree: &NodeTree, kubelet_dir: &Path, kubeconfig: &Path, extra: &[&str]) -> Agent {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_erdma-agent"))
            .arg("--sysfs-root")
            .arg(tree.sys())
            .arg("--dev-root")
            .arg(tree.dev())
            .arg("--kubelet-dir")
            .arg(kubelet_dir)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--slots-per-device", "5", "--prefer-driver", "none"])
            .args(["--local-eri-discovery", "--request-timeout", "1s"])
            .args(extra)
            .env("NODE_NAME", "n1")
            .env_remove("KUBECONFIG")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn erdma-agent");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Agent { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits (up to `GUARD`) until stderr holds `text`.
    async fn wait_for_log(&self, text: &str) -> String {
        let start = std::time::Instant::now();
        loop {
            let s = self.stderr();
            if s.contains(text) {
                return s;
            }
            assert!(start.elapsed() < GUARD, "never logged {text:?}:\n{s}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn kubelet_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// The node condition the agent publishes at start times out; the agent logs it naming the
/// deadline and goes on serving its devices to the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_its_devices_while_the_api_server_is_silent() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = kubelet_dir();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .expect("fake kubelet");
    let (url, kubeconfig) = silent_api_server(dir.path());
    let mut agent = Agent::spawn(&tree, dir.path(), &kubeconfig, &[]);
    let log = agent
        .wait_for_log("did not answer within 1s (request timed out)")
        .await;
    assert!(log.contains("of node n1") && log.contains(&url), "{log}");
    let s = kubelet
        .wait_for(GUARD, |s| {
            s.resources
                .get("aliyun/erdma")
                .is_some_and(|r| r.devices.len() == 10)
        })
        .await
        .expect("the devices are served all the same");
    assert!(
        s.resources["aliyun/erdma"]
            .devices
            .iter()
            .all(|d| d.health == "Healthy")
    );
    assert!(
        agent.child.try_wait().expect("wait").is_none(),
        "the agent keeps running"
    );
    kubelet.shutdown().await;
}

/// `--resource-api node-label` reads the node before serving: against a silent API server the
/// start-up fails at the deadline with the reason (exit 1, restarted by the DaemonSet), instead
/// of an agent that hangs before serving anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_read_of_the_node_fails_at_the_deadline_instead_of_hanging() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = kubelet_dir();
    let (_, kubeconfig) = silent_api_server(dir.path());
    let mut agent = Agent::spawn(
        &tree,
        dir.path(),
        &kubeconfig,
        &["--resource-api", "node-label"],
    );
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = agent.child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            start.elapsed() < GUARD,
            "still hanging:\n{}",
            agent.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", agent.stderr());
    let log = agent.wait_for_log("read node n1 for label").await;
    assert!(log.contains("did not answer within 1s"), "{log}");
}
