//! An in-memory Kubernetes API server, served as a tower service to `kube::Client::new`: the
//! client, its serialisation, URL building, errors and watch streaming all run for real; only the
//! API server behind the HTTP boundary is replaced. It is a test double: it behaves like an API
//! server where erdma's code depends on it, and no further.
//!
//! Modelled:
//! - GET (object, list with `labelSelector` equality terms and `fieldSelector` terms; a list
//!   without a namespace spans every namespace). Field selectors: for the resources of
//!   [`FIELD_LABELS`] every label the API server accepts is honoured (`=`, `==`, `!=`) and any
//!   other is refused with 400 `BadRequest`, as the API server's field label conversion refuses
//!   it; for other resources only `metadata.name` is honoured and other terms are ignored,
//!   (not modelled). Lists and watches alike. Lists in pages (`limit`, `continue`, as
//!   `Api::list` and the watcher's initial list ask; see `list_answer`).
//!   POST (409 `AlreadyExists`), PUT, PATCH, DELETE with finalizers (sets `deletionTimestamp`;
//!   removal when the last finalizer goes), resourceVersion/uid/creationTimestamp.
//! - Optimistic concurrency: PUT or PATCH carrying a stale `metadata.resourceVersion` gets 409
//!   `Conflict` (without one, PUT is unconditional, as for every resource erdma writes).
//! - Discovery (`/api`, `/apis`, each group version), `/version`, and `/openapi/v2` as a
//!   definition-less protobuf document (clients that validate manifests, Helm among them, then
//!   leave validation to the server).
//! - Patches: JSON merge patch (RFC 7386); strategic merge patch for built-in kinds with the merge
//!   keys erdma's patches and Helm's three-way merges of erdma's chart touch ([`SMP_LISTS`]: Node
//!   `status.conditions` and `status.addresses` by `type`, `metadata.ownerReferences` by `uid`,
//!   `metadata.finalizers` as a set, webhook entries by `name`, Service ports by `port`, a pod
//!   template's containers, volumes, env, ports and mounts by their keys; other lists are
//!   replaced, `$patch: delete` removes a keyed element); strategic merge patch on a custom
//!   resource is refused with 415, as the API server does; server-side apply treated as
//!   create-or-merge; JSON patch refused (415).
//! - The `/status` subresource: only status changes; main-resource writes keep status.
//! - Validation on create/update/patch: the resulting object must deserialise into its
//!   k8s-openapi type (or [`ERdmaDevice`]), else 422 `Invalid` naming the error; `metadata.name`
//!   is required. Kinds known: core and apps objects erdma touches, RBAC, leases, events, webhook
//!   configurations, CRDs, `ERdmaDevice`, and DRA's `resource.k8s.io/v1` ResourceSlice,
//!   ResourceClaim and DeviceClass.
//! - Watches from a resourceVersion (without a namespace, of every namespace, as lists); [`FakeApiServer::compact`] forgets the history, after which a
//!   watch from an older resourceVersion gets an `ERROR` event with a 410 `Expired` Status (as the
//!   watch cache sends it), and [`FakeApiServer::close_watches`] ends open watch streams (as the
//!   API server's watch timeout does).
//! - Feature gates ([`FeatureGates`], default: the newest release's): with `DRADeviceTaints`,
//!   `DRAConsumableCapacity` or `DRAExtendedResource` off, creates and updates of ResourceSlices
//!   and DeviceClasses lose those features' fields, as the API server drops them.
//! - Identity and RBAC: [`FakeApiServer::client_as`] gives a client a user name, and over HTTP(S)
//!   a bearer token registered with [`FakeApiServer::accept_token`] authenticates its requests as
//!   that token's user (once a token is registered, an unknown bearer token gets 401
//!   `Unauthorized`, as the API server's token authenticator answers); every request is
//!   recorded with the attributes the API server's authorizer sees ([`crate::rbac::Attributes`]:
//!   verb, API group, resource, subresource, namespace, name, user) and the current test step
//!   ([`FakeApiServer::set_step`]); with [`FakeApiServer::enforce`] a request of a named user that
//!   the rendered RBAC objects do not allow gets 403 `Forbidden` with the API server's message.
//!   [`FakeApiServer::client`] is an unrestricted administrator (test set-up, `erdmactl`).
//! - Injected failures and a request log.
//! - Sustained faults, set over HTTP at [`FAULT_PATH`] ([`Fault`]): every request is answered
//!   with a status (500 `InternalError`; 429 `TooManyRequests` with the `Retry-After` header and
//!   `details.retryAfterSeconds`, as the API server's max-in-flight and priority-and-fairness
//!   filters answer) or held without an answer until the fault is lifted, and each faulted
//!   request is logged with its time, so a client's retry spacing can be read back. Open watch
//!   streams are not interrupted.
//!
//! - The pod proxy (`GET /api/v1/namespaces/{ns}/pods/{name}[:{port}]/proxy/{path}`, as
//!   `kubectl get --raw` and `Api::<Pod>` requests reach a pod's HTTP port through the API
//!   server): forwarded as HTTP/1.0 to the address a test registers with
//!   [`FakeApiServer::proxy_pod`], else to the pod's `status.podIP` and the port (80 when none);
//!   the backend's status and body come back as they are. Only loopback and the subnets given
//!   to [`FakeApiServer::allow_dial`] are dialled: any other address (a fixture's pod IP) is
//!   answered 500 with `refusing to dial …` and no packet leaves the machine. A missing pod is 404 `NotFound`, a pod
//!   without an IP 400 `BadRequest`, and a backend that cannot be reached 500 `InternalError`
//!   with the API server's `error trying to reach service: …` message (the proxy handler's
//!   error is not an API status, so the API server answers it as an internal error).
//! - Container logs (`GET /api/v1/namespaces/{ns}/pods/{name}/log?container=…&tailLines=…`): the
//!   text a test sets with [`FakeApiServer::set_pod_log`] (its last `tailLines` lines); a pod
//!   that does not exist is 404, a container without a log set answers an empty log.
//!
//! Not modelled: admission webhooks and semantic validation beyond deserialisation (immutable
//! fields, name formats, CRD structural schemas and pruning), garbage collection by
//! ownerReferences, field managers and apply conflicts, pagination (`limit`/`continue` are
//! ignored), bookmarks, set-based label selectors, `resourceVersionMatch`, strategic merge
//! directives other than `$patch: delete`, and lists outside [`SMP_LISTS`].

use crate::rbac::{Attributes, Authorizer, Recorded};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::broadcast;

type Body = UnsyncBoxBody<Bytes, Infallible>;

#[derive(Debug, Clone)]
struct WatchEvent {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

/// An injected failure.
#[derive(Debug, Clone)]
pub struct Failure {
    /// HTTP method (`GET`, `PATCH`, …).
    pub method: String,
    /// Substring of the path.
    pub path_contains: String,
    /// HTTP status to answer.
    pub status: u16,
}

/// The path of the fault control: `GET` answers the current [`Fault`] and the faulted requests
/// ([`FaultReport`]), `PUT` sets a fault (`{"mode": "status", "code": 429, "retryAfterSeconds":
/// 3}`, `{"mode": "hang"}`) or lifts it (`{"mode": "off"}`).
pub const FAULT_PATH: &str = "/lab/fault";

/// A fault the server answers every request with (the fault control excepted) until lifted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum Fault {
    /// No fault.
    Off,
    /// Answer with this HTTP status; with 429 or 503 and `retryAfterSeconds`, also the
    /// `Retry-After` header and the Status `details.retryAfterSeconds`.
    Status {
        /// The HTTP status.
        code: u16,
        /// Seconds the client is told to wait.
        #[serde(
            rename = "retryAfterSeconds",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        retry_after_seconds: Option<u32>,
    },
    /// Hold every request without an answer until the fault changes; then answer it normally.
    Hang,
}

/// A request answered with (or held by) a fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultedRequest {
    /// Milliseconds since the server started.
    pub at_ms: u64,
    /// `METHOD path?query-keys`, as in the request log.
    pub request: String,
    /// The fault's mode and code (`status 429`, `hang`).
    pub fault: String,
}

/// What [`FAULT_PATH`] answers to `GET`.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    /// The fault in force.
    pub fault: Fault,
    /// Every faulted request since the server started, oldest first.
    pub faulted: Vec<FaultedRequest>,
}

/// The server's state.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Objects by collection path (e.g. `/api/v1/nodes`) and name.
    pub objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// Every request as `METHOD path?query` (the query's keys).
    pub requests: Vec<String>,
    /// Every request's method, path and query parameters (decoded).
    pub queries: Vec<(String, String, BTreeMap<String, String>)>,
    /// Failures answered once each, first match first.
    pub failures: Vec<Failure>,
    /// Every request of a client with an identity ([`FakeApiServer::client_as`]), as the
    /// authorizer sees it, with the step it was made in.
    pub audit: Vec<Recorded>,
    /// The current step, recorded with each request ([`FakeApiServer::set_step`]).
    pub step: String,
    /// When set, requests of identified clients are authorized against it (403 when denied).
    pub authorizer: Option<Authorizer>,
    rv: u64,
    /// History before this resourceVersion is forgotten (410 for watches from before it).
    compacted: u64,
    history: Vec<WatchEvent>,
    /// Open watch streams end when this is cancelled.
    watches: tokio_util::sync::CancellationToken,
    /// Bearer tokens accepted over HTTP(S), with the user each authenticates.
    tokens: BTreeMap<String, String>,
    /// The feature gates that drop fields of `resource.k8s.io` objects on write.
    pub feature_gates: FeatureGates,
    /// The requests answered with (or held by) a [`Fault`].
    pub faulted: Vec<FaultedRequest>,
    /// Where the pod proxy sends `namespace/pod:port` ([`FakeApiServer::proxy_pod`]); without
    /// an entry, to the pod's `status.podIP` and the port.
    pub pod_proxies: BTreeMap<String, std::net::SocketAddr>,
    /// Where the pod proxy may connect: loopback, and the lab's subnets
    /// ([`FakeApiServer::allow_dial`]).
    pub dial_guard: crate::dial_guard::DialGuard,
    /// Container logs by `namespace/pod/container` ([`FakeApiServer::set_pod_log`]).
    pub pod_logs: BTreeMap<String, String>,
    /// Where containers' CRI logs are read for a container without a log set
    /// ([`FakeApiServer::serve_pod_logs_from`]).
    pub pod_log_dir: Option<std::path::PathBuf>,
}

