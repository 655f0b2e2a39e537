//! A local ECS + STS API emulator: an HTTP server on 127.0.0.1 that validates V2 and V3
//! signatures against the access keys it knows, checks STS security tokens, and keeps state:
//! instances, instance types, ENIs (with an attach latency: `Attaching` until it has passed),
//! `ClientToken` idempotency, and injected errors (throttling, 5xx, any code). Every accepted call
//! is logged for assertions.
//!
//! What it is faithful to: the request shapes, signature schemes, answer JSON shapes and error
//! shape (`Code`, `Message`, `RequestId`) of the public ECS 2014-05-26 and STS 2015-04-01 APIs for
//! the actions below.
//!
//! - Parameters: for the 8 ECS actions, every parameter name is checked against the list the
//!   official SDK defines ([`crate::apispec`], generated from the SDK, never hand-kept): an
//!   undefined one is answered `400 InvalidParameter` `The specified parameter "X" is not valid.`
//!   (the code and message ECS gives for a parameter it does not accept, e.g.
//!   aliyun/alibaba-cloud-sdk-go#405, kubernetes-sigs/alibaba-cloud-csi-driver#767; the generic
//!   gateway table help.aliyun.com/document_detail/48054 lists `Missing{ParameterName}` for an
//!   absent required one, answered here too). Real ECS may also ignore some unknown names
//!   silently; the emulator is strict on purpose, so a wrong name fails a test instead.
//! - Signatures: [`verify_signature`] checks V3 over exactly the headers `SignedHeaders` names (the
//!   official SDK signs `user-agent` and `accept` too) and V2 over every parameter; it is pinned to
//!   the official signers' vectors in `tests/signature_vectors.rs`. Timestamps older than 15 min
//!   are refused (`InvalidTimeStamp.Expired`).
//!
//! - Scale: `DescribeInstances` pages 10 instances by default and 100 at most (`MaxResults`,
//!   `NextToken`) and lists each instance's ENIs (`NetworkInterfaces`); it and
//!   `DescribeNetworkInterfaces` refuse more than 100 IDs (the SDK documents 100 as the limit of
//!   `InstanceIds` and `NetworkInterfaceId.N`). [`EmuState::throttle`] answers a call over an
//!   action's rate `400 Throttling.User` `Request was denied due to user flow control.`, as ECS
//!   answers an account over its per-API quota.
//!
//! What it does not model: quotas other than the per-action rate, real IP allocation,
//! Detach/Delete, nonce reuse (`SignatureNonceUsed`), value validation beyond the IDs it keeps.

use crate::encode::{iso8601, parse_iso8601, percent_decode};
use crate::signer::{self, V3Input};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The VPC of every instance unless [`EmuState::instance_vpcs`] names another.
pub const EMU_VPC: &str = "vpc-emu";

/// An instance.
#[derive(Debug, Clone)]
pub struct EmuInstance {
    /// ID.
    pub id: String,
    /// Type name (must exist in `instance_types` for `DescribeInstanceTypes`).
    pub instance_type: String,
    /// Primary private IP.
    pub private_ip: String,
    /// vSwitch.
    pub vswitch_id: String,
    /// Security groups.
    pub security_groups: Vec<String>,
    /// `DescribeInstanceAttribute.EnableJumboFrame`; `None` answers an error.
    pub jumbo_frame: Option<bool>,
}

/// An instance type.
#[derive(Debug, Clone)]
pub struct EmuInstanceType {
    /// Name.
    pub id: String,
    /// `EriQuantity` (None: field absent).
    pub eri_quantity: Option<i64>,
    /// `NetworkCardQuantity`.
    pub network_cards: i64,
    /// `QueuePairNumber`.
    pub queue_pairs: i64,
    /// `GPUAmount`.
    pub gpus: i64,
}

/// An ENI.
#[derive(Debug, Clone)]
pub struct EmuEni {
    /// ID.
    pub id: String,
    /// MAC.
    pub mac: String,
    /// `Primary` / `Secondary`.
    pub kind: String,
    /// Attached instance or empty.
    pub instance_id: String,
    /// `Available` / `Attaching` / `InUse`.
    pub status: String,
    /// `Standard` / `HighPerformance`.
    pub traffic_mode: String,
    /// Queue pairs.
    pub queue_pairs: Option<i64>,
    /// Card index of the attachment.
    pub card_index: i64,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Name.
    pub name: String,
    /// vSwitch.
    pub vswitch_id: String,
    /// Security groups.
    pub security_groups: Vec<String>,
    /// While `Attaching`: when it becomes `InUse`.
    pub attach_done_at: Option<Instant>,
}

