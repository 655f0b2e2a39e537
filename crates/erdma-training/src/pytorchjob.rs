//! The Kubeflow `PyTorchJob` (`kubeflow.org/v1`) as typed structs, with the pod templates from
//! k8s-openapi. Only the fields erdma sets or reads are modelled; unknown fields in responses are
//! ignored.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// API group of the Kubeflow training operator.
pub const GROUP: &str = "kubeflow.org";
/// API version of `PyTorchJob`.
pub const VERSION: &str = "v1";
/// `apiVersion` of `PyTorchJob`.
pub const API_VERSION: &str = "kubeflow.org/v1";
/// `kind` of `PyTorchJob`.
pub const KIND: &str = "PyTorchJob";
/// Resource plural of `PyTorchJob`.
pub const PLURAL: &str = "pytorchjobs";
/// The container name the training operator expects (it injects the distributed env into it).
pub const CONTAINER_NAME: &str = "pytorch";
/// Replica type key of the rank-0 pod.
pub const MASTER: &str = "Master";
/// Replica type key of the other pods.
pub const WORKER: &str = "Worker";

/// A Kubeflow `PyTorchJob`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchJob {
    /// Always `kubeflow.org/v1`.
    pub api_version: String,
    /// Always `PyTorchJob`.
    pub kind: String,
    /// Name, namespace, labels, annotations.
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: PyTorchJobSpec,
    /// The operator's status, kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// `PyTorchJob.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchJobSpec {
    /// Clean-up, deadlines and retries (the training operator's common `RunPolicy`).
    #[serde(default)]
    pub run_policy: RunPolicy,
    /// Replica specs keyed by type (`Master`, `Worker`).
    pub pytorch_replica_specs: BTreeMap<String, ReplicaSpec>,
}

/// `spec.runPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// `None`, `Running` or `All`: which pods are deleted when the job finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_pod_policy: Option<String>,
    /// Seconds after which the finished job is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Seconds the job may run before it is failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Retries before the job is failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
}

/// One entry of `spec.pytorchReplicaSpecs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSpec {
    /// Number of pods of this type.
    pub replicas: i32,
    /// `Never`, `OnFailure`, `Always` or `ExitCode`.
    pub restart_policy: String,
    /// The pod template.
    pub template: PodTemplateSpec,
}

impl PyTorchJob {
    /// Total number of pods (Master plus Workers).
    pub fn pod_count(&self) -> i32 {
        self.spec
            .pytorch_replica_specs
            .values()
            .map(|r| r.replicas)
            .sum()
    }
}

impl kube::Resource for PyTorchJob {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn resource_path_matches_the_training_operator_crd() {
        assert_eq!(
            PyTorchJob::url_path(&(), Some("team-a")),
            "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs"
        );
        assert_eq!(PyTorchJob::api_version(&()), API_VERSION);
    }

    #[test]
    fn reads_an_operator_shaped_object() {
        // The shape the training operator returns (status included, unknown fields present).
        let json = r#"{
          "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
          "metadata": {"name": "pt", "namespace": "default", "uid": "1"},
          "spec": {"runPolicy": {"cleanPodPolicy": "None", "suspend": false},
                   "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                      "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}}}},
          "status": {"conditions": [{"type": "Created", "status": "True"}]}
        }"#;
        let job: PyTorchJob = serde_json::from_str(json).unwrap();
        assert_eq!(job.pod_count(), 1);
        assert_eq!(
            job.spec.run_policy.clean_pod_policy.as_deref(),
            Some("None")
        );
        assert!(job.status.is_some());
    }
}
