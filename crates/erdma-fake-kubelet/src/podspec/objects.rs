//! What the kubelet reads from the API server for a pod, read before the pod is planned
//! ([`ApiObjects`]: the ConfigMaps and Secrets its spec references, the Services of its
//! namespace, the `kubernetes` service, its service account's token), and what the kubelet
//! makes of it: a volume's payload (`MakePayload` of the configMap and secret volume plugins:
//! all keys, or the `items` with their paths and modes, `optional` sources that are missing
//! giving nothing) and the service environment variables (`envvars.FromServices`).

use super::atomic::{self, FileProjection};
use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, PodSpec, Secret, Service};
use std::collections::{BTreeMap, BTreeSet};

/// What the kubelet read from the API server for one pod.
#[derive(Debug, Clone)]
pub struct ApiObjects {
    /// ConfigMaps of the pod's namespace by name (`None`: not found).
    pub config_maps: BTreeMap<String, Option<ConfigMap>>,
    /// Secrets of the pod's namespace by name (`None`: not found).
    pub secrets: BTreeMap<String, Option<Secret>>,
    /// The Services of the pod's namespace (for `enableServiceLinks`).
    pub services: Vec<Service>,
    /// The API server as the `kubernetes` service gives it to pods: host and port.
    pub master: Option<(String, u16)>,
    /// The token of the pod's service account, or why there is none.
    pub token: Result<String, String>,
    /// What was done before planning (the ServiceAccount admission), for the record.
    pub notes: BTreeMap<String, String>,
}

impl Default for ApiObjects {
    fn default() -> Self {
        ApiObjects {
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            services: Vec::new(),
            master: None,
            token: Err("no token was read".into()),
            notes: BTreeMap::new(),
        }
    }
}

/// The ConfigMaps and Secrets `spec` references, in volumes, projected volumes, env and envFrom
/// of every container: `(config maps, secrets)`.
pub fn references(spec: &PodSpec) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut cms = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            cms.insert(c.name.clone());
        }
        if let Some(s) = &v.secret
            && let Some(n) = &s.secret_name
        {
            secrets.insert(n.clone());
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &p.config_map {
                cms.insert(c.name.clone());
            }
            if let Some(s) = &p.secret {
                secrets.insert(s.name.clone());
            }
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    cms.insert(r.name.clone());
                }
                if let Some(r) = &from.secret_key_ref {
                    secrets.insert(r.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    cms.retain(|n| !n.is_empty());
    secrets.retain(|n| !n.is_empty());
    (cms, secrets)
}

/// A ConfigMap's keys and contents as files: `data` and `binaryData`.
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.entry(k.clone()).or_insert_with(|| v.0.clone());
    }
    out
}

/// A Secret's keys and contents.
pub fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// The files of a configMap or secret source (`MakePayload`): every key with `default_mode`,
/// or the `items` (key to path, their own mode or `default_mode`); a key an item names that the
/// object lacks is an error unless the source is `optional`. `what` is `configmap` or `secret`
/// for the kubelet's message.
pub fn payload(
    what: &str,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<BTreeMap<String, FileProjection>, String> {
    let mut out = BTreeMap::new();
    let file = |data: &[u8], mode: u32| FileProjection {
        data: data.to_vec(),
        mode,
        fs_user: None,
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                atomic::check_path(k)?;
                out.insert(k.clone(), file(v, default_mode));
            }
        }
        Some(items) => {
            for it in items {
                let Some(v) = data.get(&it.key) else {
                    if optional {
                        continue;
                    }
                    let kind = if what == "secret" { "secret" } else { "config" };
                    return Err(format!(
                        "{what} references non-existent {kind} key: {}",
                        it.key
                    ));
                };
                atomic::check_path(&it.path)?;
                let mode = match it.mode {
                    Some(m) => mode_of(m)?,
                    None => default_mode,
                };
                out.insert(it.path.clone(), file(v, mode));
            }
        }
    }
    Ok(out)
}

/// A file mode from the API (`defaultMode`, `mode`): 0 to 0777, as the API server validates.
pub fn mode_of(m: i32) -> Result<u32, String> {
    u32::try_from(m)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("mode {m} must be between 0 and 0777 (511)"))
}

/// `makeEnvVariableName`: upper case, `-` and `.` as `_`, a leading digit prefixed with `_`.
fn env_name(s: &str) -> String {
    let n = s.replace(['-', '.'], "_").to_uppercase();
    if n.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{n}")
    } else {
        n
    }
}

