//! The reconcile loop: observe → plan → guard → execute → verify, at start and periodically.

use crate::execute::{Executed, execute};
use crate::host::{Host, HostError};
use crate::observe::{ErdmaState, Observed, RunningMode, observe};
use crate::plan::{InstallerVersion, Plan, plan};
use crate::status::{DriverStatus, PendingChange, StatusCode};
use crate::usage::{Held, PodResourceUsage, RESOURCE_NAME};
use erdma_model::{Backoff, DriverMode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Driver-manager settings (agent flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// `--prefer-driver`.
    pub mode: DriverMode,
    /// `--erdma-installer-version`.
    pub installer_version: InstallerVersion,
    /// `--force-driver-reload`: reload even while pods hold the devices.
    pub force_reload: bool,
    /// Period between checks when all is well.
    pub resync: Duration,
    /// First retry delay after a failure; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// What holding the devices means (the extended resource, and the DRA driver's claims):
    /// its holders block a reload.
    pub resource: Held,
    /// Where installers come from and the SHA-256 pins they must match.
    pub installer_trust: crate::fetch::InstallerTrust,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            mode: DriverMode::Auto,
            installer_version: InstallerVersion::default(),
            force_reload: false,
            resync: Duration::from_secs(60),
            backoff_initial: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            resource: Held::both(RESOURCE_NAME, erdma_model::names::DRA_DRIVER),
            installer_trust: crate::fetch::InstallerTrust::default(),
        }
    }
}

/// A driver flag has a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `--prefer-driver`.
    #[error("--prefer-driver: {0}")]
    Mode(#[from] erdma_model::driver::UnknownDriverMode),
    /// `--erdma-installer-version`.
    #[error(transparent)]
    Version(#[from] crate::plan::InvalidInstallerVersion),
}

impl DriverConfig {
    /// Settings from the agent's flags (`--prefer-driver`, `--erdma-installer-version`,
    /// `--force-driver-reload`); the periods keep their defaults.
    pub fn from_flags(
        prefer_driver: &str,
        installer_version: &str,
        force_reload: bool,
    ) -> Result<Self, ConfigError> {
        Ok(DriverConfig {
            mode: prefer_driver.parse()?,
            installer_version: InstallerVersion::parse(installer_version)?,
            force_reload,
            ..DriverConfig::default()
        })
    }
}

/// The result of [`DriverReconciler::assess`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Assessment {
    /// The node's driver state.
    pub observed: Observed,
    /// What the agent would do.
    pub plan: Plan,
    /// The status as it stands.
    pub status: DriverStatus,
}

/// What one reconcile pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The resulting status.
    pub status: DriverStatus,
    /// Host actions that succeeded, in order.
    pub executed: Vec<String>,
    /// Whether the pass failed (the loop then retries with backoff).
    pub failed: bool,
}

/// Drives the node's erdma driver towards the configured mode, safely.
///
/// ```text
/// let (tx, rx) = tokio::sync::watch::channel(DriverStatus::starting(cfg.mode));
/// tokio::spawn(DriverReconciler::new(NodeHost::new(), usage, cfg).run(cancel.clone(), tx));
/// // device plugin: advertise only while rx.borrow().ready
/// ```
pub struct DriverReconciler<H, U> {
    host: Arc<H>,
    usage: U,
    config: DriverConfig,
}

