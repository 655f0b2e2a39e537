//! The driver's published state: the readiness gate, node labels and the node condition, as data.

use crate::observe::RunningMode;
use crate::usage::Holder;
use erdma_model::DriverMode;
use serde::Serialize;
use std::collections::BTreeMap;

/// Node label with the running driver mode (`default`, `compat`, `ofed`, `hardware`, `not-loaded`,
/// `missing`).
pub const LABEL_DRIVER_MODE: &str = "erdma.alibabacloud.com/driver-mode";
/// Node label `true`/`false`: whether the device plugin may advertise devices.
pub const LABEL_DRIVER_READY: &str = "erdma.alibabacloud.com/driver-ready";
/// Node label naming the mode a refused change would switch to; absent when nothing is pending.
pub const LABEL_DRIVER_PENDING: &str = "erdma.alibabacloud.com/driver-pending-mode";
/// Node condition type.
pub const CONDITION_TYPE: &str = "ERdmaDriverReady";

/// Why the driver is (not) ready; also the node condition's `reason` and a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StatusCode {
    /// Not checked yet.
    Starting,
    /// Running in the target mode.
    Converged,
    /// Running in another mode; the switch was refused because pods hold the devices.
    ModeChangePending,
    /// The kernel's erdma has no `compat_mode`; the hardware decides the mode.
    HardwareDecided,
    /// `--prefer-driver=none`: serving the driver as found.
    Unmanaged,
    /// An action or a host read failed; retrying with backoff.
    Failed,
}

impl StatusCode {
    /// CamelCase name (Kubernetes condition reason style).
    pub fn name(&self) -> &'static str {
        match self {
            StatusCode::Starting => "Starting",
            StatusCode::Converged => "Converged",
            StatusCode::ModeChangePending => "ModeChangePending",
            StatusCode::HardwareDecided => "HardwareDecided",
            StatusCode::Unmanaged => "Unmanaged",
            StatusCode::Failed => "Failed",
        }
    }
}

/// A mode change that was planned but refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingChange {
    /// The mode running now.
    pub from: RunningMode,
    /// The mode the change would switch to.
    pub to: DriverMode,
    /// Containers holding the devices (empty when usage could not be determined).
    pub holders: Vec<Holder>,
    /// Why it was refused.
    pub blocked_by: String,
}

/// The driver state the agent publishes (`tokio::sync::watch<DriverStatus>`). The device plugin
/// advertises devices only while `ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverStatus {
    /// The configured mode (`--prefer-driver`).
    pub desired: DriverMode,
    /// The concrete target after resolving `auto`; `None` for `none` or before the first check.
    pub target: Option<DriverMode>,
    /// The mode running now.
    pub running: RunningMode,
    /// Whether devices may be advertised.
    pub ready: bool,
    /// Machine-readable reason.
    pub code: StatusCode,
    /// Human-readable reason, naming the fix when not ready.
    pub reason: String,
    /// A refused mode change, if any.
    pub pending: Option<PendingChange>,
    /// Best-effort failures (e.g. `smc` could not be loaded).
    pub warnings: Vec<String>,
}

impl DriverStatus {
    /// The state before the first reconcile: not ready.
    pub fn starting(desired: DriverMode) -> Self {
        DriverStatus {
            desired,
            target: None,
            running: RunningMode::NotLoaded,
            ready: false,
            code: StatusCode::Starting,
            reason: "driver state not checked yet".to_string(),
            pending: None,
            warnings: Vec::new(),
        }
    }

    /// The status of `--prefer-driver none`: ready at once, the driver never touched.
    pub fn unmanaged() -> Self {
        let mut s = DriverStatus::starting(DriverMode::None);
        s.running = RunningMode::NotLoaded;
        s.ready = true;
        s.code = StatusCode::Unmanaged;
        s.reason = "--prefer-driver none: the driver is never touched; devices are served as found"
            .to_string();
        s
    }

    /// Node labels to publish; `None` means "remove the label" (a JSON merge patch `null`). With
    /// `--prefer-driver none` the mode label says `unmanaged`, since nobody looks at the module.
    pub fn node_labels(&self) -> BTreeMap<&'static str, Option<String>> {
        let mut labels = BTreeMap::new();
        let mode = if self.code == StatusCode::Starting {
            None
        } else if self.code == StatusCode::Unmanaged && self.desired == DriverMode::None {
            Some("unmanaged".to_string())
        } else {
            Some(self.running.name().to_string())
        };
        labels.insert(LABEL_DRIVER_MODE, mode);
        labels.insert(LABEL_DRIVER_READY, Some(self.ready.to_string()));
        labels.insert(
            LABEL_DRIVER_PENDING,
            self.pending.as_ref().map(|p| p.to.name().to_string()),
        );
        labels
    }

    /// The node condition: `(type, status, reason, message)` with status `"True"`/`"False"`.
    pub fn node_condition(&self) -> (&'static str, &'static str, &'static str, String) {
        (
            CONDITION_TYPE,
            if self.ready { "True" } else { "False" },
            self.code.name(),
            self.reason.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_condition() {
        let mut s = DriverStatus::starting(DriverMode::Auto);
        let l = s.node_labels();
        assert_eq!(l[LABEL_DRIVER_MODE], None);
        assert_eq!(l[LABEL_DRIVER_READY].as_deref(), Some("false"));
        assert_eq!(l[LABEL_DRIVER_PENDING], None);
        s.running = RunningMode::Mode(DriverMode::Compat);
        s.ready = true;
        s.code = StatusCode::ModeChangePending;
        s.pending = Some(PendingChange {
            from: s.running,
            to: DriverMode::Default,
            holders: vec![],
            blocked_by: "x".into(),
        });
        let l = s.node_labels();
        assert_eq!(l[LABEL_DRIVER_MODE].as_deref(), Some("compat"));
        assert_eq!(l[LABEL_DRIVER_READY].as_deref(), Some("true"));
        assert_eq!(l[LABEL_DRIVER_PENDING].as_deref(), Some("default"));
        let (t, st, reason, _) = s.node_condition();
        assert_eq!(
            (t, st, reason),
            ("ERdmaDriverReady", "True", "ModeChangePending")
        );
    }
}