/// `host:port`, brackets around an IPv6 host.
fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether a service has a cluster IP (`IsServiceIPSet`: set and not `None`).
fn has_cluster_ip(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The environment variables of the services a pod in `namespace` sees (`getServiceEnvVarMap`
/// and `envvars.FromServices`): the `kubernetes` service (`master`: the lab's API server, a
/// service with port `https`) always, and with `links` (`enableServiceLinks`, true by default)
/// every service of the namespace with a cluster IP; sorted by name.
pub fn service_env(
    services: &[Service],
    master: Option<(&str, u16)>,
    namespace: &str,
    links: bool,
) -> Vec<(String, String)> {
    // (name, cluster IP, ports as (name, port, protocol))
    type Ports = Vec<(String, i32, String)>;
    let mut by_name: BTreeMap<String, (String, Ports)> = BTreeMap::new();
    if let Some((host, port)) = master {
        by_name.insert(
            "kubernetes".into(),
            (
                host.to_string(),
                vec![("https".into(), i32::from(port), "TCP".into())],
            ),
        );
    }
    if links {
        for s in services.iter().filter(|s| has_cluster_ip(s)) {
            if s.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| n != namespace)
            {
                continue;
            }
            let Some(spec) = &s.spec else { continue };
            let ports: Ports = spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port,
                        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    )
                })
                .collect();
            if ports.is_empty() {
                continue;
            }
            by_name.insert(
                s.metadata.name.clone().unwrap_or_default(),
                (spec.cluster_ip.clone().unwrap_or_default(), ports),
            );
        }
    }
    let mut out = BTreeMap::new();
    for (name, (ip, ports)) in by_name {
        let prefix = env_name(&name);
        out.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        out.insert(format!("{prefix}_SERVICE_PORT"), ports[0].1.to_string());
        for (pname, port, _) in &ports {
            if !pname.is_empty() {
                out.insert(
                    format!("{prefix}_SERVICE_PORT_{}", env_name(pname)),
                    port.to_string(),
                );
            }
        }
        for (i, (_, port, proto)) in ports.iter().enumerate() {
            let lower = proto.to_lowercase();
            let url = format!("{lower}://{}", join_host_port(&ip, *port));
            if i == 0 {
                out.insert(format!("{prefix}_PORT"), url.clone());
            }
            let p = format!("{prefix}_PORT_{port}_{}", proto.to_uppercase());
            out.insert(p.clone(), url);
            out.insert(format!("{p}_PROTO"), lower);
            out.insert(format!("{p}_PORT"), port.to_string());
            out.insert(format!("{p}_ADDR"), ip.clone());
        }
    }
    out.into_iter().collect()
}

