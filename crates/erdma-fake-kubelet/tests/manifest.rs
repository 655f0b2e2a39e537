//! `pod run --manifest`'s translation of a PodSpec into CRI, against what the kubelet sends for
//! the same pod (the expected configs are written out from the kubelet's rules in
//! kuberuntime_sandbox.go, kuberuntime_container(_linux).go, security_context.go and
//! kubelet_pods.go, not computed by the code under test), and its refusals.

mod common;

use erdma_cri::runtime::v1 as cri;
use erdma_fake_kubelet::client::{AllocationOutput, DeviceOut, MountOut};
use erdma_fake_kubelet::podspec::manifest;
use erdma_fake_kubelet::podspec::probe::{ProbeAction, ProbePlan};
use erdma_fake_kubelet::podspec::translate::{ContainerInputs, NodeInfo, PodPlan, VolumePlan};
use erdma_fake_kubelet::podspec::volumes::HostPathType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A DaemonSet like the chart's agent (PreStart path, NRI on), as `helm template` renders it.
const AGENT: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: erdma-agent
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: erdma-agent
  namespace: kube-system
  labels:
    app.kubernetes.io/name: erdma
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: erdma
      app.kubernetes.io/component: agent
  template:
    metadata:
      labels:
        app.kubernetes.io/name: erdma
        app.kubernetes.io/component: agent
      annotations:
        prometheus.io/scrape: "true"
    spec:
      serviceAccountName: erdma-agent
      hostNetwork: true
      hostPID: true
      dnsPolicy: ClusterFirstWithHostNet
      priorityClassName: system-node-critical
      containers:
        - name: agent
          image: "lab.local/erdma-agent:1"
          imagePullPolicy: IfNotPresent
          args:
            - --deviceplugin-prestart-container
            - --node-name=$(NODE_NAME)
            - --dev-root=/host/dev
            - --metrics-addr=0.0.0.0:9101
            - --literal=$$(NODE_NAME)
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: AGENT_POD
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: LOG
              value: "node $(NODE_NAME) pod $(AGENT_POD) $(UNDEFINED)"
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: MEM_LIMIT_MI
              valueFrom:
                resourceFieldRef:
                  resource: limits.memory
                  divisor: 1Mi
            - name: CPU_REQ_M
              valueFrom:
                resourceFieldRef:
                  resource: requests.cpu
                  divisor: 1m
          ports:
            - name: metrics
              containerPort: 9101
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 5
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 5
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          securityContext:
            privileged: false
            capabilities:
              add: [SYS_MODULE, SYS_ADMIN, SYS_CHROOT, SYS_PTRACE, NET_ADMIN]
              drop: [NET_RAW]
          resources:
            requests:
              cpu: 50m
              memory: 64Mi
          volumeMounts:
            - name: device-plugins
              mountPath: /var/lib/kubelet/device-plugins
              readOnly: false
            - name: pod-resources
              mountPath: /var/lib/kubelet/pod-resources
              readOnly: true
            - name: host-dev
              mountPath: /host/dev
              readOnly: true
            - name: netns
              mountPath: /var/run/netns
              readOnly: true
              mountPropagation: HostToContainer
      volumes:
        - name: device-plugins
          hostPath:
            path: /var/lib/kubelet/device-plugins
            type: DirectoryOrCreate
        - name: pod-resources
          hostPath:
            path: /var/lib/kubelet/pod-resources
            type: DirectoryOrCreate
        - name: host-dev
          hostPath:
            path: /dev
            type: Directory
        - name: netns
          hostPath:
            path: /var/run/netns
            type: DirectoryOrCreate
"#;

fn node() -> NodeInfo {
    common::lab_node("10.77.0.1", 1_610_612_736)
}

fn plan_of(text: &str, uid: &str) -> PodPlan {
    let m = manifest::parse(text, "test.yaml", None).unwrap();
    PodPlan::new(m, &node(), uid.into()).unwrap()
}