/// An error to inject.
#[derive(Debug, Clone)]
pub struct Injected {
    /// Only for this action (`None`: any).
    pub action: Option<String>,
    /// HTTP status.
    pub status: u16,
    /// Error code.
    pub code: String,
}

/// One accepted call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Action.
    pub action: String,
    /// Parameters (decoded), without the signature ones.
    pub params: BTreeMap<String, String>,
    /// Every parameter name as sent (query and form body, signature ones included), in order.
    pub sent: Vec<String>,
    /// V3: the headers the request signed (`SignedHeaders`); empty otherwise.
    pub signed_headers: Vec<String>,
    /// Access key ID used (empty for anonymous STS calls).
    pub access_key_id: String,
    /// `V2` or `V3` or `anonymous`.
    pub scheme: &'static str,
    /// The answer's HTTP status.
    pub status: u16,
}

/// The emulator's state; lock it with [`EcsEmulator::state`] to arrange or inspect.
#[derive(Debug, Default)]
pub struct EmuState {
    /// Access key ID → (secret, required STS token).
    pub keys: BTreeMap<String, (String, Option<String>)>,
    /// Instances by ID.
    pub instances: BTreeMap<String, EmuInstance>,
    /// Instance types by name.
    pub instance_types: BTreeMap<String, EmuInstanceType>,
    /// ENIs by ID.
    pub enis: BTreeMap<String, EmuEni>,
    /// How long `Attaching` lasts.
    pub attach_latency: Duration,
    /// Errors answered before normal processing, first first.
    pub inject: VecDeque<Injected>,
    /// ClientToken → ENI created with it.
    pub client_tokens: BTreeMap<String, String>,
    /// Accepted calls (signature valid), in order.
    pub calls: Vec<Call>,
    /// Calls rejected for authentication, with the code.
    pub rejected: Vec<(String, String)>,
    /// STS: OIDC token accepted by `AssumeRoleWithOIDC` → role ARN.
    pub oidc_tokens: BTreeMap<String, String>,
    /// STS credentials lifetime.
    pub sts_lifetime: Duration,
    /// Per-action flow control of the ECS actions (`None`: none): beyond it a call is answered
    /// HTTP 400 `Throttling.User`, as ECS answers an account over its quota for an API.
    pub throttle: Option<Throttle>,
    /// Calls answered `Throttling.User` by [`EmuState::throttle`], per action.
    pub throttled: BTreeMap<String, u64>,
    /// Instances in a VPC other than [`EMU_VPC`] (instance ID → VPC ID).
    pub instance_vpcs: BTreeMap<String, String>,
    buckets: BTreeMap<String, (f64, Instant)>,
    counter: u64,
}

/// A token bucket per action: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy)]
pub struct Throttle {
    /// Calls per second per action.
    pub per_second: f64,
    /// Calls at once after a quiet period.
    pub burst: u32,
}

impl EmuState {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Adds an access key.
    pub fn add_key(&mut self, id: &str, secret: &str) {
        self.keys.insert(id.into(), (secret.into(), None));
    }

    /// Adds an instance type.
    pub fn add_type(&mut self, t: EmuInstanceType) {
        self.instance_types.insert(t.id.clone(), t);
    }

    /// Adds an instance with its primary ENI (Standard, InUse, card 0); returns the primary ENI ID.
    pub fn add_instance(&mut self, i: EmuInstance) -> String {
        let eni = self.new_eni("Primary", &i.vswitch_id, &i.security_groups);
        let e = self.enis.get_mut(&eni).expect("just inserted");
        e.instance_id = i.id.clone();
        e.status = "InUse".into();
        self.instances.insert(i.id.clone(), i);
        eni
    }

    /// Adds a secondary ENI in `status` (attached to `instance` on `card` unless `Available`).
    pub fn add_secondary_eni(
        &mut self,
        instance: &str,
        card: i64,
        traffic_mode: &str,
        status: &str,
        tags: &[(&str, &str)],
    ) -> String {
        let (vsw, sgs) = self
            .instances
            .get(instance)
            .map(|i| (i.vswitch_id.clone(), i.security_groups.clone()))
            .unwrap_or_default();
        let id = self.new_eni("Secondary", &vsw, &sgs);
        let e = self.enis.get_mut(&id).expect("just inserted");
        e.traffic_mode = traffic_mode.into();
        if traffic_mode == "HighPerformance" {
            e.queue_pairs = Some(8);
        }
        e.status = status.into();
        if status != "Available" {
            e.instance_id = instance.into();
            e.card_index = card;
        }
        e.tags = tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        id
    }

