//! A runtime stand-in (feature `fake`): listens on an NRI socket and drives a connected plugin the
//! way containerd 1.7 does (accept, wait for `RegisterPlugin`, `Configure`, `Synchronize`, then pod
//! and container events, each a ttRPC call on the plugin's connection). The real runtime checks the
//! same plugin in the lab (containerd with NRI enabled).

use crate::api::{self, Event};
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Answer, BoxFuture, Client, RpcError, Service, code};
use prost::Message as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::mpsc;

/// Listens for plugins.
pub struct FakeRuntime {
    listener: UnixListener,
}

/// One connected plugin.
pub struct Session {
    client: Client,
    registrations: mpsc::UnboundedReceiver<api::RegisterPluginRequest>,
    /// Subscribed events, after [`Session::configure`].
    pub events: i32,
    /// Timeout of each call to the plugin.
    pub timeout: Duration,
    /// Whether `Configure` tells the plugin that timeout (containerd 1.7 sends none).
    pub announce_timeout: bool,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Session {
    /// Closes the connection, as a runtime that goes away.
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct RuntimeService {
    registrations: mpsc::UnboundedSender<api::RegisterPluginRequest>,
}

impl Service for RuntimeService {
    fn call<'a>(
        &'a self,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            match (service, method) {
                (api::RUNTIME_SERVICE, "RegisterPlugin") => {
                    let req = api::RegisterPluginRequest::decode(body.as_slice())
                        .map_err(|e| (code::INTERNAL, e.to_string()))?;
                    if req.plugin_idx.len() != 2 {
                        return Err((
                            code::UNKNOWN,
                            format!("invalid plugin index {:?}", req.plugin_idx),
                        ));
                    }
                    let _ = self.registrations.send(req);
                    Ok(api::Empty {}.encode_to_vec())
                }
                _ => Err((code::UNIMPLEMENTED, format!("{service}/{method}"))),
            }
        })
    }
}

impl FakeRuntime {
    /// Listens on `path`.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        Ok(FakeRuntime {
            listener: UnixListener::bind(path)?,
        })
    }

    /// Accepts the next plugin connection.
    pub async fn accept(&self) -> std::io::Result<Session> {
        let (stream, _) = self.listener.accept().await?;
        let mut mux = Mux::new(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
        let mux_task = mux.start();
        let (tx, rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(ttrpc::serve(
            runtime_conn,
            Arc::new(RuntimeService { registrations: tx }),
        ));
        let (client, reader) = Client::new(plugin_conn);
        Ok(Session {
            client,
            registrations: rx,
            events: 0,
            timeout: Duration::from_secs(2),
            announce_timeout: true,
            tasks: vec![
                mux_task.abort_handle(),
                server.abort_handle(),
                reader.abort_handle(),
            ],
        })
    }
}

impl Session {
    /// Waits for the plugin's `RegisterPlugin`.
    pub async fn registration(&mut self) -> Option<api::RegisterPluginRequest> {
        self.registrations.recv().await
    }

    async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
    ) -> Result<Resp, RpcError> {
        let body = self
            .client
            .call(
                api::PLUGIN_SERVICE,
                method,
                req.encode_to_vec(),
                self.timeout,
            )
            .await?;
        Resp::decode(body.as_slice()).map_err(|e| RpcError::Protocol(e.to_string()))
    }

    /// `Configure`; remembers the subscribed events.
    pub async fn configure(&mut self) -> Result<i32, RpcError> {
        let r: api::ConfigureResponse = self
            .call(
                "Configure",
                &api::ConfigureRequest {
                    config: String::new(),
                    runtime_name: "erdma-fake-runtime".into(),
                    runtime_version: "0".into(),
                    registration_timeout: 5_000_000_000,
                    request_timeout: if self.announce_timeout {
                        i64::try_from(self.timeout.as_nanos()).unwrap_or(i64::MAX)
                    } else {
                        0
                    },
                },
            )
            .await?;
        self.events = r.events;
        Ok(r.events)
    }

    /// `Synchronize` with existing pods and containers.
    pub async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<api::SynchronizeResponse, RpcError> {
        self.call(
            "Synchronize",
            &api::SynchronizeRequest {
                pods,
                containers,
                more: false,
            },
        )
        .await
    }

    /// A pod or container event, sent only when subscribed (as the runtime does); `Ok(false)`
    /// when not subscribed.
    pub async fn state_change(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<bool, RpcError> {
        if !api::subscribed(self.events, event) {
            return Ok(false);
        }
        let _: api::Empty = self
            .call(
                "StateChange",
                &api::StateChangeEvent {
                    event: event as i32,
                    pod: Some(pod.clone()),
                    container: container.cloned(),
                },
            )
            .await?;
        Ok(true)
    }

    /// `CreateContainer` (only when subscribed; else no adjustment).
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<api::CreateContainerResponse, RpcError> {
        if !api::subscribed(self.events, Event::CreateContainer) {
            return Ok(api::CreateContainerResponse::default());
        }
        self.call(
            "CreateContainer",
            &api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(container.clone()),
            },
        )
        .await
    }
}