/// The downward API's file for a map (`metadata.labels`, `metadata.annotations`): one
/// `key="value"` line per entry, sorted by key (values quoted as Go's `%q` does for printable
/// text: `"` and `\` escaped, control characters as escapes).
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(name: &str, ns: &str, ip: Option<&str>, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: ip.map(str::to_string),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: (!n.is_empty()).then(|| n.to_string()),
                            port: *p,
                            protocol: (!proto.is_empty()).then(|| proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_kubelets_service_variables() {
        let services = [
            svc(
                "metrics-api",
                "lab",
                Some("10.96.0.10"),
                &[("http", 8080, ""), ("", 9090, "UDP")],
            ),
            svc("headless", "lab", Some("None"), &[("x", 1, "")]),
            svc("no-ip", "lab", None, &[("x", 2, "")]),
            svc("elsewhere", "other", Some("10.96.0.11"), &[("x", 3, "")]),
            svc("9lives", "lab", Some("10.96.0.12"), &[("", 80, "")]),
        ];
        assert_eq!(
            service_env(&services, Some(("10.77.0.1", 6443)), "lab", true),
            env(&[
                ("KUBERNETES_SERVICE_HOST", "10.77.0.1"),
                ("KUBERNETES_SERVICE_PORT", "6443"),
                ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
                ("KUBERNETES_PORT", "tcp://10.77.0.1:6443"),
                ("KUBERNETES_PORT_6443_TCP", "tcp://10.77.0.1:6443"),
                ("KUBERNETES_PORT_6443_TCP_PROTO", "tcp"),
                ("KUBERNETES_PORT_6443_TCP_PORT", "6443"),
                ("KUBERNETES_PORT_6443_TCP_ADDR", "10.77.0.1"),
                ("METRICS_API_SERVICE_HOST", "10.96.0.10"),
                ("METRICS_API_SERVICE_PORT", "8080"),
                ("METRICS_API_SERVICE_PORT_HTTP", "8080"),
                ("METRICS_API_PORT", "tcp://10.96.0.10:8080"),
                ("METRICS_API_PORT_8080_TCP", "tcp://10.96.0.10:8080"),
                ("METRICS_API_PORT_8080_TCP_PROTO", "tcp"),
                ("METRICS_API_PORT_8080_TCP_PORT", "8080"),
                ("METRICS_API_PORT_8080_TCP_ADDR", "10.96.0.10"),
                ("METRICS_API_PORT_9090_UDP", "udp://10.96.0.10:9090"),
                ("METRICS_API_PORT_9090_UDP_PROTO", "udp"),
                ("METRICS_API_PORT_9090_UDP_PORT", "9090"),
                ("METRICS_API_PORT_9090_UDP_ADDR", "10.96.0.10"),
                ("_9LIVES_SERVICE_HOST", "10.96.0.12"),
                ("_9LIVES_SERVICE_PORT", "80"),
                ("_9LIVES_PORT", "tcp://10.96.0.12:80"),
                ("_9LIVES_PORT_80_TCP", "tcp://10.96.0.12:80"),
                ("_9LIVES_PORT_80_TCP_PROTO", "tcp"),
                ("_9LIVES_PORT_80_TCP_PORT", "80"),
                ("_9LIVES_PORT_80_TCP_ADDR", "10.96.0.12"),
            ])
        );
        // enableServiceLinks: false keeps only the kubernetes service.
        let only = service_env(&services, Some(("fd00::1", 443)), "lab", false);
        assert_eq!(only.len(), 8);
        assert!(only.contains(&("KUBERNETES_PORT".into(), "tcp://[fd00::1]:443".into())));
    }

    #[test]
    fn payloads_as_make_payload_builds_them() {
        let data = BTreeMap::from([
            ("a.conf".to_string(), b"x=1\n".to_vec()),
            ("b".to_string(), b"bee".to_vec()),
        ]);
        let all = payload("configmap", &data, None, 0o644, false).unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a.conf", "b"]);
        assert_eq!(all["b"].mode, 0o644);
        let items = [
            KeyToPath {
                key: "a.conf".into(),
                path: "conf/a.conf".into(),
                mode: Some(0o600),
            },
            KeyToPath {
                key: "b".into(),
                path: "b.txt".into(),
                mode: None,
            },
        ];
        let some = payload("configmap", &data, Some(&items), 0o440, false).unwrap();
        assert_eq!(some.keys().collect::<Vec<_>>(), ["b.txt", "conf/a.conf"]);
        assert_eq!(
            (some["conf/a.conf"].mode, some["b.txt"].mode),
            (0o600, 0o440)
        );
        assert_eq!(some["conf/a.conf"].data, b"x=1\n");
        let missing = [KeyToPath {
            key: "zzz".into(),
            path: "z".into(),
            mode: None,
        }];
        assert_eq!(
            payload("configmap", &data, Some(&missing), 0o644, false),
            Err("configmap references non-existent config key: zzz".into())
        );
        assert_eq!(
            payload("secret", &data, Some(&missing), 0o644, false),
            Err("secret references non-existent secret key: zzz".into())
        );
        assert!(
            payload("secret", &data, Some(&missing), 0o644, true)
                .unwrap()
                .is_empty()
        );
        let bad = [KeyToPath {
            key: "b".into(),
            path: "../b".into(),
            mode: None,
        }];
        assert!(payload("configmap", &data, Some(&bad), 0o644, false).is_err());
        assert_eq!(mode_of(0o777), Ok(0o777));
        assert!(mode_of(0o1000).is_err() && mode_of(-1).is_err());
    }

    #[test]
    fn downward_api_maps() {
        let m = BTreeMap::from([
            ("b".to_string(), "two words".to_string()),
            ("a".to_string(), "say \"hi\"\n".to_string()),
        ]);
        assert_eq!(format_map(&m), "a=\"say \\\"hi\\\"\\n\"\nb=\"two words\"");
    }
}
