//! What the node looks like right now, as plain values, and how to read it through a [`Host`].

use crate::host::{Host, HostError};
use erdma_model::{DeviceMode, DriverMode};
use serde::Serialize;

/// Name of the eRDMA kernel module.
pub const ERDMA_MODULE: &str = "erdma";
/// Name of the SMC kernel module.
pub const SMC_MODULE: &str = "smc";
/// Name of the GPUDirect peer-memory module.
pub const PEERMEM_MODULE: &str = "nvidia_peermem";
pub use crate::host::COMPAT_MODE_PARAM;

/// How the loaded `erdma` module decides its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompatMode {
    /// `compat_mode=Y`: RoCE-compatible mode.
    Yes,
    /// `compat_mode=N`: eRDMA's own iWARP mode.
    No,
    /// No `compat_mode` parameter (upstream Linux 6.14+): the hardware decides; it cannot be switched.
    HardwareDecided,
}

impl CompatMode {
    /// The device protocol this setting produces, when the module decides it.
    pub fn device_mode(&self) -> Option<DeviceMode> {
        match self {
            CompatMode::Yes => Some(DeviceMode::Roce),
            CompatMode::No => Some(DeviceMode::Iwarp),
            CompatMode::HardwareDecided => None,
        }
    }
}

/// State of the `erdma` driver on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ErdmaState {
    /// No `erdma` module for the running kernel (`modinfo erdma` fails): the installer is needed.
    Missing,
    /// The module is installed but not loaded. `compat_param` says whether it takes `compat_mode`.
    NotLoaded {
        /// Whether `modinfo` lists the `compat_mode` parameter (out-of-tree driver).
        compat_param: bool,
    },
    /// The module is loaded.
    Loaded {
        /// The mode it was loaded in.
        compat: CompatMode,
    },
}

/// Everything the planner needs to know about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// The `erdma` driver.
    pub erdma: ErdmaState,
    /// Whether `smc` is loaded.
    pub smc_loaded: bool,
    /// Whether an `nvidia_peermem` module exists for the running kernel.
    pub peermem_available: bool,
    /// Whether `nvidia_peermem` is loaded.
    pub peermem_loaded: bool,
    /// Whether the node has NVIDIA GPUs (host `nvidia-smi` or `/proc/driver/nvidia`).
    pub gpu: bool,
    /// Whether the node runs a container-optimised OS (ContainerOS, "lifsea" kernels).
    pub container_os: bool,
}

impl Observed {
    /// The driver mode the node is running, as far as module state can tell. RoCE-compatible mode is
    /// reported as `ofed` when that is the target (the two differ only in the installed stack).
    pub fn running_mode(&self, target: Option<DriverMode>) -> RunningMode {
        match self.erdma {
            ErdmaState::Missing => RunningMode::Missing,
            ErdmaState::NotLoaded { .. } => RunningMode::NotLoaded,
            ErdmaState::Loaded {
                compat: CompatMode::No,
            } => RunningMode::Mode(DriverMode::Default),
            ErdmaState::Loaded {
                compat: CompatMode::Yes,
            } => match target {
                Some(DriverMode::Ofed) => RunningMode::Mode(DriverMode::Ofed),
                _ => RunningMode::Mode(DriverMode::Compat),
            },
            ErdmaState::Loaded {
                compat: CompatMode::HardwareDecided,
            } => RunningMode::HardwareDecided,
        }
    }
}

/// The driver mode a node is running, for status and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunningMode {
    /// No driver installed.
    Missing,
    /// Installed, not loaded.
    NotLoaded,
    /// Loaded in this mode.
    Mode(DriverMode),
    /// Loaded by an upstream kernel whose hardware decides the protocol.
    HardwareDecided,
}

impl RunningMode {
    /// Short name, also a valid Kubernetes label value.
    pub fn name(&self) -> &'static str {
        match self {
            RunningMode::Missing => "missing",
            RunningMode::NotLoaded => "not-loaded",
            RunningMode::Mode(m) => m.name(),
            RunningMode::HardwareDecided => "hardware",
        }
    }
}

/// Reads the node's driver state through the host door.
pub fn observe<H: Host + ?Sized>(host: &H) -> Result<Observed, HostError> {
    let erdma = if host.module_loaded(ERDMA_MODULE)? {
        let compat = match host.compat_mode()? {
            Some(true) => CompatMode::Yes,
            Some(false) => CompatMode::No,
            None => CompatMode::HardwareDecided,
        };
        ErdmaState::Loaded { compat }
    } else {
        match host.module_info(ERDMA_MODULE)? {
            None => ErdmaState::Missing,
            Some(info) => ErdmaState::NotLoaded {
                compat_param: info.params.iter().any(|p| p == COMPAT_MODE_PARAM),
            },
        }
    };
    let peermem_loaded = host.module_loaded(PEERMEM_MODULE)?;
    let peermem_available = peermem_loaded || host.module_info(PEERMEM_MODULE)?.is_some();
    Ok(Observed {
        erdma,
        smc_loaded: host.module_loaded(SMC_MODULE)?,
        peermem_available,
        peermem_loaded,
        gpu: host.has_gpu()?,
        container_os: host.container_os()?,
    })
}