/// The API server's feature gates whose fields it drops from a `resource.k8s.io` object on
/// create and update while they are off (`dropDisabledFields` of
/// `pkg/registry/resource/{resourceslice,deviceclass}/strategy.go`), keeping a field the stored
/// object already uses (an update does not take away what is in use):
///
/// - `DRADeviceTaints`: ResourceSlice device `taints`;
/// - `DRAConsumableCapacity`: ResourceSlice device `allowMultipleAllocations` and capacity
///   `requestPolicy`;
/// - `DRAExtendedResource`: DeviceClass `extendedResourceName`.
///
/// Defaults per release ([`FeatureGates::release`], `pkg/features`): all three alpha and off in
/// 1.34 and 1.35, beta and on in 1.36, on in 1.37 (`DRADeviceTaints` GA, `DRAExtendedResource`
/// GA and locked to on, `DRAConsumableCapacity` beta). The default is the newest release.
/// Writes with [`FakeApiServer::put`] are stored as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    /// The release whose defaults and locks apply (minor version: 34 to 37).
    pub release: u32,
    /// `DRADeviceTaints`.
    pub dra_device_taints: bool,
    /// `DRAConsumableCapacity`.
    pub dra_consumable_capacity: bool,
    /// `DRAExtendedResource`.
    pub dra_extended_resource: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self::newest()
    }
}

impl FeatureGates {
    /// The releases modelled (minor versions).
    pub const RELEASES: [u32; 4] = [34, 35, 36, 37];
    /// The gates modelled, by name.
    pub const NAMES: [&'static str; 3] = [
        "DRAConsumableCapacity",
        "DRADeviceTaints",
        "DRAExtendedResource",
    ];

    /// The defaults of the newest release modelled (1.37).
    pub fn newest() -> Self {
        Self::release(37).unwrap_or(FeatureGates {
            release: 37,
            dra_device_taints: true,
            dra_consumable_capacity: true,
            dra_extended_resource: true,
        })
    }

    /// The defaults of release `1.<minor>`, or `None` when it is not modelled.
    pub fn release(minor: u32) -> Option<Self> {
        let on = match minor {
            34 | 35 => false,
            36 | 37 => true,
            _ => return None,
        };
        Some(FeatureGates {
            release: minor,
            dra_device_taints: on,
            dra_consumable_capacity: on,
            dra_extended_resource: on,
        })
    }

    /// True when `gate` is locked to its default in this release (GA with `LockToDefault`):
    /// `DRAExtendedResource` in 1.37.
    pub fn locked(&self, gate: &str) -> bool {
        gate == "DRAExtendedResource" && self.release >= 37
    }

    /// Applies `--feature-gates` (`Name=true|false,...`) to these defaults, refusing what the
    /// API server refuses: an unknown gate (among those modelled), a value that is not a
    /// boolean, a locked gate set to another value.
    pub fn with(mut self, spec: &str) -> Result<Self, String> {
        for term in spec.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let Some((name, value)) = term.split_once('=') else {
                return Err(format!("missing bool value for {term}"));
            };
            let (name, value) = (name.trim(), value.trim());
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(format!(
                        "invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
                    ));
                }
            };
            let locked = self.locked(name);
            let slot = match name {
                "DRADeviceTaints" => &mut self.dra_device_taints,
                "DRAConsumableCapacity" => &mut self.dra_consumable_capacity,
                "DRAExtendedResource" => &mut self.dra_extended_resource,
                other => {
                    return Err(format!(
                        "unrecognized feature gate: {other} (the fake API server models {})",
                        Self::NAMES.join(", ")
                    ));
                }
            };
            if *slot != on && locked {
                return Err(format!(
                    "cannot set feature gate {name} to {on}, feature is locked to {}",
                    *slot
                ));
            }
            *slot = on;
        }
        Ok(self)
    }
}