    fn new_eni(&mut self, kind: &str, vsw: &str, sgs: &[String]) -> String {
        let n = self.next();
        let id = format!("eni-emu{n:012x}");
        let mac = format!(
            "00:16:3e:{:02x}:{:02x}:{:02x}",
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        );
        self.enis.insert(
            id.clone(),
            EmuEni {
                id: id.clone(),
                mac,
                kind: kind.into(),
                instance_id: String::new(),
                status: "Available".into(),
                traffic_mode: "Standard".into(),
                queue_pairs: None,
                card_index: 0,
                tags: BTreeMap::new(),
                name: String::new(),
                vswitch_id: vsw.into(),
                security_groups: sgs.to_vec(),
                attach_done_at: None,
            },
        );
        id
    }

    /// Injects `times` errors `code` with `status` for `action` (or any action).
    pub fn inject_error(&mut self, action: Option<&str>, status: u16, code: &str, times: usize) {
        for _ in 0..times {
            self.inject.push_back(Injected {
                action: action.map(str::to_string),
                status,
                code: code.into(),
            });
        }
    }

    /// The accepted calls of `action`.
    pub fn calls_of(&self, action: &str) -> Vec<&Call> {
        self.calls.iter().filter(|c| c.action == action).collect()
    }

    /// Takes a token of `action`'s bucket; false when the call is over the quota.
    fn admit(&mut self, action: &str) -> bool {
        let Some(t) = self.throttle else {
            return true;
        };
        let burst = f64::from(t.burst.max(1));
        let now = Instant::now();
        let (tokens, last) = self
            .buckets
            .entry(action.to_string())
            .or_insert((burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*last).as_secs_f64() * t.per_second)
            .min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            *self.throttled.entry(action.to_string()).or_default() += 1;
            false
        }
    }

    fn settle(&mut self) {
        let now = Instant::now();
        for e in self.enis.values_mut() {
            if e.status == "Attaching" && e.attach_done_at.is_some_and(|t| t <= now) {
                e.status = "InUse".into();
                e.attach_done_at = None;
            }
        }
    }
}

/// The running emulator. Dropping it stops the server.
#[derive(Debug)]
pub struct EcsEmulator {
    addr: SocketAddr,
    state: Arc<Mutex<EmuState>>,
    stop: CancellationToken,
}

impl Drop for EcsEmulator {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EcsEmulator {
    /// Starts on `127.0.0.1:<free port>`.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(EmuState {
            sts_lifetime: Duration::from_secs(3600),
            ..EmuState::default()
        }));
        let stop = CancellationToken::new();
        let (st, token) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    _ = token.cancelled() => break,
                    c = listener.accept() => c,
                };
                let Ok((stream, _)) = conn else { continue };
                let st = st.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(st, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    tokio::select! {
                        _ = token.cancelled() => {},
                        _ = conn => {},
                    }
                });
            }
        });
        Ok(Self { addr, state, stop })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Locks the state.
    pub fn state(&self) -> MutexGuard<'_, EmuState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn answer(status: u16, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn error(status: u16, code: &str, message: &str) -> Response<Full<Bytes>> {
    answer(
        status,
        json!({"RequestId": "emu-req", "HostId": "ecs.emulator", "Code": code, "Message": message}),
    )
}

fn parse_pairs(s: &str) -> Option<Vec<(String, String)>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