fn refusal(text: &str) -> String {
    let m = manifest::parse(text, "test.yaml", None).unwrap();
    PodPlan::new(m, &node(), "uid-x".into())
        .map(|_| ())
        .expect_err("refused")
        .to_string()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The kubelet's masked and read-only /proc paths for the default procMount.
fn masked() -> Vec<String> {
    strings(&[
        "/proc/asound",
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/sys/firmware",
        "/sys/devices/virtual/powercap",
    ])
}

fn readonly() -> Vec<String> {
    strings(&[
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    ])
}

fn agent_paths() -> BTreeMap<String, PathBuf> {
    [
        ("device-plugins", "/var/lib/kubelet/device-plugins"),
        ("pod-resources", "/var/lib/kubelet/pod-resources"),
        ("host-dev", "/dev"),
        ("netns", "/var/run/netns"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
    .collect()
}

#[test]
fn the_chart_agent_daemonset_becomes_the_kubelets_sandbox_config() {
    let p = plan_of(AGENT, "uid-agent");
    assert_eq!(p.pod_name(), "kube-system/erdma-agent");
    assert_eq!(p.source, "DaemonSet kube-system/erdma-agent in test.yaml");
    let got = p.sandbox_config(Path::new("/var/log/pods"), "2026-01-02T03:04:05Z");
    let node_ns = cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Node as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        target_id: String::new(),
    };
    let want = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "erdma-agent".into(),
            uid: "uid-agent".into(),
            namespace: "kube-system".into(),
            attempt: 0,
        }),
        // No hostname in the node's UTS namespace.
        hostname: String::new(),
        log_directory: "/var/log/pods/kube-system_erdma-agent_uid-agent".into(),
        // The API server defaults a hostNetwork pod's hostPort to its containerPort.
        port_mappings: vec![cri::PortMapping {
            protocol: cri::Protocol::Tcp as i32,
            container_port: 9101,
            host_port: 9101,
            host_ip: String::new(),
        }],
        labels: map(&[
            ("app.kubernetes.io/component", "agent"),
            ("app.kubernetes.io/name", "erdma"),
            ("io.kubernetes.pod.name", "erdma-agent"),
            ("io.kubernetes.pod.namespace", "kube-system"),
            ("io.kubernetes.pod.uid", "uid-agent"),
        ]),
        annotations: map(&[
            ("kubernetes.io/config.seen", "2026-01-02T03:04:05Z"),
            ("kubernetes.io/config.source", "api"),
            ("prometheus.io/scrape", "true"),
        ]),
        linux: Some(cri::LinuxPodSandboxConfig {
            // requests without equal limits: Burstable, under the kubelet's cgroupfs name
            cgroup_parent: "/kubepods/burstable/poduid-agent".into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(node_ns),
                run_as_user: None,
                supplemental_groups: vec![],
                privileged: false,
                run_as_group: None,
            }),
            sysctls: BTreeMap::new(),
        }),
    };
    assert_eq!(got, want);
}

#[test]
fn the_chart_agent_daemonset_becomes_the_kubelets_container_config() {
    let p = plan_of(AGENT, "uid-agent");
    assert_eq!(p.app.extended, None);
    let paths = agent_paths();
    let got = p
        .container_config(&ContainerInputs {
            pod_ip: "10.77.0.1",
            image_id: "sha256:agent",
            image_uid: Some(0),
            image_username: "",
            allocation: None,
            volume_paths: &paths,
        })
        .unwrap();
    let node_ns = cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Node as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        target_id: String::new(),
    };
    let kv = |k: &str, v: &str| cri::KeyValue {
        key: k.into(),
        value: v.into(),
    };
    let mount = |c: &str, h: &str, ro: bool, prop: cri::MountPropagation| cri::Mount {
        container_path: c.into(),
        host_path: h.into(),
        readonly: ro,
        selinux_relabel: false,
        propagation: prop as i32,
    };
    let private = cri::MountPropagation::PropagationPrivate;
    let want = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "agent".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "sha256:agent".into(),
            annotations: BTreeMap::new(),
            user_specified_image: "lab.local/erdma-agent:1".into(),
        }),
        command: vec![],
        args: strings(&[
            "--deviceplugin-prestart-container",
            "--node-name=lab-node",
            "--dev-root=/host/dev",
            "--metrics-addr=0.0.0.0:9101",
            "--literal=$(NODE_NAME)",
        ]),
        working_dir: String::new(),
        envs: vec![
            kv("NODE_NAME", "lab-node"),
            kv("AGENT_POD", "erdma-agent"),
            kv("LOG", "node lab-node pod erdma-agent $(UNDEFINED)"),
            kv("POD_IP", "10.77.0.1"),
            // No memory limit: the node's allocatable memory, 1536 MiB.
            kv("MEM_LIMIT_MI", "1536"),
            kv("CPU_REQ_M", "50"),
        ],
        mounts: vec![
            mount(
                "/var/lib/kubelet/device-plugins",
                "/var/lib/kubelet/device-plugins",
                false,
                private,
            ),
            mount(
                "/var/lib/kubelet/pod-resources",
                "/var/lib/kubelet/pod-resources",
                true,
                private,
            ),
            mount("/host/dev", "/dev", true, private),
            mount(
                "/var/run/netns",
                "/var/run/netns",
                true,
                cri::MountPropagation::PropagationHostToContainer,
            ),
        ],
        devices: vec![],
        labels: map(&[
            ("io.kubernetes.container.name", "agent"),
            ("io.kubernetes.pod.name", "erdma-agent"),
            ("io.kubernetes.pod.namespace", "kube-system"),
            ("io.kubernetes.pod.uid", "uid-agent"),
        ]),
        annotations: map(&[
            (
                "io.kubernetes.container.ports",
                r#"[{"name":"metrics","hostPort":9101,"containerPort":9101,"protocol":"TCP"}]"#,
            ),
            ("io.kubernetes.container.restartCount", "0"),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log",
            ),
            ("io.kubernetes.container.terminationMessagePolicy", "File"),
            ("io.kubernetes.pod.terminationGracePeriod", "30"),
        ]),
        log_path: "agent/0.log".into(),
        stdin: false,
        stdin_once: false,
        tty: false,
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                // No CPU limit: no quota.
                cpu_quota: 0,
                // 50m * 1024 / 1000.
                cpu_shares: 51,
                memory_limit_in_bytes: 0,
                // system-node-critical.
                oom_score_adj: -997,
            }),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: Some(cri::Capability {
                    add_capabilities: strings(&[
                        "SYS_MODULE",
                        "SYS_ADMIN",
                        "SYS_CHROOT",
                        "SYS_PTRACE",
                        "NET_ADMIN",
                    ]),
                    drop_capabilities: strings(&["NET_RAW"]),
                }),
                privileged: false,
                namespace_options: Some(node_ns),
                // The image has no user: the kubelet sends root explicitly.
                run_as_user: Some(cri::Int64Value { value: 0 }),
                run_as_username: String::new(),
                readonly_rootfs: false,
                supplemental_groups: vec![],
                no_new_privs: false,
                run_as_group: None,
                masked_paths: masked(),
                readonly_paths: readonly(),
                // no appArmorProfile: the runtime's default profile
                apparmor: None,
                // no seccompProfile: Unconfined (the kubelet's --seccomp-default is off)
                seccomp: Some(unconfined()),
            }),
        }),
        cdi_devices: vec![],
    };
    assert_eq!(got, want);
}