fn devices_mut(v: &mut Value) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    v.pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn devices(v: Option<&Value>) -> impl Iterator<Item = &serde_json::Map<String, Value>> {
    v.and_then(|v| v.pointer("/spec/devices"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn set(v: Option<&Value>) -> bool {
    v.is_some_and(|x| !x.is_null())
}

fn nonempty(v: Option<&Value>) -> bool {
    v.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// Drops the fields of `gates` that are off from `new` (the object to store), unless `old` (the
/// stored object an update replaces) uses them; see [`FeatureGates`].
fn drop_disabled_fields(gates: &FeatureGates, route: &Route, new: &mut Value, old: Option<&Value>) {
    match (route.group.as_str(), route.resource.as_str()) {
        ("resource.k8s.io", "resourceslices") => {
            let taints_in_use = devices(old).any(|d| nonempty(d.get("taints")));
            if !gates.dra_device_taints && !taints_in_use {
                for d in devices_mut(new) {
                    d.remove("taints");
                }
            }
            let capacity_in_use = devices(old).any(|d| {
                set(d.get("allowMultipleAllocations"))
                    || d.get("capacity")
                        .and_then(Value::as_object)
                        .is_some_and(|c| c.values().any(|c| set(c.get("requestPolicy"))))
            });
            if !gates.dra_consumable_capacity && !capacity_in_use {
                for d in devices_mut(new) {
                    d.remove("allowMultipleAllocations");
                    for c in d
                        .get_mut("capacity")
                        .and_then(Value::as_object_mut)
                        .into_iter()
                        .flat_map(|c| c.values_mut())
                        .filter_map(Value::as_object_mut)
                    {
                        c.remove("requestPolicy");
                    }
                }
            }
        }
        ("resource.k8s.io", "deviceclasses") => {
            let in_use = set(old.and_then(|o| o.pointer("/spec/extendedResourceName")));
            if !gates.dra_extended_resource
                && !in_use
                && let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut)
            {
                spec.remove("extendedResourceName");
            }
        }
        _ => {}
    }
}

/// The fake API server. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct FakeApiServer {
    state: Arc<Mutex<FakeState>>,
    events: broadcast::Sender<WatchEvent>,
    fault: Arc<tokio::sync::watch::Sender<Fault>>,
    started: std::time::Instant,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

fn collection_of<K: Resource<DynamicType = ()>>(namespace: Option<&str>) -> String {
    K::url_path(&(), namespace)
}

impl FakeApiServer {
    /// An empty server.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(1024);
        Self {
            state: Arc::new(Mutex::new(FakeState::default())),
            events,
            fault: Arc::new(tokio::sync::watch::Sender::new(Fault::Off)),
            started: std::time::Instant::now(),
        }
    }

    /// Locks the state.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kube client talking to this server (default namespace `default`) as an unrestricted
    /// administrator: test set-up and `erdmactl`; its requests are not audited.
    pub fn client(&self) -> kube::Client {
        self.client_for(None)
    }

    /// A kube client authenticated as `user` (e.g. [`crate::rbac::service_account_user`]): its
    /// requests are audited and, with [`FakeApiServer::enforce`], authorized.
    pub fn client_as(&self, user: &str) -> kube::Client {
        self.client_for(Some(user.to_string()))
    }

    fn client_for(&self, user: Option<String>) -> kube::Client {
        let me = self.clone();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let me = me.clone();
            let user = user.clone();
            async move { Ok::<_, Infallible>(me.handle(req, user.as_deref()).await) }
        });
        kube::Client::new(svc, "default")
    }

    /// Accepts `token` as a bearer token over HTTP(S) ([`FakeApiServer::serve_http`],
    /// [`FakeApiServer::serve_https`]): requests carrying `Authorization: Bearer <token>` are
    /// made as `user` (audited, and authorized with [`FakeApiServer::enforce`]), as the API
    /// server's token authenticator maps a service account token to
    /// `system:serviceaccount:<namespace>:<name>`. Requests without credentials stay
    /// unrestricted; once a token is registered, a bearer token that is not one gets 401.
    pub fn accept_token(&self, token: &str, user: &str) {
        self.state()
            .tokens
            .insert(token.to_string(), user.to_string());
    }

    /// The user a request's `Authorization` header authenticates: `Ok(None)` without a bearer
    /// token (or when no token is registered), `Err(())` for a bearer token not registered.
    fn authenticate(&self, headers: &hyper::HeaderMap) -> Result<Option<String>, ()> {
        let st = self.state();
        if st.tokens.is_empty() {
            return Ok(None);
        }
        let Some(value) = headers.get(hyper::header::AUTHORIZATION) else {
            return Ok(None);
        };
        let bearer = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(())?;
        st.tokens.get(bearer).cloned().map(Some).ok_or(())
    }

    /// Authorizes every request of an identified client against `authz` from now on.
    pub fn enforce(&self, authz: Authorizer) {
        self.state().authorizer = Some(authz);
    }

    /// Sets the step recorded with the following requests (what the code under test is doing).
    pub fn set_step(&self, step: &str) {
        self.state().step = step.to_string();
    }

    /// The audited requests so far.
    pub fn audit(&self) -> Vec<Recorded> {
        self.state().audit.clone()
    }

    /// Sets the feature gates that drop `resource.k8s.io` fields on write ([`FeatureGates`]).
    pub fn set_feature_gates(&self, gates: FeatureGates) {
        self.state().feature_gates = gates;
    }

    /// Forgets the watch history up to now (etcd compaction): a later watch from an older
    /// resourceVersion gets 410 Gone and the client has to list again.
    pub fn compact(&self) {
        let mut st = self.state();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Ends every open watch stream (as the API server's watch timeout does); clients re-watch
    /// from the last resourceVersion they saw.
    pub fn close_watches(&self) {
        let mut st = self.state();
        st.watches.cancel();
        st.watches = tokio_util::sync::CancellationToken::new();
    }

    /// Stores `obj` (create or replace), as if another client had written it.
    pub fn put<K: Resource<DynamicType = ()> + Serialize>(&self, obj: &K) {
        let ns = obj.meta().namespace.clone();
        let coll = collection_of::<K>(ns.as_deref());
        let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
        v["apiVersion"] = json!(K::api_version(&()));
        v["kind"] = json!(K::kind(&()));
        let name = obj.meta().name.clone().unwrap_or_default();
        let mut st = self.state();
        let existed = st.objects.get(&coll).is_some_and(|m| m.contains_key(&name));
        self.store(
            &mut st,
            &coll,
            &name,
            v,
            if existed { "MODIFIED" } else { "ADDED" },
        );
    }

    /// Reads an object back, typed. `None` when absent or not decodable.
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        let coll = collection_of::<K>(namespace);
        let v = self.state().objects.get(&coll)?.get(name)?.clone();
        serde_json::from_value(v).ok()
    }

    /// All objects of a kind, typed.
    pub fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
    ) -> Vec<K> {
        let coll = collection_of::<K>(namespace);
        self.state()
            .objects
            .get(&coll)
            .map(|m| {
                m.values()
                    .filter_map(|v| serde_json::from_value(v.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes an object outright (as garbage collection would), emitting a DELETED event.
    pub fn remove<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) {
        let coll = collection_of::<K>(namespace);
        let mut st = self.state();
        if let Some(v) = st.objects.get_mut(&coll).and_then(|m| m.remove(name)) {
            st.rv += 1;
            let ev = WatchEvent {
                rv: st.rv,
                collection: coll,
                kind: "DELETED",
                object: v,
            };
            st.history.push(ev.clone());
            let _ = self.events.send(ev);
        }
    }

    /// Sends the pod proxy's requests for `namespace/pod` port `port` to `addr` (a test's fake
    /// agent on a local port) instead of the pod's IP.
    pub fn proxy_pod(&self, namespace: &str, pod: &str, port: u16, addr: std::net::SocketAddr) {
        self.state()
            .pod_proxies
            .insert(format!("{namespace}/{pod}:{port}"), addr);
    }

    /// Lets the pod proxy connect to `cidr` (the lab's own subnets); by default it dials only
    /// loopback and answers any other pod IP with `refusing to dial …`.
    pub fn allow_dial(&self, cidr: crate::dial_guard::Cidr) {
        self.state().dial_guard.allow(cidr);
    }

    /// Sets the log of `container` in `namespace/pod` (`kubectl logs` reads it).
    pub fn set_pod_log(&self, namespace: &str, pod: &str, container: &str, text: &str) {
        self.state()
            .pod_logs
            .insert(format!("{namespace}/{pod}/{container}"), text.to_string());
    }

    /// Serves the log of a container without a log set from the CRI log files under `dir`, laid
    /// out as the kubelet lays them out (`<dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`,
    /// `/var/log/pods`): the newest pod directory of that name and the container's latest
    /// restart, as `kubectl logs` shows the current container.
    pub fn serve_pod_logs_from(&self, dir: &std::path::Path) {
        self.state().pod_log_dir = Some(dir.to_path_buf());
    }

    /// Answers a container log request: `rest` is what follows `/api/v1/namespaces/`.
    fn pod_log(&self, rest: &str, query: &BTreeMap<String, String>) -> Option<Response<Body>> {
        let (ns, rest) = rest.split_once("/pods/")?;
        let pod = rest.strip_suffix("/log")?;
        if ns.contains('/') || pod.contains('/') {
            return None;
        }
        let st = self.state();
        let pod_obj = st
            .objects
            .get(&format!("/api/v1/namespaces/{ns}/pods"))
            .and_then(|m| m.get(pod))?;
        let container = query.get("container").cloned().or_else(|| {
            pod_obj
                .pointer("/spec/containers/0/name")
                .and_then(Value::as_str)
                .map(str::to_string)
        })?;
        let text = st
            .pod_logs
            .get(&format!("{ns}/{pod}/{container}"))
            .cloned()
            .or_else(|| {
                let dir = st.pod_log_dir.as_deref()?;
                Some(cri_log_lines(&read_cri_log(dir, ns, pod, &container)?).join("\n") + "\n")
            })
            .unwrap_or_default();
        let text = match query.get("tailLines").and_then(|t| t.parse::<usize>().ok()) {
            Some(n) => {
                let lines: Vec<&str> = text.lines().collect();
                let mut t = lines[lines.len().saturating_sub(n)..].join("\n");
                if !t.is_empty() {
                    t.push('\n');
                }
                t
            }
            None => text,
        };
        Some(
            Response::builder()
                .status(200)
                .header("content-type", "text/plain")
                .body(BodyExt::boxed_unsync(Full::new(Bytes::from(text))))
                .unwrap_or_else(|_| status(500, "InternalError", "response")),
        )
    }

    /// Answers a pod proxy request: `rest` is what follows `/api/v1/namespaces/`.
    async fn pod_proxy(&self, rest: &str, query: &str) -> Option<Response<Body>> {
        let (ns, rest) = rest.split_once("/pods/")?;
        let (target, path) = rest.split_once("/proxy")?;
        if ns.contains('/') || target.contains('/') || !(path.is_empty() || path.starts_with('/')) {
            return None;
        }
        let (pod, port) = match target.split_once(':') {
            Some((p, port)) => (p, port.parse::<u16>().ok()?),
            None => (target, 80),
        };
        let (pod_obj, registered, guard) = {
            let st = self.state();
            (
                st.objects
                    .get(&format!("/api/v1/namespaces/{ns}/pods"))
                    .and_then(|m| m.get(pod))
                    .cloned(),
                st.pod_proxies.get(&format!("{ns}/{pod}:{port}")).copied(),
                st.dial_guard.clone(),
            )
        };
        let Some(pod_obj) = pod_obj else {
            return Some(status(
                404,
                "NotFound",
                &format!("pods \"{pod}\" not found"),
            ));
        };
        let addr = match registered {
            Some(a) => a,
            None => match pod_obj.pointer("/status/podIP").and_then(Value::as_str) {
                Some(ip) if !ip.is_empty() => match ip.parse::<std::net::IpAddr>() {
                    Ok(ip) => std::net::SocketAddr::new(ip, port),
                    Err(_) => {
                        return Some(status(
                            400,
                            "BadRequest",
                            &format!("pod {ns}/{pod} has status.podIP {ip:?}, not an IP address"),
                        ));
                    }
                },
                _ => {
                    return Some(status(
                        400,
                        "BadRequest",
                        &format!("pod {ns}/{pod} has no IP address"),
                    ));
                }
            },
        };
        if let Err(e) = guard.check(addr, &format!("the pod proxy for {ns}/{pod}")) {
            tracing::warn!(error = %e, "fake API server: pod proxy refused");
            return Some(status(
                500,
                "InternalError",
                &format!("error trying to reach service: {e}"),
            ));
        }
        let addr = addr.to_string();
        let path = if path.is_empty() { "/" } else { path };
        let target = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        Some(match http_get(&addr, &target).await {
            Ok((code, content_type, body)) => Response::builder()
                .status(code)
                .header("content-type", content_type)
                .body(BodyExt::boxed_unsync(Full::new(Bytes::from(body))))
                .unwrap_or_else(|_| status(502, "InternalError", "bad backend answer")),
            Err(e) => status(
                500,
                "InternalError",
                &format!("error trying to reach service: {e}"),
            ),
        })
    }

    /// Sets (or with [`Fault::Off`] lifts) the fault every request is answered with; held
    /// requests go on when it changes.
    pub fn set_fault(&self, fault: Fault) {
        tracing::info!(?fault, "fake API server: fault set");
        self.fault.send_replace(fault);
    }

    /// The fault in force and the requests faulted so far.
    pub fn fault_report(&self) -> FaultReport {
        FaultReport {
            fault: self.fault.borrow().clone(),
            faulted: self.state().faulted.clone(),
        }
    }

    /// Answers the request with the fault in force, or holds it while the fault is
    /// [`Fault::Hang`]; `None`: no fault, the request goes on.
    async fn faulted(&self, line: &str) -> Option<Response<Body>> {
        let fault = self.fault.borrow().clone();
        if fault == Fault::Off {
            return None;
        }
        let record = |fault: String| {
            let at_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.state().faulted.push(FaultedRequest {
                at_ms,
                request: line.to_string(),
                fault,
            });
        };
        match fault {
            Fault::Off => None,
            Fault::Hang => {
                record("hang".into());
                let mut rx = self.fault.subscribe();
                // a dropped sender cannot happen while `self` holds it; treat it as lifted
                let _ = rx.wait_for(|f| *f != Fault::Hang).await;
                None
            }
            Fault::Status {
                code,
                retry_after_seconds,
            } => {
                record(format!("status {code}"));
                let reason = match code {
                    429 => "TooManyRequests",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    _ => "InternalError",
                };
                let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": reason, "code": code,
                    "message": format!("injected by the lab API server's fault control ({code})")});
                if let Some(s) = retry_after_seconds {
                    body["details"] = json!({"retryAfterSeconds": s});
                }
                let mut answer = ok(code, &body);
                if let Some(s) = retry_after_seconds
                    && let Ok(v) = hyper::header::HeaderValue::from_str(&s.to_string())
                {
                    answer.headers_mut().insert("retry-after", v);
                }
                Some(answer)
            }
        }
    }

    /// `GET` or `PUT` of [`FAULT_PATH`].
    fn fault_control(&self, method: &str, body: &[u8]) -> Response<Body> {
        match method {
            "GET" => match serde_json::to_value(self.fault_report()) {
                Ok(v) => ok(200, &v),
                Err(e) => status(500, "InternalError", &e.to_string()),
            },
            "PUT" | "POST" => match serde_json::from_slice::<Fault>(body) {
                Ok(f) => {
                    self.set_fault(f);
                    self.fault_control("GET", &[])
                }
                Err(e) => status(
                    400,
                    "BadRequest",
                    &format!(
                        "fault control: {e}; expected {{\"mode\": \"off\"}}, {{\"mode\": \"hang\"}} or {{\"mode\": \"status\", \"code\": 429, \"retryAfterSeconds\": 3}}"
                    ),
                ),
            },
            _ => status(405, "MethodNotAllowed", "fault control: GET or PUT"),
        }
    }

    /// Answers the next request matching `method` and `path_contains` with `status`.
    pub fn fail_once(&self, method: &str, path_contains: &str, status: u16) {
        self.state().failures.push(Failure {
            method: method.into(),
            path_contains: path_contains.into(),
            status,
        });
    }

    /// The query parameters of each request whose method is `method` and whose path contains
    /// `path`, in order.
    pub fn queries_matching(&self, method: &str, path: &str) -> Vec<BTreeMap<String, String>> {
        self.state()
            .queries
            .iter()
            .filter(|(m, p, _)| m == method && p.contains(path))
            .map(|(_, _, q)| q.clone())
            .collect()
    }

    /// The request log entries that start with `method` and contain `path`.
    pub fn requests_matching(&self, method: &str, path: &str) -> Vec<String> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.starts_with(method) && r.contains(path))
            .cloned()
            .collect()
    }

    fn store(&self, st: &mut FakeState, coll: &str, name: &str, mut v: Value, kind: &'static str) {
        st.rv += 1;
        let rv = st.rv;
        let meta = &mut v["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["resourceVersion"] = json!(rv.to_string());
        if meta.get("uid").is_none_or(Value::is_null) {
            meta["uid"] = json!(format!("uid-{rv}"));
        }
        if meta.get("creationTimestamp").is_none_or(Value::is_null) {
            meta["creationTimestamp"] = json!("2026-11-29T00:00:00Z");
        }
        st.objects
            .entry(coll.to_string())
            .or_default()
            .insert(name.to_string(), v.clone());
        let ev = WatchEvent {
            rv,
            collection: coll.to_string(),
            kind,
            object: v,
        };
        st.history.push(ev.clone());
        let _ = self.events.send(ev);
    }

    /// Serves this API server over plain HTTP/1.1 on `listener` until `cancel`, for a client in
    /// another process (e.g. the real `erdma-agent` binary in a benchmark); [`kubeconfig`] writes
    /// the file that points such a client here. Watch streams stay open until the client drops
    /// them or the process ends.
    pub async fn serve_http(
        self,
        listener: tokio::net::TcpListener,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        self.serve_with(listener, None, cancel).await
    }

    /// Serves this API server over HTTPS (HTTP/1.1 in TLS, the certificate of `tls`) on
    /// `listener` until `cancel`, as a cluster's API server is reached: a client configured by
    /// [`kubeconfig_tls`] trusts only `tls`'s CA, as an in-cluster client trusts only the
    /// service account's `ca.crt`.
    pub async fn serve_https(
        self,
        listener: tokio::net::TcpListener,
        tls: FakeTls,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        self.serve_with(listener, Some(tls.acceptor), cancel).await
    }

    async fn serve_with(
        self,
        listener: tokio::net::TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                _ = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("fake API server: accept failed: {e}");
                        continue;
                    }
                },
            };
            let me = self.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let me = me.clone();
                    async move {
                        let answer = match me.authenticate(req.headers()) {
                            Ok(user) => me.handle(req, user.as_deref()).await,
                            Err(()) => status(401, "Unauthorized", "Unauthorized"),
                        };
                        Ok::<_, Infallible>(answer)
                    }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    }
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .await;
                        }
                        Err(e) => tracing::debug!("fake API server: TLS handshake failed: {e}"),
                    },
                }
            });
        }
    }

    async fn handle<B>(&self, req: Request<B>, user: Option<&str>) -> Response<Body>
    where
        B: hyper::body::Body,
    {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let raw_query = req.uri().query().unwrap_or("").to_string();
        let query: BTreeMap<String, String> = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_string(), decode(v))
            })
            .collect();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        tracing::debug!(%method, %path, %content_type, "fake API server: request");
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return status(400, "BadRequest", "unreadable body"),
        };
        if path == FAULT_PATH {
            return self.fault_control(&method, &body);
        }
        let line = format!(
            "{method} {path}{}",
            if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.keys().cloned().collect::<Vec<_>>().join("&"))
            }
        );
        if let Some(answer) = self.faulted(&line).await {
            return answer;
        }
        {
            let mut st = self.state();
            st.requests.push(line);
            st.queries
                .push((method.clone(), path.clone(), query.clone()));
            if let Some(i) = st
                .failures
                .iter()
                .position(|f| f.method == method && path.contains(&f.path_contains))
            {
                let f = st.failures.remove(i);
                return status(f.status, "InternalError", "injected by the fake API server");
            }
            if let (Some(user), Some(attrs)) = (user, attributes(&method, &path, &query)) {
                let attrs = Attributes {
                    user: user.to_string(),
                    ..attrs
                };
                let step = st.step.clone();
                st.audit.push(Recorded {
                    attributes: attrs.clone(),
                    step,
                });
                if let Some(a) = &st.authorizer
                    && a.authorize(&attrs).is_empty()
                {
                    return status(403, "Forbidden", &attrs.forbidden_message());
                }
            }
        }
        if method == "GET"
            && let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
            && let Some(answer) = self.pod_proxy(rest, &raw_query).await
        {
            return answer;
        }
        if method == "GET"
            && let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
            && let Some(answer) = self.pod_log(rest, &query)
        {
            return answer;
        }
        if method == "GET" && path == "/openapi/v2" {
            return openapi_v2();
        }
        if method == "GET"
            && let Some(list) = discovery(&path)
        {
            return ok(200, &list);
        }
        let Some(route) = Route::parse(&path) else {
            return status(404, "NotFound", &format!("no route for {path}"));
        };
        if method == "GET"
            && route.name.is_none()
            && let Err(e) = check_field_selector(&route, &query)
        {
            return status(400, "BadRequest", &e);
        }
        match (method.as_str(), &route.name) {
            ("GET", None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                self.watch(&route, &query)
            }
            ("GET", None) => self.list_answer(&route, &query),
            ("GET", Some(name)) => match self
                .state()
                .objects
                .get(&route.collection)
                .and_then(|m| m.get(name))
            {
                Some(v) => ok(200, v),
                None => not_found(&route, name),
            },
            ("POST", None) => self.create(&route, &body),
            ("PUT", Some(name)) => self.replace(&route, name, &body),
            ("PATCH", Some(name)) => self.patch(&route, name, &body, &content_type),
            ("DELETE", Some(name)) => self.delete(&route, name),
            _ => status(405, "MethodNotAllowed", &format!("{method} {path}")),
        }
    }

    fn list_answer(&self, route: &Route, query: &BTreeMap<String, String>) -> Response<Body> {
        let st = self.state();
        let mut items: Vec<Value> = st
            .objects
            .get(&route.collection)
            .map(|m| {
                m.values()
                    .filter(|v| selected(route, v, query))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if route.namespace.is_none() {
            // A list without a namespace of a namespaced resource spans every namespace.
            for (coll, objs) in &st.objects {
                if coll != &route.collection && route.covers(coll) {
                    items.extend(objs.values().filter(|v| selected(route, v, query)).cloned());
                }
            }
        }
        // Pages as the API server serves `limit` and `continue`: items in key order (namespace,
        // name), at most `limit` of them, and while more remain a `continue` token (base64url of
        // `{"v","rv","start"}`, as etcd3's storage encodes it) with `remainingItemCount`; the
        // token's resourceVersion is that of the first page. Not modelled: the snapshot (later
        // pages show the objects as they are now, not as of that resourceVersion).
        let key = |v: &Value| {
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            format!("{}/{}", s("/metadata/namespace"), s("/metadata/name"))
        };
        items.sort_by_cached_key(key);
        let mut rv = st.rv.to_string();
        if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
            let Some((from_rv, start)) = decode_continue(token) else {
                return status(
                    400,
                    "BadRequest",
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                );
            };
            rv = from_rv;
            items.retain(|v| key(v) >= start);
        }
        let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut meta = json!({"resourceVersion": rv});
        if limit > 0 && items.len() > limit {
            let rest = items.split_off(limit);
            meta["continue"] = json!(encode_continue(
                &rv,
                &format!("{}\0", key(&items[limit - 1]))
            ));
            meta["remainingItemCount"] = json!(rest.len());
        }
        ok(
            200,
            &json!({"apiVersion": "v1", "kind": "List", "metadata": meta, "items": items}),
        )
    }

    fn watch(&self, route: &Route, query: &BTreeMap<String, String>) -> Response<Body> {
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let mut rx = self.events.subscribe();
        let (backlog, expired, closed) = {
            let st = self.state();
            let backlog: Vec<WatchEvent> = st
                .history
                .iter()
                .filter(|e| e.rv > from && route.covers(&e.collection))
                .cloned()
                .collect();
            (
                backlog,
                from != 0 && from < st.compacted,
                st.watches.clone(),
            )
        };
        let last = backlog.last().map(|e| e.rv).unwrap_or(from);
        let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(64);
        let route = route.clone();
        let query = query.clone();
        let line = |v: Value| {
            let mut s = v.to_string();
            s.push('\n');
            Bytes::from(s)
        };
        if expired {
            // As the watch cache answers: 200, then one ERROR event carrying a 410 Status.
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {from}")}});
            let _ = tx.try_send(line(gone));
        } else {
            tokio::spawn(async move {
                let ev = |e: &WatchEvent| line(json!({"type": e.kind, "object": e.object}));
                for e in &backlog {
                    if selected(&route, &e.object, &query) && tx.send(ev(e)).await.is_err() {
                        return;
                    }
                }
                loop {
                    let e = tokio::select! {
                        _ = closed.cancelled() => return,
                        r = rx.recv() => match r { Ok(e) => e, Err(_) => return },
                    };
                    if e.rv > last
                        && route.covers(&e.collection)
                        && selected(&route, &e.object, &query)
                        && tx.send(ev(&e)).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
        let stream = futures::stream::unfold(out, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(BodyExt::boxed_unsync(StreamBody::new(stream.boxed())))
            .unwrap_or_else(|_| status(500, "InternalError", "response"))
    }

    fn create(&self, route: &Route, body: &[u8]) -> Response<Body> {
        let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "body is not JSON");
        };
        let Some(name) = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return status(422, "Invalid", "metadata.name is required");
        };
        let mut st = self.state();
        if st
            .objects
            .get(&route.collection)
            .is_some_and(|m| m.contains_key(&name))
        {
            return status(
                409,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", route.resource),
            );
        }
        if let Some(ns) = &route.namespace {
            v["metadata"]["namespace"] = json!(ns);
        }
        drop_disabled_fields(&st.feature_gates, route, &mut v, None);
        if let Err(e) = validate(route, &v) {
            return invalid(route, &name, &e);
        }
        self.store(&mut st, &route.collection, &name, v, "ADDED");
        ok(201, &st.objects[&route.collection][&name])
    }

    fn replace(&self, route: &Route, name: &str, body: &[u8]) -> Response<Body> {
        let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "body is not JSON");
        };
        let mut st = self.state();
        let Some(old) = st
            .objects
            .get(&route.collection)
            .and_then(|m| m.get(name))
            .cloned()
        else {
            return not_found(route, name);
        };
        let sent_rv = v
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        if sent_rv.is_some_and(|rv| {
            Some(rv)
                != old
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
        }) {
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            );
        }
        let mut merged = if route.subresource.as_deref() == Some("status") {
            let mut o = old.clone();
            o["status"] = v.get("status").cloned().unwrap_or(Value::Null);
            o
        } else {
            if let Some(s) = old.get("status") {
                v["status"] = s.clone();
            }
            v["metadata"]["uid"] = old["metadata"]["uid"].clone();
            v["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
            v
        };
        drop_disabled_fields(&st.feature_gates, route, &mut merged, Some(&old));
        if let Err(e) = validate(route, &merged) {
            return invalid(route, name, &e);
        }
        self.finish_write(&mut st, route, name, merged)
    }

    fn patch(&self, route: &Route, name: &str, body: &[u8], content_type: &str) -> Response<Body> {
        let Ok(p) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "patch is not JSON");
        };
        if content_type.starts_with("application/json-patch+json") {
            return status(
                415,
                "UnsupportedMediaType",
                "JSON patch is not modelled by the fake API server",
            );
        }
        let apply = content_type.starts_with("application/apply-patch");
        let strategic = content_type.starts_with("application/strategic-merge-patch");
        if strategic && route.is_custom() {
            // What the API server answers: custom resources have no patch strategies.
            return status(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for {})",
                    route.resource
                ),
            );
        }
        let mut st = self.state();
        let old = st
            .objects
            .get(&route.collection)
            .and_then(|m| m.get(name))
            .cloned();
        let before = old.clone();
        let mut v = match (old, apply) {
            (Some(o), _) => o,
            (None, true) => {
                let mut v = json!({"metadata": {"name": name}});
                if let Some(ns) = &route.namespace {
                    v["metadata"]["namespace"] = json!(ns);
                }
                v
            }
            (None, false) => return not_found(route, name),
        };
        let sent_rv = p
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        if sent_rv.is_some_and(|rv| {
            Some(rv)
                != v.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
        }) {
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            );
        }
        let apply_patch = |target: &mut Value, patch: &Value, path: &str| {
            if strategic {
                strategic_merge(target, patch, path);
            } else {
                merge(target, patch);
            }
        };
        if route.subresource.as_deref() == Some("status") {
            if let Some(s) = p.get("status") {
                apply_patch(&mut v["status"], s, "status");
            }
        } else {
            let mut p = p.clone();
            if let Some(o) = p.as_object_mut() {
                o.remove("status");
            }
            apply_patch(&mut v, &p, "");
        }
        drop_disabled_fields(&st.feature_gates, route, &mut v, before.as_ref());
        if let Err(e) = validate(route, &v) {
            return invalid(route, name, &e);
        }
        self.finish_write(&mut st, route, name, v)
    }

    fn finish_write(
        &self,
        st: &mut FakeState,
        route: &Route,
        name: &str,
        v: Value,
    ) -> Response<Body> {
        let deleting = v
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|d| !d.is_null());
        let no_finalizers = v
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if deleting && no_finalizers {
            drop(
                st.objects
                    .get_mut(&route.collection)
                    .and_then(|m| m.remove(name)),
            );
            st.rv += 1;
            let ev = WatchEvent {
                rv: st.rv,
                collection: route.collection.clone(),
                kind: "DELETED",
                object: v.clone(),
            };
            st.history.push(ev.clone());
            let _ = self.events.send(ev);
            return ok(200, &v);
        }
        let existed = st
            .objects
            .get(&route.collection)
            .is_some_and(|m| m.contains_key(name));
        self.store(
            st,
            &route.collection,
            name,
            v,
            if existed { "MODIFIED" } else { "ADDED" },
        );
        ok(200, &st.objects[&route.collection][name])
    }

    fn delete(&self, route: &Route, name: &str) -> Response<Body> {
        let mut st = self.state();
        let Some(mut v) = st
            .objects
            .get(&route.collection)
            .and_then(|m| m.get(name))
            .cloned()
        else {
            return not_found(route, name);
        };
        v["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:01Z");
        self.finish_write(&mut st, route, name, v)
    }
}

