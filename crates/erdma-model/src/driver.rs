//! Protocol modes of a device and the driver modes a user can ask for (`preferDriver`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The RDMA protocol a device speaks, as observed on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceMode {
    /// iWARP: eRDMA's default ("standard") mode, `compat_mode=N`; also siw.
    Iwarp,
    /// RoCE (v2): eRDMA's compat mode, `compat_mode=Y`; also rxe and Ethernet mlx5.
    Roce,
    /// Native InfiniBand.
    Infiniband,
}

impl DeviceMode {
    /// Short name used in tables and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            DeviceMode::Iwarp => "iwarp",
            DeviceMode::Roce => "roce",
            DeviceMode::Infiniband => "infiniband",
        }
    }

    /// Whether this mode has MAD-capable ports, so `umadN` char devices are expected.
    pub fn has_umad(&self) -> bool {
        !matches!(self, DeviceMode::Iwarp)
    }

    /// Whether NCCL's `NET/IB` transport can use the device (it drives QPs with verbs and never
    /// uses iw_cm, so iWARP devices do not work with it).
    pub fn nccl_ib_capable(&self) -> bool {
        !matches!(self, DeviceMode::Iwarp)
    }
}

impl fmt::Display for DeviceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The driver mode a node is asked to run (`--prefer-driver`, chart value `agent.preferDriver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverMode {
    /// eRDMA's own iWARP mode: `compat_mode=N` and the `smc` module.
    Default,
    /// RoCE-compatible mode: `compat_mode=Y`, `nvidia_peermem` when present, `smc`.
    Compat,
    /// OFED-based stack for GPU instances: GPU installer, `compat_mode=Y`, `nvidia_peermem`.
    Ofed,
    /// `ofed` on GPU nodes, `default` elsewhere (the original's empty value).
    Auto,
    /// Never touch the driver; serve devices as found.
    None,
}

/// Error for an unknown `preferDriver` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown driver mode {0:?} (expected one of: default, compat, ofed, auto, none; empty means auto)"
)]
pub struct UnknownDriverMode(pub String);

impl FromStr for DriverMode {
    type Err = UnknownDriverMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "default" => Ok(DriverMode::Default),
            "compat" => Ok(DriverMode::Compat),
            "ofed" => Ok(DriverMode::Ofed),
            "" | "auto" => Ok(DriverMode::Auto),
            "none" => Ok(DriverMode::None),
            _ => Err(UnknownDriverMode(s.to_string())),
        }
    }
}

impl DriverMode {
    /// Name as accepted on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            DriverMode::Default => "default",
            DriverMode::Compat => "compat",
            DriverMode::Ofed => "ofed",
            DriverMode::Auto => "auto",
            DriverMode::None => "none",
        }
    }

    /// The device protocol this driver mode produces on eRDMA, when it decides one.
    pub fn device_mode(&self) -> Option<DeviceMode> {
        match self {
            DriverMode::Default => Some(DeviceMode::Iwarp),
            DriverMode::Compat | DriverMode::Ofed => Some(DeviceMode::Roce),
            DriverMode::Auto | DriverMode::None => None,
        }
    }
}

impl fmt::Display for DriverMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_value() {
        assert_eq!(
            "default".parse::<DriverMode>().unwrap(),
            DriverMode::Default
        );
        assert_eq!("compat".parse::<DriverMode>().unwrap(), DriverMode::Compat);
        assert_eq!("OFED".parse::<DriverMode>().unwrap(), DriverMode::Ofed);
        assert_eq!("".parse::<DriverMode>().unwrap(), DriverMode::Auto);
        assert_eq!("none".parse::<DriverMode>().unwrap(), DriverMode::None);
        let e = "fake".parse::<DriverMode>().unwrap_err();
        assert!(e.to_string().contains("\"fake\""));
    }

    #[test]
    fn iwarp_has_no_umad_and_no_nccl() {
        assert!(!DeviceMode::Iwarp.has_umad());
        assert!(!DeviceMode::Iwarp.nccl_ib_capable());
        assert!(DeviceMode::Roce.has_umad());
        assert!(DeviceMode::Roce.nccl_ib_capable());
    }
}
