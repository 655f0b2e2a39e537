//! eRDMA driver manager.
//!
//! Driver management is explicit, safe and observable:
//!
//! 1. [`observe`] reads the node through the [`Host`] door (module state, `compat_mode`, GPUs,
//!    container-optimised OS) into an [`Observed`] value;
//! 2. [`plan`] turns the desired [`DriverMode`](erdma_model::DriverMode) and that value into a
//!    [`Plan`]: a list of [`Step`] values (installer, `rmmod`, `modprobe`), pure and testable;
//! 3. [`DriverReconciler`] asks [`PodResourceUsage`] before any reload and refuses while
//!    containers hold `aliyun/erdma` (unless forced), runs the steps through the host door, verifies,
//!    and publishes a [`DriverStatus`] (readiness gate, node labels, node condition) on a
//!    `tokio::sync::watch` channel, at start and periodically.
//!
//! The real host is [`NodeHost`]: it runs kmod and installers inside PID 1's mount and cgroup
//! namespaces with `setns` (no `nsenter`). The fakes are behind the `fake` feature.

mod execute;
mod host;
mod kubelet;
mod node;
mod observe;
mod plan;
mod reconcile;
mod status;
mod usage;

#[cfg(test)]
mod matrix_tests;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub mod fetch;
pub use execute::{Executed, execute};
pub use host::{Host, HostError, ModuleInfo};
pub use kubelet::KubeletPodResources;
pub use node::{CommandOutput, HOST_PATH, HostNamespaces, NodeHost};
pub use observe::{
    COMPAT_MODE_PARAM, CompatMode, ERDMA_MODULE, ErdmaState, Observed, PEERMEM_MODULE, RunningMode,
    SMC_MODULE, observe,
};
pub use plan::{
    DEFAULT_INSTALLER_VERSION, Installer, InstallerVersion, InvalidInstallerVersion, ModuleParam,
    Plan, Step, plan, resolve,
};
pub use reconcile::{Assessment, ConfigError, DriverConfig, DriverReconciler, Pass};
pub use status::{
    CONDITION_TYPE, DriverStatus, LABEL_DRIVER_MODE, LABEL_DRIVER_PENDING, LABEL_DRIVER_READY,
    PendingChange, StatusCode,
};
pub use usage::{Holder, PodResourceUsage, RESOURCE_NAME, UsageError};
