//! Doctor checks against the API objects in `testdata/k8s/` (one per product-FAQ failure case).

use erdma_doctor::libs::parse_ls;
use erdma_doctor::pod::LibsProbe;
use erdma_doctor::{Check, Report, Status, node, pod};
use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use serde::de::DeserializeOwned;
use std::path::PathBuf;

fn read<T: DeserializeOwned>(file: &str) -> T {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/k8s")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pods(file: &str) -> Vec<Pod> {
    let l: List<Pod> = read(file);
    l.items
}

fn events(file: &str) -> Vec<Event> {
    let l: List<Event> = read(file);
    l.items
}

fn status_of<'a>(checks: &'a [Check], id: &str) -> Vec<&'a Check> {
    checks.iter().filter(|c| c.id == id).collect()
}

fn one(checks: &[Check], id: &str) -> Check {
    let v = status_of(checks, id);
    assert_eq!(v.len(), 1, "exactly one {id} in {checks:#?}");
    v[0].clone()
}

#[test]
fn healthy_erdma_node_passes() {
    let n: Node = read("node-erdma-ready.json");
    let checks = node::checks(
        &n,
        &pods("pods-on-node-agent-running.json")
            .into_iter()
            .filter(node::is_agent_pod)
            .collect::<Vec<_>>(),
    );
    for c in &checks {
        assert_eq!(c.status, Status::Pass, "{c:?}");
    }
    assert!(
        one(&checks, "node.allocatable")
            .message
            .contains("aliyun/erdma: 400 allocatable of 400 capacity")
    );
    assert!(
        one(&checks, "agent.pod")
            .message
            .contains("kube-system/erdma-agent-7xk2p")
    );
    assert!(one(&checks, "driver.ready").message.contains("Converged"));
    insta::assert_json_snapshot!(
        "node_ready",
        Report::new("node/cn-hangzhou.192.0.2.23", checks)
    );
}

#[test]
fn agent_pods_are_recognised_and_others_are_not() {
    let all = pods("pods-on-node-agent-running.json");
    let agents: Vec<_> = all.iter().filter(|p| node::is_agent_pod(p)).collect();
    assert_eq!(agents.len(), 1);
    assert_eq!(
        agents[0].metadata.name.as_deref(),
        Some("erdma-agent-7xk2p")
    );
}

#[test]
fn node_without_agent_fails_allocatable_and_agent() {
    let n: Node = read("node-no-erdma.json");
    let agents: Vec<Pod> = pods("pods-on-node-no-agent.json")
        .into_iter()
        .filter(node::is_agent_pod)
        .collect();
    let checks = node::checks(&n, &agents);
    let alloc = one(&checks, "node.allocatable");
    assert_eq!(alloc.status, Status::Fail);
    assert!(alloc.message.contains("does not advertise aliyun/erdma"));
    let agent = one(&checks, "agent.pod");
    assert_eq!(agent.status, Status::Fail);
    assert!(
        agent
            .hint
            .as_deref()
            .unwrap()
            .contains("nodeSelector and tolerations")
    );
    assert_eq!(one(&checks, "driver.mode").status, Status::Warn);
    assert_eq!(one(&checks, "driver.ready").status, Status::Skip);
    insta::assert_json_snapshot!(
        "node_no_erdma",
        Report::new("node/cn-hangzhou.198.51.100.7", checks)
    );
}

#[test]
fn crashlooping_agent_and_failed_driver() {
    let n: Node = read("node-erdma-driver-failed.json");
    let agents: Vec<Pod> = pods("pods-on-node-agent-crashloop.json")
        .into_iter()
        .filter(node::is_agent_pod)
        .collect();
    let checks = node::checks(&n, &agents);
    let alloc = one(&checks, "node.allocatable");
    assert_eq!(alloc.status, Status::Fail);
    assert!(alloc.message.contains("capacity 400 but 0 allocatable"));
    let agent = one(&checks, "agent.pod");
    assert_eq!(agent.status, Status::Fail);
    assert!(
        agent.message.contains("CrashLoopBackOff"),
        "{}",
        agent.message
    );
    assert!(agent.message.contains("14 restarts"));
    assert!(
        agent
            .message
            .contains("mount the host's /var/lib/kubelet/device-plugins"),
        "last log line is shown"
    );
    assert!(
        agent
            .hint
            .as_deref()
            .unwrap()
            .contains("kubectl logs -n kube-system erdma-agent-7xk2p --previous")
    );
    let mode = one(&checks, "driver.mode");
    assert_eq!(mode.status, Status::Fail);
    let ready = one(&checks, "driver.ready");
    assert_eq!(ready.status, Status::Fail);
    assert!(ready.message.contains("Module erdma not found"));
    insta::assert_json_snapshot!(
        "node_driver_failed",
        Report::new("node/cn-hangzhou.192.0.2.23", checks)
    );
}

