//! Pure planning: desired mode × observed state → the host actions, as values.

pub use crate::host::{Installer, ModuleParam};
use crate::observe::{CompatMode, ERDMA_MODULE, ErdmaState, Observed, PEERMEM_MODULE, SMC_MODULE};
use erdma_model::DriverMode;
use serde::Serialize;
use std::fmt;

pub use erdma_model::installer::{
    DEFAULT_INSTALLER_VERSION, InstallerVersion, InvalidInstallerVersion,
};

/// One host action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Step {
    /// Install the driver.
    Install(Installer),
    /// `rmmod <module>`: disruptive, guarded by the in-use check.
    Unload {
        /// Module name.
        module: String,
    },
    /// `modprobe <module> [params]`.
    Load {
        /// Module name.
        module: String,
        /// Parameters.
        params: Vec<ModuleParam>,
        /// Whether a failure makes the driver not ready (false: best-effort, reported as a warning).
        required: bool,
    },
}

impl Step {
    fn load(module: &str, params: Vec<ModuleParam>, required: bool) -> Self {
        Step::Load {
            module: module.to_string(),
            params,
            required,
        }
    }

    /// Whether the step touches the `erdma` module itself (an unload or a load of it).
    pub fn touches_erdma(&self) -> bool {
        matches!(self, Step::Unload { module } | Step::Load { module, .. } if module == ERDMA_MODULE)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Install(Installer::Standard { version, force_mad }) => write!(
                f,
                "install erdma_installer-{}{}",
                version.as_str(),
                if *force_mad {
                    " (ERDMA_FORCE_MAD_ENABLE=1)"
                } else {
                    ""
                }
            ),
            Step::Install(Installer::ContainerOs) => {
                f.write_str("yum install -y kernel-modules-$(uname -r)")
            }
            Step::Install(Installer::Gpu) => f.write_str("env_setup.sh --egs"),
            Step::Unload { module } => write!(f, "rmmod {module}"),
            Step::Load { module, params, .. } => {
                write!(f, "modprobe {module}")?;
                for p in params {
                    write!(f, " {}={}", p.name, p.value)?;
                }
                Ok(())
            }
        }
    }
}

/// The host actions that bring a node to its target mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The mode that was asked for.
    pub desired: DriverMode,
    /// The concrete mode after resolving `auto`; `None` for `none`.
    pub target: Option<DriverMode>,
    /// The actions, in order.
    pub steps: Vec<Step>,
    /// The kernel's erdma has no `compat_mode`: the hardware decides the protocol and the target mode
    /// cannot be enforced (only reported).
    pub hardware_decided: bool,
}

impl Plan {
    /// Whether the plan unloads a loaded module (disruptive for pods using the devices).
    pub fn reloads(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Unload { .. }))
    }

    /// The same plan without the erdma reload (used when the reload is refused).
    pub fn without_reload(&self) -> Plan {
        Plan {
            steps: self
                .steps
                .iter()
                .filter(|s| !s.touches_erdma())
                .cloned()
                .collect(),
            ..self.clone()
        }
    }
}

/// Resolves `auto` (and passes the concrete modes through): `ofed` on GPU nodes, else `default`.
/// `none` resolves to `None`.
pub fn resolve(desired: DriverMode, gpu: bool) -> Option<DriverMode> {
    match desired {
        DriverMode::Auto if gpu => Some(DriverMode::Ofed),
        DriverMode::Auto => Some(DriverMode::Default),
        DriverMode::None => None,
        m => Some(m),
    }
}

