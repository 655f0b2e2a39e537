//! The lab kubelet's pod lifecycle against a CRI runtime on a real Unix socket (the recording fake
//! runtime of erdma-cri): what it sends for a pod, and how it deletes one.

mod common;

use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_fake_kubelet::client::{AllocationOutput, DeviceOut, MountOut};
use erdma_fake_kubelet::pods::{self, CdiForm, PodSpec};
use erdma_fake_kubelet::podspec::translate::CgroupDriver;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::collections::BTreeMap;
use std::path::Path;
use tokio_util::sync::CancellationToken;

fn spec(pod: &str, cdi: CdiForm) -> PodSpec {
    PodSpec {
        pod: pod.into(),
        container: "app".into(),
        image: "lab.local/rdma-tools:1".into(),
        command: vec!["sleep".into(), "100".into()],
        resource: None,
        cdi,
        annotations: BTreeMap::from([(
            "network.alibabacloud.com/erdma-smcr".to_string(),
            "true".to_string(),
        )]),
        host_network: false,
        authority: ClientAuthority::Localhost,
        log_root: std::env::temp_dir().join("erdma-fake-kubelet-test-logs"),
        dra: None,
        run_as_user: None,
        mounts: vec![],
        cgroup_driver: CgroupDriver::Cgroupfs,
    }
}

fn allocation() -> AllocationOutput {
    AllocationOutput {
        pod: "lab/pod-a".into(),
        container: "app".into(),
        resource: "aliyun/erdma".into(),
        device_ids: vec!["rxe0/0".into()],
        reused: vec![],
        offered: vec![],
        preferred: vec![],
        pre_start_called: false,
        envs: BTreeMap::from([("ERDMA_DEVICES".to_string(), "rxe0".to_string())]),
        mounts: vec![MountOut {
            container_path: "/etc/erdma".into(),
            host_path: "/var/lib/erdma".into(),
            read_only: true,
        }],
        devices: vec![DeviceOut {
            container_path: "/dev/infiniband/uverbs0".into(),
            host_path: "/dev/infiniband/uverbs0".into(),
            permissions: "rw".into(),
        }],
        annotations: BTreeMap::from([("erdma/slots".to_string(), "rxe0/0".to_string())]),
        cdi_devices: vec!["aliyun.com/erdma=rxe0".into()],
    }
}

#[test]
fn container_config_carries_the_allocate_response() {
    let s = spec("lab/pod-a", CdiForm::Field);
    let sandbox = pods::sandbox_config(&s, "uid-1").unwrap();
    let c = pods::container_config(&s, &sandbox, Some(&allocation()));
    assert_eq!(
        c.devices,
        vec![cri::Device {
            container_path: "/dev/infiniband/uverbs0".into(),
            host_path: "/dev/infiniband/uverbs0".into(),
            permissions: "rw".into(),
        }]
    );
    assert_eq!(c.mounts.len(), 1);
    assert_eq!(c.mounts[0].container_path, "/etc/erdma");
    assert_eq!(c.mounts[0].host_path, "/var/lib/erdma");
    assert!(c.mounts[0].readonly);
    assert_eq!(
        c.envs,
        vec![cri::KeyValue {
            key: "ERDMA_DEVICES".into(),
            value: "rxe0".into()
        }]
    );
    assert_eq!(
        c.cdi_devices,
        vec![cri::CdiDevice {
            name: "aliyun.com/erdma=rxe0".into()
        }]
    );
    // The field form adds no CDI annotation; the plugin's own annotations pass through.
    assert_eq!(
        c.annotations,
        BTreeMap::from([("erdma/slots".to_string(), "rxe0/0".to_string())])
    );
    assert_eq!(c.labels["io.kubernetes.container.name"], "app");
    assert_eq!(c.labels["io.kubernetes.pod.name"], "pod-a");
    assert_eq!(c.labels["io.kubernetes.pod.namespace"], "lab");

    let s = spec("lab/pod-b", CdiForm::Annotation);
    let c = pods::container_config(&s, &sandbox, Some(&allocation()));
    assert!(c.cdi_devices.is_empty());
    assert_eq!(
        c.annotations["cdi.k8s.io/erdma-fake-kubelet_app"],
        "aliyun.com/erdma=rxe0"
    );

    // A pod without the resource gets nothing of an allocation.
    let c = pods::container_config(&s, &sandbox, None);
    assert!(c.devices.is_empty() && c.mounts.is_empty() && c.envs.is_empty());
    assert!(c.cdi_devices.is_empty() && c.annotations.is_empty());
    assert_eq!(c.linux, None, "no user given: the image's");
}

#[test]
fn container_config_carries_the_user_and_the_pods_host_paths() {
    let mut s = spec("lab/pod-u", CdiForm::Field);
    s.run_as_user = Some(1000);
    s.mounts = vec![MountOut {
        container_path: "/usr/local/bin/probe".into(),
        host_path: "/usr/bin/probe".into(),
        read_only: true,
    }];
    let sandbox = pods::sandbox_config(&s, "uid-1").unwrap();
    let c = pods::container_config(&s, &sandbox, Some(&allocation()));
    let uid = c
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.run_as_user.as_ref())
        .map(|u| u.value);
    assert_eq!(uid, Some(1000));
    let paths: Vec<(&str, &str, bool)> = c
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.readonly))
        .collect();
    assert_eq!(
        paths,
        [
            ("/usr/bin/probe", "/usr/local/bin/probe", true),
            ("/var/lib/erdma", "/etc/erdma", true)
        ],
        "the pod's own volume and the Allocate response's mount"
    );
    // Root is a user too: 0 is sent, not left out.
    s.run_as_user = Some(0);
    let c = pods::container_config(&s, &sandbox, None);
    assert_eq!(
        c.linux
            .and_then(|l| l.security_context)
            .and_then(|sc| sc.run_as_user)
            .map(|u| u.value),
        Some(0)
    );
}