/// Resources the fake serves in discovery: (group/version, plural, kind, namespaced).
const DISCOVERY: &[(&str, &str, &str, bool)] = &[
    ("v1", "namespaces", "Namespace", false),
    ("v1", "nodes", "Node", false),
    ("v1", "pods", "Pod", true),
    ("v1", "services", "Service", true),
    ("v1", "serviceaccounts", "ServiceAccount", true),
    ("v1", "configmaps", "ConfigMap", true),
    ("v1", "secrets", "Secret", true),
    ("apps/v1", "deployments", "Deployment", true),
    ("apps/v1", "daemonsets", "DaemonSet", true),
    (
        "rbac.authorization.k8s.io/v1",
        "clusterroles",
        "ClusterRole",
        false,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
    ),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", true),
    (
        "rbac.authorization.k8s.io/v1",
        "rolebindings",
        "RoleBinding",
        true,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
    ),
    (
        "apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
    ),
    ("coordination.k8s.io/v1", "leases", "Lease", true),
    ("events.k8s.io/v1", "events", "Event", true),
    (
        "policy/v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
    ),
    (
        "resource.k8s.io/v1",
        "resourceslices",
        "ResourceSlice",
        false,
    ),
    (
        "resource.k8s.io/v1",
        "resourceclaims",
        "ResourceClaim",
        true,
    ),
    ("resource.k8s.io/v1", "deviceclasses", "DeviceClass", false),
    (
        "network.alibabacloud.com/v1",
        "erdmadevices",
        "ERdmaDevice",
        false,
    ),
];

