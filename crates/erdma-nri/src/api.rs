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
