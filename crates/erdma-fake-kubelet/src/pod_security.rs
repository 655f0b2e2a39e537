//! Pod Security admission at the `baseline` level, for the lab's admission step: a namespace
//! labelled `pod-security.kubernetes.io/enforce: baseline` (or `restricted`, of which only the
//! baseline checks are modelled, noted) refuses a pod that breaks one of the baseline checks of
//! `staging/src/k8s.io/pod-security-admission/policy` (latest version of each):
//!
//! - host namespaces: `hostNetwork`, `hostPID`, `hostIPC` unset or false;
//! - privileged: no container (init, ephemeral included) with `privileged: true`;
//! - capabilities: `add` only from [`BASELINE_CAPABILITIES`];
//! - hostPath volumes: none; host ports: none but 0;
//! - AppArmor: no `Unconfined` profile (field or `container.apparmor.security.beta.kubernetes.io/`
//!   annotation: only `runtime/default` and `localhost/...`);
//! - SELinux: `type` one of [`SELINUX_TYPES`] or empty, no `user`, no `role`;
//! - `/proc` mount: `Default` or unset; seccomp: no `Unconfined` (pod or container);
//! - sysctls: only [`SAFE_SYSCTLS`]; Windows `hostProcess`: unset or false.
//!
//! The API server's answer lists every failed check; so does [`violations`]. This is the lab's
//! model, tested against cases written after upstream's pass/fail fixtures
//! (`pod-security-admission/test/testdata/baseline`), not upstream's code.

use k8s_openapi::api::core::v1::{Pod, PodSpec, SecurityContext};
use std::collections::BTreeMap;

/// The namespace label that enforces a level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Capabilities a baseline pod may add.
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// SELinux types a baseline pod may set.
pub const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Sysctls a baseline pod may set.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// What the namespace's labels enforce: `Some("baseline")` or `Some("restricted")` (checked at
/// baseline), `None` for `privileged` or no label.
pub fn enforced(namespace_labels: &BTreeMap<String, String>) -> Option<&str> {
    match namespace_labels.get(ENFORCE_LABEL).map(String::as_str) {
        Some(l @ ("baseline" | "restricted")) => Some(l),
        _ => None,
    }
}

