//! NRI call cost: `CreateContainer` answered with the adjustment erdma makes for a container holding
//! `aliyun/erdma` (RLIMIT_MEMLOCK plus an `rdma.max` line parsed from the pod annotation, the work
//! of the agent's `nri::adjust_container_on`) against the same call answered with no adjustment, on
//! one connection through the plugin runner, alternating so both see the same load.
//!
//! Prints `BENCH nri.KEY=VALUE UNIT` lines for `scripts/bench.sh` (section `nri`).

use erdma_model::rdma_limit::{Memlock, RDMA_MAX_ANNOTATION, RdmaLimit};
use erdma_nri::api::{self, Event};
use erdma_nri::fake::FakeRuntime;
use erdma_nri::plugin::{self, Handler, PluginConfig};
use erdma_nri::ttrpc::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Bench;

impl Handler for Bench {
    fn synchronize(
        &self,
        _: Vec<api::PodSandbox>,
        _: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>> {
        Box::pin(async { Vec::new() })
    }
    fn state_change(
        &self,
        _: Event,
        _: Option<api::PodSandbox>,
        _: Option<api::Container>,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn create_container(
        &self,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> BoxFuture<'_, Result<api::ContainerAdjustment, String>> {
        Box::pin(async move {
            let mut adjust = api::ContainerAdjustment::default();
            let Some(dev) = c.env.iter().find_map(|e| e.strip_prefix("ERDMA_DEVICES=")) else {
                return Ok(adjust);
            };
            if let Some(v) = Memlock::parse("unlimited").ok().and_then(|m| m.value()) {
                adjust.rlimits.push(api::PosixRlimit {
                    r#type: "RLIMIT_MEMLOCK".into(),
                    hard: v,
                    soft: v,
                });
            }
            if let Some(l) = pod
                .annotations
                .get(RDMA_MAX_ANNOTATION)
                .and_then(|a| RdmaLimit::parse(a).ok())
            {
                adjust.linux = Some(api::LinuxContainerAdjustment {
                    resources: Some(api::LinuxResources {
                        unified: [("rdma.max".to_string(), l.line(dev))]
                            .into_iter()
                            .collect(),
                    }),
                    ..Default::default()
                });
            }
            Ok(adjust)
        })
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::Builder::new()
            .prefix("nri-bench")
            .tempdir_in("/tmp")
            .expect("dir");
        let sock = dir.path().join("nri.sock");
        let runtime = FakeRuntime::bind(&sock).expect("bind");
        let cancel = CancellationToken::new();
        let cfg = PluginConfig {
            socket: sock,
            name: "erdma".into(),
            idx: "10".into(),
            events: vec![Event::CreateContainer],
            budget: Duration::from_millis(800),
            observer: None,
        };
        let c2 = cancel.clone();
        let task =
            tokio::spawn(async move { plugin::run_session(&cfg, Arc::new(Bench), &c2).await });
        let mut s = runtime.accept().await.expect("accept");
        s.registration().await.expect("registered");
        s.configure().await.expect("configure");
        s.synchronize(vec![], vec![]).await.expect("synchronize");
        let pod = api::PodSandbox {
            name: "trainer-0".into(),
            namespace: "team-a".into(),
            annotations: [(
                RDMA_MAX_ANNOTATION.to_string(),
                "hca_handle=4 hca_object=4096".to_string(),
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let erdma = api::Container {
            name: "main".into(),
            env: vec!["PATH=/usr/bin".into(), "ERDMA_DEVICES=erdma_0".into()],
            ..Default::default()
        };
        let plain = api::Container {
            name: "main".into(),
            env: vec!["PATH=/usr/bin".into()],
            ..Default::default()
        };
        let n = 5000;
        let (mut adj, mut empty) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..(n + 200) {
            let t = Instant::now();
            let r = s.create_container(&pod, &erdma).await.expect("adjusting call");
            let a = t.elapsed().as_secs_f64() * 1e6;
            assert!(r.adjust.is_some_and(|a| a.linux.is_some()));
            let t = Instant::now();
            s.create_container(&pod, &plain).await.expect("empty call");
            let e = t.elapsed().as_secs_f64() * 1e6;
            if i >= 200 {
                adj.push(a);
                empty.push(e);
            }
        }
        let (a50, a99) = (pct(&mut adj, 0.5), pct(&mut adj, 0.99));
        let (e50, e99) = (pct(&mut empty, 0.5), pct(&mut empty, 0.99));
        println!(
            "CreateContainer with erdma's adjustment: p50 {a50:.1} µs, p99 {a99:.1} µs (n = {n})"
        );
        println!("CreateContainer, no adjustment:          p50 {e50:.1} µs, p99 {e99:.1} µs");
        println!(
            "BENCHCONF nri the plugin runner (erdma_nri::plugin) and the runtime stand-in (erdma_nri::fake) in one process over a Unix socket in /tmp, NRI's multiplexer and ttRPC, 2 tokio worker threads; calls alternate, 200 warm-up pairs"
        );
        println!("BENCH nri.adjust_p50={a50:.3} us");
        println!("BENCH nri.adjust_p99={a99:.3} us");
        println!("BENCH nri.empty_p50={e50:.3} us");
        println!("BENCH nri.empty_p99={e99:.3} us");
        println!("BENCH nri.ratio_p99={:.3} x", a99 / e99);
        drop(s);
        cancel.cancel();
        let _ = task.await;
    });
}
