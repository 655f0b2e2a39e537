//! The one pod-resources client: the kubelet's `List` answer reduced to the containers that hold
//! erdma's devices, through either resource API ([`Held`]: the device plugin's extended resource
//! in `devices`, a DRA driver's claimed devices in `dynamic_resources`), and
//! `GetAllocatableResources` reduced to the extended resource's device IDs. What a caller makes of
//! them (slots in use, the owner of a device, the live pods, foreign devices) is a pure function in
//! the caller's crate.

use super::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::v1::{
    AllocatableResourcesRequest, DEFAULT_SOCKET, ListPodResourcesRequest, ListPodResourcesResponse,
};
use crate::uds::{self, ClientAuthority};
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

/// How long connecting, and then the `List` call, may take each.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What counts as holding the devices: IDs of an extended resource (device plugin), and devices
/// a DRA driver prepared for a claim of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The extended resource (`aliyun/erdma`).
    pub resource: String,
    /// The DRA driver whose claimed devices count too (`erdma.alibabacloud.com`); `None` counts
    /// only the extended resource.
    pub dra_driver: Option<String>,
}

impl Held {
    /// Devices of the extended resource `resource`, and of DRA driver `dra_driver`.
    pub fn both(resource: &str, dra_driver: &str) -> Self {
        Held {
            resource: resource.to_string(),
            dra_driver: Some(dra_driver.to_string()),
        }
    }

    /// Devices of the extended resource `resource` only.
    pub fn resource(resource: &str) -> Self {
        Held {
            resource: resource.to_string(),
            dra_driver: None,
        }
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.dra_driver {
            Some(d) => write!(f, "{} (or a claim on DRA driver {d})", self.resource),
            None => f.write_str(&self.resource),
        }
    }
}

/// A device a DRA driver prepared for one of the container's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimedDevice {
    /// The claim's namespace.
    pub claim_namespace: String,
    /// The claim's name.
    pub claim_name: String,
    /// The pool the device belongs to (the node name, for erdma).
    pub pool: String,
    /// The device's name in the pool (`erdma-0`).
    pub device: String,
}

/// A container that holds devices, through the device plugin, a DRA claim, or both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Device IDs of the extended resource it holds (slot IDs with erdma's device plugin).
    pub device_ids: Vec<String>,
    /// Devices it holds through DRA claims.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<ClaimedDevice>,
}

impl Holder {
    /// A holder of extended-resource devices only.
    pub fn of_ids(namespace: &str, pod: &str, container: &str, device_ids: Vec<String>) -> Self {
        Holder {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container: container.to_string(),
            device_ids,
            claimed: Vec::new(),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} (container {}",
            self.namespace, self.pod, self.container
        )?;
        let mut claims: Vec<String> = self
            .claimed
            .iter()
            .map(|c| format!("{}/{}", c.claim_namespace, c.claim_name))
            .collect();
        claims.dedup();
        if !claims.is_empty() {
            write!(f, ", claim {}", claims.join(", "))?;
        }
        f.write_str(")")
    }
}

/// The kubelet did not answer `List`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// The socket could not be reached.
    #[error("cannot connect to the kubelet pod-resources API at {}: {detail}", socket.display())]
    Connect {
        /// The pod-resources socket.
        socket: PathBuf,
        /// Why.
        detail: String,
    },
    /// The call failed or timed out.
    #[error("pod-resources {call} on {}: {detail}", socket.display())]
    Call {
        /// The RPC (`List`, `GetAllocatableResources`).
        call: &'static str,
        /// The pod-resources socket.
        socket: PathBuf,
        /// The gRPC status, or the timeout.
        detail: String,
    },
}

/// A client of the kubelet's pod-resources socket. It keeps its connection between calls (and
/// clones share it), so a caller that asks periodically should keep one client: a call on a
/// connection the kubelet has closed (a kubelet restart) is made once more on a new one.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    socket: PathBuf,
    channel: Arc<Mutex<Option<Channel>>>,
}

impl Default for PodResourcesClient {
    fn default() -> Self {
        Self::new(Path::new(DEFAULT_SOCKET))
    }
}

impl PodResourcesClient {
    /// A client of the pod-resources socket at `socket` (default [`DEFAULT_SOCKET`]).
    pub fn new(socket: &Path) -> Self {
        PodResourcesClient {
            socket: socket.to_path_buf(),
            channel: Arc::default(),
        }
    }

    /// The socket asked.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The containers that hold devices of `held` now (one `List` call, [`TIMEOUT`] each for
    /// connecting and for the answer).
    pub async fn list(&self, held: &Held) -> Result<Vec<Holder>, ListError> {
        let resp = self
            .call("List", |mut c| async move {
                c.list(ListPodResourcesRequest {}).await
            })
            .await?;
        Ok(holders_in(&resp, held))
    }

