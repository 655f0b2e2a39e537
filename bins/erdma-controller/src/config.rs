//! The controller's configuration: `config.json` (same keys and defaults as the original's
//! `internal/types/config.go`) and `credential.json`.

use erdma_cloud::credentials::{OidcRole, SecretSource};
use erdma_cloud::{CredentialSource, Credentials};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Default path of `config.json`.
pub const CONFIG_PATH: &str = "/etc/erdma-controller/config.json";
/// Default path of `credential.json`.
pub const CREDENTIAL_PATH: &str = "/etc/erdma-controller-credential/credential.json";
/// Default `smcr-init` image: erdma's own (`deploy/docker/smcr-init.Dockerfile`), released with
/// the agent and controller images at this version (the chart's appVersion, which the chart also
/// renders into `config.json`).
pub const DEFAULT_SMC_INIT_IMAGE: &str =
    concat!("ghcr.io/erdma/smcr-init:", env!("CARGO_PKG_VERSION"));

fn yes() -> bool {
    true
}
fn ns() -> String {
    "kube-system".into()
}
fn name() -> String {
    "alibabacloud-erdma-controller".into()
}
fn domain() -> String {
    "cluster.local".into()
}
fn cert_dir() -> String {
    "/var/lib/certDir".into()
}
fn wait() -> u64 {
    300
}
fn kube_request_timeout() -> u64 {
    erdma_k8s::client::DEFAULT_REQUEST_TIMEOUT.as_secs()
}
fn ecs_connect_timeout() -> u64 {
    erdma_cloud::http::DEFAULT_CONNECT_TIMEOUT.as_secs()
}
fn ecs_rate() -> u32 {
    10
}
fn concurrent() -> u16 {
    128
}
fn ecs_read_timeout() -> u64 {
    erdma_cloud::http::DEFAULT_READ_TIMEOUT.as_secs()
}

/// `config.json`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Region; empty: ask the metadata service.
    #[serde(default)]
    pub region: String,
    /// The cluster's VPC: the controller changes only instances in it. Empty: the VPC of the
    /// instance the controller runs on (metadata service `vpc-id`), resolved at start.
    #[serde(default)]
    pub vpc_id: String,
    /// Adopt HighPerformance ENIs the controller did not create.
    #[serde(default = "yes", rename = "manageNonOwnedENIs")]
    pub manage_non_owned_enis: bool,
    /// Namespace of the controller (webhook Service, cert Secret, Lease).
    #[serde(default = "ns")]
    pub controller_namespace: String,
    /// Name of the controller (Service, webhook configuration).
    #[serde(default = "name")]
    pub controller_name: String,
    /// Cluster DNS domain (webhook certificate SAN).
    #[serde(default = "domain")]
    pub cluster_domain: String,
    /// Where the webhook certificate is also written.
    #[serde(default = "cert_dir")]
    pub cert_dir: String,
    /// The webhook injects only when the device plugin is enabled.
    #[serde(default = "yes")]
    pub enable_device_plugin: bool,
    /// Serve the mutating webhook.
    #[serde(default = "yes")]
    pub enable_webhook: bool,
    /// Image of `smcr-init`; empty: [`DEFAULT_SMC_INIT_IMAGE`].
    #[serde(default)]
    pub smc_init_image: String,
    /// Inject `smcr-init`.
    #[serde(default = "yes")]
    pub enable_init_container_inject: bool,
    /// Local discovery: the controller has nothing to provision.
    #[serde(default, rename = "localERIDiscovery")]
    pub local_eri_discovery: bool,
    /// Only nodes with these labels get ERIs.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// How long to wait for a new node to become Ready before provisioning anyway.
    #[serde(default = "wait")]
    pub wait_node_ready_timeout_seconds: u64,
    /// Deadline of each Kubernetes API request that is not a watch, in seconds (default 70,
    /// kube-controller-manager's; 0: none). Watches end by the API server's `timeoutSeconds`.
    #[serde(default = "kube_request_timeout")]
    pub kube_request_timeout_seconds: u64,
    /// ECS: each attempt's connection must be up within this many seconds (default 5, the
    /// Alibaba Cloud SDKs' `connectTimeout`; 0: none). STS and the metadata service keep their
    /// defaults.
    #[serde(default = "ecs_connect_timeout")]
    pub ecs_connect_timeout_seconds: u64,
    /// ECS: each attempt's whole answer must be in within this many seconds (default 10, the
    /// Alibaba Cloud SDKs' `readTimeout`; 0: none). A timed-out attempt is retried with
    /// backoff as a transport error, then the reconcile fails and is requeued.
    #[serde(default = "ecs_read_timeout")]
    pub ecs_read_timeout_seconds: u64,
    /// ECS: calls per second per action (a token bucket each; default 10, controller-runtime's
    /// client-side rate; 0: none). A `Throttling` answer pauses the action for the back-off.
    #[serde(default = "ecs_rate")]
    pub ecs_requests_per_second: u32,
    /// ECS: calls per action that may go at once after a quiet period (default 10).
    #[serde(default = "ecs_rate")]
    pub ecs_burst: u32,
    /// Reconciles that run at once per controller (Node, ERdmaDevice; default 128: enough for
    /// the describes of a batch window to fill a call of 100 IDs).
    #[serde(default = "concurrent")]
    pub concurrent_reconciles: u16,
}

