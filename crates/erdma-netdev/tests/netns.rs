//! ERI setup against the real kernel, in throw-away network namespaces (needs root and iproute2).
//! Verification reads the result back with `ip -j`, independently of the code under test.

use erdma_cloud::imds::ImdsClient;
use erdma_cloud::imds_emulator::MetadataEmulator;
use erdma_netdev::{EriNetdev, NetdevError, RouteNetlink};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A named network namespace, deleted (with its links) on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        let name = format!(
            "erdma-nd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip (apt-get install iproute2)");
        assert!(ok.success(), "ip netns add {name} (needs root)");
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["-j"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ip(&a)).expect("ip -j output is JSON")
    }

    /// `eth0` (primary: 10.0.0.5/24, default via .253 metric 100) and `eth1` (the ERI, down, MAC
    /// 00:16:3e:00:00:02), both veths with their peers up.
    fn node() -> Self {
        let ns = Netns::new();
        ns.ip(&[
            "link",
            "add",
            "eth0",
            "address",
            "00:16:3e:00:00:01",
            "type",
            "veth",
            "peer",
            "name",
            "p0",
        ]);
        ns.ip(&[
            "link",
            "add",
            "eth1",
            "address",
            "00:16:3e:00:00:02",
            "type",
            "veth",
            "peer",
            "name",
            "p1",
        ]);
        for l in ["p0", "p1", "eth0"] {
            ns.ip(&["link", "set", l, "up"]);
        }
        ns.ip(&["addr", "add", "10.0.0.5/24", "dev", "eth0"]);
        ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            "10.0.0.253",
            "dev",
            "eth0",
            "metric",
            "100",
        ]);
        ns
    }

    /// Routes as canonical strings: `dst via gw dev D proto P metric M src S`.
    fn routes(&self) -> BTreeSet<String> {
        let v = self.json(&["-4", "route", "show", "table", "main"]);
        v.as_array()
            .expect("array")
            .iter()
            .map(|r| {
                let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
                let metric = r.get("metric").and_then(Value::as_u64).unwrap_or(0);
                format!(
                    "{} via {} dev {} proto {} metric {} src {}",
                    s("dst"),
                    s("gateway"),
                    s("dev"),
                    s("protocol"),
                    metric,
                    s("prefsrc")
                )
            })
            .collect()
    }

    /// `(up, mtu, [addr/len …])` of a link.
    fn link(&self, dev: &str) -> (bool, u64, Vec<String>) {
        let v = self.json(&["addr", "show", "dev", dev]);
        let l = &v[0];
        let up = l["flags"]
            .as_array()
            .expect("flags")
            .iter()
            .any(|f| f == "UP");
        let mtu = l["mtu"].as_u64().expect("mtu");
        let addrs = l["addr_info"]
            .as_array()
            .expect("addr_info")
            .iter()
            .filter(|a| a["family"] == "inet")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
            .collect();
        (up, mtu, addrs)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn eri() -> EriNetdev {
    EriNetdev {
        ifname: "eth1".into(),
        mac: "00:16:3e:00:00:02".parse().unwrap(),
        primary: false,
        jumbo_frame: true,
    }
}

async fn metadata() -> (MetadataEmulator, ImdsClient) {
    let emu = MetadataEmulator::start().await.expect("emulator");
    emu.add_eni(eri().mac, "10.0.0.9", "10.0.0.0/24", "10.0.0.253");
    let c = ImdsClient::new(&emu.endpoint())
        .unwrap()
        .with_backoff(Duration::from_millis(5));
    (emu, c)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn configures_the_eri_and_a_second_run_changes_nothing() {
    let ns = Netns::node();
    let (_emu, md) = metadata().await;
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    let before_primary = ns.link("eth0");

    let setup = rtnl.ensure_eri(&md, &eri(), 8500).await.expect("setup");
    let text: Vec<String> = setup.changes.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        text,
        [
            "ip link set dev eth1 mtu 8500",
            "ip link set dev eth1 up",
            "ip addr add 10.0.0.9/24 dev eth1 noprefixroute",
            "ip route add 10.0.0.0/24 dev eth1 metric 200 scope link src 10.0.0.9",
            "ip route add 0.0.0.0/0 via 10.0.0.253 dev eth1 metric 200",
        ]
    );
    assert_eq!(
        ns.link("eth1"),
        (true, 8500, vec!["10.0.0.9/24".to_string()])
    );
    assert_eq!(ns.link("eth0"), before_primary, "primary untouched");
    let routes = ns.routes();
    assert_eq!(
        routes,
        set(&[
            "default via 10.0.0.253 dev eth0 proto - metric 100 src -",
            "default via 10.0.0.253 dev eth1 proto static metric 200 src -",
            "10.0.0.0/24 via - dev eth0 proto kernel metric 0 src 10.0.0.5",
            "10.0.0.0/24 via - dev eth1 proto static metric 200 src 10.0.0.9",
        ])
    );
    // The primary ENI still wins: the kernel picks eth0 for traffic to the subnet and the Internet.
    assert!(ns.ip(&["route", "get", "8.8.8.8"]).contains("dev eth0"));
    assert!(ns.ip(&["route", "get", "10.0.0.77"]).contains("dev eth0"));

    let again = rtnl
        .ensure_eri(&md, &eri(), 8500)
        .await
        .expect("second run");
    assert!(again.changes.is_empty(), "{:?}", again.changes);
    assert_eq!(ns.routes(), routes);
    assert_eq!(
        ns.link("eth1"),
        (true, 8500, vec!["10.0.0.9/24".to_string()])
    );
}

#[tokio::test]
async fn primary_eni_is_never_touched() {
    let ns = Netns::node();
    let (emu, md) = metadata().await;
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    let (before_routes, before_link) = (ns.routes(), ns.link("eth1"));
    let mut e = eri();
    e.primary = true;
    let setup = rtnl.ensure_eri(&md, &e, 8500).await.expect("skip");
    assert!(setup.skipped_primary && setup.changes.is_empty());
    assert_eq!((ns.routes(), ns.link("eth1")), (before_routes, before_link));
    assert!(
        emu.log().is_empty(),
        "not even the metadata service is asked"
    );
}

#[tokio::test]
async fn metadata_failure_changes_nothing() {
    let ns = Netns::node();
    let (emu, md) = metadata().await;
    emu.set(
        "/latest/meta-data/network/interfaces/macs/00:16:3e:00:00:02/gateway",
        "garbage",
    );
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    let (before_routes, before_link) = (ns.routes(), ns.link("eth1"));
    let e = rtnl.ensure_eri(&md, &eri(), 8500).await.unwrap_err();
    assert!(matches!(e, NetdevError::Metadata(_)), "{e}");
    assert!(e.to_string().contains("gateway"), "{e}");
    assert_eq!((ns.routes(), ns.link("eth1")), (before_routes, before_link));
}

#[tokio::test]
async fn repairs_seed_state_and_keeps_metrics_above_other_links() {
    let ns = Netns::node();
    // What the original leaves (or a hand-made setup): address with the kernel prefix route (metric
    // 0, which would beat the primary's subnet route), and a third link with default metric 250.
    ns.ip(&["link", "set", "eth1", "up"]);
    ns.ip(&["addr", "add", "10.0.0.9/24", "dev", "eth1"]);
    ns.ip(&["link", "add", "eth2", "type", "veth", "peer", "name", "p2"]);
    ns.ip(&["link", "set", "p2", "up"]);
    ns.ip(&["link", "set", "eth2", "up"]);
    ns.ip(&["addr", "add", "192.168.5.2/24", "dev", "eth2"]);
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.168.5.1",
        "dev",
        "eth2",
        "metric",
        "250",
    ]);
    let (_emu, md) = metadata().await;
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    let mut e = eri();
    e.jumbo_frame = false;
    let setup = rtnl.ensure_eri(&md, &e, 8500).await.expect("setup");
    let text: Vec<String> = setup.changes.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        text,
        [
            "ip route del 10.0.0.0/24 dev eth1 proto kernel metric 0",
            "ip route add 10.0.0.0/24 dev eth1 metric 200 scope link src 10.0.0.9",
            "ip route add 0.0.0.0/0 via 10.0.0.253 dev eth1 metric 251",
        ]
    );
    let routes = ns.routes();
    assert!(
        routes.contains("10.0.0.0/24 via - dev eth1 proto static metric 200 src 10.0.0.9"),
        "{routes:?}"
    );
    assert!(
        !routes.iter().any(|r| r.contains("dev eth1 proto kernel")),
        "{routes:?}"
    );
    assert!(
        routes.contains("default via 10.0.0.253 dev eth1 proto static metric 251 src -"),
        "{routes:?}"
    );
    assert_eq!(
        ns.link("eth1").1,
        1500,
        "MTU untouched without jumbo frames"
    );
    assert!(
        rtnl.ensure_eri(&md, &e, 8500)
            .await
            .expect("again")
            .changes
            .is_empty()
    );
}

