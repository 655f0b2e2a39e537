//! The pod runtime against what the real agent produced in the lab (see testdata/README.md).

use std::path::{Path, PathBuf};

use erdma_lab::allocation::Allocation;
use erdma_lab::cdi::CdiRegistry;
use erdma_lab::plan::{PodPlan, PodSpec};

fn testdata(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(p)
}

#[test]
fn a_cdi_mode_allocation_becomes_rxe0_and_rdma_cm_only() {
    let alloc = Allocation::from_file(&testdata("cdi-allocate-pod-a.json"))
        .expect("captured allocation parses");
    assert!(alloc.devices.is_empty(), "CDI mode answers with names only");
    let names: Vec<&str> = alloc.cdi_devices.iter().map(|c| c.name()).collect();
    let cdi = CdiRegistry::load(&[testdata("cdi")])
        .expect("captured spec loads")
        .resolve(&names)
        .expect("resolves");
    let plan = PodPlan::build(&PodSpec {
        name: "pod-a".into(),
        netns: Some("pod-a".into()),
        allocations: vec![alloc],
        cdi,
        command: vec!["ibv_devices".into()],
        ..PodSpec::default()
    })
    .expect("plan");
    let ib: Vec<String> = plan
        .devices
        .iter()
        .map(|d| d.container_path.display().to_string())
        .filter(|p| p.starts_with("/dev/infiniband/"))
        .collect();
    assert_eq!(
        ib,
        [
            "/dev/infiniband/rdma_cm",
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/umad0"
        ]
    );
    assert!(plan.devices.iter().all(|d| d.mode == 0o666));
    assert_eq!(plan.env["ERDMA_DEVICES"], "rxe0");
    assert_eq!(plan.env["SMCR_PNET"], "525400E70001");
    assert_eq!(plan.device_ids, ["rxe0/0"]);
}

#[test]
fn both_devices_share_the_spec_wide_rdma_cm_once() {
    let reg = CdiRegistry::load(&[testdata("cdi")]).expect("loads");
    let cdi = reg
        .resolve(&["aliyun.com/erdma=rxe0", "aliyun.com/erdma=rxe1"])
        .expect("resolves");
    let plan = PodPlan::build(&PodSpec {
        name: "pod-c".into(),
        cdi,
        command: vec!["true".into()],
        ..PodSpec::default()
    })
    .expect("the repeated rdma_cm node merges instead of conflicting");
    let ib = plan
        .devices
        .iter()
        .filter(|d| d.container_path.starts_with("/dev/infiniband"))
        .count();
    assert_eq!(ib, 5, "rdma_cm once, uverbs0, umad0, uverbs1, umad1");
}