impl Default for Config {
    fn default() -> Self {
        serde_json::from_str("{}").expect("all fields have defaults")
    }
}

impl Config {
    /// Reads `path`; the error names the file and the key at fault.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let raw = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read {}: {e}; fix: mount the controller ConfigMap there",
                path.display()
            )
        })?;
        serde_json::from_str(&raw).map_err(|e| {
            anyhow::anyhow!("{} is not a valid controller config: {e}; fix: check the ConfigMap (erdmactl install renders a valid one)", path.display())
        })
    }

    /// The `smcr-init` image to inject.
    pub fn smc_init_image(&self) -> &str {
        if self.smc_init_image.is_empty() {
            DEFAULT_SMC_INIT_IMAGE
        } else {
            &self.smc_init_image
        }
    }

    /// The deadline of Kubernetes API requests (`kubeRequestTimeoutSeconds`), `None` for none.
    pub fn kube_request_timeout(&self) -> Option<Duration> {
        seconds(self.kube_request_timeout_seconds)
    }

    /// The kube client options of the controller (`kubeRequestTimeoutSeconds`).
    pub fn kube_client_options(&self) -> erdma_k8s::client::ClientOptions {
        erdma_k8s::client::ClientOptions::with_deadline(self.kube_request_timeout())
    }

    /// The ECS deadlines per attempt (`ecsConnectTimeoutSeconds`, `ecsReadTimeoutSeconds`).
    pub fn ecs_timeouts(&self) -> erdma_cloud::http::Timeouts {
        erdma_cloud::http::Timeouts {
            connect: seconds(self.ecs_connect_timeout_seconds),
            read: seconds(self.ecs_read_timeout_seconds),
        }
    }

    /// The per-action ECS rate (`ecsRequestsPerSecond`, `ecsBurst`).
    pub fn ecs_rate_limit(&self) -> erdma_cloud::RateLimit {
        erdma_cloud::RateLimit {
            per_second: f64::from(self.ecs_requests_per_second),
            burst: self.ecs_burst.max(1),
        }
    }

    /// The node label selector string (`k=v,k=v`), empty for all nodes.
    pub fn node_label_selector(&self) -> String {
        self.node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `n` seconds; 0 is no limit.
fn seconds(n: u64) -> Option<Duration> {
    (n > 0).then(|| Duration::from_secs(n))
}

/// `credential.json`.
#[derive(Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CredentialConfig {
    /// `""`/`access_key`, `oidc_role_arn`, `ecs_ram_role`, `ram_role_sts`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Access key ID.
    #[serde(default, rename = "accessKeyID")]
    pub access_key_id: String,
    /// Access key secret.
    #[serde(default)]
    pub access_key_secret: String,
    /// STS Secret namespace (default `kube-system`).
    #[serde(default)]
    pub sts_secret_ns: String,
    /// STS Secret name (default `addon.network.token`).
    #[serde(default)]
    pub sts_secret_name: String,
}