#[test]
fn iwarp_node_with_pending_mode_change_warns() {
    let n: Node = read("node-erdma-mode-pending.json");
    let checks = node::checks(&n, &[]);
    let mode = one(&checks, "driver.mode");
    assert_eq!(mode.status, Status::Warn);
    assert!(mode.message.contains("NCCL NET/IB cannot bring QPs up"));
    let ready = one(&checks, "driver.ready");
    assert_eq!(ready.status, Status::Warn);
    assert!(ready.message.contains("switch to mode compat is pending"));
    assert!(ready.message.contains("2 containers hold aliyun/erdma"));
}

#[test]
fn pending_on_insufficient_erdma_gpu_and_taint() {
    let p: Pod = read("pod-pending-insufficient-erdma.json");
    let ev = events("events-pending-insufficient-erdma.json");
    let checks = pod::checks(&p, &ev, None, None, &LibsProbe::NotRequested);
    let sched = status_of(&checks, "pod.scheduling");
    assert_eq!(sched.len(), 3, "{sched:#?}");
    assert!(sched.iter().all(|c| c.status == Status::Fail));
    // The newest event wins over the older one (which had no erdma shortage).
    let erdma = sched
        .iter()
        .find(|c| c.message.contains("Insufficient aliyun/erdma"))
        .expect("erdma reason");
    assert!(
        erdma.message.contains("2 node(s)") && erdma.message.contains("(of 4 nodes)"),
        "{}",
        erdma.message
    );
    assert!(
        erdma
            .hint
            .as_deref()
            .unwrap()
            .contains("erdmactl doctor --node")
    );
    assert!(
        sched
            .iter()
            .any(|c| c.message.contains("Insufficient nvidia.com/gpu"))
    );
    assert!(sched.iter().any(|c| {
        c.message
            .contains("untolerated taint {node-role.kubernetes.io/control-plane: }")
    }));
    assert_eq!(one(&checks, "pod.resources").status, Status::Pass);
    assert!(
        one(&checks, "pod.resources")
            .message
            .contains("pytorch: aliyun/erdma=1, nvidia.com/gpu=8, cpu=32, memory=256Gi")
    );
    assert_eq!(one(&checks, "pod.ipc_lock").status, Status::Pass);
    assert_eq!(one(&checks, "pod.rdma_libs").status, Status::Skip);
    insta::assert_json_snapshot!(
        "pod_pending_erdma",
        Report::new("pod/default/pt-erdma-master-0", checks)
    );
}

#[test]
fn pending_on_selector_uses_the_condition_when_events_expired() {
    let p: Pod = read("pod-pending-selector.json");
    let checks = pod::checks(&p, &[], None, None, &LibsProbe::NotRequested);
    let sched = status_of(&checks, "pod.scheduling");
    assert_eq!(sched.len(), 2);
    let sel = sched
        .iter()
        .find(|c| c.message.contains("node affinity/selector"))
        .unwrap();
    assert!(sel.message.contains("3 node(s)"));
    assert!(
        sel.hint
            .as_deref()
            .unwrap()
            .contains("kubectl get nodes --show-labels")
    );
}

#[test]
fn admission_error_when_devices_are_unhealthy() {
    let p: Pod = read("pod-admission-error.json");
    let checks = pod::checks(&p, &[], None, None, &LibsProbe::NotRequested);
    let adm = one(&checks, "pod.admission");
    assert_eq!(adm.status, Status::Fail);
    assert!(
        adm.message
            .contains("cannot allocate unhealthy devices aliyun/erdma")
    );
    assert_eq!(one(&checks, "pod.scheduling").status, Status::Pass);
}

