//! A pod from its manifest, as the kubelet sees it: [`manifest`] reads the object (a Pod, or a
//! workload's pod template), [`translate`] checks its spec and turns it into the CRI requests
//! the kubelet sends, with [`expand`] (`$(VAR)`), [`quantity`] (resource amounts),
//! [`volumes`] (hostPath type checks, emptyDir), [`images`] (pull policy, `ImageStatus`) and
//! [`probe`] (startup, readiness and liveness probes). `crate::manifest_pod` runs it.

pub mod expand;
pub mod images;
pub mod manifest;
pub mod probe;
pub mod quantity;
pub mod translate;
pub mod volumes;
