//! Creating the job through the Kubernetes API, with Arena-style explanations of failures.

use crate::pytorchjob::PyTorchJob;
use kube::api::{Api, PostParams};
use kube::core::Status;

/// The field manager recorded on objects erdmactl creates.
pub const FIELD_MANAGER: &str = "erdmactl";

/// What was created.
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    /// The object as the API server stored it.
    pub job: PyTorchJob,
    /// `true` when the server only validated it (`dryRun=All`).
    pub server_dry_run: bool,
}

/// Why the API server did not create the job; each message names the object and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The job already exists.
    #[error(
        "the job {name} already exists in namespace {namespace}, please delete it first: kubectl delete pytorchjob {name} -n {namespace}"
    )]
    AlreadyExists {
        /// Job name.
        name: String,
        /// Namespace.
        namespace: String,
    },
    /// The namespace does not exist.
    #[error(
        "namespace {namespace} not found: create it (kubectl create namespace {namespace}) or pass -n <namespace>"
    )]
    NamespaceNotFound {
        /// Namespace.
        namespace: String,
    },
    /// The PyTorchJob CRD is not installed.
    #[error(
        "the cluster does not serve pytorchjobs.kubeflow.org/v1: install the Kubeflow training operator (it provides the PyTorchJob CRD) and retry"
    )]
    CrdMissing,
    /// RBAC refused the request.
    #[error(
        "not allowed to create pytorchjobs in namespace {namespace}: {message} (ask for create on pytorchjobs.kubeflow.org)"
    )]
    Forbidden {
        /// Namespace.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// The API server rejected the object (admission webhook, validation, quota).
    #[error("the API server rejected pytorchjob {name}: {message} (HTTP {code}, {reason})")]
    Rejected {
        /// Job name.
        name: String,
        /// HTTP status code.
        code: u16,
        /// Machine-readable reason.
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The API server could not be reached.
    #[error(
        "cannot reach the Kubernetes API server: {0} (check your kubeconfig, --context and network)"
    )]
    Connection(#[source] kube::Error),
}

/// Maps an API server `Status` for a create of `name` in `namespace` to a [`CreateError`].
pub fn explain(status: &Status, name: &str, namespace: &str) -> CreateError {
    let details_kind = status
        .details
        .as_ref()
        .map(|d| d.kind.as_str())
        .unwrap_or_default();
    match (status.code, status.reason.as_str()) {
        (409, _) | (_, "AlreadyExists") => CreateError::AlreadyExists {
            name: name.into(),
            namespace: namespace.into(),
        },
        (404, _) if details_kind == "namespaces" || status.message.starts_with("namespaces ") => {
            CreateError::NamespaceNotFound {
                namespace: namespace.into(),
            }
        }
        (404, _) => CreateError::CrdMissing,
        (403, _) => CreateError::Forbidden {
            namespace: namespace.into(),
            message: status.message.clone(),
        },
        (code, reason) => CreateError::Rejected {
            name: name.into(),
            code,
            reason: reason.into(),
            message: status.message.clone(),
        },
    }
}

/// Creates `job` (server-side dry run when `server_dry_run`).
pub async fn create(
    client: kube::Client,
    job: &PyTorchJob,
    server_dry_run: bool,
) -> Result<Created, CreateError> {
    let namespace = job
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = job.metadata.name.clone().unwrap_or_default();
    let api: Api<PyTorchJob> = Api::namespaced(client, &namespace);
    let params = PostParams {
        dry_run: server_dry_run,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match api.create(&params, job).await {
        Ok(job) => Ok(Created {
            job,
            server_dry_run,
        }),
        Err(kube::Error::Api(status)) => Err(explain(&status, &name, &namespace)),
        Err(e) => Err(CreateError::Connection(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(json: &str) -> Status {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn recorded_api_server_errors_are_explained() {
        // Response bodies as kube-apiserver returns them.
        let exists = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pytorchjobs.kubeflow.org \"pt\" already exists","reason":"AlreadyExists","details":{"name":"pt","group":"kubeflow.org","kind":"pytorchjobs"},"code":409}"#,
        );
        let e = explain(&exists, "pt", "default").to_string();
        assert!(
            e.contains("pt already exists")
                && e.contains("kubectl delete pytorchjob pt -n default"),
            "{e}"
        );

        let no_crd = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
        );
        assert!(matches!(
            explain(&no_crd, "pt", "default"),
            CreateError::CrdMissing
        ));

        let no_ns = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \"team\" not found","reason":"NotFound","details":{"name":"team","kind":"namespaces"},"code":404}"#,
        );
        assert!(
            explain(&no_ns, "pt", "team")
                .to_string()
                .contains("kubectl create namespace team")
        );

        let forbidden = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pytorchjobs.kubeflow.org is forbidden: User \"dev\" cannot create resource \"pytorchjobs\" in API group \"kubeflow.org\" in the namespace \"default\"","reason":"Forbidden","details":{"group":"kubeflow.org","kind":"pytorchjobs"},"code":403}"#,
        );
        assert!(
            explain(&forbidden, "pt", "default")
                .to_string()
                .contains("User \"dev\" cannot create")
        );

        let invalid = status(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"admission webhook denied the request","reason":"BadRequest","code":400}"#,
        );
        let e = explain(&invalid, "pt", "default").to_string();
        assert!(
            e.contains("HTTP 400") && e.contains("admission webhook denied"),
            "{e}"
        );
    }
}
