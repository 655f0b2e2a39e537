//! Benchmark of the DRA driver's `NodePrepareResources` against an empty call on the same socket
//! (plain harness): `cargo bench -p erdma-dra --bench prepare`.
//!
//! The driver (`erdma_dra::Driver` behind `erdma_dra::server::serve`) runs in this process on its
//! real Unix sockets under a temp kubelet directory, registered by the fake kubelet's
//! plugin-watcher client, which then makes the calls the kubelet makes. It reads each claim by a
//! GET from the in-memory fake API server (`erdma_k8s::fake`) served over HTTP on loopback, as
//! the upstream kubelet-plugin helper does (no watch of the cluster's claims). `PREPARED` claims
//! are prepared first, so every measured call rewrites a checkpoint of that many claims, as on a
//! busy node.
//!
//! Each round models a pod start: the claim is written to the API server allocated and reserved
//! (as kube-scheduler does before it binds the pod), the kubelet GETs it (untimed; it does so
//! before it calls the driver), then the timed calls.
//!
//! Measured, calls alternating so that all see the same load (n = `N` each):
//! - empty `NodePrepareResources` (no claims): the gRPC round trip on the same connection;
//! - a new claim prepared (ResourceClaim GET, capacity check, CDI spec and checkpoint written);
//! - the same claim prepared again (the kubelet repeats it for every pod sync and after its own
//!   restart): answered from the checkpoint;
//! - the claim unprepared (spec and checkpoint entry removed).
//!
//! Output: `BENCH dra.key=value unit` and `BENCHCONF dra text` lines for `scripts/bench.sh`.

use erdma_dra::{CapacityModel, DraConfig, Driver};
use erdma_fake_kubelet::dra::{self as kubelet, DraDriverClient};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::device::NumaNode;
use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE: &str = "bench-node";
/// Measured calls of each kind.
const N: usize = 1000;
/// Warm-up rounds (not measured).
const WARMUP: usize = 50;
/// Claims prepared before measuring (the checkpoint's size during the measured calls).
const PREPARED: usize = 64;

fn inventory() -> NodeDevices {
    let mut n = NodeDevices::empty();
    for i in 0..2u32 {
        let mut d = RdmaDevice::named(format!("erdma_{i}"), DeviceKind::Erdma);
        d.driver = Some("erdma".into());
        d.numa_node = NumaNode(Some(i));
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{i}"),
            major: Some(231),
            minor: Some(192 + i),
            present: true,
        });
        n.devices.push(d);
    }
    n.rdma_cm = Some(CharDevice {
        path: "/dev/infiniband/rdma_cm".into(),
        major: Some(10),
        minor: Some(58),
        present: true,
    });
    n
}

/// The allocation and reservation kube-scheduler's DRA plugin would write (BENCH-WRITTEN
/// ALLOCATION): one request `rdma` on `erdma-0` of this node's pool, one share, 4 contexts,
/// reserved for one pod.
fn allocated_claim(name: &str, uid: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: erdma_model::names::DRA_DRIVER.into(),
                        pool: NODE.into(),
                        device: "erdma-0".into(),
                        request: "rdma".into(),
                        share_id: Some(format!("share-{uid}")),
                        consumed_capacity: Some(BTreeMap::from([
                            ("shares".to_string(), Quantity("1".into())),
                            ("hcaHandle".to_string(), Quantity("4".into())),
                        ])),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: format!("pod-{name}"),
                uid: format!("pod-{uid}"),
            }]),
            ..Default::default()
        }),
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn timed<F: std::future::Future<Output = T>, T>(f: F) -> (Duration, T) {
    let t = Instant::now();
    let r = f.await;
    (t.elapsed(), r)
}

async fn prepare_ok(k: &DraDriverClient, name: &str, uid: &str) {
    let r = k
        .prepare(vec![kubelet::claim("default", name, uid)])
        .await
        .expect("prepare answers");
    let c = &r.claims[uid];
    assert_eq!(c.error, "", "claim {name} prepared");
    assert_eq!(c.devices.len(), 1, "claim {name} got its device");
}

