//! The one pod-resources client: the kubelet's `List` answer reduced to the containers that hold
//! devices of one resource, and `GetAllocatableResources` reduced to that resource's device IDs.
//! What a caller makes of them (slots in use, the owner of a device, the live pods, foreign
//! devices) is a pure function in the caller's crate.

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

/// A container that has devices of a resource allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Device IDs of the resource it holds (never empty).
    pub device_ids: Vec<String>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} (container {})",
            self.namespace, self.pod, self.container
        )
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

    /// The containers that hold devices of `resource` now (one `List` call, [`TIMEOUT`] each
    /// for connecting and for the answer).
    pub async fn list(&self, resource: &str) -> Result<Vec<Holder>, ListError> {
        let resp = self
            .call("List", |mut c| async move {
                c.list(ListPodResourcesRequest {}).await
            })
            .await?;
        Ok(holders_in(&resp, resource))
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

/// The containers in a `List` answer that have devices of `resource`.
pub fn holders_in(resp: &ListPodResourcesResponse, resource: &str) -> Vec<Holder> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            let device_ids: Vec<String> = c
                .devices
                .iter()
                .filter(|d| d.resource_name == resource)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            if !device_ids.is_empty() {
                out.push(Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    device_ids,
                });
            }
        }
    }
    out
}
