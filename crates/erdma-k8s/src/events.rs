//! `events.k8s.io/v1` Events through kube's [`Recorder`]: one recorder per reporting process, so
//! that a repeated Event (same object, reason, action, note) within kube's cache window becomes a
//! series on the first one (a `patch`) instead of a new object. An Event that happens once per
//! object ([`Events::publish_once`]) skips the recorder: its cache would keep a copy of each
//! for six minutes (5 000 copies when 5 000 nodes join at once) for a series that never comes.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Longest note written (the API server rejects notes over 1 KiB).
pub const MAX_NOTE: usize = 1024;

/// The Events of one reporter (`reporting_controller` / `reporting_instance`).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    client: Client,
    controller: String,
    instance: String,
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
                client.clone(),
                Reporter {
                    controller: controller.into(),
                    instance: Some(instance.into()),
                },
            ),
            client,
            controller: controller.into(),
            instance: instance.into(),
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

    /// Publishes an Event as [`Events::publish`] does, but as a new object that nothing is
    /// kept of: for what happens once per object (an ERI selection), where a series cannot
    /// form and the recorder's cache would only hold memory.
    pub async fn publish_once(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let ev = one_event(
            regarding,
            warning,
            reason,
            action,
            note,
            &self.controller,
            &self.instance,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let ns = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), ns);
        api.create(&PostParams::default(), &ev).await.map(|_| ())
    }
}

/// The Event object of [`Events::publish_once`]: named after the object and the time (in
/// nanoseconds, hexadecimal), as the recorder names its own.
#[allow(clippy::too_many_arguments)]
fn one_event(
    regarding: &ObjectReference,
    warning: bool,
    reason: &str,
    action: &str,
    note: &str,
    controller: &str,
    instance: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> K8sEvent {
    let object = regarding.name.as_deref().unwrap_or("unnamed");
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", now.as_nanosecond())),
            namespace: Some(regarding.namespace.clone().unwrap_or("default".into())),
            ..Default::default()
        },
        action: Some(action.into()),
        reason: Some(reason.into()),
        note: Some(note.chars().take(MAX_NOTE).collect()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(controller.into()),
        reporting_instance: Some(instance.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_off_event_names_its_object_reporter_and_words() {
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some("gpu-1".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        let now: k8s_openapi::jiff::Timestamp = "2026-01-02T03:04:05.000000006Z".parse().unwrap();
        let long = "x".repeat(MAX_NOTE + 10);
        let ev = one_event(
            &node,
            false,
            "ERIsSelected",
            "Provision",
            &long,
            "ctl",
            "pod-a",
            now,
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        let name = ev.metadata.name.unwrap();
        assert!(name.starts_with("gpu-1."), "{name}");
        assert_eq!(
            i128::from_str_radix(name.trim_start_matches("gpu-1."), 16).unwrap(),
            now.as_nanosecond()
        );
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(ev.reason.as_deref(), Some("ERIsSelected"));
        assert_eq!(ev.action.as_deref(), Some("Provision"));
        assert_eq!(ev.note.unwrap().len(), MAX_NOTE);
        assert_eq!(ev.regarding.unwrap().uid.as_deref(), Some("u-1"));
        assert_eq!(ev.reporting_controller.as_deref(), Some("ctl"));
        assert_eq!(ev.reporting_instance.as_deref(), Some("pod-a"));
        assert_eq!(ev.event_time.unwrap().0, now);
        let w = one_event(&node, true, "R", "A", "n", "ctl", "pod-a", now);
        assert_eq!(w.type_.as_deref(), Some("Warning"));
    }
}