#[test]
fn smcr_on_one_end_only_and_on_an_ofed_node() {
    let server: Pod = read("pod-running-smcr.json");
    let client: Pod = read("pod-running-no-smcr-peer.json");
    let n: Node = read("node-erdma-ready.json");
    let checks = pod::checks(
        &server,
        &[],
        Some(&n),
        Some(&client),
        &LibsProbe::NotRequested,
    );
    let smcr = status_of(&checks, "pod.smcr");
    assert_eq!(smcr.len(), 1);
    assert_eq!(smcr[0].status, Status::Fail);
    assert!(
        smcr[0]
            .message
            .contains("driver mode ofed, which has no SMC-R")
    );
    let peer = one(&checks, "pod.smcr.peer");
    assert_eq!(peer.status, Status::Fail);
    assert!(
        peer.message
            .contains("default/smc-client-7b9c8d6f5-mn3vz does not ask for SMC-R")
    );
    // From the other end: the peer asks, this pod does not.
    let back = pod::checks(
        &client,
        &[],
        Some(&n),
        Some(&server),
        &LibsProbe::NotRequested,
    );
    let c = one(&back, "pod.smcr");
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.message
            .contains("peer default/smc-server-6d5f7c9b8-x2kq4 asks for SMC-R")
    );
    // The server has aliyun/erdma but no IPC_LOCK: a warning, not a failure.
    assert_eq!(one(&checks, "pod.ipc_lock").status, Status::Warn);
    insta::assert_json_snapshot!(
        "pod_smcr_one_end",
        Report::new("pod/default/smc-server-6d5f7c9b8-x2kq4", checks)
    );
}

