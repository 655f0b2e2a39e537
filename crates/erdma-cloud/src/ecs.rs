//! The ECS OpenAPI client (RPC style, version `2014-05-26`): signed requests, retries with
//! exponential backoff and jitter on throttling, 5xx and transport errors, `ClientToken`
//! idempotency for creations, and typed wrappers for the actions the controller uses.

use crate::credentials::{CredentialError, CredentialProvider};
use crate::encode::{iso8601, nonce};
use crate::http::{HttpClient, HttpError, Timeouts, send};
use crate::ratelimit::{Limiter, RateLimit};
use crate::signer::{self, SignatureVersion, V3Input};
use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// ECS API version.
pub const ECS_VERSION: &str = "2014-05-26";
/// `DescribeInstances`: at most this many IDs in `InstanceIds` (and instances per page).
pub const MAX_INSTANCE_IDS: usize = 100;
/// `DescribeNetworkInterfaces`: at most this many `NetworkInterfaceId.N`.
pub const MAX_ENI_IDS: usize = 100;
/// `DescribeNetworkInterfaces`: the largest page (`MaxResults`).
pub const MAX_ENI_PAGE: usize = 500;
/// `DescribeInstanceTypes`: at most this many `InstanceTypes.N`.
pub const MAX_INSTANCE_TYPES: usize = 10;

/// The ECS endpoint of `region`: the VPC endpoint, or the public one when `public` (the original's
/// `PUBLIC_NETWORK=true`).
pub fn ecs_endpoint(region: &str, public: bool) -> String {
    if public {
        format!("https://ecs.{region}.aliyuncs.com")
    } else {
        format!("https://ecs-vpc.{region}.aliyuncs.com")
    }
}

/// The STS endpoint of `region` (VPC or public).
pub fn sts_endpoint(region: &str, public: bool) -> String {
    if public {
        format!("https://sts.{region}.aliyuncs.com")
    } else {
        format!("https://sts-vpc.{region}.aliyuncs.com")
    }
}

/// Retry policy: `max_attempts` tries in all, waiting `base · 2^(n-1)` (capped at `max`, times a
/// random factor in [0.5, 1)) between them.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all (≥ 1).
    pub max_attempts: u32,
    /// First backoff.
    pub base: Duration,
    /// Backoff cap.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base: Duration::from_millis(300),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait before try `attempt + 1` (attempt counts from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let capped = exp.min(self.max);
        // Jitter in [0.5, 1.0) from the nonce's randomness.
        let r = u8::from_str_radix(&nonce()[..2], 16).unwrap_or(128);
        capped.mul_f64(0.5 + f64::from(r) / 512.0)
    }
}

/// Errors of ECS calls. Messages name the action, the API's code and message and a fix; they
/// never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum EcsError {
    /// The API answered with an error.
    #[error(
        "ECS {action}: HTTP {status} {code}: {message} (request {request_id}){}",
        hint(code)
    )]
    Api {
        /// The action.
        action: String,
        /// HTTP status.
        status: u16,
        /// The API error code, e.g. `Throttling.User`.
        code: String,
        /// The API message.
        message: String,
        /// `RequestId` for support tickets.
        request_id: String,
    },
    /// Connection failure or timeout (of the last attempt, after retries).
    #[error(
        "ECS {action}: {source} (endpoint {endpoint}, {attempts} attempt(s)); fix: check network access to the ECS endpoint (set PUBLIC_NETWORK=true outside a VPC){}",
        timeout_hint(source)
    )]
    Transport {
        /// The action.
        action: String,
        /// The endpoint.
        endpoint: String,
        /// The HTTP error.
        source: HttpError,
        /// Attempts made in all.
        attempts: u32,
    },
    /// Credentials could not be obtained.
    #[error("ECS {action}: {source}")]
    Credentials {
        /// The action.
        action: String,
        /// Why.
        source: CredentialError,
    },
    /// The answer was not the JSON expected.
    #[error("ECS {action}: unexpected answer: {message}")]
    Decode {
        /// The action.
        action: String,
        /// What did not parse.
        message: String,
    },
}

