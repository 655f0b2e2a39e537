//! The container runtime (CRI `runtime.v1`) calls erdma needs, among them a pod's sandbox for the
//! device plugin's `PreStartContainer` (the pod itself comes from who holds the devices:
//! `erdma_kubelet::podresources::Snapshot::holding`).
//!
//! - [`runtime::v1`]: the generated messages, client and server of the few CRI calls used
//!   (`Version`, `ListPodSandbox`, `PodSandboxStatus`, the lifecycle calls of [`lifecycle`] and
//!   `ImageService.ImageStatus`), from `proto/runtime/v1/api.proto`,
//!   checked in under `src/gen/` (the test `generated_code_is_fresh` keeps it in step).
//! - [`CriClient`]: a client over the runtime's Unix socket that finds a pod's sandbox and reads
//!   its network namespace, host-network flag and annotations ([`SandboxInfo`],
//!   [`CriClient::pod_sandbox`]).
//! - [`lifecycle`]: running sandboxes and containers as the kubelet does (the lab's kubelet).
//! - [`image`]: whether an image is in the runtime's store (`ImageService.ImageStatus`), as the
//!   kubelet asks before it creates a container.

mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod image;
pub mod lifecycle;

pub use error::CriError;

use erdma_kubelet::uds::{self, ClientAuthority};
use runtime::v1 as cri;
use runtime::v1::image_service_client::ImageServiceClient;
use runtime::v1::runtime_service_client::RuntimeServiceClient;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

/// CRI `runtime.v1`.
pub mod runtime {
    /// `package runtime.v1` (`k8s.io/cri-api/pkg/apis/runtime/v1`), the subset erdma uses.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        include!("gen/runtime_v1.rs");
    }
}

/// Runtime sockets tried in order when none is configured (containerd, k3s, CRI-O,
/// cri-dockerd), relative to the host root.
pub const DEFAULT_SOCKETS: &[&str] = &[
    "/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/var/run/cri-dockerd.sock",
];

/// Sandbox label with the pod name (set by the kubelet).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Sandbox label with the pod namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Sandbox label with the pod UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";

/// How long one CRI call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What erdma needs to know about a pod's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// Sandbox id.
    pub id: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The pod uses the node's network namespace.
    pub host_network: bool,
    /// Path of the network namespace as seen from the host (`None` for host-network pods).
    pub netns: Option<PathBuf>,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
}

impl SandboxInfo {
    /// `namespace/name`.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A pod as the runtime's sandbox metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// Pod UID.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
}

/// The runtime socket: `explicit` if given (it must exist), else the first of
/// [`DEFAULT_SOCKETS`] under `host_root` that exists.
pub fn find_socket(explicit: Option<&Path>, host_root: &Path) -> Result<PathBuf, CriError> {
    let candidates: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_path_buf()],
        None => DEFAULT_SOCKETS
            .iter()
            .map(|s| host_root.join(s.trim_start_matches('/')))
            .collect(),
    };
    candidates
        .iter()
        .find(|p| uds::is_socket(p))
        .cloned()
        .ok_or_else(|| CriError::SocketMissing {
            tried: candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The network namespace path from a verbose `PodSandboxStatus` `info` map: the OCI runtime
/// spec's network namespace path (containerd, CRI-O), else `/proc/<pid>/ns/net` of the sandbox
/// process under `proc_root`. Malformed JSON is ignored (`None`).
pub fn netns_from_info(info: &BTreeMap<String, String>, proc_root: &Path) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    let spec_path = v
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(|n| n.as_array())
        .and_then(|list| {
            list.iter()
                .find(|n| n.get("type").and_then(|t| t.as_str()) == Some("network"))
        })
        .and_then(|n| n.get("path"))
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty());
    if let Some(p) = spec_path {
        return Some(PathBuf::from(p));
    }
    let pid = v.get("pid").and_then(|p| p.as_u64()).filter(|&p| p > 0)?;
    Some(proc_root.join(pid.to_string()).join("ns/net"))
}

/// A CRI client on a runtime's Unix socket.
#[derive(Debug, Clone)]
pub struct CriClient {
    client: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    socket: PathBuf,
    proc_root: PathBuf,
}

impl CriClient {
    /// Connects to `socket`. `proc_root` is the host's `/proc` as mounted in this process
    /// (used when the runtime reports only the sandbox pid).
    pub async fn connect(socket: &Path, proc_root: &Path) -> Result<Self, CriError> {
        let ch = uds::connect(socket, ClientAuthority::Localhost, Duration::from_secs(2))
            .await
            .map_err(|e| CriError::Connect {
                what: "container runtime",
                path: socket.to_path_buf(),
                detail: e.to_string(),
            })?;
        Ok(CriClient {
            images: ImageServiceClient::new(ch.clone()),
            client: RuntimeServiceClient::new(ch),
            socket: socket.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
        })
    }

    fn call_err(&self, call: &'static str, detail: String) -> CriError {
        CriError::Call {
            call,
            path: self.socket.clone(),
            detail,
        }
    }