    /// The device IDs of `resource` the kubelet holds (`GetAllocatableResources`): the device
    /// list of whichever plugin fed the kubelet last.
    pub async fn allocatable(&self, resource: &str) -> Result<Vec<String>, ListError> {
        let resp = self
            .call("GetAllocatableResources", |mut c| async move {
                c.get_allocatable_resources(AllocatableResourcesRequest {})
                    .await
            })
            .await?;
        Ok(resp
            .devices
            .into_iter()
            .filter(|d| d.resource_name == resource)
            .flat_map(|d| d.device_ids)
            .collect())
    }

    /// Makes `call` on the kept connection, or on a new one when there is none or the kept one
    /// failed at the transport (the kubelet restarted since): at most one call per connection.
    async fn call<T, F, Fut>(&self, name: &'static str, call: F) -> Result<T, ListError>
    where
        F: Fn(PodResourcesListerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // Bound first: the guard must not live across the call.
        let kept = self.kept().clone();
        if let Some(channel) = kept {
            match self
                .answer(name, call(PodResourcesListerClient::new(channel)))
                .await
            {
                Err(Failure::Status(code, _)) if transport_failure(code) => {
                    *self.kept() = None;
                }
                answer => {
                    if !connection_works(&answer) {
                        *self.kept() = None;
                    }
                    return answer.map_err(Failure::into_error);
                }
            }
        }
        let channel = self.connect().await?;
        let answer = self
            .answer(name, call(PodResourcesListerClient::new(channel.clone())))
            .await;
        *self.kept() = connection_works(&answer).then_some(channel);
        answer.map_err(Failure::into_error)
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Option<Channel>> {
        self.channel.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn connect(&self) -> Result<Channel, ListError> {
        // A missing socket (no kubelet here, or not mounted) needs no connection attempt.
        if !self.socket.exists() {
            return Err(ListError::Connect {
                socket: self.socket.clone(),
                detail: "no such socket".into(),
            });
        }
        uds::connect(&self.socket, ClientAuthority::Localhost, TIMEOUT)
            .await
            .map_err(|e| ListError::Connect {
                socket: self.socket.clone(),
                detail: e.to_string(),
            })
    }

    async fn answer<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Failure> {
        let error = |detail: String| ListError::Call {
            call,
            socket: self.socket.clone(),
            detail,
        };
        match tokio::time::timeout(TIMEOUT, fut).await {
            Err(_) => Err(Failure::Timeout(error(format!(
                "no answer within {TIMEOUT:?}"
            )))),
            Ok(Err(s)) => Err(Failure::Status(
                s.code(),
                error(format!("{}: {}", s.code(), s.message())),
            )),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }
}

/// How a call on a connection failed.
enum Failure {
    /// An error status, with its code.
    Status(tonic::Code, ListError),
    /// No answer in time.
    Timeout(ListError),
}

impl Failure {
    fn into_error(self) -> ListError {
        match self {
            Failure::Status(_, e) | Failure::Timeout(e) => e,
        }
    }
}

/// Whether the connection a call went over still works after `answer`: it gave an answer, or an
/// error status the kubelet sent.
fn connection_works<T>(answer: &Result<T, Failure>) -> bool {
    match answer {
        Ok(_) => true,
        Err(Failure::Status(code, _)) => !transport_failure(*code),
        Err(Failure::Timeout(_)) => false,
    }
}

/// Codes tonic gives a call whose connection broke (not an answer of the kubelet's).
fn transport_failure(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// The containers in a `List` answer that hold devices of `held`: the extended resource's device
/// IDs from `devices`, the DRA driver's devices from `dynamic_resources` (kubelets list a claim's
/// devices under every container that references the claim).
pub fn holders_in(resp: &ListPodResourcesResponse, held: &Held) -> Vec<Holder> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            let device_ids: Vec<String> = c
                .devices
                .iter()
                .filter(|d| d.resource_name == held.resource)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            let claimed: Vec<ClaimedDevice> = match &held.dra_driver {
                None => Vec::new(),
                Some(driver) => c
                    .dynamic_resources
                    .iter()
                    .flat_map(|claim| {
                        claim
                            .claim_resources
                            .iter()
                            .filter(|r| &r.driver_name == driver && !r.device_name.is_empty())
                            .map(|r| ClaimedDevice {
                                claim_namespace: claim.claim_namespace.clone(),
                                claim_name: claim.claim_name.clone(),
                                pool: r.pool_name.clone(),
                                device: r.device_name.clone(),
                            })
                    })
                    .collect(),
            };
            if !device_ids.is_empty() || !claimed.is_empty() {
                out.push(Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    device_ids,
                    claimed,
                });
            }
        }
    }
    out
}
