//! The reader against the real kernel (in the lab VM), apart from `source` so that no module of
//! the crate imports `attribution` and `source` both ways.

/// Against the real kernel, with `rdma` (iproute2) as the oracle: run in the lab VM by
/// `crates/erdma-usage/lab/run-usage.sh`, which has rxe0 and rxe1 cabled to each other.
mod lab {
    use crate::attribution::{Traffic, attribute};
    use crate::cgroup::read_pid_pods;
    use crate::nldev;
    use crate::source::*;
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// The children are killed however the test ends.
    struct Kill(Vec<Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    fn env(k: &str, d: &str) -> String {
        std::env::var(k).unwrap_or_else(|_| d.to_string())
    }

    /// The index of the device's IPv4-mapped GID (RoCEv2 over IPv4), as lab/guest/lib.sh's
    /// `gid_v4` finds it.
    fn gid_v4(dev: &str) -> String {
        for i in 0..16 {
            let p = format!("/sys/class/infiniband/{dev}/ports/1/gids/{i}");
            if std::fs::read_to_string(p)
                .is_ok_and(|g| g.starts_with("0000:0000:0000:0000:0000:ffff:"))
            {
                return i.to_string();
            }
        }
        panic!("{dev} has no IPv4 GID")
    }

    /// `rdma -j ARGS`: the JSON values it prints, arrays flattened.
    fn rdma_json(args: &[&str]) -> Vec<Value> {
        let out = Command::new("rdma")
            .arg("-j")
            .args(args)
            .output()
            .expect("rdma (iproute2) in PATH");
        assert!(
            out.status.success(),
            "rdma {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut v = Vec::new();
        for x in serde_json::Deserializer::from_str(&text).into_iter::<Value>() {
            match x.unwrap_or_else(|e| panic!("rdma {args:?} printed {text:?}: {e}")) {
                Value::Array(a) => v.extend(a),
                o => v.push(o),
            }
        }
        v
    }

    fn u(v: &Value, k: &str) -> Option<u64> {
        v.get(k).and_then(Value::as_u64)
    }

    fn st(v: &Value, k: &str) -> String {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    #[ignore = "needs a lab VM with rxe: lab/ci.sh runs ::lab:: tests (crates/erdma-usage/lab/run-usage.sh)"]
    fn real_kernel_agrees_with_rdma_resource_show() {
        let (srv_dev, cli_dev) = (
            env("ERDMA_LAB_SRV_DEV", "rxe0"),
            env("ERDMA_LAB_CLI_DEV", "rxe1"),
        );
        let srv_ip = env("ERDMA_LAB_SRV_IP", "10.77.0.1");
        let src = NetlinkSource::with_timeout(Duration::from_secs(5));
        let devs = src.devices().expect("RDMA netlink devices");
        let names: BTreeSet<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert!(
            names.contains(srv_dev.as_str()) && names.contains(cli_dev.as_str()),
            "devices {names:?}"
        );
        let oracle_devs: BTreeSet<String> = rdma_json(&["dev", "show"])
            .iter()
            .map(|d| st(d, "ifname"))
            .collect();
        assert_eq!(
            names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            oracle_devs
        );

        // A verbs program: ibv_rc_pingpong server on one device, client on the other.
        let iters = "100000000";
        let server = Command::new("ibv_rc_pingpong")
            .args(["-d", &srv_dev, "-g", &gid_v4(&srv_dev), "-n", iters])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ibv_rc_pingpong in PATH");
        let mut kids = Kill(vec![server]);
        std::thread::sleep(Duration::from_secs(2)); // the server listens on TCP 18515
        let client = Command::new("ibv_rc_pingpong")
            .args([
                "-d",
                &cli_dev,
                "-g",
                &gid_v4(&cli_dev),
                "-n",
                iters,
                &srv_ip,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        kids.0.push(client);
        let pids: BTreeSet<u32> = kids.0.iter().map(|c| c.id()).collect();

        // Both QPs in RTS, as the netlink reader sees them.
        let t0 = Instant::now();
        let mut ours = loop {
            let q = src.qps().expect("qps");
            let rts = q
                .iter()
                .filter(|e| {
                    e.pid.is_some_and(|p| pids.contains(&p)) && e.state == nldev::QpState::Rts
                })
                .count();
            if rts == 2 {
                break q;
            }
            for c in &mut kids.0 {
                assert!(
                    c.try_wait().unwrap().is_none(),
                    "ibv_rc_pingpong exited early"
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no two RC QPs in RTS: {q:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let oracle = rdma_json(&["resource", "show", "qp"]);
        let key = |dev: &str, lqpn: u64, ty: &str, state: &str, pid: Option<u64>, comm: &str| {
            format!("{dev} lqpn={lqpn} type={ty} state={state} pid={pid:?} kern={comm}")
        };
        let mine: BTreeSet<String> = ours
            .iter()
            .map(|q| {
                let k = q.kern_name.clone().unwrap_or_default();
                key(
                    &q.dev_name,
                    q.lqpn.into(),
                    q.qp_type.as_str(),
                    q.state.as_str(),
                    q.pid.map(u64::from),
                    &k,
                )
            })
            .collect();
        let theirs: BTreeSet<String> = oracle
            .iter()
            .map(|q| {
                let pid = u(q, "pid");
                let comm = if pid.is_some() {
                    String::new()
                } else {
                    st(q, "comm")
                };
                key(
                    &st(q, "ifname"),
                    u(q, "lqpn").unwrap_or(u64::MAX),
                    &st(q, "type"),
                    &st(q, "state"),
                    pid,
                    &comm,
                )
            })
            .collect();
        eprintln!(
            "QPs (netlink reader):\n  {}",
            mine.iter().cloned().collect::<Vec<_>>().join("\n  ")
        );
        assert_eq!(mine, theirs, "QPs: erdma-usage vs rdma resource show qp");
        ours.retain(|q| q.pid.is_some_and(|p| pids.contains(&p)));
        assert_eq!(ours.len(), 2);
        assert!(
            ours.iter()
                .all(|q| q.qp_type == nldev::QpType::Rc && q.port == Some(1))
        );

        // MRs: number, length and owner of each.
        let mrs = src.mrs().expect("mrs");
        let mine: BTreeSet<String> = mrs
            .iter()
            .map(|m| {
                format!(
                    "{} mrn={:?} len={} pid={:?}",
                    m.dev_name, m.mrn, m.mr_len, m.pid
                )
            })
            .collect();
        let theirs: BTreeSet<String> = rdma_json(&["resource", "show", "mr"])
            .iter()
            .map(|m| {
                let pid = u(m, "pid").map(|p| p as u32);
                let mrn = u(m, "mrn").map(|p| p as u32);
                format!(
                    "{} mrn={mrn:?} len={} pid={pid:?}",
                    st(m, "ifname"),
                    u(m, "mrlen").unwrap_or(0)
                )
            })
            .collect();
        eprintln!(
            "MRs (netlink reader):\n  {}",
            mine.iter().cloned().collect::<Vec<_>>().join("\n  ")
        );
        assert_eq!(mine, theirs, "MRs: erdma-usage vs rdma resource show mr");
        assert!(
            mrs.iter()
                .filter(|m| m.pid.is_some_and(|p| pids.contains(&p)))
                .all(|m| m.mr_len >= 4096)
        );

        // CQs and PDs: per device and owner, the counts.
        let count = |v: Vec<(String, Option<u32>)>| {
            let mut m: BTreeMap<(String, Option<u32>), usize> = BTreeMap::new();
            for k in v {
                *m.entry(k).or_default() += 1;
            }
            m
        };
        let oracle_count = |what: &str| {
            count(
                rdma_json(&["resource", "show", what])
                    .iter()
                    .map(|e| (st(e, "ifname"), u(e, "pid").map(|p| p as u32)))
                    .collect(),
            )
        };
        let cqs = src.cqs().expect("cqs");
        assert_eq!(
            count(cqs.iter().map(|e| (e.dev_name.clone(), e.pid)).collect()),
            oracle_count("cq")
        );
        let pds = src.pds().expect("pds");
        assert_eq!(
            count(pds.iter().map(|e| (e.dev_name.clone(), e.pid)).collect()),
            oracle_count("pd")
        );

        // Port counters: the same names as `rdma statistic`, and ours read first, so never more.
        let c = src.port_counters(&srv_dev, 1).expect("port counters");
        let link = format!("{srv_dev}/1");
        let stat = rdma_json(&["statistic", "show", "link", &link]);
        let s = stat.first().expect("rdma statistic output");
        let theirs: BTreeSet<String> = s
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !["ifindex", "ifname", "port"].contains(&k.as_str()))
            .cloned()
            .collect();
        assert_eq!(
            c.counters.keys().cloned().collect::<BTreeSet<_>>(),
            theirs,
            "counter names"
        );
        for (k, v) in &c.counters {
            assert!(
                u(s, k).unwrap_or(0) >= *v,
                "{k}: ours {v} > rdma's later {:?}",
                u(s, k)
            );
        }
        let sent: u64 = c
            .counters
            .iter()
            .filter(|(k, _)| k.contains("sent_pkts"))
            .map(|(_, v)| *v)
            .sum();
        assert!(sent > 0, "{srv_dev} sent nothing: {:?}", c.counters);

        // sysfs hw_counters/: the same counters, read later, so never less.
        let sys =
            crate::sysfs::port_counters(std::path::Path::new("/sys/class/infiniband"), &srv_dev, 1);
        assert_eq!(
            sys.hw.keys().collect::<Vec<_>>(),
            c.counters.keys().collect::<Vec<_>>()
        );
        for (k, v) in &c.counters {
            assert!(
                sys.hw[k] >= *v,
                "{k}: netlink {v} > sysfs's later {}",
                sys.hw[k]
            );
        }

        // The kernel's own per-device counts (RDMA_NLDEV_CMD_RES_GET) agree with the dumps.
        let qps = src.qps().expect("qps");
        for sum in src.summaries().expect("summaries") {
            let d = sum.dev_name.as_str();
            let n = |k: &str| sum.counts.get(k).copied();
            let on = |v: Vec<&str>| Some(v.into_iter().filter(|x| *x == d).count() as u64);
            assert_eq!(
                n("qp"),
                on(qps.iter().map(|e| e.dev_name.as_str()).collect()),
                "{sum:?}"
            );
            assert_eq!(
                n("mr"),
                on(mrs.iter().map(|e| e.dev_name.as_str()).collect()),
                "{sum:?}"
            );
            assert_eq!(
                n("cq"),
                on(cqs.iter().map(|e| e.dev_name.as_str()).collect()),
                "{sum:?}"
            );
            assert_eq!(
                n("pd"),
                on(pds.iter().map(|e| e.dev_name.as_str()).collect()),
                "{sum:?}"
            );
        }

        // The whole chain: a snapshot, no pod yet (host processes): the host bucket.
        let snap = Snapshot::read(&src).expect("snapshot");
        let pid_pods = read_pid_pods(std::path::Path::new("/proc"), &snap.pids());
        assert!(pids.iter().all(|p| !pid_pods.contains_key(p)));
        let usage = attribute(&snap, &pid_pods, &BTreeMap::new());
        let rts =
            |c: &crate::attribution::Counts| c.qps_by_state.get(&nldev::QpState::Rts).copied();
        assert_eq!(rts(&usage.host.devices[&srv_dev]), Some(1));
        assert_eq!(usage.devices[&srv_dev].traffic, Traffic::Shared);

        // The server moved into a cgroup named as the kubelet and containerd name a
        // best-effort pod's container (systemd driver): the kernel's /proc/<pid>/cgroup for
        // it names the pod, whose device's traffic is then the pod's.
        let uid = "0e5d2c1b-aaaa-4bbb-8ccc-123456789abc";
        let cid = "c0ffee".repeat(10) + "beef";
        let dir = PodCgroup::create(uid, &cid);
        let server_pid = kids.0[0].id();
        std::fs::write(dir.0.join("cgroup.procs"), server_pid.to_string())
            .expect("move the server");
        let snap = Snapshot::read(&src).expect("snapshot");
        let pid_pods = read_pid_pods(std::path::Path::new("/proc"), &snap.pids());
        let pod = crate::cgroup::PodUid(uid.to_string());
        let want = (pod.clone(), crate::cgroup::ContainerId(cid.clone()));
        assert_eq!(pid_pods.get(&server_pid), Some(&want));
        let pod_devices = [(pod.clone(), [srv_dev.clone()].into_iter().collect())]
            .into_iter()
            .collect();
        let usage = attribute(&snap, &pid_pods, &pod_devices);
        let p = &usage.pods[&pod];
        assert_eq!(rts(&p.devices[&srv_dev]), Some(1));
        assert!(p.devices[&srv_dev].mr_bytes >= 4096);
        assert_eq!(usage.devices[&srv_dev].traffic, Traffic::Pod(pod.clone()));
        assert!(
            p.traffic[&srv_dev]
                .iter()
                .any(|c| c.counters.values().any(|&v| v > 0))
        );
        assert_eq!(usage.devices[&cli_dev].traffic, Traffic::Shared);
        eprintln!("usage: {}", serde_json::to_string(&usage).unwrap());
        drop(kids);
    }

    /// A kubelet-named pod and container cgroup (cgroup v2), removed at the end.
    struct PodCgroup(std::path::PathBuf, Vec<std::path::PathBuf>);

    impl PodCgroup {
        fn create(uid: &str, cid: &str) -> Self {
            let root = std::path::Path::new("/sys/fs/cgroup");
            if !root.join("cgroup.controllers").exists() {
                let ok = Command::new("mount")
                    .args(["-t", "cgroup2", "none", "/sys/fs/cgroup"])
                    .status();
                assert!(
                    ok.is_ok_and(|s| s.success()),
                    "mount cgroup2 on /sys/fs/cgroup"
                );
            }
            let uid_ = uid.replace('-', "_");
            let mut dirs = vec![root.join("kubepods.slice")];
            dirs.push(dirs[0].join("kubepods-besteffort.slice"));
            dirs.push(dirs[1].join(format!("kubepods-besteffort-pod{uid_}.slice")));
            dirs.push(dirs[2].join(format!("cri-containerd-{cid}.scope")));
            for d in &dirs {
                std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            }
            PodCgroup(dirs[3].clone(), dirs)
        }
    }

    impl Drop for PodCgroup {
        fn drop(&mut self) {
            // Its processes are gone by then (the children are killed first); rmdir from the leaf.
            for d in self.1.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}