    /// `Version`: `(runtime name, runtime version)`.
    pub async fn version(&mut self) -> Result<(String, String), CriError> {
        let fut = self.client.version(cri::VersionRequest {
            version: "v1".into(),
        });
        let r = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| self.call_err("Version", "timed out".into()))?
            .map_err(|s| self.call_err("Version", s.to_string()))?
            .into_inner();
        Ok((r.runtime_name, r.runtime_version))
    }

    /// The newest ready sandbox of pod `namespace/name`.
    pub async fn find_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<cri::PodSandbox, CriError> {
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_POD_NAMESPACE.to_string(), namespace.to_string());
        labels.insert(LABEL_POD_NAME.to_string(), name.to_string());
        let req = cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                id: String::new(),
                state: Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxReady as i32,
                }),
                label_selector: labels,
            }),
        };
        let fut = self.client.list_pod_sandbox(req);
        let items = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| self.call_err("ListPodSandbox", "timed out".into()))?
            .map_err(|s| self.call_err("ListPodSandbox", s.to_string()))?
            .into_inner()
            .items;
        // Runtimes may ignore the filter: check the pod identity and state ourselves.
        items
            .into_iter()
            .filter(|s| {
                s.state == cri::PodSandboxState::SandboxReady as i32
                    && s.metadata
                        .as_ref()
                        .is_some_and(|m| m.namespace == namespace && m.name == name)
            })
            .max_by_key(|s| s.created_at)
            .ok_or_else(|| {
                CriError::NotFound(format!(
                    "pod {namespace}/{name} has no ready sandbox in the runtime at {}",
                    self.socket.display()
                ))
            })
    }

    /// Every sandbox's pod (`ListPodSandbox` without a filter; ready or not): UID, namespace and
    /// name, one entry per UID (a pod's sandboxes share it), sorted by UID. What maps the pod UID
    /// of a cgroup path to the pod's name.
    pub async fn pods(&mut self) -> Result<Vec<PodIdentity>, CriError> {
        let fut = self
            .client
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None });
        let items = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| self.call_err("ListPodSandbox", "timed out".into()))?
            .map_err(|s| self.call_err("ListPodSandbox", s.to_string()))?
            .into_inner()
            .items;
        let by_uid: BTreeMap<String, PodIdentity> = items
            .into_iter()
            .filter_map(|s| s.metadata)
            .filter(|m| !m.uid.is_empty())
            .map(|m| {
                (
                    m.uid.clone(),
                    PodIdentity {
                        uid: m.uid,
                        namespace: m.namespace,
                        name: m.name,
                    },
                )
            })
            .collect();
        Ok(by_uid.into_values().collect())
    }

    /// The newest ready sandbox of pod `namespace/name`, with its network namespace, host-network
    /// flag and annotations ([`Self::find_sandbox`], then [`Self::sandbox`]).
    pub async fn pod_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<SandboxInfo, CriError> {
        let sandbox = self.find_sandbox(namespace, name).await?;
        self.sandbox(&sandbox.id).await
    }

    /// Verbose status of sandbox `id`: host-network flag, netns path, annotations.
    pub async fn sandbox(&mut self, id: &str) -> Result<SandboxInfo, CriError> {
        let fut = self
            .client
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            });
        let r = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .map_err(|_| self.call_err("PodSandboxStatus", "timed out".into()))?
            .map_err(|s| self.call_err("PodSandboxStatus", s.to_string()))?
            .into_inner();
        let status = r.status.ok_or_else(|| {
            CriError::NotFound(format!("sandbox {id}: the runtime returned no status"))
        })?;
        let meta = status.metadata.unwrap_or_default();
        let host_network = status
            .linux
            .and_then(|l| l.namespaces)
            .and_then(|n| n.options)
            .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
        let mut info = SandboxInfo {
            id: status.id,
            namespace: meta.namespace,
            name: meta.name,
            uid: meta.uid,
            host_network,
            netns: None,
            annotations: status.annotations,
        };
        if !host_network {
            info.netns = Some(netns_from_info(&r.info, &self.proc_root).ok_or_else(|| {
                CriError::NoNetns {
                    id: id.to_string(),
                    pod: info.pod(),
                }
            })?);
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(json: &str) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("info".to_string(), json.to_string());
        m
    }

    #[test]
    fn netns_from_containerd_and_crio_info() {
        let proc_root = Path::new("/host/proc");
        // containerd: runtimeSpec with the CNI netns path, plus the pid.
        let c = r#"{"pid": 4242, "runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1234"}]}}}"#;
        assert_eq!(
            netns_from_info(&info(c), proc_root),
            Some(PathBuf::from("/var/run/netns/cni-1234"))
        );
        // Only a pid: /proc/<pid>/ns/net under the host proc.
        assert_eq!(
            netns_from_info(&info(r#"{"pid": 77}"#), proc_root),
            Some(PathBuf::from("/host/proc/77/ns/net"))
        );
        // Network namespace without a path (new namespace, path unknown) and pid 0: none.
        let n = r#"{"pid": 0, "runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}}"#;
        assert_eq!(netns_from_info(&info(n), proc_root), None);
        assert_eq!(netns_from_info(&info("not json"), proc_root), None);
        assert_eq!(netns_from_info(&BTreeMap::new(), proc_root), None);
    }

    #[test]
    fn socket_discovery() {
        let d = tempfile::tempdir().unwrap();
        let e = find_socket(None, d.path()).unwrap_err().to_string();
        assert!(
            e.contains("containerd.sock") && e.contains("crio.sock") && e.contains("Fix"),
            "{e}"
        );
        let sock = d.path().join("run/k3s/containerd/containerd.sock");
        std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(find_socket(None, d.path()).unwrap(), sock);
        // A regular file is not a socket.
        let f = d.path().join("plain");
        std::fs::write(&f, "").unwrap();
        assert!(find_socket(Some(&f), d.path()).is_err());
    }
}