#[test]
fn the_agents_volumes_probes_and_notes() {
    let p = plan_of(AGENT, "uid-agent");
    assert_eq!(
        p.volumes,
        [
            VolumePlan::HostPath {
                name: "device-plugins".into(),
                path: "/var/lib/kubelet/device-plugins".into(),
                ty: HostPathType::DirectoryOrCreate
            },
            VolumePlan::HostPath {
                name: "pod-resources".into(),
                path: "/var/lib/kubelet/pod-resources".into(),
                ty: HostPathType::DirectoryOrCreate
            },
            VolumePlan::HostPath {
                name: "host-dev".into(),
                path: "/dev".into(),
                ty: HostPathType::Directory
            },
            VolumePlan::HostPath {
                name: "netns".into(),
                path: "/var/run/netns".into(),
                ty: HostPathType::DirectoryOrCreate
            },
        ]
    );
    let http = ProbeAction::Http {
        host: String::new(),
        port: 9101,
        path: "/healthz".into(),
        headers: vec![],
    };
    assert_eq!(
        p.probes.readiness,
        Some(ProbePlan {
            kind: "readiness",
            action: http.clone(),
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            success_threshold: 1,
            failure_threshold: 3,
        })
    );
    assert_eq!(
        p.probes.readiness.as_ref().unwrap().description(),
        "http-get http://:9101/healthz delay=5s timeout=5s period=10s #success=1 #failure=3"
    );
    assert_eq!(
        p.probes.liveness.as_ref().map(|l| (l.period, l.kind)),
        Some((Duration::from_secs(20), "liveness"))
    );
    assert_eq!(p.probes.startup, None);
    assert_eq!(
        p.notes.get("service_account").map(String::as_str),
        Some("not mounted (no API server)")
    );
}

/// A pod on the pod network with pod-level security defaults, an emptyDir with a subPath, an
/// extended resource and Burstable resources.
const WORKER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: worker
  namespace: lab
  uid: 5f0c-uid
  labels: {app: worker, tier: rdma}
  annotations: {network.alibabacloud.com/erdma-smcr: "true"}
spec:
  shareProcessNamespace: true
  serviceAccountName: runner
  securityContext:
    runAsUser: 1000
    runAsGroup: 2000
    fsGroup: 3000
    supplementalGroups: [4000]
    sysctls:
      - {name: net.ipv4.ip_local_port_range, value: "32768 60999"}
  containers:
    - name: app
      image: lab.local/rdma-tools:1
      command: [sh, -c]
      args: ["echo $(GREETING) on $(HOST_IP) as $(TIER); sleep 1000"]
      workingDir: /work
      env:
        - {name: GREETING, value: hello}
        - {name: GREETING, value: "$(GREETING) again"}
        - name: HOST_IP
          valueFrom: {fieldRef: {fieldPath: status.hostIP}}
        - name: TIER
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}
        - name: MISSING_ANNOTATION
          valueFrom: {fieldRef: {fieldPath: "metadata.annotations['nope']"}}
        - name: SA
          valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}
        - name: MY_IPS
          valueFrom: {fieldRef: {fieldPath: status.podIPs}}
        - name: CPU_LIMIT
          valueFrom: {resourceFieldRef: {resource: limits.cpu}}
        - name: MEM_REQ_KI
          valueFrom: {resourceFieldRef: {resource: requests.memory, divisor: 1Ki}}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        runAsUser: 1001
      resources:
        requests: {cpu: 250m, memory: 128Mi}
        limits: {cpu: 500m, memory: 256Mi, example.com/dev: 2}
      volumeMounts:
        - {name: scratch, mountPath: /scratch}
        - {name: scratch, mountPath: /cache, subPath: cache/app}
      startupProbe:
        exec: {command: [cat, /tmp/$(GREETING)]}
        periodSeconds: 1
        failureThreshold: 30
  volumes:
    - name: scratch
      emptyDir: {}
