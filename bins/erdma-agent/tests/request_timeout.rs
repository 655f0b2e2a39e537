//! The agent's Kubernetes API deadline (`--request-timeout`, issue 30, item 3): against an API
//! server that accepts connections and never answers, each call fails with an error naming the
//! deadline instead of hanging, and the agent goes on serving its devices. `GUARD` only keeps a
//! regression from hanging the test run; nothing here measures how fast anything is.

use erdma_agent::cluster;
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
    let c = cluster::detect_with(Some("n1"), Some(&kubeconfig), Some(Duration::from_secs(1)))
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
