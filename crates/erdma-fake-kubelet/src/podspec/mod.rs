//! A pod from its manifest, as the kubelet sees it: [`manifest`] reads the object (a Pod, or a
//! workload's pod template), [`translate`] checks its spec and turns it into the CRI requests
//! the kubelet sends, with [`expand`] (`$(VAR)`), [`quantity`] (resource amounts),
//! [`volumes`] (hostPath type checks, emptyDir), [`images`] (pull policy, `ImageStatus`) and
//! [`probe`] (startup, readiness and liveness probes); with an API server, [`objects`] (what the
//! kubelet read for the pod: ConfigMaps, Secrets, Services, the token; volume payloads and
//! service variables from them), [`serviceaccount`] (the API server's ServiceAccount admission)
//! and [`atomic`] (the kubelet's atomic writer of configMap/secret/projected volumes).
//! `crate::manifest_pod` runs it.

pub mod atomic;
pub mod expand;
pub mod images;
pub mod manifest;
pub mod objects;
pub mod probe;
pub mod quantity;
pub mod serviceaccount;
pub mod translate;
pub mod volumes;