/// The `APIResourceList` of `/api/v1` or `/apis/<group>/<version>`.
fn discovery(path: &str) -> Option<Value> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let gv = match segs.as_slice() {
        ["version"] => {
            return Some(json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0",
                "platform": "linux/amd64"}));
        }
        ["api"] => {
            return Some(json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": []}));
        }
        ["apis"] => {
            let mut groups: Vec<(&str, &str)> = DISCOVERY
                .iter()
                .filter_map(|(gv, ..)| gv.split_once('/'))
                .collect();
            groups.dedup();
            let groups: Vec<Value> = groups
                .iter()
                .map(|(g, v)| {
                    let version = json!({"groupVersion": format!("{g}/{v}"), "version": v});
                    json!({"name": g, "versions": [version.clone()], "preferredVersion": version})
                })
                .collect();
            return Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}));
        }
        ["api", v] => (*v).to_string(),
        ["apis", g, v] => format!("{g}/{v}"),
        _ => return None,
    };
    let resources: Vec<Value> = DISCOVERY
        .iter()
        .filter(|(g, ..)| *g == gv)
        .map(|(_, plural, kind, namespaced)| {
            json!({"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// A parsed resource URL.
#[derive(Debug, Clone)]
struct Route {
    group: String,
    collection: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Route {
    fn parse(path: &str) -> Option<Self> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, prefix, rest) = match *segs.first()? {
            "api" => (String::new(), format!("/api/{}", segs.get(1)?), &segs[2..]),
            "apis" => (
                segs.get(1)?.to_string(),
                format!("/apis/{}/{}", segs.get(1)?, segs.get(2)?),
                &segs[3..],
            ),
            _ => return None,
        };
        let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
            (Some(rest[1].to_string()), &rest[2..])
        } else {
            (None, rest)
        };
        let resource = rest.first()?.to_string();
        let collection = match &namespace {
            Some(ns) => format!("{prefix}/namespaces/{ns}/{resource}"),
            None => format!("{prefix}/{resource}"),
        };
        Some(Self {
            group,
            collection,
            resource,
            namespace,
            name: rest.get(1).map(|s| s.to_string()),
            subresource: rest.get(2).map(|s| s.to_string()),
        })
    }
}

impl Route {
    /// True when objects stored under `collection` belong to this route's list or watch: its
    /// own collection, and for a route without a namespace every namespace's collection of the
    /// same resource (a list or watch across namespaces, as `Api::all` makes).
    fn covers(&self, collection: &str) -> bool {
        if collection == self.collection {
            return true;
        }
        if self.namespace.is_some() {
            return false;
        }
        let Some(prefix) = self.collection.strip_suffix(&format!("/{}", self.resource)) else {
            return false;
        };
        collection
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("/namespaces/"))
            .and_then(|rest| rest.strip_suffix(&format!("/{}", self.resource)))
            .is_some_and(|ns| !ns.is_empty() && !ns.contains('/'))
    }

    /// A custom resource (a group served by a CRD, not by Kubernetes itself).
    fn is_custom(&self) -> bool {
        self.group.contains('.') && !self.group.ends_with(".k8s.io")
    }
}

/// The authorizer's view of a request (user left empty); `None` for non-resource URLs.
fn attributes(method: &str, path: &str, query: &BTreeMap<String, String>) -> Option<Attributes> {
    let route = Route::parse(path)?;
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (method, route.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    // As the API server: a list or watch narrowed to one name by a field selector carries it.
    let from_selector = || {
        query
            .get("fieldSelector")?
            .split(',')
            .find_map(|t| t.strip_prefix("metadata.name="))
            .map(|n| n.trim_start_matches('=').to_string())
    };
    let name = match (&route.name, verb) {
        (Some(n), _) => n.clone(),
        (None, "list" | "watch") => from_selector().unwrap_or_default(),
        _ => String::new(),
    };
    Some(Attributes {
        user: String::new(),
        verb: verb.into(),
        api_group: route.group,
        resource: route.resource,
        subresource: route.subresource.unwrap_or_default(),
        namespace: route.namespace.unwrap_or_default(),
        name,
    })
}

/// Checks that `v` deserialises into the type the route serves (the API server decodes every
/// write into its Go type and rejects what does not fit).
fn validate(route: &Route, v: &Value) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{
        ConfigMap, Namespace, Node, Pod, Secret, Service, ServiceAccount,
    };
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    fn de<T: DeserializeOwned>(v: &Value) -> Result<(), String> {
        serde_json::from_value::<T>(v.clone())
            .map(drop)
            .map_err(|e| e.to_string())
    }
    match (route.group.as_str(), route.resource.as_str()) {
        ("", "nodes") => de::<Node>(v),
        ("", "pods") => de::<Pod>(v),
        ("", "secrets") => de::<Secret>(v),
        ("", "configmaps") => de::<ConfigMap>(v),
        ("", "services") => de::<Service>(v),
        ("", "serviceaccounts") => de::<ServiceAccount>(v),
        ("", "namespaces") => de::<Namespace>(v),
        ("apps", "deployments") => de::<Deployment>(v),
        ("apps", "daemonsets") => de::<DaemonSet>(v),
        ("coordination.k8s.io", "leases") => de::<Lease>(v),
        ("events.k8s.io", "events") => de::<Event>(v),
        ("policy", "poddisruptionbudgets") => de::<PodDisruptionBudget>(v),
        ("rbac.authorization.k8s.io", "clusterroles") => de::<ClusterRole>(v),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => de::<ClusterRoleBinding>(v),
        ("rbac.authorization.k8s.io", "roles") => de::<Role>(v),
        ("rbac.authorization.k8s.io", "rolebindings") => de::<RoleBinding>(v),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
            de::<MutatingWebhookConfiguration>(v)
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => de::<CustomResourceDefinition>(v),
        ("resource.k8s.io", "resourceslices") => de::<ResourceSlice>(v),
        ("resource.k8s.io", "resourceclaims") => de::<ResourceClaim>(v),
        ("resource.k8s.io", "deviceclasses") => de::<DeviceClass>(v),
        ("network.alibabacloud.com", "erdmadevices") => de::<crate::crd::ERdmaDevice>(v),
        (g, r) => Err(format!(
            "the fake API server does not know the type of {r} in API group {g:?}; add it to validate()"
        )),
    }
}

fn invalid(route: &Route, name: &str, why: &str) -> Response<Body> {
    status(
        422,
        "Invalid",
        &format!("{} \"{name}\" is invalid: {why}", route.resource),
    )
}

/// The lists a strategic merge patch merges (path from the object's root, merge key; an empty key
/// merges a list of strings as a set), as the patch strategies of the Kubernetes types define
/// them. Every other list is replaced.
pub const SMP_LISTS: &[(&str, &str)] = &[
    ("status.conditions", "type"),
    ("status.addresses", "type"),
    ("metadata.ownerReferences", "uid"),
    ("metadata.finalizers", ""),
    // MutatingWebhookConfiguration.webhooks (patchMergeKey name).
    ("webhooks", "name"),
    // Service.spec.ports (patchMergeKey port).
    ("spec.ports", "port"),
    // A workload's pod template: PodSpec's and Container's keyed lists.
    ("spec.template.spec.containers", "name"),
    ("spec.template.spec.initContainers", "name"),
    ("spec.template.spec.volumes", "name"),
    ("spec.template.spec.imagePullSecrets", "name"),
    ("spec.template.spec.containers.env", "name"),
    ("spec.template.spec.containers.ports", "containerPort"),
    ("spec.template.spec.containers.volumeMounts", "mountPath"),
    ("spec.template.spec.initContainers.env", "name"),
    (
        "spec.template.spec.initContainers.volumeMounts",
        "mountPath",
    ),
];

/// Strategic merge patch of `patch` into `target` at `path` (see [`SMP_LISTS`]).
fn strategic_merge(target: &mut Value, patch: &Value, path: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let key = SMP_LISTS
            .iter()
            .find(|(p, _)| *p == child)
            .map(|(_, key)| *key);
        match (key, v, t.get_mut(k)) {
            (Some(key), Value::Array(items), Some(Value::Array(have))) => {
                merge_list(have, items, key, &child)
            }
            (Some(key), Value::Array(items), None) => {
                let mut have = Vec::new();
                merge_list(&mut have, items, key, &child);
                t.insert(k.clone(), Value::Array(have));
            }
            (_, Value::Object(_), Some(existing)) => strategic_merge(existing, v, &child),
            _ => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, v, &child);
                t.insert(k.clone(), if v.is_object() { fresh } else { v.clone() });
            }
        }
    }
}

