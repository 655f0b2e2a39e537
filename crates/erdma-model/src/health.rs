//! Health of a device and the findings discovery reports about it.

use serde::Serialize;

/// Whether a device can be handed to pods, with the reasons when it cannot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Health {
    /// Usable: char device present, port active, netdev up.
    Healthy,
    /// Not usable now; each reason names the object and what to check.
    Unhealthy {
        /// Human-readable reasons, most important first.
        reasons: Vec<String>,
    },
}

impl Health {
    /// True when healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }

    /// Builds a health value from a list of reasons (empty = healthy).
    pub fn from_reasons(reasons: Vec<String>) -> Self {
        if reasons.is_empty() {
            Health::Healthy
        } else {
            Health::Unhealthy { reasons }
        }
    }

    /// The reasons (empty when healthy).
    pub fn reasons(&self) -> &[String] {
        match self {
            Health::Healthy => &[],
            Health::Unhealthy { reasons } => reasons,
        }
    }
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing, nothing broken.
    Info,
    /// Inconsistent or degraded, but the device may still work.
    Warning,
    /// A value could not be read or parsed.
    Error,
}

/// Something discovery noticed about a device: an unreadable file, a mode mismatch, …
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Severity.
    pub severity: Severity,
    /// What was found, naming the file or value and the fix.
    pub message: String,
}

impl Finding {
    /// A warning.
    pub fn warning(message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Warning,
            message: message.into(),
        }
    }
    /// An error.
    pub fn error(message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Error,
            message: message.into(),
        }
    }
    /// An informational note.
    pub fn info(message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Info,
            message: message.into(),
        }
    }
}
