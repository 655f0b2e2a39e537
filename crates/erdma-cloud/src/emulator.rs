//! A local ECS + STS API emulator: an HTTP server on 127.0.0.1 that validates V2 and V3
//! signatures against the access keys it knows, checks STS security tokens, and keeps state:
//! instances, instance types, ENIs (with an attach latency: `Attaching` until it has passed),
//! `ClientToken` idempotency, and injected errors (throttling, 5xx, any code). Every accepted call
//! is logged for assertions.
//!
//! What it is faithful to: the request shapes, signature schemes, answer JSON shapes and error
//! shape (`Code`, `Message`, `RequestId`) of the public ECS 2014-05-26 and STS 2015-04-01 APIs for
//! the actions below. What it does not model: quotas, pagination limits other than `MaxResults`,
//! real IP allocation, Detach/Delete.

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
    counter: u64,
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
    let (action, key_id, scheme, token) = if let Some(auth) = header("authorization") {
        let Some(a) = signer::parse_authorization_v3(&auth) else {
            return error(
                400,
                "InvalidAuthorization",
                "Authorization is not ACS3-HMAC-SHA256",
            );
        };
        let Some((secret, _)) = st.keys.get(&a.access_key_id).cloned() else {
            st.rejected.push((
                a.access_key_id.clone(),
                "InvalidAccessKeyId.NotFound".into(),
            ));
            return error(
                404,
                "InvalidAccessKeyId.NotFound",
                "Specified access key is not found.",
            );
        };
        let signed: Vec<(String, String)> = a
            .signed_headers
            .iter()
            .filter_map(|h| header(h).map(|v| (h.clone(), v)))
            .collect();
        let body_hash = signer::sha256_hex(&body);
        if header("x-acs-content-sha256").as_deref() != Some(body_hash.as_str()) {
            return error(
                400,
                "InvalidParameter",
                "x-acs-content-sha256 does not match the body",
            );
        }
        if signed.len() != a.signed_headers.len() {
            return error(400, "IncompleteSignature", "a signed header is missing");
        }
        for required in [
            "host",
            "x-acs-action",
            "x-acs-date",
            "x-acs-signature-nonce",
        ] {
            if !a.signed_headers.iter().any(|h| h == required) {
                return error(
                    400,
                    "IncompleteSignature",
                    &format!("{required} must be signed"),
                );
            }
        }
        let (canonical, _) = signer::canonical_request_v3(&V3Input {
            method: &method,
            path: "/",
            query: &params,
            headers: &signed,
            body_sha256: &body_hash,
        });
        if signer::sign_v3(&canonical, &secret) != a.signature {
            st.rejected
                .push((a.access_key_id.clone(), "SignatureDoesNotMatch".into()));
            return error(
                400,
                "SignatureDoesNotMatch",
                "Specified signature is not matched with our calculation.",
            );
        }
        if let Some(d) = header("x-acs-date")
            && !fresh(&d)
        {
            return error(
                400,
                "InvalidTimeStamp.Expired",
                "x-acs-date is too far from now",
            );
        }
        (
            header("x-acs-action").unwrap_or_default(),
            a.access_key_id,
            "V3",
            header("x-acs-security-token"),
        )
    } else if let Some(sig) = get(&params, "Signature") {
        let id = get(&params, "AccessKeyId").unwrap_or_default();
        let Some((secret, _)) = st.keys.get(&id).cloned() else {
            st.rejected
                .push((id.clone(), "InvalidAccessKeyId.NotFound".into()));
            return error(
                404,
                "InvalidAccessKeyId.NotFound",
                "Specified access key is not found.",
            );
        };
        let unsigned: Vec<(&str, &str)> = params
            .iter()
            .filter(|(k, _)| k != "Signature")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if signer::sign_v2(&method, unsigned, &secret) != sig {
            st.rejected
                .push((id.clone(), "SignatureDoesNotMatch".into()));
            return error(
                400,
                "SignatureDoesNotMatch",
                "Specified signature is not matched with our calculation.",
            );
        }
        if !get(&params, "Timestamp").is_some_and(|t| fresh(&t)) {
            return error(
                400,
                "InvalidTimeStamp.Expired",
                "Timestamp is missing or too far from now",
            );
        }
        (
            get(&params, "Action").unwrap_or_default(),
            id,
            "V2",
            get(&params, "SecurityToken"),
        )
    } else if get(&params, "Action").as_deref() == Some("AssumeRoleWithOIDC") {
        (
            "AssumeRoleWithOIDC".to_string(),
            String::new(),
            "anonymous",
            None,
        )
    } else {
        return error(400, "MissingSignature", "the request is not signed");
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
    let resp = if let Some(i) = injected.and_then(|i| st.inject.remove(i)) {
        error(i.status, &i.code, "injected by the emulator")
    } else {
        st.settle();
        dispatch(&mut st, &action, &p)
    };
    let status = resp.status().as_u16();
    st.calls.push(Call {
        action,
        params: p,
        access_key_id: key_id,
        scheme,
        status,
    });
    resp
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
            &format!("MissingParameter.{name}"),
            &format!("{name} is mandatory"),
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
            let found: Vec<Value> = st
                .instances
                .values()
                .filter(|i| ids.is_empty() || ids.contains(&i.id))
                .filter(|i| ips.is_empty() || ips.contains(&i.private_ip))
                .map(|i| json!({
                    "InstanceId": i.id, "InstanceType": i.instance_type, "RegionId": "emu-region",
                    "ZoneId": "emu-zone-a",
                    "VpcAttributes": {"VSwitchId": i.vswitch_id, "VpcId": "vpc-emu",
                        "PrivateIpAddress": {"IpAddress": [i.private_ip]}},
                    "SecurityGroupIds": {"SecurityGroupId": i.security_groups},
                }))
                .collect();
            answer(
                200,
                json!({"RequestId": "emu", "TotalCount": found.len(), "Instances": {"Instance": found}}),
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
            let inst = p.get("InstanceId");
            let all: Vec<&EmuEni> = st
                .enis
                .values()
                .filter(|e| ids.is_empty() || ids.contains(&e.id))
                .filter(|e| inst.is_none_or(|i| &e.instance_id == i))
                .collect();
            let max: usize = p
                .get("MaxResults")
                .and_then(|m| m.parse().ok())
                .unwrap_or(10)
                .clamp(1, 500);
            let start: usize = p.get("NextToken").and_then(|t| t.parse().ok()).unwrap_or(0);
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
            let sgs = list(p, "SecurityGroupIds");
            if sgs.is_empty() {
                return missing("SecurityGroupIds");
            }
            let id = st.new_eni("Secondary", &vsw, &sgs);
            let e = st.enis.get_mut(&id).expect("just inserted");
            e.name = p.get("NetworkInterfaceName").cloned().unwrap_or_default();
            e.traffic_mode = p
                .get("NetworkInterfaceTrafficMode")
                .cloned()
                .unwrap_or_else(|| "Standard".into());
            e.queue_pairs = p.get("QueuePairNumber").and_then(|q| q.parse().ok());
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
            if let Some(m) = p.get("NetworkInterfaceTrafficMode") {
                e.traffic_mode = m.clone();
            }
            if let Some(q) = p.get("QueuePairNumber").and_then(|q| q.parse().ok()) {
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
