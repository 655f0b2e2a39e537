//! The door to the node for everything driver management touches.

use erdma_model::installer::InstallerVersion;
use serde::Serialize;

/// The out-of-tree driver's mode parameter.
pub const COMPAT_MODE_PARAM: &str = "compat_mode";

/// Which installation path brings the driver onto a node that lacks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Installer {
    /// `erdma_installer-<version>.tar.gz` + `./install.sh --batch`; `force_mad` sets
    /// `ERDMA_FORCE_MAD_ENABLE=1` (compat mode).
    Standard {
        /// Installer tarball version.
        version: InstallerVersion,
        /// Build with MAD support (RoCE-compatible mode).
        force_mad: bool,
    },
    /// Container-optimised OS: `yum install -y kernel-modules-$(uname -r)`.
    ContainerOs,
    /// GPU instances: `env_setup.sh --egs` (the OFED-based stack).
    Gpu,
}

/// One `name=value` module parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleParam {
    /// Parameter name.
    pub name: String,
    /// Parameter value.
    pub value: String,
}

impl ModuleParam {
    /// `compat_mode=Y` or `compat_mode=N`.
    pub fn compat_mode(on: bool) -> Self {
        ModuleParam {
            name: COMPAT_MODE_PARAM.to_string(),
            value: if on { "Y" } else { "N" }.to_string(),
        }
    }
}

/// What `modinfo` says about a module.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModuleInfo {
    /// Parameter names (`modinfo -F parm`).
    pub params: Vec<String>,
}

/// A failed host operation, naming what was attempted and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A host command could not be started or exited non-zero.
    #[error("{step}: {detail}. Fix: {fix}")]
    Command {
        /// The command, e.g. `modprobe erdma compat_mode=N`.
        step: String,
        /// Exit status and the tail of its output.
        detail: String,
        /// What an operator can do about it.
        fix: String,
    },
    /// Host state could not be read.
    #[error("reading {what}: {detail}. Fix: {fix}")]
    Read {
        /// The file or fact.
        what: String,
        /// The underlying error.
        detail: String,
        /// What an operator can do about it.
        fix: String,
    },
}

/// Everything driver management needs from the node. Blocking; callers run it off the async
/// runtime. One real implementation ([`crate::NodeHost`]) and one fake (`FakeHost`, feature `fake`).
pub trait Host: Send + Sync + 'static {
    /// `compat_mode` of the loaded `erdma` module (`/sys/module/erdma/parameters/compat_mode`):
    /// `Some(true)` for `Y`, `Some(false)` for `N`, `None` when the parameter does not exist.
    fn compat_mode(&self) -> Result<Option<bool>, HostError>;
    /// Whether the module is loaded.
    fn module_loaded(&self, module: &str) -> Result<bool, HostError>;
    /// `modinfo` of a module for the running kernel; `None` when there is none.
    fn module_info(&self, module: &str) -> Result<Option<ModuleInfo>, HostError>;
    /// Whether the node has NVIDIA GPUs.
    fn has_gpu(&self) -> Result<bool, HostError>;
    /// Whether the node runs a container-optimised OS.
    fn container_os(&self) -> Result<bool, HostError>;
    /// Runs an installer on the host.
    fn run_installer(&self, installer: &Installer) -> Result<(), HostError>;
    /// `modprobe module params…` with the host's kmod.
    fn load_module(&self, module: &str, params: &[ModuleParam]) -> Result<(), HostError>;
    /// `rmmod module` with the host's kmod.
    fn unload_module(&self, module: &str) -> Result<(), HostError>;
}

impl<T: Host> Host for std::sync::Arc<T> {
    fn compat_mode(&self) -> Result<Option<bool>, HostError> {
        (**self).compat_mode()
    }
    fn module_loaded(&self, module: &str) -> Result<bool, HostError> {
        (**self).module_loaded(module)
    }
    fn module_info(&self, module: &str) -> Result<Option<ModuleInfo>, HostError> {
        (**self).module_info(module)
    }
    fn has_gpu(&self) -> Result<bool, HostError> {
        (**self).has_gpu()
    }
    fn container_os(&self) -> Result<bool, HostError> {
        (**self).container_os()
    }
    fn run_installer(&self, installer: &Installer) -> Result<(), HostError> {
        (**self).run_installer(installer)
    }
    fn load_module(&self, module: &str, params: &[ModuleParam]) -> Result<(), HostError> {
        (**self).load_module(module, params)
    }
    fn unload_module(&self, module: &str) -> Result<(), HostError> {
        (**self).unload_module(module)
    }
}
