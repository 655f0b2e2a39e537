//! Sandbox and container lifecycle over CRI, as the kubelet drives it after admission:
//! `RunPodSandbox`, `CreateContainer`, `StartContainer`, `ExecSync`, `ContainerStatus`, and
//! `StopContainer` / `RemoveContainer` / `StopPodSandbox` / `RemovePodSandbox` on deletion.
//! Used by the lab's kubelet (`erdma-fake-kubelet pod`); the agent itself only reads sandboxes.

use crate::runtime::v1 as cri;
use crate::{CriClient, CriError};
use std::path::Path;
use std::time::Duration;

/// How long one lifecycle call may take. Creating a sandbox runs CNI and starts a process; in
/// an emulated lab VM on a loaded machine that takes seconds, so this is generous.
pub const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(120);

/// What `ExecSync` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code.
    pub exit_code: i32,
}

/// Awaits one call on `socket` within `limit`.
pub(crate) async fn timed<T>(
    socket: &Path,
    call: &'static str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError> {
    let err = |detail: String| CriError::Call {
        call,
        path: socket.to_path_buf(),
        detail,
    };
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| err(format!("timed out after {} s", limit.as_secs())))?
        .map(tonic::Response::into_inner)
        .map_err(|s| err(s.to_string()))
}

impl CriClient {
    /// `RunPodSandbox`: the new sandbox's id.
    pub async fn run_pod_sandbox(
        &mut self,
        config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let fut = self.client.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        });
        let r = timed(&self.socket, "RunPodSandbox", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(r.pod_sandbox_id)
    }

    /// `StopPodSandbox` (idempotent in the runtime).
    pub async fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let fut = self.client.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        });
        timed(&self.socket, "StopPodSandbox", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(())
    }

    /// `RemovePodSandbox` (idempotent in the runtime).
    pub async fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        let fut = self
            .client
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            });
        timed(&self.socket, "RemovePodSandbox", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(())
    }

    /// `CreateContainer` in sandbox `sandbox_id`: the new container's id.
    pub async fn create_container(
        &mut self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let fut = self.client.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        });
        let r = timed(&self.socket, "CreateContainer", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(r.container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&mut self, id: &str) -> Result<(), CriError> {
        let fut = self.client.start_container(cri::StartContainerRequest {
            container_id: id.to_string(),
        });
        timed(&self.socket, "StartContainer", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(())
    }

    /// `StopContainer` with `grace` seconds between the stop signal and the kill.
    pub async fn stop_container(&mut self, id: &str, grace: i64) -> Result<(), CriError> {
        let fut = self.client.stop_container(cri::StopContainerRequest {
            container_id: id.to_string(),
            timeout: grace,
        });
        timed(&self.socket, "StopContainer", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(())
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&mut self, id: &str) -> Result<(), CriError> {
        let fut = self.client.remove_container(cri::RemoveContainerRequest {
            container_id: id.to_string(),
        });
        timed(&self.socket, "RemoveContainer", LIFECYCLE_TIMEOUT, fut).await?;
        Ok(())
    }

    /// `ContainerStatus` (not verbose).
    pub async fn container_status(&mut self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        let fut = self.client.container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        });
        timed(&self.socket, "ContainerStatus", crate::CALL_TIMEOUT, fut)
            .await?
            .status
            .ok_or_else(|| {
                CriError::NotFound(format!("container {id}: the runtime returned no status"))
            })
    }

    /// `ExecSync`: runs `cmd` in container `id`; `timeout` seconds (0: no limit, and no client
    /// deadline either).
    pub async fn exec_sync(
        &mut self,
        id: &str,
        cmd: Vec<String>,
        timeout: u32,
    ) -> Result<ExecOutput, CriError> {
        let fut = self.client.exec_sync(cri::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: i64::from(timeout),
        });
        let limit = if timeout == 0 {
            Duration::MAX
        } else {
            Duration::from_secs(u64::from(timeout)) + LIFECYCLE_TIMEOUT
        };
        let r = timed(&self.socket, "ExecSync", limit, fut).await?;
        Ok(ExecOutput {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
        })
    }
}

impl CriClient {
    /// `PodSandboxStatus` as the runtime answered it (`verbose` adds the `info` JSON).
    pub async fn sandbox_status(
        &mut self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::PodSandboxStatusResponse, CriError> {
        let fut = self
            .client
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose,
            });
        timed(&self.socket, "PodSandboxStatus", crate::CALL_TIMEOUT, fut).await
    }
}