async fn handle(state: Arc<Mutex<EmuState>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return error(400, "InvalidParameter", "unreadable body"),
    };
    let Some(mut params) = parse_pairs(&query) else {
        return error(400, "InvalidParameter", "bad query encoding");
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let is_form =
        header("content-type").is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if is_form {
        let Some(form) = std::str::from_utf8(&body).ok().and_then(parse_pairs) else {
            return error(400, "InvalidParameter", "bad form body");
        };
        params.extend(form);
    }
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let get = |params: &[(String, String)], k: &str| {
        params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    };

    // Authentication.
    let anonymous = header("authorization").is_none()
        && get(&params, "Signature").is_none()
        && get(&params, "Action").as_deref() == Some("AssumeRoleWithOIDC");
    let (action, key_id, scheme, token, signed_headers) = if anonymous {
        (
            "AssumeRoleWithOIDC".to_string(),
            String::new(),
            "anonymous",
            None,
            Vec::new(),
        )
    } else {
        let keys = &st.keys;
        let verified = verify_signature(&method, &params, &headers, &body, |id| {
            keys.get(id).map(|(secret, _)| secret.clone())
        });
        let v = match verified {
            Ok(v) => v,
            Err(r) => {
                if let Some(id) = r.access_key_id {
                    st.rejected.push((id, r.code.clone()));
                }
                return error(r.status, &r.code, &r.message);
            }
        };
        if !fresh(&v.date) {
            return error(
                400,
                "InvalidTimeStamp.Expired",
                "Specified time stamp or date value is expired.",
            );
        }
        (
            v.action,
            v.access_key_id,
            v.scheme,
            v.security_token,
            v.signed_headers,
        )
    };
    if let Some((_, Some(required))) = st.keys.get(&key_id)
        && token.as_deref() != Some(required.as_str())
    {
        st.rejected
            .push((key_id.clone(), "InvalidSecurityToken.Mismatch".into()));
        return error(
            400,
            "InvalidSecurityToken.Mismatch",
            "the security token does not match the access key",
        );
    }
    let sent: Vec<String> = params.iter().map(|(k, _)| k.clone()).collect();
    let checked = check_params(&action, &sent, scheme == "V2");

    let p: BTreeMap<String, String> = params
        .into_iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "Signature"
                    | "SignatureNonce"
                    | "Timestamp"
                    | "SignatureMethod"
                    | "SignatureVersion"
            )
        })
        .collect();
    let injected = st
        .inject
        .iter()
        .position(|i| i.action.as_deref().is_none_or(|a| a == action));
    let is_ecs = crate::apispec::ACTIONS.contains(&action.as_str());
    let resp = if let Some(i) = injected.and_then(|i| st.inject.remove(i)) {
        error(i.status, &i.code, "injected by the emulator")
    } else if let Some(resp) = checked {
        resp
    } else if is_ecs && !st.admit(&action) {
        error(
            400,
            "Throttling.User",
            "Request was denied due to user flow control.",
        )
    } else {
        st.settle();
        dispatch(&mut st, &action, &p)
    };
    let status = resp.status().as_u16();
    st.calls.push(Call {
        action,
        params: p,
        sent,
        signed_headers,
        access_key_id: key_id,
        scheme,
        status,
    });
    resp
}

/// A request whose signature verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `V2` or `V3`.
    pub scheme: &'static str,
    /// The access key that signed.
    pub access_key_id: String,
    /// The action (`x-acs-action` or `Action`).
    pub action: String,
    /// `x-acs-security-token` or `SecurityToken`.
    pub security_token: Option<String>,
    /// `x-acs-date` or `Timestamp` (freshness is the caller's check).
    pub date: String,
    /// V3: the header names `SignedHeaders` lists (empty for V2).
    pub signed_headers: Vec<String>,
}

/// Why a request's signature was refused, as ECS answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// HTTP status.
    pub status: u16,
    /// ECS error code (`SignatureDoesNotMatch`, `InvalidAccessKeyId.NotFound`, ...).
    pub code: String,
    /// Message.
    pub message: String,
    /// The access key, when the refusal is about it or its signature.
    pub access_key_id: Option<String>,
}

fn rejected(status: u16, code: &str, message: &str, id: Option<&str>) -> Rejected {
    Rejected {
        status,
        code: code.into(),
        message: message.into(),
        access_key_id: id.map(str::to_string),
    }
}