"#;

#[test]
fn the_pod_cgroup_is_the_kubelets_cgroupfs_name_by_qos_class() {
    use erdma_fake_kubelet::podspec::translate::{CgroupDriver, QosClass, pod_cgroup_parent};
    let fs = CgroupDriver::Cgroupfs;
    assert_eq!(
        pod_cgroup_parent(fs, QosClass::Guaranteed, "u1"),
        "/kubepods/podu1"
    );
    assert_eq!(
        pod_cgroup_parent(fs, QosClass::Burstable, "u1"),
        "/kubepods/burstable/podu1"
    );
    assert_eq!(
        pod_cgroup_parent(fs, QosClass::BestEffort, "u1"),
        "/kubepods/besteffort/podu1"
    );
}

/// The names a kubelet with `cgroupDriver: systemd` sends (as on an ACK node with
/// `SystemdCgroup = true`: `/proc/<pid>/cgroup` of a pod's process reads
/// `0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID_>.slice/cri-containerd-<id>.scope`).
#[test]
fn the_pod_cgroup_is_the_kubelets_systemd_slice_by_qos_class() {
    use erdma_fake_kubelet::podspec::translate::{CgroupDriver, QosClass, pod_cgroup_parent};
    let sd = CgroupDriver::Systemd;
    let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    assert_eq!(
        pod_cgroup_parent(sd, QosClass::Guaranteed, uid),
        "/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
    );
    assert_eq!(
        pod_cgroup_parent(sd, QosClass::Burstable, uid),
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
    );
    assert_eq!(
        pod_cgroup_parent(sd, QosClass::BestEffort, uid),
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
    );
}

#[test]
fn a_systemd_node_gives_the_manifest_pod_its_slice() {
    use erdma_fake_kubelet::podspec::translate::CgroupDriver;
    let m = manifest::parse(AGENT, "test.yaml", None).unwrap();
    let node = NodeInfo {
        cgroup_driver: CgroupDriver::Systemd,
        ..node()
    };
    let p = PodPlan::new(m, &node, "9d8c-7b6a".into()).unwrap();
    let sb = p.sandbox_config(Path::new("/logs"), "t");
    assert_eq!(
        sb.linux.map(|l| l.cgroup_parent),
        Some(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9d8c_7b6a.slice".into()
        )
    );
}