/// Plans the actions for `desired` on a node in state `observed` (seed-system.md §8):
///
/// * the installer runs only when the driver is missing (`ofed`: the GPU installer; on a
///   container-optimised OS: the kernel-modules package);
/// * `default` loads `erdma compat_mode=N`, then `smc`;
/// * `compat` loads `erdma compat_mode=Y`, then `nvidia_peermem` when it exists, then `smc`;
/// * `ofed` loads `erdma compat_mode=Y`, then `nvidia_peermem` when it exists;
/// * a module loaded in the other mode is unloaded and loaded again (the caller guards this);
/// * a kernel without `compat_mode` is never switched;
/// * `none` plans nothing.
pub fn plan(desired: DriverMode, observed: &Observed, version: &InstallerVersion) -> Plan {
    let target = resolve(desired, observed.gpu);
    let mut steps = Vec::new();
    let mut hardware_decided = false;
    let Some(mode) = target else {
        return Plan {
            desired,
            target,
            steps,
            hardware_decided,
        };
    };
    let want_compat = !matches!(mode, DriverMode::Default);
    let erdma_with_mode = || {
        Step::load(
            ERDMA_MODULE,
            vec![ModuleParam::compat_mode(want_compat)],
            true,
        )
    };

    match observed.erdma {
        ErdmaState::Missing => {
            let installer = if mode == DriverMode::Ofed {
                Installer::Gpu
            } else if observed.container_os {
                Installer::ContainerOs
            } else {
                Installer::Standard {
                    version: version.clone(),
                    force_mad: want_compat,
                }
            };
            steps.push(Step::Install(installer));
            steps.push(erdma_with_mode());
        }
        ErdmaState::NotLoaded { compat_param: true } => steps.push(erdma_with_mode()),
        ErdmaState::NotLoaded {
            compat_param: false,
        } => {
            hardware_decided = true;
            steps.push(Step::load(ERDMA_MODULE, Vec::new(), true));
        }
        ErdmaState::Loaded {
            compat: CompatMode::HardwareDecided,
        } => hardware_decided = true,
        ErdmaState::Loaded { compat } => {
            if (compat == CompatMode::Yes) != want_compat {
                steps.push(Step::Unload {
                    module: ERDMA_MODULE.to_string(),
                });
                steps.push(erdma_with_mode());
            }
        }
    }

    if mode != DriverMode::Default && observed.peermem_available && !observed.peermem_loaded {
        steps.push(Step::load(PEERMEM_MODULE, Vec::new(), false));
    }
    if mode != DriverMode::Ofed && !observed.smc_loaded {
        steps.push(Step::load(SMC_MODULE, Vec::new(), false));
    }
    Plan {
        desired,
        target,
        steps,
        hardware_decided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installer_version_is_validated() {
        assert_eq!(InstallerVersion::parse("1.5.9").unwrap().as_str(), "1.5.9");
        assert_eq!(InstallerVersion::default().as_str(), "1.5.9");
        for bad in ["", "1..2", "1.5.9;rm -rf /", "v1.5", "1.5.", "../x"] {
            let e = InstallerVersion::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("--erdma-installer-version"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn steps_render_as_the_commands_they_run() {
        let v = InstallerVersion::default();
        let s = |st: Step| st.to_string();
        assert_eq!(
            s(Step::Install(Installer::Standard {
                version: v.clone(),
                force_mad: false
            })),
            "install erdma_installer-1.5.9"
        );
        assert_eq!(
            s(Step::Install(Installer::Standard {
                version: v,
                force_mad: true
            })),
            "install erdma_installer-1.5.9 (ERDMA_FORCE_MAD_ENABLE=1)"
        );
        assert_eq!(
            s(Step::Unload {
                module: "erdma".into()
            }),
            "rmmod erdma"
        );
        assert_eq!(
            s(Step::load(
                "erdma",
                vec![ModuleParam::compat_mode(true)],
                true
            )),
            "modprobe erdma compat_mode=Y"
        );
        assert_eq!(s(Step::load("smc", vec![], false)), "modprobe smc");
    }

    #[test]
    fn auto_resolves_by_gpu() {
        assert_eq!(resolve(DriverMode::Auto, true), Some(DriverMode::Ofed));
        assert_eq!(resolve(DriverMode::Auto, false), Some(DriverMode::Default));
        assert_eq!(resolve(DriverMode::Compat, true), Some(DriverMode::Compat));
        assert_eq!(resolve(DriverMode::None, true), None);
    }
}