/// Merges a keyed list; items' own fields are at `path` (the list's path: a nested keyed list of
/// an item is `<path>.<field>`).
fn merge_list(have: &mut Vec<Value>, items: &[Value], key: &str, path: &str) {
    for item in items {
        if key.is_empty() {
            if !have.contains(item) {
                have.push(item.clone());
            }
            continue;
        }
        let id = item.get(key).cloned();
        let pos = have
            .iter()
            .position(|h| h.get(key).cloned() == id && id.is_some());
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => drop(have.remove(i)),
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut have[i], item, path),
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item, path);
                have.push(fresh);
            }
        }
    }
}

/// The text of a CRI container log (`<RFC 3339 time> <stream> <P|F> <text>` per line, a `P`
/// line continued by the next), one entry per logged line, as the kubelet serves `kubectl logs`.
/// A line not in that format is kept as it is.
pub fn cri_log_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut partial = String::new();
    for raw in text.lines() {
        let mut parts = raw.splitn(4, ' ');
        let (Some(_time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            lines.push(raw.to_string());
            continue;
        };
        if !matches!(stream, "stdout" | "stderr") {
            lines.push(raw.to_string());
            continue;
        }
        partial.push_str(parts.next().unwrap_or(""));
        if tag != "P" {
            lines.push(std::mem::take(&mut partial));
        }
    }
    if !partial.is_empty() {
        lines.push(partial);
    }
    lines
}

/// The raw CRI log of `container` of `namespace/pod` under the kubelet's log directory `dir`:
/// the newest `<namespace>_<pod>_<uid>` directory, its container's highest `<restart>.log`.
fn read_cri_log(dir: &std::path::Path, ns: &str, pod: &str, container: &str) -> Option<String> {
    let prefix = format!("{ns}_{pod}_");
    let newest = |entries: std::fs::ReadDir, keep: &dyn Fn(&str) -> Option<u64>| {
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let rank = keep(&name)?;
                let mtime = e.metadata().ok()?.modified().ok()?;
                Some(((rank, mtime), e.path()))
            })
            .max_by_key(|(k, _)| *k)
            .map(|(_, p)| p)
    };
    let pod_dir = newest(std::fs::read_dir(dir).ok()?, &|n: &str| {
        n.strip_prefix(&prefix)
            .filter(|uid| !uid.contains('_'))
            .map(|_| 0)
    })?;
    let log = newest(
        std::fs::read_dir(pod_dir.join(container)).ok()?,
        &|n: &str| n.strip_suffix(".log")?.parse::<u64>().ok(),
    )?;
    let bytes = std::fs::read(log).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A plain HTTP/1.0 GET of `target` from `addr` (the pod proxy's backend): status, content type
/// and body, or why there was none (10 s at most).
async fn http_get(addr: &str, target: &str) -> Result<(u16, String, Vec<u8>), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dial tcp {addr}: {e}"))?;
        s.write_all(format!("GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("write tcp {addr}: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read tcp {addr}: {e}"))?;
        Ok::<_, String>(raw)
    };
    let raw = tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("dial tcp {addr}: i/o timeout"))??;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("malformed HTTP response from {addr}"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("malformed HTTP response from {addr}"))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "text/plain".into());
    Ok((code, content_type, raw[split + 4..].to_vec()))
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(x);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The field labels the API server accepts in a field selector of a resource besides
/// `metadata.name`, with where each is in the object, by (API group, resource), and the kind the
/// refusal names. ResourceSlice: `pkg/apis/resource/v1/conversion.go` (the field label
/// conversion: `metadata.name`, `spec.nodeName`, `spec.driver`; there is no `spec.pool.name`)
/// and `pkg/registry/resource/resourceslice/strategy.go` (`toSelectableFields`: a slice without
/// a node name has `spec.nodeName` "").
pub const FIELD_LABELS: &[FieldLabels] = &[FieldLabels {
    group: "resource.k8s.io",
    resource: "resourceslices",
    kind: "resource.k8s.io/v1, Kind=ResourceSlice",
    labels: &[
        ("spec.nodeName", "/spec/nodeName"),
        ("spec.driver", "/spec/driver"),
    ],
}];