/// The emulator's signature check, as a function (the server calls it for every request; the
/// tests feed it the official SDK's known-answer vectors): a V3 `Authorization` header or a V2
/// `Signature` parameter, verified with the secret `secret_of` gives for the access key. `params`
/// are the decoded query and form-body parameters, `headers` every request header. Timestamps
/// are not checked here (see [`Verified::date`]).
pub fn verify_signature(
    method: &str,
    params: &[(String, String)],
    headers: &[(String, String)],
    body: &[u8],
    secret_of: impl Fn(&str) -> Option<String>,
) -> Result<Verified, Rejected> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if let Some(auth) = header("authorization") {
        let Some(a) = signer::parse_authorization_v3(&auth) else {
            return Err(rejected(
                400,
                "InvalidAuthorization",
                "Authorization is not ACS3-HMAC-SHA256",
                None,
            ));
        };
        let id = a.access_key_id.as_str();
        let Some(secret) = secret_of(id) else {
            return Err(rejected(
                404,
                "InvalidAccessKeyId.NotFound",
                "Specified access key is not found.",
                Some(id),
            ));
        };
        let body_hash = signer::sha256_hex(body);
        if header("x-acs-content-sha256").as_deref() != Some(body_hash.as_str()) {
            return Err(rejected(
                400,
                "InvalidParameter",
                "x-acs-content-sha256 does not match the body",
                None,
            ));
        }
        // Every header SignedHeaders names, each value it was sent with.
        let mut signed: Vec<(String, String)> = Vec::new();
        for name in &a.signed_headers {
            let values: Vec<(String, String)> = headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .cloned()
                .collect();
            if values.is_empty() {
                return Err(rejected(
                    400,
                    "IncompleteSignature",
                    &format!("signed header {name} is missing"),
                    None,
                ));
            }
            signed.extend(values);
        }
        for required in [
            "host",
            "x-acs-action",
            "x-acs-date",
            "x-acs-signature-nonce",
        ] {
            if !a.signed_headers.iter().any(|h| h == required) {
                return Err(rejected(
                    400,
                    "IncompleteSignature",
                    &format!("{required} must be signed"),
                    None,
                ));
            }
        }
        let (canonical, _) = signer::canonical_request_v3(&V3Input {
            method,
            path: "/",
            query: params_in_query(params, headers, body).as_slice(),
            headers: &signed,
            body_sha256: &body_hash,
        });
        if signer::sign_v3(&canonical, &secret) != a.signature {
            return Err(rejected(
                400,
                "SignatureDoesNotMatch",
                "Specified signature is not matched with our calculation.",
                Some(id),
            ));
        }
        return Ok(Verified {
            scheme: "V3",
            access_key_id: a.access_key_id.clone(),
            action: header("x-acs-action").unwrap_or_default(),
            security_token: header("x-acs-security-token"),
            date: header("x-acs-date").unwrap_or_default(),
            signed_headers: a.signed_headers.clone(),
        });
    }
    let Some(sig) = get("Signature") else {
        return Err(rejected(
            400,
            "MissingSignature",
            "the request is not signed",
            None,
        ));
    };
    let id = get("AccessKeyId").unwrap_or_default();
    let Some(secret) = secret_of(&id) else {
        return Err(rejected(
            404,
            "InvalidAccessKeyId.NotFound",
            "Specified access key is not found.",
            Some(&id),
        ));
    };
    let unsigned: Vec<(&str, &str)> = params
        .iter()
        .filter(|(k, _)| k != "Signature")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if signer::sign_v2(method, unsigned, &secret) != sig {
        return Err(rejected(
            400,
            "SignatureDoesNotMatch",
            "Specified signature is not matched with our calculation.",
            Some(&id),
        ));
    }
    Ok(Verified {
        scheme: "V2",
        access_key_id: id,
        action: get("Action").unwrap_or_default(),
        security_token: get("SecurityToken"),
        date: get("Timestamp").unwrap_or_default(),
        signed_headers: Vec::new(),
    })
}

/// V3 signs the query string only; a form body is covered by `x-acs-content-sha256`. `params`
/// holds both, so the form's pairs (the tail, as `handle` appends them) are dropped here.
fn params_in_query(
    params: &[(String, String)],
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<(String, String)> {
    let is_form = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-type") && v.starts_with("application/x-www-form-urlencoded")
    });
    let form_len = if is_form {
        std::str::from_utf8(body)
            .ok()
            .and_then(parse_pairs)
            .map_or(0, |f| f.len())
    } else {
        0
    };
    params[..params.len().saturating_sub(form_len)].to_vec()
}

/// Checks the parameter names of an ECS action against the SDK-generated list
/// ([`crate::apispec`]): a name the action does not define is answered as ECS answers an invalid
/// parameter (HTTP 400 `InvalidParameter`, `The specified parameter "X" is not valid.`), a
/// missing required one as ECS answers that (HTTP 400 `Missing<Name>`, `<Name> is mandatory for
/// this action.`). Actions outside the data (STS) are not checked here.
/// `None` when the names are fine, else the error answer.
fn check_params(action: &str, sent: &[String], v2: bool) -> Option<Response<Full<Bytes>>> {
    let spec = match crate::apispec::ecs() {
        Ok(s) => s,
        Err(e) => return Some(error(500, "InternalError", &e)),
    };
    // Actions outside the data (STS) pass.
    spec.action(action)?;
    match spec.check(action, sent.iter().map(String::as_str), v2) {
        Ok(()) => None,
        Err(crate::apispec::ParamError::Missing(n)) => Some(error(
            400,
            &format!("Missing{n}"),
            &format!("{n} is mandatory for this action."),
        )),
        Err(crate::apispec::ParamError::Unknown(n)) => Some(error(
            400,
            "InvalidParameter",
            &format!("The specified parameter \"{n}\" is not valid."),
        )),
        Err(e @ crate::apispec::ParamError::UnknownAction(_)) => {
            Some(error(400, "InvalidAction.NotFound", &e.to_string()))
        }
    }
}