#[test]
fn smcr_both_ends_on_a_default_mode_node_pass() {
    let server: Pod = read("pod-running-smcr.json");
    let mut client: Pod = read("pod-running-no-smcr-peer.json");
    client.metadata.annotations = Some(
        [(
            "network.alibabacloud.com/erdma-smcr".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let n: Node = read("node-erdma-mode-pending.json");
    let checks = pod::checks(
        &server,
        &[],
        Some(&n),
        Some(&client),
        &LibsProbe::NotRequested,
    );
    assert_eq!(one(&checks, "pod.smcr").status, Status::Pass);
    assert_eq!(one(&checks, "pod.smcr.peer").status, Status::Pass);
}

/// The annotation is read with the one rule the agent and the webhook use (Go's ParseBool):
/// `"1"` asks for SMC-R and passes (before: FAIL, "the agent fails the container"), `"yes"` is
/// refused naming what the agent really does.
#[test]
fn smcr_annotation_spellings_are_read_as_the_agent_reads_them() {
    let server: Pod = read("pod-running-smcr.json");
    let mut client: Pod = read("pod-running-no-smcr-peer.json");
    let n: Node = read("node-erdma-mode-pending.json");
    let with = |p: &Pod, v: &str| {
        let mut p = p.clone();
        p.metadata.annotations = Some(
            [(
                "network.alibabacloud.com/erdma-smcr".to_string(),
                v.to_string(),
            )]
            .into(),
        );
        p
    };
    client = with(&client, "1");
    let checks = pod::checks(
        &with(&server, "TRUE"),
        &[],
        Some(&n),
        Some(&client),
        &LibsProbe::NotRequested,
    );
    assert_eq!(one(&checks, "pod.smcr").status, Status::Pass);
    assert_eq!(one(&checks, "pod.smcr.peer").status, Status::Pass);

    let checks = pod::checks(
        &with(&server, "yes"),
        &[],
        Some(&n),
        None,
        &LibsProbe::NotRequested,
    );
    let c = one(&checks, "pod.smcr");
    assert_eq!(c.status, Status::Fail);
    let hint = c.hint.as_deref().unwrap();
    assert!(
        hint.contains("leave SMC-R off") && !hint.contains("fails the container"),
        "{hint}"
    );
}

#[test]
fn training_pod_without_erdma_warns() {
    let p: Pod = read("pod-running-no-erdma.json");
    let checks = pod::checks(&p, &[], None, None, &LibsProbe::NotRequested);
    let r = one(&checks, "pod.resources");
    assert_eq!(r.status, Status::Warn);
    assert!(
        r.hint
            .as_deref()
            .unwrap()
            .contains("NCCL falls back to TCP")
    );
    assert_eq!(one(&checks, "pod.ipc_lock").status, Status::Skip);
    assert_eq!(one(&checks, "pod.containers").status, Status::Pass);
}

#[test]
fn image_pull_backoff_is_reported_with_the_kubelet_event() {
    let p: Pod = read("pod-image-pull-backoff.json");
    let ev = events("events-image-pull-backoff.json");
    let checks = pod::checks(&p, &ev, None, None, &LibsProbe::NotRequested);
    let c = one(&checks, "pod.containers");
    assert_eq!(c.status, Status::Fail);
    assert!(c.message.contains("pytorch: ImagePullBackOff"));
    assert!(c.message.contains("pull access denied"));
}

#[test]
fn image_libraries_from_exec_listings() {
    let p: Pod = read("pod-running-smcr.json");
    let read_txt = |f: &str| {
        std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/k8s")
                .join(f),
        )
        .unwrap()
    };
    let good = pod::rdma_libs(
        &p,
        &LibsProbe::Listed(parse_ls(&read_txt("exec-ls-erdma-image.txt"))),
    );
    assert_eq!(good.status, Status::Pass);
    assert!(good.message.contains("liberdma-rdmav34.so"));
    let stock = pod::rdma_libs(
        &p,
        &LibsProbe::Listed(parse_ls(&read_txt("exec-ls-stock-jammy.txt"))),
    );
    assert_eq!(stock.status, Status::Fail);
    assert!(
        stock
            .message
            .contains("eRDMA provider (liberdma-rdmav*.so) is missing")
    );
    assert!(stock.message.contains("libmlx5-rdmav34.so"));
    let none = pod::rdma_libs(&p, &LibsProbe::Listed(parse_ls("")));
    assert!(none.message.contains("libibverbs.so.1 not found"));
    let failed = pod::rdma_libs(&p, &LibsProbe::Failed("pods \"x\" is forbidden".into()));
    assert_eq!(failed.status, Status::Warn);
}

#[test]
fn driver_label_keys_match_the_driver_manager() {
    use erdma_driver as status;
    assert_eq!(node::LABEL_DRIVER_MODE, status::LABEL_DRIVER_MODE);
    assert_eq!(node::LABEL_DRIVER_READY, status::LABEL_DRIVER_READY);
    assert_eq!(node::LABEL_DRIVER_PENDING, status::LABEL_DRIVER_PENDING);
    assert_eq!(node::CONDITION_DRIVER, status::CONDITION_TYPE);
}

#[test]
fn text_rendering() {
    let r = Report::new(
        "node/n1",
        vec![
            Check::pass("node.ready", "node n1 is Ready"),
            Check::fail("agent.pod", "no agent", "install it"),
        ],
    );
    assert_eq!(
        r.to_text(),
        "doctor node/n1\nPASS  node.ready  node n1 is Ready\nFAIL  agent.pod   no agent\n                  fix: install it\n1 passed, 0 warnings, 1 failed, 0 skipped\n"
    );
    assert!(r.failed());
}

#[test]
fn nccl_env_that_keeps_nccl_off_erdma() {
    use k8s_openapi::api::core::v1::EnvVar;
    let mut p: Pod = read("pod-pending-insufficient-erdma.json");
    // The fixture's env follows the --erdma recipe minus the debug settings.
    assert_eq!(
        pod::nccl_env(&p, &pod::Holding::of(&p, &[])).status,
        Status::Pass
    );
    let set = |p: &mut Pod, vars: &[(&str, &str)]| {
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        let env = c.env.get_or_insert_with(Vec::new);
        for (k, v) in vars {
            env.push(EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                value_from: None,
            });
        }
    };
    set(
        &mut p,
        &[("NCCL_IB_TIMEOUT", "22"), ("NCCL_IB_RETRY_CNT", "10")],
    );
    // The vendor's advice is reported as INFO with the driver evidence, never as a problem.
    assert_eq!(
        pod::nccl_env(&p, &pod::Holding::of(&p, &[])).status,
        Status::Pass
    );
    let c = pod::nccl_retry(&p, &pod::Holding::of(&p, &[])).expect("reported when set");
    assert_eq!(c.status, Status::Info);
    for want in [
        "NCCL_IB_TIMEOUT=22",
        "NCCL_IB_RETRY_CNT=10 (outside the InfiniBand range 0-7)",
        "r0.2.37",
        "erdma_handle_compat_attr",
        "not known here",
        "NCCL_IB_TIMEOUT=23 and NCCL_IB_RETRY_CNT=10",
    ] {
        assert!(c.message.contains(want), "{want}: {}", c.message);
    }
    let report = erdma_doctor::Report::new("pod", vec![c]);
    assert_eq!(
        report.exit_status(true),
        0,
        "INFO never fails, even with --strict"
    );
    set(
        &mut p,
        &[("NCCL_IB_GID_INDEX", "0"), ("NCCL_IB_HCA", "mlx5_0")],
    );
    let c = pod::nccl_env(&p, &pod::Holding::of(&p, &[]));
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.message
            .contains("NCCL_IB_HCA=mlx5_0 does not select the erdma devices")
    );
    assert!(c.message.contains("NCCL_IB_GID_INDEX=0"));
    set(
        &mut p,
        &[
            ("NCCL_IB_HCA", "=erdma_0:1,erdma_1:1"),
            ("NCCL_IB_GID_INDEX", "-1"),
            ("NCCL_IB_DISABLE", "1"),
        ],
    );
    let c = pod::nccl_env(&p, &pod::Holding::of(&p, &[]));
    assert!(
        !c.message.contains("NCCL_IB_HCA"),
        "the last value wins: {}",
        c.message
    );
    assert!(
        c.message
            .contains("NCCL_IB_DISABLE=1 forces the socket transport")
    );
    let mut q: Pod = read("pod-pending-insufficient-erdma.json");
    set(&mut q, &[("NCCL_IB_HCA", "^mlx5")]);
    assert_eq!(
        pod::nccl_env(&q, &pod::Holding::of(&q, &[])).status,
        Status::Pass,
        "excluding mlx5 keeps erdma"
    );
    set(&mut q, &[("NCCL_IB_HCA", "^erdma")]);
    assert_eq!(
        pod::nccl_env(&q, &pod::Holding::of(&q, &[])).status,
        Status::Fail
    );
    let plain: Pod = read("pod-running-no-erdma.json");
    assert_eq!(
        pod::nccl_env(&plain, &pod::Holding::of(&plain, &[])).status,
        Status::Skip
    );
}