/// The field labels of one resource (see [`FIELD_LABELS`]).
#[derive(Debug)]
pub struct FieldLabels {
    /// API group.
    pub group: &'static str,
    /// Resource (plural).
    pub resource: &'static str,
    /// The group, version and kind as the refusal names them.
    pub kind: &'static str,
    /// Each label with the JSON pointer of its field.
    pub labels: &'static [(&'static str, &'static str)],
}

/// One term of a field selector: label, `true` for `=`/`==` (`false` for `!=`), value.
fn field_terms(sel: &str) -> Vec<(&str, bool, &str)> {
    sel.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = t.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = t.split_once('=') {
                (k, true, v)
            } else {
                (t, true, "")
            }
        })
        .collect()
}

fn field_labels(route: &Route) -> Option<&'static FieldLabels> {
    FIELD_LABELS
        .iter()
        .find(|f| f.group == route.group && f.resource == route.resource)
}

/// Refuses a field selector naming a label the resource has not (for [`FIELD_LABELS`]
/// resources), with the API server's message.
fn check_field_selector(route: &Route, query: &BTreeMap<String, String>) -> Result<(), String> {
    let (Some(sel), Some(f)) = (query.get("fieldSelector"), field_labels(route)) else {
        return Ok(());
    };
    for (label, ..) in field_terms(sel) {
        if label != "metadata.name" && !f.labels.iter().any(|(l, _)| *l == label) {
            return Err(format!("field label not supported for {}: {label}", f.kind));
        }
    }
    Ok(())
}

fn selected(route: &Route, v: &Value, query: &BTreeMap<String, String>) -> bool {
    if let Some(sel) = query.get("labelSelector") {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let (k, want) = term
                .split_once('=')
                .map(|(k, v)| (k, Some(v.trim_start_matches('='))))
                .unwrap_or((term, None));
            let have = v
                .pointer("/metadata/labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str);
            match want {
                Some(w) if have != Some(w) => return false,
                None if have.is_none() => return false,
                _ => {}
            }
        }
    }
    if let Some(sel) = query.get("fieldSelector") {
        let labels = field_labels(route).map(|f| f.labels).unwrap_or_default();
        for (label, equal, want) in field_terms(sel) {
            let pointer = match label {
                "metadata.name" => "/metadata/name",
                other => match labels.iter().find(|(l, _)| *l == other) {
                    Some((_, p)) => p,
                    // Not modelled for this resource: ignored.
                    None => continue,
                },
            };
            // An absent field selects as "" (a ResourceSlice without a node name).
            let have = v.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            if (have == want) != equal {
                return false;
            }
        }
    }
    true
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Writes a kubeconfig at `path` pointing at a [`FakeApiServer::serve_http`] listener on `addr`
/// (plain HTTP, no credentials, namespace `default`).
pub fn kubeconfig(path: &std::path::Path, addr: std::net::SocketAddr) -> std::io::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
         current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    std::fs::write(path, text)
}

/// TLS material for [`FakeApiServer::serve_https`]: a CA generated for this run and a serving
/// certificate signed by it, for `127.0.0.1` and `localhost` ([`FakeTls::generate`]) or the names
/// given ([`FakeTls::generate_for`]).
#[derive(Clone)]
pub struct FakeTls {
    ca_pem: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for FakeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeTls").finish_non_exhaustive()
    }
}

impl FakeTls {
    /// Generates a CA and the serving certificate (ECDSA P-256) for `127.0.0.1` and `localhost`.
    pub fn generate() -> Result<FakeTls, String> {
        Self::generate_for(&["127.0.0.1".to_string(), "localhost".to_string()])
    }

    /// Generates a CA and a serving certificate (ECDSA P-256) whose subject alternative names
    /// are `names`: each one that parses as an IP address is an IP SAN, the others DNS names
    /// (the API server's own certificate names its service IP, `kubernetes`,
    /// `kubernetes.default`, `kubernetes.default.svc` and `kubernetes.default.svc.<domain>`).
    pub fn generate_for(names: &[String]) -> Result<FakeTls, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        fn e(what: &'static str) -> impl Fn(rcgen::Error) -> String {
            move |err| format!("fake API server TLS: {what}: {err}")
        }
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e("CA parameters"))?;
        ca.distinguished_name
            .push(DnType::CommonName, "erdma fake API server CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(e("CA key"))?;
        let ca_cert = ca.self_signed(&ca_key).map_err(e("CA certificate"))?;
        let mut leaf =
            CertificateParams::new(names.to_vec()).map_err(e("serving certificate parameters"))?;
        leaf.distinguished_name
            .push(DnType::CommonName, "erdma fake API server");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().map_err(e("serving key"))?;
        let leaf_cert = leaf
            .signed_by(&leaf_key, &Issuer::new(ca, ca_key))
            .map_err(e("serving certificate"))?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let mut cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("fake API server TLS: protocol versions: {err}"))?
        .with_no_client_auth()
        .with_single_cert(vec![leaf_cert.der().clone()], key)
        .map_err(|err| format!("fake API server TLS: serving certificate: {err}"))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(FakeTls {
            ca_pem: ca_cert.pem(),
            acceptor: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg)),
        })
    }

    /// The CA certificate (PEM) a client must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// Writes a kubeconfig for a client of [`FakeApiServer::serve_https`] at `addr`: server
/// `https://ADDR`, `certificate-authority-data` the CA of `tls` (base64), no credentials.
pub fn kubeconfig_tls(
    path: &std::path::Path,
    addr: std::net::SocketAddr,
    tls: &FakeTls,
) -> std::io::Result<()> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(tls.ca_pem.as_bytes());
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
         current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    std::fs::write(path, text)
}

/// `/openapi/v2` as the API server sends it to clients that validate manifests (kubectl, Helm):
/// a protobuf `openapi_v2.Document` — here one with `swagger: "2.0"` and no definitions, so a
/// client finds no schema for any kind and leaves validation to the server (as this fake does
/// by deserialising every object into its k8s-openapi type).
fn openapi_v2() -> Response<Body> {
    // Field 1 (swagger), wire type 2 (length-delimited): "2.0".
    let document: &[u8] = b"\x0a\x032.0";
    Response::builder()
        .status(200)
        .header(
            "content-type",
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        )
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from_static(
            document,
        ))))
        .unwrap_or_else(|_| Response::new(BodyExt::boxed_unsync(Full::new(Bytes::new()))))
}

/// A list's `continue` token: base64url (no padding) of `{"v":"meta.k8s.io/v1","rv":RV,"start":KEY}`.
fn encode_continue(rv: &str, start: &str) -> String {
    use base64::Engine;
    let rv: i64 = rv.parse().unwrap_or(0);
    let body = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body)
}

/// The resourceVersion and start key of a `continue` token, if it is one.
fn decode_continue(token: &str) -> Option<(String, String)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v.get("v")?.as_str()? != "meta.k8s.io/v1" {
        return None;
    }
    Some((
        v.get("rv")?.as_i64()?.to_string(),
        v.get("start")?.as_str()?.to_string(),
    ))
}

fn ok(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from(v.to_string()))))
        .unwrap_or_else(|_| Response::new(BodyExt::boxed_unsync(Full::new(Bytes::new()))))
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    ok(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code}),
    )
}

