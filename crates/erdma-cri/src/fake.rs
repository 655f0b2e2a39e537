//! Test support (feature `fake`): container runtimes that answer CRI over a real socket.
//!
//! - [`FakeRuntime`] answers the calls the agent makes from a fixed list of sandboxes, the way
//!   containerd does (`verbose` status carries the `info` JSON); it refuses the lifecycle calls.
//! - [`RecordingRuntime`] also runs the lifecycle in memory, serves `ImageService.ImageStatus`
//!   from images a test adds, and records every request, for tests of a kubelet (the lab's
//!   `erdma-fake-kubelet pod`).

use crate::runtime::v1 as cri;
use crate::runtime::v1::image_service_server::ImageService;
use crate::runtime::v1::runtime_service_server::RuntimeService;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// A runtime holding sandboxes with their verbose `info` JSON. It ignores list filters, so clients
/// must not rely on them.
pub struct FakeRuntime(pub Vec<(cri::PodSandboxStatus, String)>);

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(
        &self,
        _: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "containerd".into(),
            runtime_version: "v2.1.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        let r = r.into_inner();
        let (status, info) = self
            .0
            .iter()
            .find(|(s, _)| s.id == r.pod_sandbox_id)
            .ok_or_else(|| Status::not_found(format!("sandbox {}", r.pod_sandbox_id)))?;
        let mut m = BTreeMap::new();
        if r.verbose {
            m.insert("info".to_string(), info.clone());
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(status.clone()),
            info: m,
            timestamp: 1,
        }))
    }

    async fn list_pod_sandbox(
        &self,
        _: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        Ok(Response::new(cri::ListPodSandboxResponse {
            items: self
                .0
                .iter()
                .map(|(s, _)| cri::PodSandbox {
                    id: s.id.clone(),
                    metadata: s.metadata.clone(),
                    state: s.state,
                    created_at: s.created_at,
                    labels: s.labels.clone(),
                    annotations: s.annotations.clone(),
                    runtime_handler: String::new(),
                })
                .collect(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        _: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn stop_pod_sandbox(
        &self,
        _: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn remove_pod_sandbox(
        &self,
        _: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn create_container(
        &self,
        _: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn start_container(
        &self,
        _: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn stop_container(
        &self,
        _: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn remove_container(
        &self,
        _: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn container_status(
        &self,
        _: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }

    async fn exec_sync(
        &self,
        _: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        Err(Status::unimplemented(
            "FakeRuntime serves only the calls the agent makes",
        ))
    }
}

/// One request [`RecordingRuntime`] received, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// `RunPodSandbox` with its config.
    RunPodSandbox(Box<cri::PodSandboxConfig>),
    /// `CreateContainer` with the sandbox id and the container config.
    CreateContainer(String, Box<cri::ContainerConfig>),
    /// `StartContainer` of a container id.
    StartContainer(String),
    /// `ExecSync` in a container with the command.
    ExecSync(String, Vec<String>),
    /// `StopContainer` of a container id.
    StopContainer(String),
    /// `RemoveContainer` of a container id.
    RemoveContainer(String),
    /// `StopPodSandbox` of a sandbox id.
    StopPodSandbox(String),
    /// `RemovePodSandbox` of a sandbox id.
    RemovePodSandbox(String),
    /// `ImageStatus` of an image reference or ID.
    ImageStatus(String),
}

#[derive(Default)]
struct Lifecycle {
    calls: Vec<Recorded>,
    sandboxes: BTreeMap<String, cri::PodSandboxConfig>,
    containers: BTreeMap<String, (String, cri::ContainerState)>,
    /// Exit codes of containers that exited (by [`RecordingRuntime::exit_container`]).
    exit_codes: BTreeMap<String, i32>,
    images: Vec<cri::Image>,
    /// `ExecSync` answers by the command's first word: exit code and stdout.
    exec_answers: BTreeMap<String, (i32, String)>,
}

/// A runtime that runs sandboxes and containers in memory and records every lifecycle request.
/// Sandbox `sN` gets IP `10.89.0.N` and netns `/var/run/netns/cni-sN`; `ExecSync` answers the
/// command joined by spaces on stdout, exit code 0, unless [`RecordingRuntime::answer_exec`]
/// set another answer for the command's first word. `ImageStatus` finds the images added with
/// [`RecordingRuntime::add_image`] by ID, tag or digest.
#[derive(Clone, Default)]
pub struct RecordingRuntime(Arc<Mutex<Lifecycle>>);

impl RecordingRuntime {
    /// Adds an image to the store.
    pub fn add_image(&self, image: cri::Image) {
        self.state().images.push(image);
    }

    /// From now on, `ExecSync` of a command whose first word is `program` exits with `exit_code`
    /// and prints `stdout`.
    pub fn answer_exec(&self, program: &str, exit_code: i32, stdout: &str) {
        self.state()
            .exec_answers
            .insert(program.to_string(), (exit_code, stdout.to_string()));
    }

    /// The container's process exits with `exit_code` (its state becomes `CONTAINER_EXITED`).
    pub fn exit_container(&self, id: &str, exit_code: i32) {
        let mut st = self.state();
        if let Some(c) = st.containers.get_mut(id) {
            c.1 = cri::ContainerState::ContainerExited;
            st.exit_codes.insert(id.to_string(), exit_code);
        }
    }

    /// The requests received so far.
    pub fn calls(&self) -> Vec<Recorded> {
        self.state().calls.clone()
    }

    /// Ids of the sandboxes that exist now.
    pub fn sandboxes(&self) -> Vec<String> {
        self.state().sandboxes.keys().cloned().collect()
    }

    /// Ids of the containers that exist now.
    pub fn containers(&self) -> Vec<String> {
        self.state().containers.keys().cloned().collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Lifecycle> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tonic::async_trait]
impl RuntimeService for RecordingRuntime {
    async fn version(
        &self,
        r: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        FakeRuntime(Vec::new()).version(r).await
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        let r = r.into_inner();
        let st = self.state();
        let config = st
            .sandboxes
            .get(&r.pod_sandbox_id)
            .ok_or_else(|| Status::not_found(format!("sandbox {}", r.pod_sandbox_id)))?;
        let n = r.pod_sandbox_id.trim_start_matches('s');
        let host = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
        let status = cri::PodSandboxStatus {
            id: r.pod_sandbox_id.clone(),
            metadata: config.metadata.clone(),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 1,
            network: (!host).then(|| cri::PodSandboxNetworkStatus {
                ip: format!("10.89.0.{n}"),
                additional_ips: Vec::new(),
            }),
            linux: None,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            runtime_handler: String::new(),
        };
        let mut info = BTreeMap::new();
        if r.verbose && !host {
            info.insert(
                "info".to_string(),
                format!(
                    r#"{{"pid": 1, "runtimeSpec": {{"linux": {{"namespaces": [{{"type": "network", "path": "/var/run/netns/cni-{}"}}]}}}}}}"#,
                    r.pod_sandbox_id
                ),
            );
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(status),
            info,
            timestamp: 1,
        }))
    }

    async fn list_pod_sandbox(
        &self,
        _: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        let st = self.state();
        Ok(Response::new(cri::ListPodSandboxResponse {
            items: st
                .sandboxes
                .iter()
                .map(|(id, c)| cri::PodSandbox {
                    id: id.clone(),
                    metadata: c.metadata.clone(),
                    state: cri::PodSandboxState::SandboxReady as i32,
                    created_at: 1,
                    labels: c.labels.clone(),
                    annotations: c.annotations.clone(),
                    runtime_handler: String::new(),
                })
                .collect(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        let config = r
            .into_inner()
            .config
            .ok_or_else(|| Status::invalid_argument("no sandbox config"))?;
        let mut st = self.state();
        st.calls
            .push(Recorded::RunPodSandbox(Box::new(config.clone())));
        let id = format!("s{}", st.calls.len());
        st.sandboxes.insert(id.clone(), config);
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        let mut st = self.state();
        for (sb, state) in st.containers.values_mut() {
            if *sb == id {
                *state = cri::ContainerState::ContainerExited;
            }
        }
        st.calls.push(Recorded::StopPodSandbox(id));
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        let mut st = self.state();
        st.sandboxes.remove(&id);
        st.containers.retain(|_, (sb, _)| *sb != id);
        st.calls.push(Recorded::RemovePodSandbox(id));
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        let r = r.into_inner();
        let config = r
            .config
            .ok_or_else(|| Status::invalid_argument("no container config"))?;
        let mut st = self.state();
        if !st.sandboxes.contains_key(&r.pod_sandbox_id) {
            return Err(Status::not_found(format!("sandbox {}", r.pod_sandbox_id)));
        }
        st.calls.push(Recorded::CreateContainer(
            r.pod_sandbox_id.clone(),
            Box::new(config),
        ));
        let id = format!("c{}", st.calls.len());
        st.containers.insert(
            id.clone(),
            (r.pod_sandbox_id, cri::ContainerState::ContainerCreated),
        );
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        let mut st = self.state();
        let c = st
            .containers
            .get_mut(&id)
            .ok_or_else(|| Status::not_found(format!("container {id}")))?;
        c.1 = cri::ContainerState::ContainerRunning;
        st.calls.push(Recorded::StartContainer(id));
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        let mut st = self.state();
        if let Some(c) = st.containers.get_mut(&id) {
            c.1 = cri::ContainerState::ContainerExited;
        }
        st.calls.push(Recorded::StopContainer(id));
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        let mut st = self.state();
        st.containers.remove(&id);
        st.calls.push(Recorded::RemoveContainer(id));
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        let id = r.into_inner().container_id;
        let st = self.state();
        let (_, state) = st
            .containers
            .get(&id)
            .ok_or_else(|| Status::not_found(format!("container {id}")))?;
        let exit_code = st.exit_codes.get(&id).copied().unwrap_or(0);
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id,
                state: *state as i32,
                exit_code,
                ..Default::default()
            }),
            info: BTreeMap::new(),
        }))
    }

    async fn exec_sync(
        &self,
        r: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        let r = r.into_inner();
        let mut st = self.state();
        match st.containers.get(&r.container_id) {
            Some((_, cri::ContainerState::ContainerRunning)) => {}
            _ => {
                return Err(Status::failed_precondition(format!(
                    "container {} is not running",
                    r.container_id
                )));
            }
        }
        let (exit_code, out) = r
            .cmd
            .first()
            .and_then(|p| st.exec_answers.get(p))
            .cloned()
            .unwrap_or_else(|| (0, r.cmd.join(" ")));
        st.calls.push(Recorded::ExecSync(r.container_id, r.cmd));
        Ok(Response::new(cri::ExecSyncResponse {
            stdout: out.into_bytes(),
            stderr: Vec::new(),
            exit_code,
        }))
    }
}

#[tonic::async_trait]
impl ImageService for RecordingRuntime {
    async fn image_status(
        &self,
        r: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        let wanted = r
            .into_inner()
            .image
            .map(|s| s.image)
            .ok_or_else(|| Status::invalid_argument("no image spec"))?;
        let mut st = self.state();
        st.calls.push(Recorded::ImageStatus(wanted.clone()));
        let image = st
            .images
            .iter()
            .find(|i| {
                i.id == wanted || i.repo_tags.contains(&wanted) || i.repo_digests.contains(&wanted)
            })
            .cloned();
        Ok(Response::new(cri::ImageStatusResponse {
            image,
            info: BTreeMap::new(),
        }))
    }
}