/// A pod that gets its eRDMA device through a DRA claim (no `aliyun/erdma` request) holds the
/// device as much as one with the extended resource; a claim of another driver does not count.
#[test]
fn a_pod_holding_erdma_through_a_dra_claim_passes_the_resource_checks() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "trainer-dra", "namespace": "team-d",
                     "annotations": {"network.alibabacloud.com/erdma-smcr": "true"}},
        "spec": {
            "resourceClaims": [{"name": "rdma", "resourceClaimTemplateName": "erdma"},
                               {"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "main", "image": "trainer",
                 "resources": {"claims": [{"name": "gpu"}, {"name": "rdma"}]},
                 "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]},
        "status": {"resourceClaimStatuses": [
            {"name": "rdma", "resourceClaimName": "trainer-dra-rdma-x7k2p"},
            {"name": "gpu", "resourceClaimName": "trainer-dra-gpu-9xq1z"}]}
    }))
    .unwrap();
    let claim = |name: &str, driver: &str, device: &str| -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team-d"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"driver": driver, "pool": "node-1", "device": device, "request": "req-0"}]}}}
        }))
        .unwrap()
    };
    let rdma = claim(
        "trainer-dra-rdma-x7k2p",
        "erdma.alibabacloud.com",
        "erdma-0",
    );
    let gpu = claim("trainer-dra-gpu-9xq1z", "gpu.nvidia.com", "gpu-0");

    let held = pod::Holding::of(&p, &[rdma.clone(), gpu.clone()]);
    assert_eq!(
        held.containers,
        [("main".to_string(), "claim rdma (erdma-0)".to_string())]
    );
    let checks = pod::checks_with_claims(
        &p,
        &[rdma, gpu.clone()],
        &[],
        None,
        None,
        &LibsProbe::NotRequested,
    );
    let r = one(&checks, "pod.resources");
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(
        r.message.contains("main: claim rdma (erdma-0)"),
        "{}",
        r.message
    );
    let ipc = one(&checks, "pod.ipc_lock");
    assert_eq!(ipc.status, Status::Pass, "{ipc:?}");
    assert!(ipc.message.contains("container main"), "{}", ipc.message);
    assert!(
        status_of(&checks, "pod.smcr")
            .iter()
            .all(|c| !c.message.contains("requests no aliyun/erdma")),
        "{checks:#?}"
    );

    // Only the GPU claim readable: no eRDMA device in the pod.
    let checks = pod::checks_with_claims(&p, &[gpu], &[], None, None, &LibsProbe::NotRequested);
    assert_eq!(one(&checks, "pod.resources").status, Status::Warn);
    assert_eq!(one(&checks, "pod.ipc_lock").status, Status::Skip);
}