fn not_found(route: &Route, name: &str) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", route.resource),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot HTTP backend on a local port answering every connection with `answer`.
    async fn backend(answer: &'static str) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let body = answer.replace("{request}", &line);
                let _ = s
                    .write_all(
                        format!("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}")
                            .as_bytes(),
                    )
                    .await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_pod_proxy_reaches_a_registered_backend_and_answers_errors_as_statuses() {
        use k8s_openapi::api::core::v1::{Pod, PodStatus};
        let api = FakeApiServer::new();
        let pod = |name: &str, ip: Option<&str>| Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("erdma-system".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        api.put(&pod("agent-a", Some("10.0.0.1")));
        api.put(&pod("agent-b", None));
        api.put(&pod("agent-c", Some("127.0.0.1")));
        let addr = backend(r#"{"seen": "{request}"}"#).await;
        api.proxy_pod("erdma-system", "agent-a", 9101, addr);
        let client = api.client();
        let get = |path: &str| {
            let client = client.clone();
            let req = hyper::Request::get(path).body(Vec::new()).expect("request");
            async move { client.request_text(req).await }
        };
        let text = get("/api/v1/namespaces/erdma-system/pods/agent-a:9101/proxy/usage?x=1")
            .await
            .expect("proxied");
        assert_eq!(text, r#"{"seen": "GET /usage?x=1 HTTP/1.0"}"#);
        let missing = get("/api/v1/namespaces/erdma-system/pods/nope:9101/proxy/usage")
            .await
            .expect_err("no pod");
        assert!(
            missing.to_string().contains("pods \"nope\" not found"),
            "{missing}"
        );
        let no_ip = get("/api/v1/namespaces/erdma-system/pods/agent-b:9101/proxy/usage")
            .await
            .expect_err("no IP");
        assert!(no_ip.to_string().contains("has no IP address"), "{no_ip}");
        // The pod's own IP and a port nothing listens on: the API server's dial error.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let refused = get(&format!(
            "/api/v1/namespaces/erdma-system/pods/agent-c:{closed}/proxy/usage"
        ))
        .await
        .expect_err("refused");
        assert!(
            refused
                .to_string()
                .contains("error trying to reach service: dial tcp 127.0.0.1:"),
            "{refused}"
        );
        match refused {
            kube::Error::Api(s) => assert_eq!(s.code, 500),
            other => panic!("{other}"),
        }
    }

    #[tokio::test]
    async fn the_pod_proxy_refuses_a_pod_ip_outside_loopback_without_dialling_it() {
        use k8s_openapi::api::core::v1::{Pod, PodStatus};
        let api = FakeApiServer::new();
        let pod = |name: &str, ip: &str| Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Documentation addresses: nothing answers there, so a dial could only time out.
        api.put(&pod("agent-doc", "192.0.2.10"));
        api.put(&pod("agent-v6", "2001:db8::10"));
        api.put(&pod("agent-bad", "not-an-ip"));
        let client = api.client();
        let get = |path: String| {
            let client = client.clone();
            let req = hyper::Request::get(path).body(Vec::new()).expect("request");
            async move { client.request_text(req).await }
        };
        let refused = get("/api/v1/namespaces/kube-system/pods/agent-doc:9101/proxy/usage".into())
            .await
            .expect_err("refused");
        assert!(
            refused.to_string().contains(
                "error trying to reach service: refusing to dial 192.0.2.10:9101 (not loopback or a lab address): the pod proxy for kube-system/agent-doc"
            ),
            "{refused}"
        );
        let v6 = get("/api/v1/namespaces/kube-system/pods/agent-v6:9101/proxy/usage".into())
            .await
            .expect_err("refused");
        assert!(
            v6.to_string()
                .contains("refusing to dial [2001:db8::10]:9101"),
            "{v6}"
        );
        let bad = get("/api/v1/namespaces/kube-system/pods/agent-bad:9101/proxy/usage".into())
            .await
            .expect_err("bad IP");
        assert!(
            bad.to_string()
                .contains("status.podIP \"not-an-ip\", not an IP address"),
            "{bad}"
        );
    }

    #[tokio::test]
    async fn container_logs_are_what_the_test_set_tailed() {
        use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
        let api = FakeApiServer::new();
        api.put(&Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        api.set_pod_log("ml", "p", "main", "one\ntwo\nthree\n");
        let pods: kube::Api<Pod> = kube::Api::namespaced(api.client(), "ml");
        let lp = kube::api::LogParams {
            container: Some("main".into()),
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(pods.logs("p", &lp).await.expect("log"), "two\nthree\n");
        assert_eq!(
            pods.logs("p", &Default::default()).await.expect("log"),
            "one\ntwo\nthree\n"
        );
        assert!(pods.logs("nope", &lp).await.is_err());
    }

    #[tokio::test]
    async fn container_logs_from_the_kubelets_cri_log_files() {
        use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
        let api = FakeApiServer::new();
        api.put(&Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        let d = tempfile::tempdir().expect("tempdir");
        let c = d.path().join("ml_p_0b8e2a4c").join("main");
        std::fs::create_dir_all(&c).expect("mkdir");
        // the first run and the restart that is current; another pod whose name has p as prefix
        std::fs::write(c.join("0.log"), "2026-01-01T00:00:00Z stdout F old\n").expect("write");
        std::fs::write(
            c.join("1.log"),
            "2026-01-01T00:00:01.000000001Z stdout F one\n\
             2026-01-01T00:00:01.000000002Z stderr P tw\n\
             2026-01-01T00:00:01.000000003Z stderr F o\n\
             2026-01-01T00:00:01.000000004Z stdout F three four\n",
        )
        .expect("write");
        let other = d.path().join("ml_p_x_9f").join("main");
        std::fs::create_dir_all(&other).expect("mkdir");
        std::fs::write(
            other.join("0.log"),
            "2026-01-01T00:00:00Z stdout F not mine\n",
        )
        .expect("write");
        api.serve_pod_logs_from(d.path());
        let pods: kube::Api<Pod> = kube::Api::namespaced(api.client(), "ml");
        assert_eq!(
            pods.logs("p", &Default::default()).await.expect("log"),
            "one\ntwo\nthree four\n"
        );
        let lp = kube::api::LogParams {
            container: Some("main".into()),
            tail_lines: Some(1),
            ..Default::default()
        };
        assert_eq!(pods.logs("p", &lp).await.expect("log"), "three four\n");
        api.set_pod_log("ml", "p", "main", "set\n");
        assert_eq!(
            pods.logs("p", &lp).await.expect("log"),
            "set\n",
            "a log set wins"
        );
    }

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;

    async fn client_with(kubeconfig: &str) -> kube::Client {
        let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("kubeconfig");
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .expect("config");
        kube::Client::try_from(cfg).expect("client")
    }

    fn kubeconfig_text(server: &str, ca: &std::path::Path, token: Option<&str>) -> String {
        let user = match token {
            Some(t) => format!("{{token: {t}}}"),
            None => "{}".to_string(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: default}}\ncurrent-context: c\n\
             users:\n- name: u\n  user: {user}\n",
            ca.display()
        )
    }

    #[tokio::test]
    async fn bearer_tokens_authenticate_their_users_over_https_with_the_names_asked() {
        let api = FakeApiServer::new();
        api.put(&ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("cfg".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // The certificate names `kubernetes.default.svc` (DNS) and 127.0.0.1 (IP); `localhost`
        // is not among the names asked.
        let tls = FakeTls::generate_for(&[
            "127.0.0.1".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
        .expect("TLS");
        let cancel = tokio_util::sync::CancellationToken::new();
        tokio::spawn(
            api.clone()
                .serve_https(listener, tls.clone(), cancel.clone()),
        );
        let dir = tempfile::tempdir().expect("dir");
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, tls.ca_pem()).expect("ca");
        let user = "system:serviceaccount:kube-system:controller";
        api.accept_token("tok-1", user);

        let url = format!("https://127.0.0.1:{port}");
        let cms: Api<ConfigMap> = Api::namespaced(
            client_with(&kubeconfig_text(&url, &ca, Some("tok-1"))).await,
            "kube-system",
        );
        assert!(cms.get("cfg").await.is_ok(), "a registered token");
        let audit = api.audit();
        assert_eq!(audit.len(), 1, "{audit:?}");
        assert_eq!(audit[0].attributes.user, user);
        assert_eq!(
            (
                audit[0].attributes.verb.as_str(),
                audit[0].attributes.resource.as_str(),
                audit[0].attributes.name.as_str()
            ),
            ("get", "configmaps", "cfg")
        );

        // An unknown token: 401, and nothing is audited.
        let cms: Api<ConfigMap> = Api::namespaced(
            client_with(&kubeconfig_text(&url, &ca, Some("nope"))).await,
            "kube-system",
        );
        match cms.get("cfg").await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 401, "{s:?}"),
            other => panic!("an unknown token must get 401: {other:?}"),
        }
        // No credentials: unrestricted, not audited (the lab kubelet's and scripts' client).
        let cms: Api<ConfigMap> = Api::namespaced(
            client_with(&kubeconfig_text(&url, &ca, None)).await,
            "kube-system",
        );
        assert!(cms.get("cfg").await.is_ok());
        assert_eq!(api.audit().len(), 1);

        // A name the certificate does not carry fails verification.
        let by_name = format!("https://localhost:{port}");
        let cms: Api<ConfigMap> = Api::namespaced(
            client_with(&kubeconfig_text(&by_name, &ca, None)).await,
            "kube-system",
        );
        assert!(cms.get("cfg").await.is_err(), "localhost is not a SAN");
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_sustained_fault_answers_every_request_until_lifted_and_logs_each() {
        let api = FakeApiServer::new();
        api.put(&ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("cfg".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let cms: Api<ConfigMap> = Api::namespaced(api.client(), "default");
        // 429 as the API server's flow control answers it: the Status carries the delay
        let put = |body: &str| api.fault_control("PUT", body.as_bytes()).status().as_u16();
        assert_eq!(
            put(r#"{"mode": "status", "code": 429, "retryAfterSeconds": 3}"#),
            200
        );
        for _ in 0..2 {
            match cms.get("cfg").await {
                Err(kube::Error::Api(s)) => {
                    assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
                    assert_eq!(
                        s.details.map(|d| d.retry_after_seconds),
                        Some(3),
                        "details.retryAfterSeconds"
                    );
                }
                other => panic!("a 429 fault must answer 429: {other:?}"),
            }
        }
        assert_eq!(put(r#"{"mode": "status", "code": 500}"#), 200);
        match cms.get("cfg").await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"))
            }
            other => panic!("a 500 fault must answer 500: {other:?}"),
        }
        // hang: the request is held until the fault changes, then answered normally
        assert_eq!(put(r#"{"mode": "hang"}"#), 200);
        let held = tokio::spawn({
            let cms = cms.clone();
            async move { cms.get("cfg").await }
        });
        while api.fault_report().faulted.len() < 4 {
            tokio::task::yield_now().await;
        }
        assert!(!held.is_finished(), "a hung request is not answered");
        assert_eq!(put(r#"{"mode": "off"}"#), 200);
        let got = held.await.expect("join").expect("answered once lifted");
        assert_eq!(got.metadata.name.as_deref(), Some("cfg"));
        assert!(cms.get("cfg").await.is_ok(), "no fault: served");
        let report = api.fault_report();
        assert_eq!(report.fault, Fault::Off);
        let faults: Vec<&str> = report.faulted.iter().map(|f| f.fault.as_str()).collect();
        assert_eq!(faults, ["status 429", "status 429", "status 500", "hang"]);
        assert!(
            report.faulted[0]
                .request
                .starts_with("GET /api/v1/namespaces/default/configmaps/cfg")
        );
        // a malformed fault is refused naming the accepted forms
        let bad = api.fault_control("PUT", br#"{"mode": "sometimes"}"#);
        assert_eq!(bad.status().as_u16(), 400);
    }

    #[test]
    fn without_registered_tokens_any_request_is_unrestricted() {
        let api = FakeApiServer::new();
        let mut h = hyper::HeaderMap::new();
        assert_eq!(api.authenticate(&h), Ok(None));
        h.insert(
            hyper::header::AUTHORIZATION,
            "Bearer x".parse().expect("header"),
        );
        assert_eq!(
            api.authenticate(&h),
            Ok(None),
            "no token registered: as before"
        );
        api.accept_token("t", "u");
        assert_eq!(api.authenticate(&h), Err(()));
        h.insert(
            hyper::header::AUTHORIZATION,
            "bearer t".parse().expect("header"),
        );
        assert_eq!(api.authenticate(&h), Ok(Some("u".to_string())));
        h.insert(
            hyper::header::AUTHORIZATION,
            "Basic dTpw".parse().expect("header"),
        );
        assert_eq!(
            api.authenticate(&h),
            Err(()),
            "only bearer tokens are known"
        );
    }
}
