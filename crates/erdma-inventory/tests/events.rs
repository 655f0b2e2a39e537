//! The events that wake the inventory reader: inotify on `/dev/infiniband`, rtnetlink link
//! messages (as root, a veth pair in the host's namespace).

use erdma_inventory::events::{DownLinks, watch_dev, watch_links};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long a test waits for something that must happen (a hang guard for a loaded CI machine,
/// not a latency target: those are gates in `scripts/bench.sh`).
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn dev_changes_wake_the_reader() {
    let dev = tempfile::tempdir().unwrap();
    std::fs::create_dir(dev.path().join("infiniband")).unwrap();
    let wake = Arc::new(Notify::new());
    let _w = watch_dev(dev.path(), wake.clone()).expect("inotify watch");
    std::fs::write(dev.path().join("infiniband/uverbs9"), b"").unwrap();
    tokio::time::timeout(DEADLINE, wake.notified())
        .await
        .expect("woken by the new uverbs node");
}

#[tokio::test]
#[ignore = "needs root (creates a veth pair in the host's network namespace); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
async fn link_changes_wake_the_reader_and_address_changes_ask_for_a_rescan() {
    let wake = Arc::new(Notify::new());
    let rescan = Arc::new(Notify::new());
    let cancel = CancellationToken::new();
    let down = Arc::new(DownLinks::default());
    assert!(
        watch_links(wake.clone(), rescan.clone(), down.clone(), cancel.clone()),
        "netlink route socket"
    );
    let name = format!("erdmanl{}", std::process::id() % 100_000);
    let peer = format!("{name}p");
    let added = std::process::Command::new("ip")
        .args(["link", "add", &name, "type", "veth", "peer", "name", &peer])
        .output();
    match added {
        Ok(o) if o.status.success() => {}
        other => panic!("needs root and iproute2 to create the veth pair {name}: {other:?}"),
    }
    // A new veth is down (never set up): its message, which wakes the reader, shows it so.
    let mut shown_down = Vec::new();
    let woke = tokio::time::timeout(DEADLINE, async {
        loop {
            wake.notified().await;
            shown_down.extend(down.take());
            if shown_down.contains(&name) {
                break;
            }
        }
    })
    .await;
    // An address on the new link: the GID tables follow addresses, so this asks for a full scan.
    let addr = std::process::Command::new("ip")
        .args(["addr", "add", "198.51.100.7/32", "dev", &name])
        .output();
    let rescanned = tokio::time::timeout(DEADLINE, rescan.notified()).await;
    let _ = std::process::Command::new("ip")
        .args(["link", "del", &name])
        .output();
    cancel.cancel();
    assert!(
        woke.is_ok(),
        "a new link must wake the reader and be shown down (links shown down: {shown_down:?})"
    );
    assert!(
        matches!(&addr, Ok(o) if o.status.success()),
        "ip addr add on {name}: {addr:?}"
    );
    assert!(rescanned.is_ok(), "a new address must ask for a full scan");
}
