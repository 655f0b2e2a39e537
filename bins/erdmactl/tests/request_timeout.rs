//! `--request-timeout` (issue 30, item 3): an API server that accepts connections and never
//! answers ends `doctor`, `submit`, `install`, `uninstall` and `top` with exit 2 and a message naming the
//! flag, instead of hanging for minutes. (The process guard below only keeps a regression from
//! hanging the test run; nothing here measures time.)

use std::net::TcpListener;
use std::time::Duration;

#[test]
fn a_silent_api_server_ends_each_command_with_exit_2_naming_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and hold every connection without a byte of answer.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://{addr}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\nusers: [{{name: u, user: {{}}}}]\n"
        ),
    )
    .unwrap();
    let kc = kc.to_str().unwrap();
    let t = ["--kubeconfig", kc, "--request-timeout", "1s"];
    let cases: Vec<Vec<&str>> = vec![
        [&["doctor", "--node", "n1"][..], &t].concat(),
        [&["install", "--credentials-type", "ecs_ram_role"][..], &t].concat(),
        [&["uninstall"][..], &t].concat(),
        [&["top", "pods", "-A"][..], &t].concat(),
        [&["top", "devices", "--node", "n1"][..], &t].concat(),
        [
            &["submit", "pytorch", "--name", "j", "--image", "i"][..],
            &t,
            &["--", "python", "t.py"],
        ]
        .concat(),
    ];
    for args in cases {
        let out = assert_cmd::Command::cargo_bin("erdmactl")
            .unwrap()
            .env_remove("KUBECONFIG")
            .env("HOME", "/nonexistent")
            .args(&args)
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--request-timeout"), "{args:?}: {err}");
    }
}