impl<H: Host, U: PodResourceUsage> DriverReconciler<H, U> {
    /// A reconciler acting through `host`, asking `usage` before reloads.
    pub fn new(host: H, usage: U, config: DriverConfig) -> Self {
        DriverReconciler {
            host: Arc::new(host),
            usage,
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DriverConfig {
        &self.config
    }

    /// Observes the node and returns the plan without executing it (dry run, `erdmactl doctor`).
    pub async fn plan(&self) -> Result<(Observed, Plan), HostError> {
        let observed = self.observe().await?;
        let p = plan(self.config.mode, &observed, &self.config.installer_version);
        Ok((observed, p))
    }

    /// Dry run for `erdmactl doctor`: what the node runs, what the agent would do, and the status
    /// as it stands (not ready, with the pending actions as the reason, when not converged).
    /// Changes nothing and asks nobody.
    pub async fn assess(&self) -> Result<Assessment, HostError> {
        let (observed, p) = self.plan().await?;
        let mut status = self.status(&observed, p.target, None, p.hardware_decided, Vec::new());
        if status.code == StatusCode::Failed {
            let steps: Vec<String> = p.steps.iter().map(|s| s.to_string()).collect();
            status.reason = format!(
                "erdma is {}; to reach mode {} the agent would run: {}",
                status.running.name(),
                p.target.map(|t| t.name()).unwrap_or("none"),
                steps.join("; ")
            );
        }
        Ok(Assessment {
            observed,
            plan: p,
            status,
        })
    }

    async fn observe(&self) -> Result<Observed, HostError> {
        let host = Arc::clone(&self.host);
        tokio::task::spawn_blocking(move || observe(&*host))
            .await
            .unwrap_or_else(|e| {
                Err(HostError::Read {
                    what: "driver state".into(),
                    detail: e.to_string(),
                    fix: "see agent logs".into(),
                })
            })
    }

    async fn execute(&self, plan: &Plan) -> Executed {
        let host = Arc::clone(&self.host);
        let steps = plan.steps.clone();
        tokio::task::spawn_blocking(move || execute(&*host, &steps))
            .await
            .unwrap_or_else(|e| Executed {
                error: Some(HostError::Command {
                    step: "driver actions".into(),
                    detail: e.to_string(),
                    fix: "see agent logs".into(),
                }),
                ..Executed::default()
            })
    }

    /// Guards a reloading plan: returns the plan to run and the refused change, if any.
    async fn guard(&self, p: Plan, running: RunningMode) -> (Plan, Option<PendingChange>) {
        let Some(to) = p.target.filter(|_| p.reloads()) else {
            return (p, None);
        };
        let resource = &self.config.resource;
        let (holders, blocked_by) = match self.usage.holders(resource).await {
            Ok(h) if h.is_empty() => return (p, None),
            Ok(h) => {
                let names: Vec<String> = h.iter().map(|x| x.to_string()).collect();
                let why = format!(
                    "{} container(s) hold {resource}: {}",
                    h.len(),
                    names.join(", ")
                );
                (h, why)
            }
            Err(e) => (Vec::new(), e.to_string()),
        };
        if self.config.force_reload {
            tracing::error!(
                from = running.name(), to = to.name(), blocked_by = %blocked_by,
                "driver: --force-driver-reload: RELOADING erdma WHILE IT MAY BE IN USE; running pods lose their RDMA devices"
            );
            return (p, None);
        }
        tracing::warn!(
            from = running.name(), to = to.name(), blocked_by = %blocked_by,
            "driver: mode change refused while the devices are in use; keeping the current mode"
        );
        let pending = PendingChange {
            from: running,
            to,
            holders,
            blocked_by,
        };
        (p.without_reload(), Some(pending))
    }

    /// One pass: observe, plan, guard, execute, verify.
    pub async fn reconcile_once(&self) -> Pass {
        let mut executed = Vec::new();
        let mut warnings = Vec::new();
        let mut pending = None;
        let mut hardware_decided = false;
        let mut target = None;
        // A second round only follows an installer run: the installer may leave the module in any state.
        for round in 0..2 {
            let observed = match self.observe().await {
                Ok(o) => o,
                Err(e) => {
                    return self.failed(
                        target,
                        RunningMode::NotLoaded,
                        e.to_string(),
                        executed,
                        warnings,
                    );
                }
            };
            let running = observed.running_mode(target);
            let p = plan(self.config.mode, &observed, &self.config.installer_version);
            target = p.target;
            hardware_decided = p.hardware_decided;
            let installs = p
                .steps
                .iter()
                .any(|s| matches!(s, crate::plan::Step::Install(_)));
            let (p, refused) = self.guard(p, running).await;
            pending = refused;
            let ex = self.execute(&p).await;
            executed.extend(ex.done);
            warnings.extend(ex.warnings);
            if let Some(e) = ex.error {
                let running = self
                    .observe()
                    .await
                    .map(|o| o.running_mode(target))
                    .unwrap_or(running);
                return self.failed(target, running, e.to_string(), executed, warnings);
            }
            if !(installs && round == 0) {
                break;
            }
        }
        let observed = match self.observe().await {
            Ok(o) => o,
            Err(e) => {
                return self.failed(
                    target,
                    RunningMode::NotLoaded,
                    e.to_string(),
                    executed,
                    warnings,
                );
            }
        };
        let status = self.status(&observed, target, pending, hardware_decided, warnings);
        let failed = status.code == StatusCode::Failed;
        Pass {
            status,
            executed,
            failed,
        }
    }

    fn failed(
        &self,
        target: Option<DriverMode>,
        running: RunningMode,
        reason: String,
        executed: Vec<String>,
        warnings: Vec<String>,
    ) -> Pass {
        let status = DriverStatus {
            desired: self.config.mode,
            target,
            running,
            ready: false,
            code: StatusCode::Failed,
            reason,
            pending: None,
            warnings,
        };
        Pass {
            status,
            executed,
            failed: true,
        }
    }

    fn status(
        &self,
        observed: &Observed,
        target: Option<DriverMode>,
        pending: Option<PendingChange>,
        hardware_decided: bool,
        warnings: Vec<String>,
    ) -> DriverStatus {
        let running = observed.running_mode(target);
        let loaded = matches!(observed.erdma, ErdmaState::Loaded { .. });
        let (ready, code, reason) = match (target, &pending) {
            (None, _) if loaded => (
                true,
                StatusCode::Unmanaged,
                format!("--prefer-driver=none: serving erdma as found ({} mode)", running.name()),
            ),
            (None, _) => (
                false,
                StatusCode::Unmanaged,
                "--prefer-driver=none and the erdma module is not loaded: load it by hand or choose a driver mode"
                    .to_string(),
            ),
            (Some(to), Some(p)) => (
                loaded,
                StatusCode::ModeChangePending,
                format!(
                    "driver mode change {} -> {} pending: {}; drain those pods (the change is applied on the next check) or restart the agent with --force-driver-reload",
                    running.name(),
                    to.name(),
                    p.blocked_by
                ),
            ),
            (Some(to), None) if hardware_decided && loaded => (
                true,
                StatusCode::HardwareDecided,
                format!(
                    "this kernel's erdma has no compat_mode parameter: the hardware decides the protocol; requested mode {} is not enforced",
                    to.name()
                ),
            ),
            (Some(to), None) if running == RunningMode::Mode(to) => {
                (true, StatusCode::Converged, format!("erdma loaded in {} mode", to.name()))
            }
            (Some(to), None) => (
                false,
                StatusCode::Failed,
                format!(
                    "erdma is {} after applying mode {}; retrying (check `dmesg` and the installer log on the node)",
                    running.name(),
                    to.name()
                ),
            ),
        };
        DriverStatus {
            desired: self.config.mode,
            target,
            running,
            ready,
            code,
            reason,
            pending,
            warnings,
        }
    }

    /// Reconciles now and then every `resync` (after failures: backoff from `backoff_initial` doubling
    /// to `backoff_max`), publishing every change on `status_tx`, until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken, status_tx: watch::Sender<DriverStatus>) {
        let mut backoff = Backoff::new(self.config.backoff_initial, self.config.backoff_max);
        loop {
            let pass = tokio::select! {
                _ = cancel.cancelled() => return,
                pass = self.reconcile_once() => pass,
            };
            let delay = if pass.failed {
                let d = backoff.next_delay();
                tracing::warn!(reason = %pass.status.reason, retry_in = ?d, "driver: not ready");
                d
            } else {
                backoff.reset();
                self.config.resync
            };
            status_tx.send_if_modified(|s| {
                if *s != pass.status {
                    tracing::info!(ready = pass.status.ready, code = pass.status.code.name(), reason = %pass.status.reason, "driver: status changed");
                    *s = pass.status.clone();
                    true
                } else {
                    false
                }
            });
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn assess_changes_nothing_and_explains() {
        use crate::fake::{FakeHost, FakeState, FakeUsage};
        let mut st = FakeState::default();
        st.loaded.insert("erdma".into());
        st.compat = true;
        let host = std::sync::Arc::new(FakeHost::new(st));
        let usage = std::sync::Arc::new(FakeUsage::idle());
        let r = DriverReconciler::new(
            std::sync::Arc::clone(&host),
            std::sync::Arc::clone(&usage),
            DriverConfig {
                mode: DriverMode::Default,
                ..DriverConfig::default()
            },
        );
        let a = r.assess().await.unwrap();
        assert!(host.actions().is_empty());
        assert_eq!(usage.calls(), 0);
        assert!(!a.status.ready);
        assert_eq!(
            a.status.reason,
            "erdma is compat; to reach mode default the agent would run: rmmod erdma; modprobe erdma compat_mode=N; modprobe smc"
        );
        assert_eq!(a.plan.steps.len(), 3);
    }

    #[test]
    fn flags_are_validated() {
        let c = DriverConfig::from_flags("", "1.5.9", false).unwrap();
        assert_eq!(
            (c.mode, c.installer_version.as_str(), c.force_reload),
            (DriverMode::Auto, "1.5.9", false)
        );
        assert_eq!(
            DriverConfig::from_flags("compat", "1.6.0", true)
                .unwrap()
                .mode,
            DriverMode::Compat
        );
        let e = DriverConfig::from_flags("fake", "1.5.9", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--prefer-driver")
                && e.contains("\"fake\"")
                && e.contains("default, compat, ofed"),
            "{e}"
        );
        let e = DriverConfig::from_flags("default", "latest", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--erdma-installer-version") && e.contains("latest"),
            "{e}"
        );
    }
}