#[tokio::test]
async fn a_failed_step_is_named_and_a_retry_completes() {
    let ns = Netns::node();
    let (_emu, md) = metadata().await;
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    // veth refuses an MTU this large: the first step fails, nothing after it runs.
    let e = rtnl.ensure_eri(&md, &eri(), 1_000_000).await.unwrap_err();
    let t = e.to_string();
    assert!(
        t.contains("ip link set dev eth1 mtu 1000000") && t.contains("Fix:"),
        "{t}"
    );
    assert_eq!(ns.link("eth1"), (false, 1500, vec![]));
    let setup = rtnl.ensure_eri(&md, &eri(), 9000).await.expect("retry");
    assert_eq!(setup.changes.len(), 5);
    assert_eq!(
        ns.link("eth1"),
        (true, 9000, vec!["10.0.0.9/24".to_string()])
    );
}

#[tokio::test]
async fn missing_namespace_is_a_clear_error() {
    let Err(e) =
        RouteNetlink::connect_in_netns(std::path::Path::new("/run/netns/erdma-does-not-exist"))
    else {
        panic!("connected to a namespace that does not exist");
    };
    assert!(
        e.to_string().contains("erdma-does-not-exist") && e.to_string().contains("open"),
        "{e}"
    );
}

#[tokio::test]
async fn one_failing_eri_does_not_stop_the_others() {
    let ns = Netns::node();
    let (_emu, md) = metadata().await;
    let rtnl = RouteNetlink::connect_in_netns(&ns.path()).expect("netlink in netns");
    let missing = EriNetdev {
        ifname: "eth9".into(),
        mac: "00:16:3e:00:00:02".parse().unwrap(),
        primary: false,
        jumbo_frame: false,
    };
    let results = rtnl.ensure_eris(&md, &[missing, eri()], 8500).await;
    assert_eq!(results.len(), 2);
    let e = results[0].1.as_ref().unwrap_err().to_string();
    assert!(e.contains("eth9") && e.contains("no such interface"), "{e}");
    assert_eq!(
        results[1]
            .1
            .as_ref()
            .expect("eth1 configured")
            .changes
            .len(),
        5
    );
    assert_eq!(
        ns.link("eth1"),
        (true, 8500, vec!["10.0.0.9/24".to_string()])
    );
}
