//! The usage tests' node: one pod, ml/trainer-0 (a systemd-slice cgroup for PID 100), holding
//! erdma_0 slot 0, seen through a fake kernel answer.

use erdma_agent::usage::{PodLister, UsageInputs, UsageService, parse_fake};
use erdma_cri::PodIdentity;
use erdma_kubelet::podresources::Holder;
use std::sync::Arc;

/// The usage service over `kernel` (parse_fake's text) for that pod, and the temporary /proc it
/// reads (keep it alive as long as the service).
pub fn one_pod_usage(kernel: &str, node: Option<String>) -> (Arc<UsageService>, tempfile::TempDir) {
    let proc_root = tempfile::tempdir().unwrap();
    let uid = "6a0b2c3d-1e2f-4a5b-8c7d-9e0f1a2b3c4d";
    std::fs::create_dir_all(proc_root.path().join("100")).unwrap();
    std::fs::write(
        proc_root.path().join("100/cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope\n",
            uid.replace('-', "_"),
            "ab".repeat(32)
        ),
    )
    .unwrap();
    let holders = Arc::new(vec![Holder::of_ids(
        "ml",
        "trainer-0",
        "main",
        vec!["erdma_0/0".into()],
    )]);
    let pods: Arc<dyn PodLister> = Arc::new(vec![PodIdentity {
        uid: uid.into(),
        namespace: "ml".into(),
        name: "trainer-0".into(),
    }]);
    let usage = UsageService::new(UsageInputs {
        source: Arc::new(parse_fake(kernel)),
        proc_root: proc_root.path().into(),
        holders: Arc::new(move || holders.clone()),
        pods,
        node,
    });
    (usage, proc_root)
}