/// Every baseline check `pod` fails, as the API server words them (`host namespaces
/// (hostNetwork=true)`); empty when it passes.
pub fn violations(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut host_ns = Vec::new();
    for (field, on) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            host_ns.push(format!("{field}=true"));
        }
    }
    if !host_ns.is_empty() {
        out.push(format!("host namespaces ({})", host_ns.join(", ")));
    }
    let containers = all_containers(spec);
    let named = |pick: &dyn Fn(&SecurityContext) -> bool| -> Vec<String> {
        containers
            .iter()
            .filter(|(_, sc)| sc.is_some_and(pick))
            .map(|(n, _)| format!("{n:?}"))
            .collect()
    };
    let privileged = named(&|sc| sc.privileged == Some(true));
    if !privileged.is_empty() {
        out.push(format!(
            "privileged (container{} {} must not set securityContext.privileged=true)",
            plural(&privileged),
            privileged.join(", ")
        ));
    }
    let mut added = Vec::new();
    for (name, sc) in &containers {
        let caps = sc
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.as_ref());
        let bad: Vec<&String> = caps
            .into_iter()
            .flatten()
            .filter(|c| !BASELINE_CAPABILITIES.contains(&c.as_str()))
            .collect();
        if !bad.is_empty() {
            added.push(format!(
                "{name:?} must not include {}",
                bad.iter()
                    .map(|c| format!("{c:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !added.is_empty() {
        out.push(format!(
            "non-default capabilities ({} in securityContext.capabilities.add)",
            added.join("; ")
        ));
    }
    let host_paths: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.host_path.is_some())
        .map(|v| format!("{:?}", v.name))
        .collect();
    if !host_paths.is_empty() {
        out.push(format!("hostPath volumes ({})", host_paths.join(", ")));
    }
    let ports: Vec<String> = all_ports(spec);
    if !ports.is_empty() {
        out.push(format!("hostPort ({})", ports.join(", ")));
    }
    let mut apparmor = Vec::new();
    for (k, v) in pod.metadata.annotations.iter().flatten() {
        if let Some(c) = k.strip_prefix(APPARMOR_ANNOTATION)
            && v != "runtime/default"
            && !v.starts_with("localhost/")
        {
            apparmor.push(format!("annotation {c:?}={v:?}"));
        }
    }
    let unconfined = |t: &str| t == "Unconfined";
    if let Some(p) = spec
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        && unconfined(&p.type_)
    {
        apparmor.push("pod".into());
    }
    for (name, sc) in &containers {
        if sc
            .and_then(|s| s.app_armor_profile.as_ref())
            .is_some_and(|p| unconfined(&p.type_))
        {
            apparmor.push(format!("container {name:?}"));
        }
    }
    if !apparmor.is_empty() {
        out.push(format!(
            "forbidden AppArmor profile ({})",
            apparmor.join(", ")
        ));
    }
    let mut selinux = Vec::new();
    let pod_se = spec
        .security_context
        .as_ref()
        .and_then(|s| s.se_linux_options.as_ref());
    let container_se = containers.iter().map(|(n, sc)| {
        (
            format!("container {n:?}"),
            sc.and_then(|s| s.se_linux_options.as_ref()),
        )
    });
    for (who, o) in std::iter::once(("pod".to_string(), pod_se)).chain(container_se) {
        let Some(o) = o else { continue };
        if let Some(t) = o.type_.as_deref().filter(|t| !t.is_empty())
            && !SELINUX_TYPES.contains(&t)
        {
            selinux.push(format!("{who} type {t:?}"));
        }
        if o.user.as_deref().is_some_and(|u| !u.is_empty()) {
            selinux.push(format!("{who} user"));
        }
        if o.role.as_deref().is_some_and(|r| !r.is_empty()) {
            selinux.push(format!("{who} role"));
        }
    }
    if !selinux.is_empty() {
        out.push(format!("seLinuxOptions ({})", selinux.join(", ")));
    }
    let proc_mount = named(&|sc| sc.proc_mount.as_deref().is_some_and(|m| m != "Default"));
    if !proc_mount.is_empty() {
        out.push(format!("procMount ({})", proc_mount.join(", ")));
    }
    let mut seccomp = Vec::new();
    if spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .is_some_and(|p| unconfined(&p.type_))
    {
        seccomp.push("pod".to_string());
    }
    for (name, sc) in &containers {
        if sc
            .and_then(|s| s.seccomp_profile.as_ref())
            .is_some_and(|p| unconfined(&p.type_))
        {
            seccomp.push(format!("container {name:?}"));
        }
    }
    if !seccomp.is_empty() {
        out.push(format!(
            "seccompProfile ({} must not set type to \"Unconfined\")",
            seccomp.join(", ")
        ));
    }
    let sysctls: Vec<&str> = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| s.name.as_str())
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .collect();
    if !sysctls.is_empty() {
        out.push(format!("forbidden sysctls ({})", sysctls.join(", ")));
    }
    let pod_host_process = spec
        .security_context
        .as_ref()
        .and_then(|s| s.windows_options.as_ref())
        .and_then(|w| w.host_process)
        == Some(true);
    let host_process = named(&|sc| {
        sc.windows_options
            .as_ref()
            .and_then(|w| w.host_process)
            .unwrap_or(false)
    });
    if pod_host_process || !host_process.is_empty() {
        out.push("hostProcess (Windows host process containers)".into());
    }
    out
}

/// Every container of the pod (init, app, ephemeral) by name, with its security context.
fn all_containers(spec: &PodSpec) -> Vec<(&str, Option<&SecurityContext>)> {
    let mut out: Vec<(&str, Option<&SecurityContext>)> = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        out.push((c.name.as_str(), c.security_context.as_ref()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        out.push((c.name.as_str(), c.security_context.as_ref()));
    }
    out
}

/// `"name": port` for every non-zero host port.
fn all_ports(spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        for p in c.ports.iter().flatten() {
            if let Some(h) = p.host_port.filter(|h| *h != 0) {
                out.push(format!("{:?}: {h}", c.name));
            }
        }
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        for p in c.ports.iter().flatten() {
            if let Some(h) = p.host_port.filter(|h| *h != 0) {
                out.push(format!("{:?}: {h}", c.name));
            }
        }
    }
    out
}

fn plural(v: &[String]) -> &'static str {
    if v.len() == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// Cases written for this model after the shape of upstream's pass/fail fixtures: a base pod
    /// that passes, and one change each.
    fn base() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {
                "initContainers": [{"name": "init", "image": "i"}],
                "containers": [{"name": "app", "image": "a"}]
            }
        })
    }

    fn with(change: impl FnOnce(&mut Value)) -> Pod {
        let mut p = base();
        change(&mut p);
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn the_base_pod_and_allowed_settings_pass() {
        let passing = [
            with(|_| {}),
            with(|p| p["spec"]["hostNetwork"] = json!(false)),
            with(|p| {
                p["spec"]["containers"][0]["securityContext"] = json!({
                    "privileged": false,
                    "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "appArmorProfile": {"type": "Localhost", "localhostProfile": "x"},
                    "seLinuxOptions": {"type": "container_init_t", "level": "s0:c1"},
                    "procMount": "Default"
                })
            }),
            with(
                |p| p["spec"]["securityContext"] = json!({"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]}),
            ),
            with(|p| {
                p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 0}])
            }),
            with(|p| {
                p["metadata"]["annotations"] =
                    json!({"container.apparmor.security.beta.kubernetes.io/app": "runtime/default"})
            }),
            with(|p| p["spec"]["volumes"] = json!([{"name": "v", "emptyDir": {}}])),
        ];
        for (i, pod) in passing.iter().enumerate() {
            assert_eq!(violations(pod), Vec::<String>::new(), "case {i}");
        }
    }

    #[test]
    fn each_baseline_check_fails_its_pod() {
        let failing: Vec<(Pod, &str)> = vec![
            (
                with(|p| p["spec"]["hostNetwork"] = json!(true)),
                "host namespaces (hostNetwork=true)",
            ),
            (with(|p| p["spec"]["hostPID"] = json!(true)), "hostPID=true"),
            (with(|p| p["spec"]["hostIPC"] = json!(true)), "hostIPC=true"),
            (
                with(|p| {
                    p["spec"]["initContainers"][0]["securityContext"] = json!({"privileged": true})
                }),
                "privileged (container \"init\"",
            ),
            (
                with(|p| {
                    p["spec"]["containers"][0]["securityContext"] =
                        json!({"capabilities": {"add": ["NET_ADMIN"]}})
                }),
                "\"app\" must not include \"NET_ADMIN\"",
            ),
            (
                with(|p| {
                    p["spec"]["containers"][0]["securityContext"] =
                        json!({"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}})
                }),
                "\"SYS_ADMIN\"",
            ),
            (
                with(|p| p["spec"]["volumes"] = json!([{"name": "h", "hostPath": {"path": "/"}}])),
                "hostPath volumes (\"h\")",
            ),
            (
                with(|p| {
                    p["spec"]["containers"][0]["ports"] =
                        json!([{"containerPort": 80, "hostPort": 8080}])
                }),
                "hostPort (\"app\": 8080)",
            ),
            (
                with(|p| {
                    p["metadata"]["annotations"] =
                        json!({"container.apparmor.security.beta.kubernetes.io/app": "unconfined"})
                }),
                "forbidden AppArmor profile",
            ),
            (
                with(|p| {
                    p["spec"]["securityContext"] =
                        json!({"appArmorProfile": {"type": "Unconfined"}})
                }),
                "forbidden AppArmor profile (pod)",
            ),
            (
                with(|p| {
                    p["spec"]["containers"][0]["securityContext"] =
                        json!({"seLinuxOptions": {"type": "spc_t"}})
                }),
                "seLinuxOptions (container \"app\" type \"spc_t\")",
            ),
            (
                with(|p| {
                    p["spec"]["securityContext"] = json!({"seLinuxOptions": {"user": "system_u"}})
                }),
                "seLinuxOptions (pod user)",
            ),
            (
                with(|p| {
                    p["spec"]["containers"][0]["securityContext"] = json!({"procMount": "Unmasked"})
                }),
                "procMount",
            ),
            (
                with(|p| {
                    p["spec"]["securityContext"] = json!({"seccompProfile": {"type": "Unconfined"}})
                }),
                "seccompProfile (pod",
            ),
            (
                with(|p| {
                    p["spec"]["securityContext"] = json!({"sysctls": [{"name": "net.ipv6.conf.all.disable_ipv6", "value": "1"}]})
                }),
                "forbidden sysctls (net.ipv6.conf.all.disable_ipv6)",
            ),
            (
                with(|p| {
                    p["spec"]["securityContext"] = json!({"windowsOptions": {"hostProcess": true}})
                }),
                "hostProcess",
            ),
        ];
        for (pod, want) in failing {
            let got = violations(&pod);
            assert!(
                got.iter().any(|v| v.contains(want)),
                "want {want:?}, got {got:?}"
            );
        }
    }

    #[test]
    fn only_baseline_and_restricted_namespaces_enforce() {
        let labels = |v: &str| BTreeMap::from([(ENFORCE_LABEL.to_string(), v.to_string())]);
        assert_eq!(enforced(&labels("baseline")), Some("baseline"));
        assert_eq!(enforced(&labels("restricted")), Some("restricted"));
        assert_eq!(enforced(&labels("privileged")), None);
        assert_eq!(enforced(&BTreeMap::new()), None);
    }
}