#[test]
fn a_pod_network_pod_with_pod_level_defaults_and_an_allocation() {
    let p = plan_of(WORKER, "5f0c-uid");
    assert_eq!(p.uid, "5f0c-uid");
    assert_eq!(p.app.extended, Some(("example.com/dev".to_string(), 2)));
    assert_eq!(
        p.volumes,
        [VolumePlan::EmptyDir {
            name: "scratch".into()
        }]
    );
    let sb = p.sandbox_config(Path::new("/logs"), "t");
    assert_eq!(sb.hostname, "worker");
    assert_eq!(sb.port_mappings, vec![]);
    let pod_ns = cri::NamespaceOption {
        network: cri::NamespaceMode::Pod as i32,
        // shareProcessNamespace: the pod's PID namespace.
        pid: cri::NamespaceMode::Pod as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        target_id: String::new(),
    };
    assert_eq!(
        sb.linux,
        Some(cri::LinuxPodSandboxConfig {
            // requests below the limits: Burstable
            cgroup_parent: "/kubepods/burstable/pod5f0c-uid".into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(pod_ns.clone()),
                run_as_user: Some(cri::Int64Value { value: 1000 }),
                supplemental_groups: vec![3000, 4000],
                privileged: false,
                run_as_group: Some(cri::Int64Value { value: 2000 }),
            }),
            sysctls: map(&[("net.ipv4.ip_local_port_range", "32768 60999")]),
        })
    );
    assert_eq!(
        sb.annotations["network.alibabacloud.com/erdma-smcr"],
        "true"
    );

    let allocation = AllocationOutput {
        pod: "lab/worker".into(),
        container: "app".into(),
        resource: "example.com/dev".into(),
        device_ids: vec!["d0".into(), "d1".into()],
        reused: vec![],
        offered: vec![],
        preferred: vec![],
        pre_start_called: false,
        envs: BTreeMap::from([("DEV_IDS".to_string(), "d0,d1".to_string())]),
        mounts: vec![MountOut {
            container_path: "/etc/dev".into(),
            host_path: "/var/lib/dev".into(),
            read_only: true,
        }],
        devices: vec![DeviceOut {
            container_path: "/dev/infiniband/uverbs0".into(),
            host_path: "/dev/infiniband/uverbs0".into(),
            permissions: "rw".into(),
        }],
        annotations: BTreeMap::from([("dev/slots".to_string(), "d0,d1".to_string())]),
        cdi_devices: vec![],
    };
    let paths = BTreeMap::from([(
        "scratch".to_string(),
        PathBuf::from("/k/pod-volumes/5f0c-uid/scratch"),
    )]);
    let c = p
        .container_config(&ContainerInputs {
            pod_ip: "10.89.0.7",
            image_id: "sha256:tools",
            image_uid: None,
            image_username: "tools",
            allocation: Some(&allocation),
            volume_paths: &paths,
        })
        .unwrap();
    assert_eq!(c.command, ["sh", "-c"]);
    assert_eq!(
        c.args,
        ["echo hello again on 10.77.0.1 as rdma; sleep 1000"],
        "args expanded against the whole env"
    );
    assert_eq!(c.working_dir, "/work");
    let envs: Vec<(&str, &str)> = c
        .envs
        .iter()
        .map(|e| (e.key.as_str(), std::str::from_utf8(&e.value).unwrap()))
        .collect();
    assert_eq!(
        envs,
        [
            // The Allocate response's envs first, as the kubelet appends the pod's after them.
            ("DEV_IDS", "d0,d1"),
            ("GREETING", "hello again"),
            ("HOST_IP", "10.77.0.1"),
            ("TIER", "rdma"),
            ("MISSING_ANNOTATION", ""),
            ("SA", "runner"),
            ("MY_IPS", "10.89.0.7"),
            // limits.cpu 500m, divisor 1: rounded up.
            ("CPU_LIMIT", "1"),
            ("MEM_REQ_KI", "131072"),
        ]
    );
    let mounts: Vec<(&str, &str, bool)> = c
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/etc/dev", "/var/lib/dev", true),
            ("/scratch", "/k/pod-volumes/5f0c-uid/scratch", false),
            ("/cache", "/k/pod-volumes/5f0c-uid/scratch/cache/app", false),
        ]
    );
    assert_eq!(
        c.devices,
        vec![cri::Device {
            container_path: "/dev/infiniband/uverbs0".into(),
            host_path: "/dev/infiniband/uverbs0".into(),
            permissions: "rw".into(),
        }]
    );
    assert_eq!(c.annotations["dev/slots"], "d0,d1");
    assert!(!c.annotations.contains_key("io.kubernetes.container.ports"));
    let linux = c.linux.unwrap();
    assert_eq!(
        linux.resources,
        Some(cri::LinuxContainerResources {
            cpu_period: 100_000,
            // 500m over 100 ms.
            cpu_quota: 50_000,
            // 250m * 1024 / 1000.
            cpu_shares: 256,
            memory_limit_in_bytes: 268_435_456,
            // Burstable: 1000 - 1000 * 128 Mi / 1.5 Gi (integer division).
            oom_score_adj: 917,
        })
    );
    assert_eq!(
        linux.security_context,
        Some(cri::LinuxContainerSecurityContext {
            capabilities: None,
            privileged: false,
            namespace_options: Some(pod_ns),
            // The container's runAsUser over the pod's (and over the image's user).
            run_as_user: Some(cri::Int64Value { value: 1001 }),
            run_as_username: String::new(),
            readonly_rootfs: true,
            supplemental_groups: vec![3000, 4000],
            no_new_privs: true,
            run_as_group: Some(cri::Int64Value { value: 2000 }),
            masked_paths: masked(),
            readonly_paths: readonly(),
            // no appArmorProfile: the runtime's default profile
            apparmor: None,
            seccomp: Some(unconfined()),
        })
    );
    // The exec probe's command is expanded from the literal env values only.
    assert_eq!(
        p.probes.startup.as_ref().map(|s| s.action.clone()),
        Some(ProbeAction::Exec {
            command: strings(&["cat", "/tmp/$(GREETING) again"])
        })
    );
}