async fn unprepare_ok(k: &DraDriverClient, name: &str, uid: &str) {
    let r = k
        .unprepare(vec![kubelet::claim("default", name, uid)])
        .await
        .expect("unprepare answers");
    assert_eq!(r.claims[uid].error, "", "claim {name} unprepared");
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let tmp = tempfile::Builder::new()
            .prefix("drab")
            .tempdir_in("/tmp")
            .expect("temp dir");
        // CDI specs on tmpfs, as the shipped `/var/run/cdi`; the checkpoint under the kubelet
        // directory on disk, as `/var/lib/kubelet`.
        let cdi_tmp = tempfile::Builder::new()
            .prefix("drab-cdi")
            .tempdir_in(if fs_of(std::path::Path::new("/dev/shm")) == "tmpfs" {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .expect("CDI temp dir");
        let api = FakeApiServer::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake API server");
        let addr = listener.local_addr().expect("local addr");
        let cancel = CancellationToken::new();
        tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
        let url = format!("http://{addr}");
        let client = || {
            let config = kube::Config::new(url.parse().expect("API URL"));
            kube::Client::try_from(config).expect("API client over HTTP")
        };
        let (_inv_tx, inv) = watch::channel(inventory());

        let mut cfg = DraConfig::new(NODE);
        cfg.kubelet_dir = tmp.path().join("kubelet");
        cfg.cdi_dir = cdi_tmp.path().join("cdi");
        cfg.sysfs = tmp.path().join("sys");
        cfg.capacity = CapacityModel {
            shares: 100_000,
            hca_handles: 1_000_000,
            hca_handles_default: 4,
            hca_objects: 100_000_000,
            hca_objects_default: 8000,
        };
        let driver = Arc::new(Driver::new(cfg.clone(), client(), inv.clone()).expect("driver starts"));
        let servers = erdma_dra::server::serve(driver.clone(), &cancel).expect("sockets bound");
        let k = kubelet::register(
            &cfg.kubelet_dir.join("plugins_registry"),
            erdma_model::names::DRA_DRIVER,
        )
        .await
        .expect("the kubelet registers the driver");
        println!(
            "BENCHCONF dra the driver (erdma_dra::Driver, erdma_dra::server) in the bench process on its Unix sockets under a temp kubelet dir, 2 tokio worker threads; the fake kubelet's DRA client on the driver's connection; claims from the fake API server over HTTP on loopback, written allocated and reserved each round before the kubelet's (untimed) GET and the prepare; the driver GETs each claim it prepares (no claim watch); {PREPARED} claims prepared before measuring (the checkpoint's size); CDI specs in {} ({}, as the shipped /var/run/cdi), the checkpoint in /tmp ({}, as /var/lib/kubelet), both written by rename without fsync",
            cdi_tmp.path().display(),
            fs_of(cdi_tmp.path()),
            fs_of(tmp.path())
        );
        let kubelet_api: kube::Api<ResourceClaim> = kube::Api::namespaced(client(), "default");
        // One pod start: the scheduler writes the claim, the kubelet reads it.
        let allocate = |name: String, uid: String| {
            let (api, kubelet_api) = (api.clone(), kubelet_api.clone());
            async move {
                api.put(&allocated_claim(&name, &uid));
                kubelet_api.get(&name).await.expect("the kubelet reads the claim");
            }
        };

        for i in 0..PREPARED {
            let (name, uid) = (format!("claim-{i}"), format!("uid-{i}"));
            allocate(name.clone(), uid.clone()).await;
            prepare_ok(&k, &name, &uid).await;
        }
        let (mut empty, mut fresh, mut again, mut unprep) = (vec![], vec![], vec![], vec![]);
        let mut get = vec![];
        for round in 0..WARMUP + N {
            let i = PREPARED + round;
            let (name, uid) = (format!("claim-{i}"), format!("uid-{i}"));
            allocate(name.clone(), uid.clone()).await;
            // The GET a prepare must make (as the upstream helper does), alone on the same API
            // server: what a new claim's prepare costs beyond erdma's own work.
            let (g, r) = timed(kubelet_api.get(&name)).await;
            r.expect("the claim is readable");
            let (e, r) = timed(k.prepare(Vec::new())).await;
            assert!(r.expect("empty prepare answers").claims.is_empty());
            let (f, ()) = timed(prepare_ok(&k, &name, &uid)).await;
            let (a, ()) = timed(prepare_ok(&k, &name, &uid)).await;
            let (u, ()) = timed(unprepare_ok(&k, &name, &uid)).await;
            if round >= WARMUP {
                empty.push(e);
                fresh.push(f);
                again.push(a);
                unprep.push(u);
                get.push(g);
            }
        }
        let rows = [
            ("empty", &mut empty, "empty NodePrepareResources (no claims)"),
            ("prepare", &mut fresh, "new claim prepared (GET, CDI spec, checkpoint)"),
            ("again", &mut again, "the same claim prepared again (from the checkpoint)"),
            ("unprepare", &mut unprep, "claim unprepared"),
            ("get", &mut get, "a ResourceClaim GET alone (the kubelet's client)"),
        ];
        let mut p99s = BTreeMap::new();
        for (key, v, what) in rows {
            let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
            println!("{what}: n={N} p50 {:.1} us, p99 {:.1} us", us(p50), us(p99));
            println!("BENCH dra.{key}_p50={:.2} us", us(p50));
            println!("BENCH dra.{key}_p99={:.2} us", us(p99));
            p99s.insert(key, us(p99));
        }
        for key in ["prepare", "again", "unprepare"] {
            let ratio = p99s[key] / p99s["empty"];
            println!("{key} p99 / empty p99: {ratio:.2}");
            println!("BENCH dra.{key}_ratio_p99={ratio:.2} x");
        }
        // The gate: a new claim's prepare less the GET it must make, against an empty call.
        let net = (p99s["prepare"] - p99s["get"]) / p99s["empty"];
        println!("(prepare p99 - get p99) / empty p99: {net:.2}");
        println!("BENCH dra.prepare_net_ratio_p99={net:.2} x");
        let reads = driver.claim_reads();
        println!("claim reads: {} GETs, {} failed", reads.gets, reads.failed);
        println!("BENCH dra.claim_gets={} n", reads.gets);
        servers.shutdown().await;
        cancel.cancel();
    });
}

/// The file system type of `path` (from /proc/self/mounts, longest matching mount point).
fn fs_of(path: &std::path::Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let p = path.to_string_lossy();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && p.starts_with(f[1])).then(|| (f[1].len(), f[2].to_string()))
        })
        .max()
        .map(|(_, t)| t)
        .unwrap_or_else(|| "unknown".into())
}