#[test]
fn sandbox_config_sets_the_kubelet_labels_and_network_mode() {
    let mut s = spec("lab/pod-a", CdiForm::Field);
    let c = pods::sandbox_config(&s, "uid-1").unwrap();
    let meta = c.metadata.clone().unwrap();
    assert_eq!(
        (
            meta.namespace.as_str(),
            meta.name.as_str(),
            meta.uid.as_str()
        ),
        ("lab", "pod-a", "uid-1")
    );
    assert_eq!(c.labels["io.kubernetes.pod.uid"], "uid-1");
    assert_eq!(c.annotations["network.alibabacloud.com/erdma-smcr"], "true");
    let mode = |c: &cri::PodSandboxConfig| {
        c.linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|o| o.network)
    };
    assert_eq!(mode(&c), Some(cri::NamespaceMode::Pod as i32));
    assert_eq!(c.hostname, "pod-a");
    // The pod's cgroup as the kubelet names it (cgroupfs driver; no CPU or memory asked:
    // BestEffort), so /proc/<pid>/cgroup of its processes names the pod's UID.
    assert_eq!(
        c.linux.as_ref().map(|l| l.cgroup_parent.as_str()),
        Some("/kubepods/besteffort/poduid-1")
    );
    s.host_network = true;
    let c = pods::sandbox_config(&s, "uid-1").unwrap();
    assert_eq!(mode(&c), Some(cri::NamespaceMode::Node as i32));
    // with the systemd driver: the slice path the kubelet sends (a UID's dashes become
    // underscores, since systemd reads a dash in a slice name as nesting)
    s.cgroup_driver = CgroupDriver::Systemd;
    let c = pods::sandbox_config(&s, "5f0c-uid-1").unwrap();
    assert_eq!(
        c.linux.as_ref().map(|l| l.cgroup_parent.as_str()),
        Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5f0c_uid_1.slice")
    );
    assert_eq!(c.hostname, "", "no hostname in the node's UTS namespace");
    assert!(pods::sandbox_config(&spec("no-namespace", CdiForm::Field), "u").is_err());
}

async fn serve(runtime: RecordingRuntime, socket: &Path, cancel: CancellationToken) {
    let listener = uds::bind(socket).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(runtime))
            .serve_with_incoming_shutdown(uds::incoming(listener), cancel.cancelled_owned())
            .await
    });
}

#[tokio::test]
async fn run_exec_and_delete_a_pod_over_cri() {
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("containerd.sock");
    let runtime = RecordingRuntime::default();
    let cancel = CancellationToken::new();
    serve(runtime.clone(), &socket, cancel.clone()).await;
    let mut cri = erdma_cri::CriClient::connect(&socket, Path::new("/proc"))
        .await
        .unwrap();
    let mut s = spec("lab/pod-c", CdiForm::Field);
    s.log_root = d.path().join("logs");
    let record = pods::run_pod(d.path(), &mut cri, &s).await.unwrap();
    assert_eq!(record.ip.as_deref(), Some("10.89.0.1"));
    assert_eq!(
        record.netns.as_deref(),
        Some(Path::new("/var/run/netns/cni-s1"))
    );
    assert_eq!(record.allocation, None);
    assert!(
        d.path()
            .join(format!("logs/lab_pod-c_{}", record.uid))
            .is_dir(),
        "the pod's log directory is created before the sandbox"
    );
    assert_eq!(
        pods::read_record(d.path(), "lab/pod-c").unwrap(),
        record,
        "the record is kept for exec and delete"
    );
    assert_eq!(pods::recorded_pods(d.path()).unwrap(), vec!["lab/pod-c"]);
    // A pod of the same name cannot run twice.
    assert!(pods::run_pod(d.path(), &mut cri, &s).await.is_err());

    let out = cri
        .exec_sync(&record.container_id, vec!["ls".into(), "/dev".into()], 0)
        .await
        .unwrap();
    assert_eq!((out.stdout.as_slice(), out.exit_code), (&b"ls /dev"[..], 0));

    pods::delete_pod(d.path(), &mut cri, "lab/pod-c", 0)
        .await
        .unwrap();
    let calls = runtime.calls();
    let names = common::call_names(&runtime);
    assert_eq!(
        names,
        [
            "RunPodSandbox",
            "CreateContainer",
            "StartContainer",
            "ExecSync",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox"
        ]
    );
    let Recorded::CreateContainer(sandbox, config) = &calls[1] else {
        panic!("second call is not CreateContainer: {calls:?}");
    };
    assert_eq!(sandbox, &record.sandbox_id);
    assert_eq!(config.command, ["sleep", "100"]);
    assert_eq!(
        config.image.as_ref().unwrap().image,
        "lab.local/rdma-tools:1"
    );
    assert!(runtime.sandboxes().is_empty() && runtime.containers().is_empty());
    assert!(pods::recorded_pods(d.path()).unwrap().is_empty());
    assert!(pods::read_record(d.path(), "lab/pod-c").is_err());
    cancel.cancel();
}
