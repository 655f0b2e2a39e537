//! Arena-compatible `erdmactl submit pytorch`: the flags of `arena submit pytorch` that matter for
//! eRDMA training, validated as Arena validates them, turned into a typed Kubeflow `PyTorchJob`
//! (`kubeflow.org/v1`), and created through the Kubernetes API.
//!
//! - [`JobRequest`] holds the flags; [`JobRequest::build`] validates and builds the job.
//! - [`erdma`] is the `--erdma` recipe (resource, capability, NCCL settings).
//! - [`create`] sends the job to the API server and explains failures.

pub mod create;
pub mod erdma;
pub mod job;
pub mod pytorchjob;
pub mod validate;

pub use create::{CreateError, Created, create};
pub use job::{FlagError, JobRequest};
pub use pytorchjob::PyTorchJob;