impl std::fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialConfig")
            .field("kind", &self.kind)
            .field(
                "access_key_id",
                &if self.access_key_id.is_empty() {
                    ""
                } else {
                    "***"
                },
            )
            .field("access_key_secret", &"***")
            .finish()
    }
}

impl CredentialConfig {
    /// Reads `path`; a missing file means `ecs_ram_role`-less defaults (empty access key), which
    /// fails later with a clear message.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(raw) => serde_json::from_str(&raw).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not valid credentials JSON ({e}); fix: check the controller Secret",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// The STS Secret's (namespace, name).
    pub fn sts_secret(&self) -> (String, String) {
        let ns = if self.sts_secret_ns.is_empty() {
            "kube-system"
        } else {
            &self.sts_secret_ns
        };
        let name = if self.sts_secret_name.is_empty() {
            "addon.network.token"
        } else {
            &self.sts_secret_name
        };
        (ns.to_string(), name.to_string())
    }

    /// The credential source. `secret` reads the STS Secret (built by the caller with kube);
    /// `metadata` is the metadata service endpoint; `sts_endpoint` the STS endpoint.
    pub fn source(
        &self,
        secret: Arc<dyn SecretSource>,
        metadata: &str,
        sts_endpoint: String,
    ) -> anyhow::Result<CredentialSource> {
        match self.kind.as_str() {
            "" | "access_key" => {
                if self.access_key_id.is_empty() || self.access_key_secret.is_empty() {
                    anyhow::bail!(
                        "credentials.type is access_key but accessKeyID/accessKeySecret are empty; \
                         fix: set them, or use oidc_role_arn, ecs_ram_role or ram_role_sts"
                    );
                }
                Ok(CredentialSource::AccessKey(Credentials::access_key(
                    &self.access_key_id,
                    &self.access_key_secret,
                )))
            }
            "oidc_role_arn" => Ok(CredentialSource::OidcRole(OidcRole::from_env(
                sts_endpoint,
            )?)),
            "ecs_ram_role" => Ok(CredentialSource::EcsRamRole {
                metadata_endpoint: metadata.to_string(),
                role_name: None,
            }),
            "ram_role_sts" => Ok(CredentialSource::StsSecret(secret)),
            other => anyhow::bail!(
                "unsupported credentials.type {other:?}; fix: use access_key, oidc_role_arn, ecs_ram_role or ram_role_sts"
            ),
        }
    }
}

/// Reads the ACK add-on STS token from a Secret key through the Kubernetes API.
pub struct KubeSecretSource {
    api: kube::Api<k8s_openapi::api::core::v1::Secret>,
    namespace: String,
    name: String,
    key: String,
}

impl KubeSecretSource {
    /// The key `addon.token.config` of Secret `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.into(),
            name: name.into(),
            key: "addon.token.config".into(),
        }
    }
}

impl SecretSource for KubeSecretSource {
    fn read(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send + '_>>
    {
        Box::pin(async move {
            let s = self
                .api
                .get(&self.name)
                .await
                .map_err(|e| format!("get Secret {}/{}: {e}", self.namespace, self.name))?;
            s.data
                .and_then(|d| d.get(&self.key).map(|b| b.0.clone()))
                .ok_or_else(|| {
                    format!(
                        "Secret {}/{} has no key {}",
                        self.namespace, self.name, self.key
                    )
                })
        })
    }
}