fn timeout_hint(e: &HttpError) -> &'static str {
    match e {
        HttpError::Timeout(_) | HttpError::ConnectTimeout(_) => {
            "; the deadlines are the controller config's ecsConnectTimeoutSeconds and ecsReadTimeoutSeconds"
        }
        _ => "",
    }
}

fn hint(code: &str) -> &'static str {
    if code.starts_with("Throttling") {
        "; fix: the API is throttling this account, retried with backoff; lower the reconcile rate"
    } else if code.contains("Forbidden") || code.contains("NoPermission") {
        "; fix: grant the RAM policy listed in docs/operations.md to the controller's credentials"
    } else if code.contains("SignatureDoesNotMatch") || code.contains("InvalidAccessKeyId") {
        "; fix: check credentials.accessKeyID/accessKeySecret"
    } else {
        ""
    }
}

impl EcsError {
    /// Whether a retry may succeed: throttling, 5xx, service unavailable, transport errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { status, code, .. } => {
                *status >= 500
                    || code.starts_with("Throttling")
                    || matches!(
                        code.as_str(),
                        "ServiceUnavailable" | "InternalError" | "UnknownError"
                    )
            }
            Self::Transport { .. } => true,
            Self::Credentials { .. } | Self::Decode { .. } => false,
        }
    }

    /// Whether ECS refused the call for its rate (`Throttling`, `Throttling.User`, ...).
    pub fn is_throttling(&self) -> bool {
        matches!(self, Self::Api { code, .. } if code.starts_with("Throttling"))
    }

    /// The API error code, when the API answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// Settings of an [`EcsClient`].
#[derive(Debug, Clone)]
pub struct EcsConfig {
    /// `https://ecs-vpc.<region>.aliyuncs.com` (or the emulator's `http://127.0.0.1:port`).
    pub endpoint: String,
    /// `RegionId`.
    pub region: String,
    /// Signature scheme.
    pub signature: SignatureVersion,
    /// Retries.
    pub retry: RetryPolicy,
}

/// How one attempt of an ECS call ended (for [`EcsObserver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 2xx.
    Ok,
    /// Refused with a `Throttling*` code.
    Throttled,
    /// Any other failure.
    Error,
}

impl Outcome {
    /// `ok`, `throttled`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Throttled => "throttled",
            Self::Error => "error",
        }
    }
}

/// Told of every attempt and retry of a client's calls (the controller's metrics).
pub trait EcsObserver: Send + Sync + std::fmt::Debug {
    /// One attempt of `action` with `params` ended.
    fn answered(&self, action: &str, params: &[(String, String)], outcome: Outcome);
    /// `action` with `params` is tried again after a retryable failure (the same call: an
    /// attempt answered and not followed by this was the call's last).
    fn retried(&self, action: &str, params: &[(String, String)]);
}

/// The ECS client.
#[derive(Debug, Clone)]
pub struct EcsClient {
    cfg: EcsConfig,
    authority: String,
    creds: Arc<CredentialProvider>,
    http: HttpClient,
    limiter: Arc<Limiter>,
    observer: Option<Arc<dyn EcsObserver>>,
}

