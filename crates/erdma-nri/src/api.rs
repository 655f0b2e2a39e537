//! Generated message types (prost) of our NRI and ttRPC protos, and the service names on the wire.

#[allow(missing_docs, clippy::all)]
mod nri_v1alpha1 {
    include!("gen/nri_v1alpha1.rs");
}
#[allow(missing_docs, clippy::all)]
mod ttrpc_envelope {
    include!("gen/ttrpc.rs");
}

pub use nri_v1alpha1::*;

/// ttRPC's envelope messages.
pub mod envelope {
    pub use super::ttrpc_envelope::*;
}

/// The runtime's service (served by the runtime, called by the plugin).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The plugin's service (served by the plugin, called by the runtime).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// The events an NRI v0.7-v0.9 runtime accepts in a subscription (containerd 1.7's v0.6 too):
/// `RunPodSandbox` through `RemoveContainer`; a mask with more bits fails `Configure`.
pub const VALID_EVENTS_V08: i32 = (1 << (Event::RemoveContainer as i32)) - 1;
/// The events an NRI v0.10+ runtime accepts (adds `UpdatePodSandbox`, `PostUpdatePodSandbox`,
/// `ValidateContainerAdjustment`). A runtime treats a mask of 0 as all of its valid events.
pub const VALID_EVENTS: i32 = (1 << (Event::Last as i32 - 1)) - 1;

/// The event's name as NRI writes it (`RunPodSandbox`), which is also the name of its own RPC in
/// NRI v0.12+.
pub fn event_name(event: Event) -> &'static str {
    match event {
        Event::Unknown => "Unknown",
        Event::RunPodSandbox => "RunPodSandbox",
        Event::StopPodSandbox => "StopPodSandbox",
        Event::RemovePodSandbox => "RemovePodSandbox",
        Event::CreateContainer => "CreateContainer",
        Event::PostCreateContainer => "PostCreateContainer",
        Event::StartContainer => "StartContainer",
        Event::PostStartContainer => "PostStartContainer",
        Event::UpdateContainer => "UpdateContainer",
        Event::PostUpdateContainer => "PostUpdateContainer",
        Event::StopContainer => "StopContainer",
        Event::RemoveContainer => "RemoveContainer",
        Event::UpdatePodSandbox => "UpdatePodSandbox",
        Event::PostUpdatePodSandbox => "PostUpdatePodSandbox",
        Event::ValidateContainerAdjustment => "ValidateContainerAdjustment",
        Event::Last => "Last",
    }
}

/// The subscription mask of `ConfigureResponse.events`: bit `event - 1` per event.
pub fn event_mask(events: &[Event]) -> i32 {
    events
        .iter()
        .filter(|e| **e != Event::Unknown && **e != Event::Last)
        .fold(0, |m, e| m | (1 << (*e as i32 - 1)))
}

/// Whether `mask` subscribes `event`.
pub fn subscribed(mask: i32, event: Event) -> bool {
    let bit = event as i32 - 1;
    (0..31).contains(&bit) && mask & (1 << bit) != 0
}