fn fresh(ts: &str) -> bool {
    let Some(t) = parse_iso8601(ts) else {
        return false;
    };
    let now = SystemTime::now();
    let skew = now.duration_since(t).or_else(|_| t.duration_since(now));
    skew.is_ok_and(|d| d <= Duration::from_secs(15 * 60))
}

fn list(p: &BTreeMap<String, String>, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 1.. {
        match p.get(&format!("{prefix}.{i}")) {
            Some(v) => out.push(v.clone()),
            None => break,
        }
    }
    out
}

fn tags(p: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for i in 1.. {
        match p.get(&format!("Tag.{i}.Key")) {
            Some(k) => out.push((
                k.clone(),
                p.get(&format!("Tag.{i}.Value"))
                    .cloned()
                    .unwrap_or_default(),
            )),
            None => break,
        }
    }
    out
}

/// `NextToken` (the index of the page's first item here) and `MaxResults` (below 10: 10, above
/// `max`: `max`, as the API documents it).
fn page(p: &BTreeMap<String, String>, default: usize, max: usize) -> (usize, usize) {
    let size: usize = p
        .get("MaxResults")
        .and_then(|m| m.parse().ok())
        .unwrap_or(default)
        .clamp(default, max);
    let start: usize = p.get("NextToken").and_then(|t| t.parse().ok()).unwrap_or(0);
    (start, size)
}

fn eni_json(e: &EmuEni) -> Value {
    let mut v = json!({
        "NetworkInterfaceId": e.id, "Status": e.status, "Type": e.kind, "MacAddress": e.mac,
        "InstanceId": e.instance_id, "NetworkInterfaceTrafficMode": e.traffic_mode,
        "NetworkInterfaceName": e.name, "VSwitchId": e.vswitch_id,
        "SecurityGroupIds": {"SecurityGroupId": e.security_groups},
        "Tags": {"Tag": e.tags.iter().map(|(k, v)| json!({"TagKey": k, "TagValue": v})).collect::<Vec<_>>()},
    });
    if let Some(q) = e.queue_pairs {
        v["QueuePairNumber"] = json!(q);
    }
    if !e.instance_id.is_empty() {
        v["Attachment"] = json!({"InstanceId": e.instance_id, "NetworkCardIndex": e.card_index});
    }
    v
}