#[test]
fn qos_and_user_rules() {
    let best_effort = AGENT
        .replace("priorityClassName: system-node-critical", "")
        .replace(
            "            requests:\n              cpu: 50m\n              memory: 64Mi\n",
            "            {}\n",
        );
    let p = plan_of(&best_effort, "u");
    let r = p.linux_resources();
    assert_eq!((r.cpu_shares, r.oom_score_adj), (2, 1000), "BestEffort");
    let guaranteed = AGENT
        .replace("priorityClassName: system-node-critical", "")
        .replace(
            "            requests:\n              cpu: 50m\n              memory: 64Mi\n",
            "            limits:\n              cpu: \"1\"\n              memory: 64Mi\n",
        );
    let p = plan_of(&guaranteed, "u");
    let r = p.linux_resources();
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.memory_limit_in_bytes,
            r.oom_score_adj
        ),
        (1024, 100_000, 67_108_864, -997),
        "Guaranteed: requests default to limits"
    );

    // An image user by name, no runAsUser: the name goes to the runtime.
    let p = plan_of(AGENT, "u");
    let paths = agent_paths();
    let inputs = |uid, name| ContainerInputs {
        pod_ip: "10.77.0.1",
        image_id: "sha256:x",
        image_uid: uid,
        image_username: name,
        allocation: None,
        volume_paths: &paths,
    };
    let sc = p
        .container_config(&inputs(None, "agent"))
        .unwrap()
        .linux
        .unwrap()
        .security_context
        .unwrap();
    assert_eq!(
        (sc.run_as_user, sc.run_as_username.as_str()),
        (None, "agent")
    );

    // runAsNonRoot against a root image, and against a named image user: the kubelet's errors.
    let non_root = AGENT.replace(
        "            privileged: false\n",
        "            privileged: false\n            runAsNonRoot: true\n",
    );
    let p = plan_of(&non_root, "u");
    let e = p
        .container_config(&inputs(Some(0), ""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("container has runAsNonRoot and image will run as root")
            && e.contains("kube-system/erdma-agent"),
        "{e}"
    );
    let e = p
        .container_config(&inputs(None, "agent"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("image has non-numeric user (agent)"), "{e}");
    assert!(p.container_config(&inputs(Some(1000), "")).is_ok());
    let root = non_root.replace(
        "runAsNonRoot: true\n",
        "runAsNonRoot: true\n            runAsUser: 0\n",
    );
    let e = plan_of(&root, "u")
        .container_config(&inputs(Some(1000), ""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("container's runAsUser breaks non-root policy"),
        "{e}"
    );

    // A privileged container makes the sandbox privileged and may use Bidirectional.
    let privileged = AGENT
        .replace(
            "            privileged: false\n",
            "            privileged: true\n",
        )
        .replace(
            "mountPropagation: HostToContainer",
            "mountPropagation: Bidirectional",
        );
    let p = plan_of(&privileged, "u");
    let sb = p.sandbox_config(Path::new("/l"), "t");
    assert!(sb.linux.unwrap().security_context.unwrap().privileged);
    let c = p.container_config(&inputs(Some(0), "")).unwrap();
    assert_eq!(
        c.mounts[3].propagation,
        cri::MountPropagation::PropagationBidirectional as i32
    );
}

/// The AppArmor profile goes to the runtime as the kubelet sends it: the container's
/// `appArmorProfile` over the pod's, none when neither has one.
#[test]
fn the_apparmor_profile_is_the_containers_else_the_pods() {
    use erdma_cri::runtime::v1::security_profile::ProfileType;
    let paths = BTreeMap::new();
    let apparmor = |text: &str| {
        plan_of(text, "u")
            .container_config(&ContainerInputs {
                pod_ip: "10.88.0.2",
                image_id: "sha256:x",
                image_uid: Some(0),
                image_username: "",
                allocation: None,
                volume_paths: &paths,
            })
            .unwrap()
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .apparmor
            .map(|p| {
                (
                    ProfileType::try_from(p.profile_type).unwrap(),
                    p.localhost_ref,
                )
            })
    };
    assert_eq!(apparmor(&pod("", "")), None);
    assert_eq!(
        apparmor(&pod(
            "",
            "      securityContext:\n        appArmorProfile: {type: Unconfined}\n"
        )),
        Some((ProfileType::Unconfined, String::new()))
    );
    let pod_level = "  securityContext:\n    appArmorProfile: {type: Localhost, localhostProfile: erdma-agent}\n";
    assert_eq!(
        apparmor(&pod(pod_level, "")),
        Some((ProfileType::Localhost, "erdma-agent".to_string()))
    );
    assert_eq!(
        apparmor(&pod(
            pod_level,
            "      securityContext:\n        appArmorProfile: {type: RuntimeDefault}\n"
        )),
        Some((ProfileType::RuntimeDefault, String::new())),
        "the container's profile wins over the pod's"
    );
    let e = plan_of(
        &pod(
            "",
            "      securityContext:\n        appArmorProfile: {type: Localhost}\n",
        ),
        "u",
    )
    .container_config(&ContainerInputs {
        pod_ip: "10.88.0.2",
        image_id: "sha256:x",
        image_uid: Some(0),
        image_username: "",
        allocation: None,
        volume_paths: &paths,
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("Localhost without localhostProfile"), "{e}");
}

fn unconfined() -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    }
}

/// The seccomp profile goes to the runtime as the kubelet's `fieldSeccompProfile` makes it:
/// the container's `seccompProfile` over the pod's; neither: `Unconfined` (the kubelet's
/// `--seccomp-default` off); `Localhost` as a path under `<root-dir>/seccomp`.
#[test]
fn the_seccomp_profile_is_the_containers_else_the_pods_else_unconfined() {
    use erdma_cri::runtime::v1::security_profile::ProfileType;
    let paths = BTreeMap::new();
    let config = |text: &str| {
        plan_of(text, "u").container_config(&ContainerInputs {
            pod_ip: "10.88.0.2",
            image_id: "sha256:x",
            image_uid: Some(0),
            image_username: "",
            allocation: None,
            volume_paths: &paths,
        })
    };
    let seccomp = |text: &str| {
        let p = config(text)
            .unwrap()
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .seccomp
            .unwrap();
        (
            ProfileType::try_from(p.profile_type).unwrap(),
            p.localhost_ref,
        )
    };
    assert_eq!(
        seccomp(&pod("", "")),
        (ProfileType::Unconfined, String::new())
    );
    let pod_level = "  securityContext:\n    seccompProfile: {type: RuntimeDefault}\n";
    assert_eq!(
        seccomp(&pod(pod_level, "")),
        (ProfileType::RuntimeDefault, String::new())
    );
    assert_eq!(
        seccomp(&pod(
            pod_level,
            "      securityContext:\n        seccompProfile: {type: Localhost, localhostProfile: profiles/erdma.json}\n"
        )),
        (
            ProfileType::Localhost,
            "/var/lib/kubelet/seccomp/profiles/erdma.json".to_string()
        ),
        "the container's profile wins over the pod's"
    );
    assert_eq!(
        seccomp(&pod(
            pod_level,
            "      securityContext:\n        seccompProfile: {type: Unconfined}\n"
        )),
        (ProfileType::Unconfined, String::new())
    );
    let e = config(&pod(
        "",
        "      securityContext:\n        seccompProfile: {type: Localhost}\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("Localhost without localhostProfile"), "{e}");
}

/// A minimal Pod with one container, `extra_spec` added to its spec and `extra_container` to
/// its container (YAML lines at the right indentation).
fn pod(extra_spec: &str, extra_container: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: lab\nspec:\n{extra_spec}  containers:\n    - name: c\n      image: lab.local/rdma-tools:1\n{extra_container}"
    )
}

#[test]
fn what_the_lab_kubelet_refuses_is_named() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "  volumes:\n    - name: cfg\n      configMap: {name: erdma-config}\n",
            "      volumeMounts: [{name: cfg, mountPath: /etc/erdma}]\n",
            &[
                "pod lab/p (Pod lab/p in test.yaml)",
                "spec.volumes[0] \"cfg\"",
                "configMap volume",
                "hostPath, emptyDir and downwardAPI volumes",
                "--api-server",
            ],
        ),
        (
            "",
            "      env:\n        - name: TOKEN\n          valueFrom: {secretKeyRef: {name: creds, key: token}}\n",
            &[
                "env[0] \"TOKEN\".valueFrom.secretKeyRef",
                "key \"token\" of Secret \"creds\"",
                "Fix: set the env var's value",
            ],
        ),
        (
            "",
            "      env:\n        - name: CFG\n          valueFrom: {configMapKeyRef: {name: erdma, key: cfg}}\n",
            &[
                "env[0] \"CFG\".valueFrom.configMapKeyRef",
                "ConfigMap \"erdma\"",
            ],
        ),
        (
            "",
            "      envFrom: [{configMapRef: {name: all}}]\n",
            &["spec.containers[0].envFrom", "ConfigMap \"all\""],
        ),
        (
            "  initContainers: [{name: init, image: busybox, restartPolicy: Always}]\n",
            "",
            &[
                "spec.initContainers[0].restartPolicy",
                "Always (a sidecar container)",
                "Fix:",
            ],
        ),
        (
            "  initContainers: [{name: init, image: busybox, readinessProbe: {exec: {command: [x]}}}]\n",
            "",
            &[
                "spec.initContainers[0].readinessProbe",
                "may not be set for init containers",
            ],
        ),
        (
            "  initContainers: [{name: c, image: busybox}]\n",
            "",
            &[
                "spec.containers[0].name",
                "\"c\" is also the name of spec.initContainers[0]",
            ],
        ),
        (
            "  initContainers: [{name: init, image: busybox, resources: {limits: {hugepages-2Mi: 2Mi}}}]\n",
            "",
            &["spec.initContainers[0].resources.limits.hugepages-2Mi"],
        ),
        (
            "",
            "    - name: second\n      image: busybox\n",
            &[
                "spec.containers",
                "2 containers [\"c\", \"second\"]",
                "pod record holds one container",
            ],
        ),
        (
            "  volumes: [{name: v, hostPath: {path: /var/run/netns}}]\n",
            "      volumeMounts: [{name: v, mountPath: /n, mountPropagation: Bidirectional}]\n",
            &[
                "volumeMounts[0].mountPropagation",
                "only to privileged containers",
            ],
        ),
        (
            "",
            "      readinessProbe: {httpGet: {port: 443, scheme: HTTPS}}\n",
            &[
                "spec.containers[0].readinessProbe",
                "httpGet.scheme HTTPS",
                "HTTP only",
            ],
        ),
        (
            "",
            "      livenessProbe: {grpc: {port: 9090}}\n",
            &["livenessProbe", "grpc"],
        ),
        (
            "",
            "      readinessProbe: {httpGet: {port: admin}}\n",
            &[
                "readinessProbe",
                "port \"admin\" is not a named port of container \"c\"",
            ],
        ),
        (
            "",
            "      resources: {limits: {example.com/a: 1, example.com/b: 1}}\n",
            &["two extended resources (example.com/a, example.com/b)"],
        ),
        (
            "",
            "      resources: {limits: {example.com/a: 1500m}}\n",
            &["resources.limits.example.com/a", "whole number"],
        ),
        (
            "",
            "      resources: {requests: {example.com/a: 1}}\n",
            &["resources.requests.example.com/a", "must equal its limit"],
        ),
        (
            "",
            "      resources: {limits: {hugepages-2Mi: 2Mi}}\n",
            &["resources.limits.hugepages-2Mi", "hugepages"],
        ),
        (
            "",
            "      resources: {limits: {memory: lots}}\n",
            &["resources.limits.memory", "\"lots\""],
        ),
        (
            "",
            "      env:\n        - name: X\n          valueFrom: {fieldRef: {fieldPath: status.phase}}\n",
            &[
                "env[0] \"X\".valueFrom.fieldRef.fieldPath",
                "\"status.phase\"",
            ],
        ),
        (
            "",
            "      env:\n        - name: X\n          valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 10m}}\n",
            &["resourceFieldRef", "divisor for limits.cpu must be 1m or 1"],
        ),
        (
            "  volumes: [{name: m, emptyDir: {medium: Memory}}]\n",
            "",
            &["spec.volumes[0] \"m\".emptyDir.medium", "\"Memory\""],
        ),
        (
            "  volumes: [{name: v, hostPath: {path: /x, type: Dir}}]\n",
            "",
            &[
                "spec.volumes[0] \"v\".hostPath.type",
                "Dir is an invalid volume type",
            ],
        ),
        (
            "  volumes: [{name: v, hostPath: {path: /var/../etc}}]\n",
            "",
            &["hostPath.path", "\"/var/../etc\""],
        ),
        (
            "  volumes: [{name: v, emptyDir: {}}]\n",
            "      volumeMounts: [{name: v, mountPath: /v, subPath: ../up}]\n",
            &["volumeMounts[0].subPath", "\"../up\""],
        ),
        (
            "",
            "      volumeMounts: [{name: ghost, mountPath: /g}]\n",
            &["volumeMounts[0].name", "\"ghost\" names no volume"],
        ),
        (
            "",
            "      lifecycle: {postStart: {exec: {command: [/bin/true]}}}\n",
            &["lifecycle.postStart"],
        ),
        (
            "  runtimeClassName: kata\n",
            "",
            &["spec.runtimeClassName", "\"kata\""],
        ),
        (
            "",
            "      imagePullPolicy: Sometimes\n",
            &["imagePullPolicy", "\"Sometimes\""],
        ),
    ];
    for (spec, container, wants) in cases {
        let e = refusal(&pod(spec, container));
        for w in *wants {
            assert!(e.contains(w), "{w:?} not in: {e}");
        }
    }
}

