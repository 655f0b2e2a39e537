//! Test support (feature `fake`): a container runtime that answers the CRI calls erdma makes from a
//! fixed list of sandboxes, the way containerd does (`verbose` status carries the `info` JSON).

use crate::runtime::v1 as cri;
use crate::runtime::v1::runtime_service_server::RuntimeService;
use std::collections::BTreeMap;
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
}