impl EcsClient {
    /// A client for `cfg` with credentials from `creds`. Fails when the endpoint is not
    /// `http(s)://host[:port]`.
    pub fn new(cfg: EcsConfig, creds: Arc<CredentialProvider>) -> Result<Self, EcsError> {
        let authority = cfg
            .endpoint
            .strip_prefix("https://")
            .or_else(|| cfg.endpoint.strip_prefix("http://"))
            .map(|a| a.trim_end_matches('/').to_string())
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| EcsError::Decode {
                action: "-".into(),
                message: format!(
                    "endpoint {:?} is not http(s)://host[:port]; fix: set config.region or the endpoint",
                    cfg.endpoint
                ),
            })?;
        Ok(Self {
            cfg,
            authority,
            creds,
            http: crate::http::client(),
            limiter: Arc::new(Limiter::new(RateLimit {
                per_second: 0.0,
                burst: 1,
            })),
            observer: None,
        })
    }

    /// The same client with a token bucket of `limit` per action (default: none), shared by its
    /// clones.
    pub fn with_rate_limit(mut self, limit: RateLimit) -> Self {
        self.limiter = Arc::new(Limiter::new(limit));
        self
    }

    /// The same client reporting every attempt and retry to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn EcsObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The same client with other deadlines per attempt (default: [`Timeouts::default`], the
    /// Alibaba Cloud SDKs' connect 5 s and read 10 s). Each attempt of [`EcsClient::call`] has
    /// them; the [`RetryPolicy`] decides how many attempts a timed-out call gets.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.http = HttpClient::new(timeouts);
        self
    }

    /// The deadlines per attempt.
    pub fn timeouts(&self) -> Timeouts {
        self.http.timeouts()
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.cfg.region
    }

    /// Calls `action` with `params`, retrying retryable failures; the decoded JSON answer.
    /// `params` are sent as given: include `RegionId` (see [`EcsClient::regional`]) for the actions
    /// that define it (not `DescribeInstanceTypes` nor `DescribeInstanceAttribute`).
    pub async fn call(&self, action: &str, params: &[(String, String)]) -> Result<Value, EcsError> {
        let mut attempt = 1;
        loop {
            self.limiter.acquire(action).await;
            let answer = self.call_once(action, params).await;
            if let Some(o) = &self.observer {
                o.answered(
                    action,
                    params,
                    match &answer {
                        Ok(_) => Outcome::Ok,
                        Err(e) if e.is_throttling() => Outcome::Throttled,
                        Err(_) => Outcome::Error,
                    },
                );
            }
            match answer {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < self.cfg.retry.max_attempts.max(1) => {
                    let wait = self.cfg.retry.backoff(attempt);
                    if e.is_throttling() {
                        // The account's quota for this API is spent: every caller waits.
                        self.limiter.pause(action, wait);
                    }
                    tracing::warn!(action, attempt, error = %e, wait_ms = wait.as_millis() as u64, "ECS call failed, retrying");
                    if let Some(o) = &self.observer {
                        o.retried(action, params);
                    }
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(mut e) => {
                    if let EcsError::Transport { attempts, .. } = &mut e {
                        *attempts = attempt;
                    }
                    return Err(e);
                }
            }
        }
    }

    async fn call_once(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Value, EcsError> {
        let creds = self
            .creds
            .get()
            .await
            .map_err(|source| EcsError::Credentials {
                action: action.to_string(),
                source,
            })?;
        let mut query: Vec<(String, String)> = params.to_vec();
        let now = iso8601(SystemTime::now());
        let nonce = nonce();
        let builder;
        match self.cfg.signature {
            SignatureVersion::V2 => {
                query.extend([
                    ("Action".to_string(), action.to_string()),
                    ("Version".into(), ECS_VERSION.into()),
                    ("Format".into(), "JSON".into()),
                    ("AccessKeyId".into(), creds.access_key_id.clone()),
                    ("SignatureMethod".into(), "HMAC-SHA1".into()),
                    ("SignatureVersion".into(), "1.0".into()),
                    ("SignatureNonce".into(), nonce),
                    ("Timestamp".into(), now),
                ]);
                if let Some(t) = &creds.security_token {
                    query.push(("SecurityToken".into(), t.expose().to_string()));
                }
                let sig = signer::sign_v2(
                    "GET",
                    query.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                    creds.access_key_secret.expose(),
                );
                query.push(("Signature".into(), sig));
                let qs =
                    signer::canonical_query(query.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                builder = hyper::Request::get(format!(
                    "{}/?{qs}",
                    self.cfg.endpoint.trim_end_matches('/')
                ))
                .header("host", &self.authority);
            }
            SignatureVersion::V3 => {
                let body_hash = signer::sha256_hex(b"");
                let mut headers: Vec<(String, String)> = vec![
                    ("host".into(), self.authority.clone()),
                    ("x-acs-action".into(), action.to_string()),
                    ("x-acs-version".into(), ECS_VERSION.into()),
                    ("x-acs-date".into(), now),
                    ("x-acs-signature-nonce".into(), nonce),
                    ("x-acs-content-sha256".into(), body_hash.clone()),
                ];
                if let Some(t) = &creds.security_token {
                    headers.push(("x-acs-security-token".into(), t.expose().to_string()));
                }
                let (canonical, signed) = signer::canonical_request_v3(&V3Input {
                    method: "POST",
                    path: "/",
                    query: &query,
                    headers: &headers,
                    body_sha256: &body_hash,
                });
                let sig = signer::sign_v3(&canonical, creds.access_key_secret.expose());
                let qs =
                    signer::canonical_query(query.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                let mut b = hyper::Request::post(format!(
                    "{}/?{qs}",
                    self.cfg.endpoint.trim_end_matches('/')
                ));
                for (k, v) in &headers {
                    b = b.header(k.as_str(), v.as_str());
                }
                builder = b.header(
                    "authorization",
                    signer::authorization_v3(&creds.access_key_id, &signed, &sig),
                );
            }
        }
        let req = builder
            .header("user-agent", crate::USER_AGENT)
            .header("accept", "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|e| EcsError::Decode {
                action: action.to_string(),
                message: format!("cannot build the request: {e}"),
            })?;
        let (status, body) = send(&self.http, req)
            .await
            .map_err(|source| EcsError::Transport {
                action: action.to_string(),
                endpoint: self.cfg.endpoint.clone(),
                source,
                attempts: 1,
            })?;
        let value: Value = serde_json::from_slice(&body).map_err(|e| {
            // A gateway in front of ECS can answer 5xx with HTML: retryable like any 5xx.
            if status >= 500 {
                return EcsError::Api {
                    action: action.to_string(),
                    status,
                    code: "ServiceUnavailable".into(),
                    message: "non-JSON 5xx answer".into(),
                    request_id: String::new(),
                };
            }
            EcsError::Decode {
                action: action.to_string(),
                message: format!("HTTP {status}, body is not JSON: {e}"),
            }
        })?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let field = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        Err(EcsError::Api {
            action: action.to_string(),
            status,
            code: field("Code"),
            message: field("Message"),
            request_id: field("RequestId"),
        })
    }

    /// `params` plus `RegionId` (this client's region), for the actions that define it.
    pub fn regional(&self, mut params: Vec<(String, String)>) -> Vec<(String, String)> {
        params.push(("RegionId".into(), self.cfg.region.clone()));
        params
    }

    fn decode<T: for<'de> Deserialize<'de>>(action: &str, v: Value) -> Result<T, EcsError> {
        serde_json::from_value(v).map_err(|e| EcsError::Decode {
            action: action.to_string(),
            message: e.to_string(),
        })
    }

    /// `DescribeInstances` by instance IDs: one call per [`MAX_INSTANCE_IDS`] IDs (all pages).
    pub async fn describe_instances_by_id(&self, ids: &[&str]) -> Result<Vec<Instance>, EcsError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(MAX_INSTANCE_IDS) {
            let ids = serde_json::to_string(chunk).unwrap_or_default();
            out.extend(
                self.describe_instances(vec![("InstanceIds".into(), ids)])
                    .await?,
            );
        }
        Ok(out)
    }

    /// `DescribeInstances` by private IPv4 addresses (all pages).
    pub async fn describe_instances_by_ip(&self, ips: &[&str]) -> Result<Vec<Instance>, EcsError> {
        let mut out = Vec::new();
        for chunk in ips.chunks(MAX_INSTANCE_IDS) {
            let ips = serde_json::to_string(chunk).unwrap_or_default();
            out.extend(
                self.describe_instances(vec![("PrivateIpAddresses".into(), ips)])
                    .await?,
            );
        }
        Ok(out)
    }

    async fn describe_instances(
        &self,
        params: Vec<(String, String)>,
    ) -> Result<Vec<Instance>, EcsError> {
        const A: &str = "DescribeInstances";
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct R {
            instances: Wrapped<RawInstance>,
            #[serde(default)]
            next_token: String,
        }
        let mut out = Vec::new();
        let mut token = String::new();
        for _page in 0..100 {
            let mut p = self.regional(params.clone());
            // The API's default page is 10 instances; 100 is its maximum.
            p.push(("MaxResults".into(), MAX_INSTANCE_IDS.to_string()));
            if !token.is_empty() {
                p.push(("NextToken".into(), token.clone()));
            }
            let r: R = Self::decode(A, self.call(A, &p).await?)?;
            out.extend(r.instances.items.into_iter().map(Instance::from));
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        Ok(out)
    }

    /// `DescribeInstanceTypes` for one type.
    pub async fn describe_instance_type(
        &self,
        instance_type: &str,
    ) -> Result<Option<InstanceType>, EcsError> {
        Ok(self
            .describe_instance_types(&[instance_type])
            .await?
            .into_iter()
            .find(|t| t.instance_type_id == instance_type))
    }

    /// `DescribeInstanceTypes` for these types: one call per [`MAX_INSTANCE_TYPES`] names.
    pub async fn describe_instance_types(
        &self,
        types: &[&str],
    ) -> Result<Vec<InstanceType>, EcsError> {
        const A: &str = "DescribeInstanceTypes";
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct R {
            instance_types: Wrapped<InstanceType>,
        }
        let mut out = Vec::new();
        for chunk in types.chunks(MAX_INSTANCE_TYPES) {
            let params: Vec<(String, String)> = chunk
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("InstanceTypes.{}", i + 1), t.to_string()))
                .collect();
            let r: R = Self::decode(A, self.call(A, &params).await?)?;
            out.extend(
                r.instance_types
                    .items
                    .into_iter()
                    .filter(|t| chunk.contains(&t.instance_type_id.as_str())),
            );
        }
        Ok(out)
    }

    /// `DescribeNetworkInterfaces` of an instance (all pages).
    pub async fn describe_network_interfaces_of(
        &self,
        instance_id: &str,
    ) -> Result<Vec<NetworkInterface>, EcsError> {
        self.describe_network_interfaces(vec![("InstanceId".into(), instance_id.into())])
            .await
    }

    /// `DescribeNetworkInterfaces` by ENI IDs: one call per [`MAX_ENI_IDS`] IDs (all pages).
    pub async fn describe_network_interfaces_by_id(
        &self,
        ids: &[&str],
    ) -> Result<Vec<NetworkInterface>, EcsError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(MAX_ENI_IDS) {
            let params = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| (format!("NetworkInterfaceId.{}", i + 1), id.to_string()))
                .collect();
            out.extend(self.describe_network_interfaces(params).await?);
        }
        Ok(out)
    }

    /// `DescribeNetworkInterfaces` of the ENIs carrying every one of `tags` (all pages),
    /// attached or not: how the ERIs this controller created for an instance are found again
    /// after they were detached.
    pub async fn describe_network_interfaces_tagged(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<NetworkInterface>, EcsError> {
        self.describe_network_interfaces_tagged_in(tags, None).await
    }

    /// [`EcsClient::describe_network_interfaces_tagged`] narrowed to ENIs in `status`
    /// (`Available`: the detached ones).
    pub async fn describe_network_interfaces_tagged_in(
        &self,
        tags: &BTreeMap<String, String>,
        status: Option<&str>,
    ) -> Result<Vec<NetworkInterface>, EcsError> {
        let mut params = Vec::new();
        for (i, (k, v)) in tags.iter().enumerate() {
            params.push((format!("Tag.{}.Key", i + 1), k.clone()));
            params.push((format!("Tag.{}.Value", i + 1), v.clone()));
        }
        if let Some(s) = status {
            params.push(("Status".into(), s.to_string()));
        }
        self.describe_network_interfaces(params).await
    }

    async fn describe_network_interfaces(
        &self,
        params: Vec<(String, String)>,
    ) -> Result<Vec<NetworkInterface>, EcsError> {
        const A: &str = "DescribeNetworkInterfaces";
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct R {
            network_interface_sets: Wrapped<RawEni>,
            #[serde(default)]
            next_token: String,
        }
        let mut out = Vec::new();
        let mut token = String::new();
        for _page in 0..100 {
            let mut p = self.regional(params.clone());
            // By IDs a page holds them all; a filtered listing takes the API's largest page.
            let by_id = params
                .iter()
                .any(|(k, _)| k.starts_with("NetworkInterfaceId."));
            let page = if by_id { MAX_ENI_IDS } else { MAX_ENI_PAGE };
            p.push(("MaxResults".into(), page.to_string()));
            if !token.is_empty() {
                p.push(("NextToken".into(), token.clone()));
            }
            let r: R = Self::decode(A, self.call(A, &p).await?)?;
            out.extend(
                r.network_interface_sets
                    .items
                    .into_iter()
                    .map(NetworkInterface::from),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        Ok(out)
    }

    /// `CreateNetworkInterface` (idempotent through `req.client_token`): the new ENI's ID and MAC.
    pub async fn create_network_interface(
        &self,
        req: &CreateEni,
    ) -> Result<(String, String), EcsError> {
        const A: &str = "CreateNetworkInterface";
        let mut p: Vec<(String, String)> = vec![
            ("VSwitchId".into(), req.vswitch_id.clone()),
            ("NetworkInterfaceName".into(), req.name.clone()),
            (
                "NetworkInterfaceTrafficMode".into(),
                "HighPerformance".into(),
            ),
            ("QueuePairNumber".into(), req.queue_pair_number.to_string()),
            ("ClientToken".into(), req.client_token.clone()),
            ("RegionId".into(), self.cfg.region.clone()),
        ];
        for (i, sg) in req.security_group_ids.iter().enumerate() {
            p.push((format!("SecurityGroupIds.{}", i + 1), sg.clone()));
        }
        for (i, (k, v)) in req.tags.iter().enumerate() {
            p.push((format!("Tag.{}.Key", i + 1), k.clone()));
            p.push((format!("Tag.{}.Value", i + 1), v.clone()));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct R {
            network_interface_id: String,
            #[serde(default)]
            mac_address: String,
        }
        let r: R = Self::decode(A, self.call(A, &p).await?)?;
        Ok((r.network_interface_id, r.mac_address))
    }

    /// `AttachNetworkInterface`; `NetworkCardIndex` is sent only when it is not 0 (as the original).
    pub async fn attach_network_interface(
        &self,
        eni: &str,
        instance: &str,
        card: i64,
    ) -> Result<(), EcsError> {
        let mut p = self.regional(vec![
            ("NetworkInterfaceId".to_string(), eni.to_string()),
            ("InstanceId".to_string(), instance.to_string()),
        ]);
        if card != 0 {
            p.push(("NetworkCardIndex".into(), card.to_string()));
        }
        self.call("AttachNetworkInterface", &p).await.map(|_| ())
    }

    /// `ModifyNetworkInterfaceAttribute`: switch an ENI to `HighPerformance` with `qp` queue pairs.
    /// This action takes the traffic settings only inside the `NetworkInterfaceTrafficConfig`
    /// struct (unlike `CreateNetworkInterface`, which also defines them at the top level).
    pub async fn make_high_performance(&self, eni: &str, qp: i64) -> Result<(), EcsError> {
        let p = self.regional(vec![
            ("NetworkInterfaceId".to_string(), eni.to_string()),
            (
                "NetworkInterfaceTrafficConfig.NetworkInterfaceTrafficMode".into(),
                "HighPerformance".into(),
            ),
            (
                "NetworkInterfaceTrafficConfig.QueuePairNumber".into(),
                qp.to_string(),
            ),
        ]);
        self.call("ModifyNetworkInterfaceAttribute", &p)
            .await
            .map(|_| ())
    }

    /// `TagResources` on ENIs.
    pub async fn tag_enis(
        &self,
        enis: &[&str],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), EcsError> {
        let mut p = self.regional(vec![("ResourceType".to_string(), "eni".to_string())]);
        for (i, id) in enis.iter().enumerate() {
            p.push((format!("ResourceId.{}", i + 1), id.to_string()));
        }
        for (i, (k, v)) in tags.iter().enumerate() {
            p.push((format!("Tag.{}.Key", i + 1), k.clone()));
            p.push((format!("Tag.{}.Value", i + 1), v.clone()));
        }
        self.call("TagResources", &p).await.map(|_| ())
    }

    /// `DescribeInstanceAttribute.EnableJumboFrame`.
    pub async fn jumbo_frame_enabled(&self, instance: &str) -> Result<bool, EcsError> {
        const A: &str = "DescribeInstanceAttribute";
        let v = self
            .call(A, &[("InstanceId".to_string(), instance.to_string())])
            .await?;
        Ok(v.get("EnableJumboFrame")
            .and_then(Value::as_bool)
            .unwrap_or(false))
    }
}

/// `{"X": {"Item": [...]}}` → the list, whatever the inner key.
#[derive(Debug)]
struct Wrapped<T> {
    items: Vec<T>,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Wrapped<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map: BTreeMap<String, Vec<T>> = Deserialize::deserialize(d)?;
        Ok(Self {
            items: map.into_values().flatten().collect(),
        })
    }
}

fn strings<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Wrapped<String>>::deserialize(d)?
        .map(|w| w.items)
        .unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawInstance {
    instance_id: String,
    #[serde(default)]
    instance_type: String,
    #[serde(default)]
    zone_id: String,
    #[serde(default)]
    vpc_attributes: RawVpc,
    #[serde(default, deserialize_with = "strings")]
    security_group_ids: Vec<String>,
    #[serde(default)]
    network_interfaces: Option<Wrapped<RawInstanceEni>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawInstanceEni {
    network_interface_id: String,
    #[serde(default, rename = "Type")]
    kind: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawVpc {
    #[serde(default)]
    v_switch_id: String,
    #[serde(default)]
    vpc_id: String,
    #[serde(default, deserialize_with = "strings")]
    private_ip_address: Vec<String>,
}

/// An ECS instance (the fields the controller uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `i-…`.
    pub instance_id: String,
    /// e.g. `ecs.ebmgn8v.48xlarge`.
    pub instance_type: String,
    /// Zone.
    pub zone_id: String,
    /// Primary vSwitch.
    pub vswitch_id: String,
    /// VPC.
    pub vpc_id: String,
    /// Primary private IPs.
    pub private_ips: Vec<String>,
    /// Security groups.
    pub security_group_ids: Vec<String>,
    /// The IDs of the ENIs attached to it (`NetworkInterfaces`), primary first.
    pub eni_ids: Vec<String>,
}

impl From<RawInstance> for Instance {
    fn from(r: RawInstance) -> Self {
        Self {
            instance_id: r.instance_id,
            instance_type: r.instance_type,
            zone_id: r.zone_id,
            vswitch_id: r.vpc_attributes.v_switch_id,
            vpc_id: r.vpc_attributes.vpc_id,
            private_ips: r.vpc_attributes.private_ip_address,
            security_group_ids: r.security_group_ids,
            eni_ids: {
                let mut enis = r.network_interfaces.map(|w| w.items).unwrap_or_default();
                enis.sort_by_key(|e| e.kind != "Primary");
                enis.into_iter().map(|e| e.network_interface_id).collect()
            },
        }
    }
}

/// An instance type's eRDMA-relevant capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct InstanceType {
    /// The type name.
    pub instance_type_id: String,
    /// ERIs the type supports (absent or 0: no eRDMA).
    #[serde(default)]
    pub eri_quantity: Option<i64>,
    /// Network cards.
    #[serde(default)]
    pub network_card_quantity: i64,
    /// Queue-pair budget per ERI card.
    #[serde(default)]
    pub queue_pair_number: i64,
    /// GPUs (GPU types get the QP budget per card).
    #[serde(default, rename = "GPUAmount")]
    pub gpu_amount: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEni {
    network_interface_id: String,
    #[serde(default)]
    status: String,
    #[serde(default, rename = "Type")]
    kind: String,
    #[serde(default)]
    mac_address: String,
    #[serde(default)]
    instance_id: String,
    #[serde(default)]
    network_interface_traffic_mode: String,
    #[serde(default)]
    queue_pair_number: Option<i64>,
    #[serde(default)]
    attachment: Option<RawAttachment>,
    #[serde(default)]
    tags: Option<Wrapped<RawTag>>,
    #[serde(default)]
    network_interface_name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAttachment {
    #[serde(default)]
    network_card_index: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawTag {
    tag_key: String,
    #[serde(default)]
    tag_value: String,
}

/// An ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInterface {
    /// `eni-…`.
    pub id: String,
    /// `Available`, `Attaching`, `InUse`, `Detaching`, `Deleting`.
    pub status: String,
    /// `Primary` or `Secondary`.
    pub kind: String,
    /// MAC as ECS returns it (lower case, colons).
    pub mac: String,
    /// Attached instance (empty when not attached).
    pub instance_id: String,
    /// `Standard` or `HighPerformance` (ERI).
    pub traffic_mode: String,
    /// Queue pairs (ERIs).
    pub queue_pair_number: Option<i64>,
    /// Network card index of the attachment (0 when absent).
    pub network_card_index: i64,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Name.
    pub name: String,
}

impl NetworkInterface {
    /// Whether this is the instance's primary ENI.
    pub fn is_primary(&self) -> bool {
        self.kind == "Primary"
    }
    /// Whether this is an ERI (`HighPerformance` traffic mode).
    pub fn is_high_performance(&self) -> bool {
        self.traffic_mode == "HighPerformance"
    }
}

impl From<RawEni> for NetworkInterface {
    fn from(r: RawEni) -> Self {
        Self {
            id: r.network_interface_id,
            status: r.status,
            kind: r.kind,
            mac: r.mac_address,
            instance_id: r.instance_id,
            traffic_mode: r.network_interface_traffic_mode,
            queue_pair_number: r.queue_pair_number,
            network_card_index: r.attachment.and_then(|a| a.network_card_index).unwrap_or(0),
            tags: r
                .tags
                .map(|t| {
                    t.items
                        .into_iter()
                        .map(|t| (t.tag_key, t.tag_value))
                        .collect()
                })
                .unwrap_or_default(),
            name: r.network_interface_name,
        }
    }
}

/// Parameters of `CreateNetworkInterface` for an ERI.
#[derive(Debug, Clone)]
pub struct CreateEni {
    /// vSwitch of the instance.
    pub vswitch_id: String,
    /// Security groups of the instance.
    pub security_group_ids: Vec<String>,
    /// `eri-<instance>-<card>`.
    pub name: String,
    /// Queue pairs.
    pub queue_pair_number: i64,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Idempotency token: the same token for retries of one logical creation.
    pub client_token: String,
}
