//! `events.k8s.io/v1` Events through kube's [`Recorder`]: one recorder per reporting process, so
//! that a repeated Event (same object, reason, action, note) within kube's cache window becomes a
//! series on the first one (a `patch`) instead of a new object.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Longest note written (the API server rejects notes over 1 KiB).
pub const MAX_NOTE: usize = 1024;

/// The Events of one reporter (`reporting_controller` / `reporting_instance`).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Events reported as `controller` (e.g. `alibabacloud.com/erdma-agent`) by `instance`.
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Events {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.into(),
                    instance: Some(instance.into()),
                },
            ),
        }
    }

    /// Publishes an Event regarding `regarding` (in its namespace, `default` without one):
    /// `warning` or normal, `reason`, `action`, and the note cut to [`MAX_NOTE`] characters.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note.chars().take(MAX_NOTE).collect()),
            action: action.into(),
            secondary: None,
        };
        self.recorder.publish(&ev, regarding).await
    }
}
