//! Runs planned steps through the host door.

use crate::host::{Host, HostError};
use crate::plan::Step;

/// What executing a list of steps did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Executed {
    /// Steps that succeeded, rendered (e.g. `modprobe smc`).
    pub done: Vec<String>,
    /// Best-effort steps that failed, with their errors.
    pub warnings: Vec<String>,
    /// The required step that failed; later steps were not run.
    pub error: Option<HostError>,
}

/// Runs `steps` in order. A failed best-effort step becomes a warning; a failed required step stops
/// the run. Every step is logged.
pub fn execute<H: Host + ?Sized>(host: &H, steps: &[Step]) -> Executed {
    let mut out = Executed::default();
    for step in steps {
        tracing::info!(step = %step, "driver: running host action");
        let (result, required) = match step {
            Step::Install(installer) => (host.run_installer(installer), true),
            Step::Unload { module } => (host.unload_module(module), true),
            Step::Load {
                module,
                params,
                required,
            } => (host.load_module(module, params), *required),
        };
        match result {
            Ok(()) => out.done.push(step.to_string()),
            Err(e) if !required => {
                tracing::warn!(step = %step, error = %e, "driver: best-effort action failed");
                out.warnings.push(e.to_string());
            }
            Err(e) => {
                tracing::error!(step = %step, error = %e, "driver: action failed");
                out.error = Some(e);
                break;
            }
        }
    }
    out
}