fn dispatch(
    st: &mut EmuState,
    action: &str,
    p: &BTreeMap<String, String>,
) -> Response<Full<Bytes>> {
    let missing = |name: &str| {
        error(
            400,
            &format!("Missing{name}"),
            &format!("{name} is mandatory for this action."),
        )
    };
    match action {
        "DescribeInstances" => {
            let ids: Vec<String> = p
                .get("InstanceIds")
                .map(|s| serde_json::from_str(s).unwrap_or_default())
                .unwrap_or_default();
            let ips: Vec<String> = p
                .get("PrivateIpAddresses")
                .map(|s| serde_json::from_str(s).unwrap_or_default())
                .unwrap_or_default();
            if ids.len() > 100 || ips.len() > 100 {
                return error(
                    400,
                    "InvalidParameter",
                    "The specified parameter \"InstanceIds\" is not valid.",
                );
            }
            let all: Vec<&EmuInstance> = st
                .instances
                .values()
                .filter(|i| ids.is_empty() || ids.contains(&i.id))
                .filter(|i| ips.is_empty() || ips.contains(&i.private_ip))
                .collect();
            let (start, max) = page(p, 10, 100);
            let mut enis: BTreeMap<&str, Vec<&EmuEni>> = BTreeMap::new();
            for i in all.iter().skip(start).take(max) {
                enis.insert(&i.id, Vec::new());
            }
            for e in st.enis.values() {
                if let Some(v) = enis.get_mut(e.instance_id.as_str()) {
                    v.push(e);
                }
            }
            let found: Vec<Value> = all
                .iter()
                .skip(start)
                .take(max)
                .map(|i| json!({
                    "InstanceId": i.id, "InstanceType": i.instance_type, "RegionId": "emu-region",
                    "ZoneId": "emu-zone-a",
                    "VpcAttributes": {"VSwitchId": i.vswitch_id,
                        "VpcId": st.instance_vpcs.get(&i.id).map_or(EMU_VPC, String::as_str),
                        "PrivateIpAddress": {"IpAddress": [i.private_ip]}},
                    "SecurityGroupIds": {"SecurityGroupId": i.security_groups},
                    "NetworkInterfaces": {"NetworkInterface": enis.get(i.id.as_str()).map(|v| v.iter().map(|e| json!({
                        "NetworkInterfaceId": e.id, "Type": e.kind, "MacAddress": e.mac,
                    })).collect::<Vec<_>>()).unwrap_or_default()},
                }))
                .collect();
            let next = if start + max < all.len() {
                (start + max).to_string()
            } else {
                String::new()
            };
            answer(
                200,
                json!({"RequestId": "emu", "TotalCount": all.len(), "NextToken": next,
                "Instances": {"Instance": found}}),
            )
        }
        "DescribeInstanceTypes" => {
            let wanted = list(p, "InstanceTypes");
            let found: Vec<Value> = st
                .instance_types
                .values()
                .filter(|t| wanted.is_empty() || wanted.contains(&t.id))
                .map(|t| {
                    let mut v = json!({"InstanceTypeId": t.id, "NetworkCardQuantity": t.network_cards,
                        "QueuePairNumber": t.queue_pairs, "GPUAmount": t.gpus});
                    if let Some(q) = t.eri_quantity {
                        v["EriQuantity"] = json!(q);
                    }
                    v
                })
                .collect();
            answer(
                200,
                json!({"RequestId": "emu", "InstanceTypes": {"InstanceType": found}}),
            )
        }
        "DescribeNetworkInterfaces" => {
            let ids = list(p, "NetworkInterfaceId");
            if ids.len() > 100 {
                return error(
                    400,
                    "InvalidParameter",
                    "The specified parameter \"NetworkInterfaceId.N\" is not valid.",
                );
            }
            let inst = p.get("InstanceId");
            let status = p.get("Status");
            let wanted_tags = tags(p);
            let all: Vec<&EmuEni> = if ids.is_empty() {
                st.enis.values().collect()
            } else {
                ids.iter().filter_map(|id| st.enis.get(id)).collect()
            };
            let all: Vec<&EmuEni> = all
                .into_iter()
                .filter(|e| inst.is_none_or(|i| &e.instance_id == i))
                .filter(|e| status.is_none_or(|s| &e.status == s))
                .filter(|e| wanted_tags.iter().all(|(k, v)| e.tags.get(k) == Some(v)))
                .collect();
            let (start, max) = page(p, 10, 500);
            let page: Vec<Value> = all
                .iter()
                .skip(start)
                .take(max)
                .map(|e| eni_json(e))
                .collect();
            let next = if start + max < all.len() {
                (start + max).to_string()
            } else {
                String::new()
            };
            answer(
                200,
                json!({"RequestId": "emu", "TotalCount": all.len(), "NextToken": next,
                "NetworkInterfaceSets": {"NetworkInterfaceSet": page}}),
            )
        }
        "CreateNetworkInterface" => {
            let Some(vsw) = p.get("VSwitchId").cloned() else {
                return missing("VSwitchId");
            };
            if let Some(id) = p
                .get("ClientToken")
                .and_then(|t| st.client_tokens.get(t))
                .cloned()
            {
                let mac = st.enis.get(&id).map(|e| e.mac.clone()).unwrap_or_default();
                return answer(
                    200,
                    json!({"RequestId": "emu", "NetworkInterfaceId": id, "MacAddress": mac, "Status": "Available"}),
                );
            }
            let mut sgs = list(p, "SecurityGroupIds");
            sgs.extend(p.get("SecurityGroupId").cloned());
            if sgs.is_empty() {
                return missing("SecurityGroupIds");
            }
            let id = st.new_eni("Secondary", &vsw, &sgs);
            let e = st.enis.get_mut(&id).expect("just inserted");
            e.name = p.get("NetworkInterfaceName").cloned().unwrap_or_default();
            // Create defines the traffic settings both nested and at the top level.
            e.traffic_mode = p
                .get("NetworkInterfaceTrafficConfig.NetworkInterfaceTrafficMode")
                .or_else(|| p.get("NetworkInterfaceTrafficMode"))
                .cloned()
                .unwrap_or_else(|| "Standard".into());
            e.queue_pairs = p
                .get("NetworkInterfaceTrafficConfig.QueuePairNumber")
                .or_else(|| p.get("QueuePairNumber"))
                .and_then(|q| q.parse().ok());
            e.tags = tags(p).into_iter().collect();
            let mac = e.mac.clone();
            if let Some(t) = p.get("ClientToken") {
                st.client_tokens.insert(t.clone(), id.clone());
            }
            answer(
                200,
                json!({"RequestId": "emu", "NetworkInterfaceId": id, "MacAddress": mac, "Status": "Available"}),
            )
        }
        "AttachNetworkInterface" => {
            let (Some(eni), Some(inst)) = (p.get("NetworkInterfaceId"), p.get("InstanceId")) else {
                return missing("NetworkInterfaceId/InstanceId");
            };
            if !st.instances.contains_key(inst) {
                return error(
                    404,
                    "InvalidInstanceId.NotFound",
                    "The specified instance does not exist.",
                );
            }
            let latency = st.attach_latency;
            let Some(e) = st.enis.get_mut(eni) else {
                return error(
                    404,
                    "InvalidEniId.NotFound",
                    "The specified ENI does not exist.",
                );
            };
            if e.status != "Available" {
                return error(
                    403,
                    "InvalidOperation.InvalidEniState",
                    "The ENI is not Available.",
                );
            }
            e.instance_id = inst.clone();
            e.card_index = p
                .get("NetworkCardIndex")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            if latency.is_zero() {
                e.status = "InUse".into();
            } else {
                e.status = "Attaching".into();
                e.attach_done_at = Some(Instant::now() + latency);
            }
            answer(200, json!({"RequestId": "emu"}))
        }
        "ModifyNetworkInterfaceAttribute" => {
            let Some(e) = p
                .get("NetworkInterfaceId")
                .and_then(|id| st.enis.get_mut(id))
            else {
                return error(
                    404,
                    "InvalidEniId.NotFound",
                    "The specified ENI does not exist.",
                );
            };
            if let Some(m) = p.get("NetworkInterfaceTrafficConfig.NetworkInterfaceTrafficMode") {
                e.traffic_mode = m.clone();
            }
            if let Some(q) = p
                .get("NetworkInterfaceTrafficConfig.QueuePairNumber")
                .and_then(|q| q.parse().ok())
            {
                e.queue_pairs = Some(q);
            }
            answer(200, json!({"RequestId": "emu"}))
        }
        "TagResources" => {
            if p.get("ResourceType").map(String::as_str) != Some("eni") {
                return error(
                    400,
                    "InvalidResourceType.NotSupported",
                    "ResourceType must be eni here",
                );
            }
            let new_tags = tags(p);
            for id in list(p, "ResourceId") {
                let Some(e) = st.enis.get_mut(&id) else {
                    return error(
                        404,
                        "InvalidResourceId.NotFound",
                        "The specified resource does not exist.",
                    );
                };
                e.tags.extend(new_tags.iter().cloned());
            }
            answer(200, json!({"RequestId": "emu"}))
        }
        "DescribeInstanceAttribute" => {
            let Some(i) = p.get("InstanceId").and_then(|id| st.instances.get(id)) else {
                return error(
                    404,
                    "InvalidInstanceId.NotFound",
                    "The specified instance does not exist.",
                );
            };
            match i.jumbo_frame {
                Some(j) => answer(
                    200,
                    json!({"RequestId": "emu", "InstanceId": i.id, "EnableJumboFrame": j}),
                ),
                None => error(500, "InternalError", "jumbo frame attribute unavailable"),
            }
        }
        "AssumeRoleWithOIDC" => {
            let token = p.get("OIDCToken").cloned().unwrap_or_default();
            let role = p.get("RoleArn").cloned().unwrap_or_default();
            if st.oidc_tokens.get(&token) != Some(&role) {
                return error(
                    400,
                    "AuthenticationFail.OIDCToken.Invalid",
                    "The OIDC token is invalid for this role.",
                );
            }
            let n = st.next();
            let (id, secret, sts) = (
                format!("STS.emu{n}"),
                format!("sts-secret-{n}"),
                format!("sts-token-{n}"),
            );
            st.keys
                .insert(id.clone(), (secret.clone(), Some(sts.clone())));
            let exp = iso8601(SystemTime::now() + st.sts_lifetime);
            answer(
                200,
                json!({"RequestId": "emu", "Credentials": {"AccessKeyId": id,
                "AccessKeySecret": secret, "SecurityToken": sts, "Expiration": exp}}),
            )
        }
        other => error(
            400,
            "InvalidAction.NotFound",
            &format!("Specified api {other} is not found"),
        ),
    }
}
