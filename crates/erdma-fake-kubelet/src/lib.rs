//! A fake kubelet for device-plugin tests and the lab.
//!
//! It plays the kubelet's side of the device-plugin protocol over real Unix sockets:
//!
//! - serves `v1beta1.Registration` on `<dir>/kubelet.sock`, validates the version and the
//!   resource name like the kubelet, and dials the plugin back *inside* `Register` (plain h2c,
//!   `:authority` `localhost` or, as old kubelets did, the socket path);
//! - consumes `ListAndWatch` and keeps the advertised devices; when the stream ends the devices
//!   become `Unhealthy`, as the kubelet marks them;
//! - allocates like kubelet admission for one container: takes the devices it reuses from an
//!   init container of the pod, calls `GetPreferredAllocation` (when offered) with the free
//!   healthy IDs plus the reused ones as `must_include`, uses the preferred IDs that are free and
//!   fills up from the free ones, then calls `Allocate`, records the result in its ledger (a
//!   checkpoint file that survives restarts) *before* calling `PreStartContainer` (when required),
//!   as the kubelet does, so a pre-start hook finds the pod through pod-resources; a failed
//!   `PreStartContainer` removes the record again (the kubelet fails the container);
//! - simulates kubelet restarts: deletes every socket in the directory and re-creates
//!   `kubelet.sock`;
//! - with the lab's API server, writes the plugins' resources into the Node's status as the
//!   kubelet does ([`node_status`]): capacity and allocatable while registered, kept at 0 once
//!   the plugin is gone;
//! - serves the pod-resources v1 API (List / Get / GetAllocatableResources) from its ledger;
//! - runs pods on a real container runtime over CRI after admission ([`pods`]): sandbox,
//!   allocation, container with the Allocate response's devices, mounts, envs and CDI names;
//!   or a pod from a manifest ([`manifest_pod`], [`podspec`]): a Pod or a workload's pod
//!   template translated into CRI as the kubelet does (namespaces, security context, env with
//!   the downward API, hostPath and emptyDir volumes, extended resources through the device
//!   plugin, image pull policy against `ImageStatus`, init containers run to completion in
//!   order first, startup/readiness/liveness probes) and, with the lab's API server
//!   ([`pod_api`]), the ServiceAccount admission, configMap/secret/projected volumes, env from
//!   ConfigMaps and Secrets and the service variables;
//! - accepts a second plugin for a resource as the kubelet does (it becomes the endpoint, every
//!   open stream keeps feeding the device list, any stream ending marks the resource unhealthy);
//!   [`other_plugin`] is a stand-in for such a plugin (terway's eRDMA ENI plugin);
//! - plays the kubelet's side of DRA ([`dra`]): plugin-watcher registration of a DRA driver and
//!   NodePrepareResources / NodeUnprepareResources over its sockets; [`claims`] finds a
//!   container's ResourceClaims in its Pod object and prepares them, so that [`pods`] runs the
//!   container with the CDI devices the driver returned; as the kubelet release of its choice
//!   ([`dra::KubeletVersion`], 1.34 to 1.37): the plugin API and the resource-health service
//!   picked from `GetInfo`, one or more plugins per driver ([`dra::DraKubelet`]);
//!   [`dra_plugin`] is a stand-in DRA plugin listing the services it is given;
//! - for the lab, the API server ([`apiserver`]: erdma-k8s's fake over HTTP or HTTPS, loaded with
//!   a rendered chart's objects, with a token per service account that authenticates as it);
//! - for the lab, the API server's admission step ([`admission`]): the mutating webhooks of the
//!   MutatingWebhookConfigurations called for a pod CREATE over HTTPS, their JSON patches
//!   applied ([`json_patch`]);
//! - for the lab, a minimal allocator ([`allocator`], not the scheduler) that writes the
//!   allocation the scheduler would into a ResourceClaim, including the claim the scheduler makes
//!   for an extended resource served through a DeviceClass (KEP-5004).
//!
//! Everything it knows is written to `<dir>/fake-kubelet-state.json` whenever it changes, so a
//! test or a lab script can read it.

pub mod admission;
pub mod allocator;
pub mod apiserver;
pub mod claims;
pub mod client;
pub mod daemon;
pub mod dra;
pub mod dra_plugin;
pub mod error;
pub mod json_patch;
pub mod manifest_pod;
pub mod node_status;
pub mod other_plugin;
pub mod pod_api;
pub mod pod_security;
pub mod podresources;
pub mod pods;
pub mod podspec;
pub mod state;

pub use client::{AllocateOptions, AllocationOutput, allocate, allocate_reusing, release};
pub use daemon::{FakeKubelet, FakeKubeletConfig};
pub use error::{FakeKubeletError, Result};
pub use other_plugin::OtherPlugin;
pub use state::{AllocationRecord, DeviceState, OptionsState, ResourceState, StateFile};

/// File name of the state file in the device-plugin directory.
pub const STATE_FILE: &str = "fake-kubelet-state.json";
/// File name of the allocation ledger (the fake's checkpoint) in the device-plugin directory.
pub const LEDGER_FILE: &str = "fake-kubelet-checkpoint.json";
/// File name of the lock that serialises state and ledger updates.
pub const LOCK_FILE: &str = "fake-kubelet.lock";
/// File name of the daemon's PID file.
pub const PID_FILE: &str = "fake-kubelet.pid";
