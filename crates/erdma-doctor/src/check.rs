//! One check result, a report of checks, and their text rendering.

use serde::Serialize;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Pass,
    /// Worth knowing, not a problem: e.g. a setting whose effect depends on facts the doctor
    /// cannot see (the message says what is known and what is not).
    Info,
    /// Not applicable, or not checked (the message says why).
    Skip,
    /// Works, but something will likely bite (performance, a missing safety net).
    Warn,
    /// Broken: the fix hint says what to do.
    Fail,
}

impl Status {
    /// Upper-case name as printed.
    pub fn name(&self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Info => "INFO",
            Status::Skip => "SKIP",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check: a stable id, the outcome, what was seen, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable dotted id (`node.allocatable`, `pod.scheduling`, …) for scripts.
    pub id: String,
    /// Outcome.
    pub status: Status,
    /// What was observed, naming the object and the value.
    pub message: String,
    /// What to do about it (absent on PASS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    /// A passing check.
    pub fn pass(id: &str, message: impl Into<String>) -> Self {
        Check {
            id: id.into(),
            status: Status::Pass,
            message: message.into(),
            hint: None,
        }
    }
    /// Information with a suggestion (never changes the exit status).
    pub fn info(id: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Check {
            id: id.into(),
            status: Status::Info,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
    /// A skipped check (the message says why).
    pub fn skip(id: &str, message: impl Into<String>) -> Self {
        Check {
            id: id.into(),
            status: Status::Skip,
            message: message.into(),
            hint: None,
        }
    }
    /// A warning with a fix hint.
    pub fn warn(id: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Check {
            id: id.into(),
            status: Status::Warn,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
    /// A failure with a fix hint.
    pub fn fail(id: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Check {
            id: id.into(),
            status: Status::Fail,
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
}

/// What was diagnosed and the checks, in the order they ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `node/<name>`, `pod/<ns>/<name>` or `local`.
    pub target: String,
    /// The checks.
    pub checks: Vec<Check>,
    /// Counts per outcome.
    pub summary: Summary,
}

/// Counts per outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// PASS count.
    pub pass: usize,
    /// WARN count.
    pub warn: usize,
    /// FAIL count.
    pub fail: usize,
    /// SKIP count.
    pub skip: usize,
    /// INFO count (omitted when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub info: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// Builds a report and its summary.
    pub fn new(target: impl Into<String>, checks: Vec<Check>) -> Self {
        let mut summary = Summary::default();
        for c in &checks {
            match c.status {
                Status::Pass => summary.pass += 1,
                Status::Warn => summary.warn += 1,
                Status::Fail => summary.fail += 1,
                Status::Skip => summary.skip += 1,
                Status::Info => summary.info += 1,
            }
        }
        Report {
            target: target.into(),
            checks,
            summary,
        }
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.summary.fail > 0
    }

    /// The exit status `erdmactl doctor` uses: 1 when a check failed, or (with `strict`) warned;
    /// else 0. INFO and SKIP never count.
    pub fn exit_status(&self, strict: bool) -> u8 {
        u8::from(self.failed() || (strict && self.summary.warn > 0))
    }

    /// The human-readable form: one `STATUS  id  message` line per check, the hint indented below.
    pub fn to_text(&self) -> String {
        let width = self.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
        let mut out = format!("doctor {}\n", self.target);
        for c in &self.checks {
            out.push_str(&format!(
                "{}  {:width$}  {}\n",
                c.status.name(),
                c.id,
                c.message
            ));
            if let Some(h) = &c.hint {
                out.push_str(&format!("      {:width$}  fix: {}\n", "", h));
            }
        }
        let s = self.summary;
        out.push_str(&format!(
            "{} passed, {} warnings, {} failed, {} skipped",
            s.pass, s.warn, s.fail, s.skip
        ));
        if s.info > 0 {
            out.push_str(&format!(", {} info", s.info));
        }
        out.push('\n');
        out
    }
}