#[test]
fn the_service_account_token_volume_is_not_mounted() {
    // A pod as `kubectl get -o yaml` prints it, with the admission-added token volume.
    let e = pod(
        "  volumes:\n    - name: kube-api-access-x7k2p\n      projected:\n        sources:\n          - serviceAccountToken: {path: token}\n",
        "      volumeMounts: [{name: kube-api-access-x7k2p, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}]\n",
    );
    let p = plan_of(&e, "u");
    assert!(p.volumes.is_empty() && p.app.mounts.is_empty());
    assert_eq!(p.notes["service_account"], "not mounted (no API server)");
    let off = pod("  automountServiceAccountToken: false\n", "");
    assert_eq!(
        plan_of(&off, "u").notes["service_account"],
        "not requested (automountServiceAccountToken: false)"
    );
}

#[test]
fn the_installs_rendered_agent_is_runnable_as_is() {
    // The install's own render (the same manifests as the chart) goes through unchanged.
    let yaml = erdma_k8s::install::render_yaml(&erdma_k8s::install::Values::default()).unwrap();
    let m = manifest::parse(
        &yaml,
        "install.yaml",
        Some("DaemonSet/alibabacloud-erdma-agent"),
    )
    .unwrap();
    assert_eq!(m.kind, "DaemonSet");
    let p = PodPlan::new(m, &node(), "u".into()).unwrap();
    let caps = p
        .app
        .container
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .cloned()
        .unwrap();
    assert_eq!(
        caps.add.unwrap(),
        strings(&[
            "SYS_MODULE",
            "SYS_ADMIN",
            "SYS_CHROOT",
            "SYS_PTRACE",
            "NET_ADMIN"
        ])
    );
    assert_eq!(caps.drop.unwrap(), strings(&["NET_RAW"]));
    let ns = p.namespace_options();
    assert_eq!(
        (ns.network, ns.pid),
        (
            cri::NamespaceMode::Node as i32,
            cri::NamespaceMode::Node as i32
        )
    );
    assert!(p.volumes.iter().any(|v| matches!(
        v,
        VolumePlan::HostPath { path, ty: HostPathType::DirectoryOrCreate, .. }
            if path == Path::new("/var/lib/kubelet/device-plugins")
    )));
}
