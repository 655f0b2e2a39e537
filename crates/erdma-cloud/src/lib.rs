//! The Alibaba Cloud side of erdma: a client for the ECS OpenAPI (RPC style, signature V3 or
//! V2), credentials (access key, RRSA OIDC role, ECS instance RAM role, ACK STS token Secret),
//! the instance metadata-service client ([`imds`], IMDSv2) and, with the `emulator` feature,
//! local ECS/STS API and metadata-service emulators for tests.
//!
//! No Kubernetes dependency: the one Kubernetes-backed credential (the STS token Secret) comes in
//! through the [`credentials::SecretSource`] trait.

#[cfg(feature = "emulator")]
pub mod apispec;
pub mod credentials;
pub mod ecs;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod encode;
pub mod http;
pub mod imds;
#[cfg(feature = "emulator")]
pub mod imds_emulator;
pub mod ratelimit;
pub mod signer;

pub use credentials::{CredentialProvider, CredentialSource, Credentials, Secret};
pub use ecs::{EcsClient, EcsConfig, EcsError, RetryPolicy};
pub use ratelimit::RateLimit;
pub use signer::SignatureVersion;

/// User agent of every request (the original's, with our name).
pub const USER_AGENT: &str = "AlibabaCloud/ERdma-Controller/0.1 (erdma)";
