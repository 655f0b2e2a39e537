//! Test doubles: a host that simulates module state and records every action, and a pod-resource
//! usage source with a settable answer.

use crate::host::{Host, HostError, ModuleInfo};
use crate::plan::{Installer, ModuleParam, Step};
use crate::usage::{Holder, PodResourceUsage, UsageError};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// Simulated node state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeState {
    /// `modinfo erdma` succeeds.
    pub erdma_installed: bool,
    /// The installed erdma takes `compat_mode` (out-of-tree); false models upstream kernels.
    pub erdma_has_compat_param: bool,
    /// Loaded modules.
    pub loaded: BTreeSet<String>,
    /// `compat_mode` of the loaded erdma.
    pub compat: bool,
    /// Modules `modinfo` finds besides erdma (e.g. `smc`, `nvidia_peermem`).
    pub available: BTreeSet<String>,
    /// GPU node.
    pub gpu: bool,
    /// Container-optimised OS.
    pub container_os: bool,
    /// Actions that fail, matched against the step's rendering (e.g. `modprobe smc`).
    pub failing: BTreeSet<String>,
}

impl Default for FakeState {
    fn default() -> Self {
        FakeState {
            erdma_installed: true,
            erdma_has_compat_param: true,
            loaded: BTreeSet::new(),
            compat: false,
            available: ["smc".to_string()].into_iter().collect(),
            gpu: false,
            container_os: false,
            failing: BTreeSet::new(),
        }
    }
}

/// A host that simulates module loading and records the actions it was asked to do.
#[derive(Debug, Default)]
pub struct FakeHost {
    state: Mutex<FakeState>,
    actions: Mutex<Vec<String>>,
}

impl FakeHost {
    /// A fake host starting in `state`.
    pub fn new(state: FakeState) -> Self {
        FakeHost {
            state: Mutex::new(state),
            actions: Mutex::new(Vec::new()),
        }
    }

    /// The mutating actions performed so far, in order (failed ones included), rendered as the
    /// commands they stand for (e.g. `modprobe erdma compat_mode=N`).
    pub fn actions(&self) -> Vec<String> {
        self.actions.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Forgets the recorded actions.
    pub fn clear_actions(&self) {
        if let Ok(mut a) = self.actions.lock() {
            a.clear();
        }
    }

    /// A copy of the current state.
    pub fn state(&self) -> FakeState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Changes the state (e.g. to simulate someone unloading the module by hand).
    pub fn with_state(&self, f: impl FnOnce(&mut FakeState)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
    }

    fn record(&self, step: Step) -> Result<(), HostError> {
        let text = step.to_string();
        if let Ok(mut a) = self.actions.lock() {
            a.push(text.clone());
        }
        if self.state().failing.contains(&text) {
            return Err(HostError::Command {
                step: text,
                detail: "exit status 1 (simulated)".into(),
                fix: "none (test)".into(),
            });
        }
        Ok(())
    }
}

impl Host for FakeHost {
    fn compat_mode(&self) -> Result<Option<bool>, HostError> {
        let s = self.state();
        Ok((s.loaded.contains("erdma") && s.erdma_has_compat_param).then_some(s.compat))
    }

    fn module_loaded(&self, module: &str) -> Result<bool, HostError> {
        Ok(self.state().loaded.contains(module))
    }

    fn module_info(&self, module: &str) -> Result<Option<ModuleInfo>, HostError> {
        let s = self.state();
        if module == "erdma" {
            return Ok(s.erdma_installed.then(|| ModuleInfo {
                params: if s.erdma_has_compat_param {
                    vec!["compat_mode".into()]
                } else {
                    vec![]
                },
            }));
        }
        Ok(s.available.contains(module).then(ModuleInfo::default))
    }

    fn has_gpu(&self) -> Result<bool, HostError> {
        Ok(self.state().gpu)
    }

    fn container_os(&self) -> Result<bool, HostError> {
        Ok(self.state().container_os)
    }

    fn run_installer(&self, installer: &Installer) -> Result<(), HostError> {
        self.record(Step::Install(installer.clone()))?;
        self.with_state(|s| {
            s.erdma_installed = true;
            s.erdma_has_compat_param = true;
        });
        Ok(())
    }

    fn load_module(&self, module: &str, params: &[ModuleParam]) -> Result<(), HostError> {
        self.record(Step::Load {
            module: module.into(),
            params: params.to_vec(),
            required: false,
        })?;
        let s = self.state();
        let exists = if module == "erdma" {
            s.erdma_installed
        } else {
            s.available.contains(module)
        };
        if !exists {
            return Err(HostError::Command {
                step: format!("modprobe {module}"),
                detail: format!("modprobe: FATAL: Module {module} not found"),
                fix: "install the module".into(),
            });
        }
        self.with_state(|s| {
            // Like modprobe: loading an already loaded module changes nothing.
            if s.loaded.insert(module.to_string()) && module == "erdma" {
                s.compat = params
                    .iter()
                    .any(|p| p.name == "compat_mode" && p.value == "Y");
            }
        });
        Ok(())
    }

    fn unload_module(&self, module: &str) -> Result<(), HostError> {
        self.record(Step::Unload {
            module: module.into(),
        })?;
        self.with_state(|s| {
            s.loaded.remove(module);
        });
        Ok(())
    }
}

/// Pod-resource usage with a settable answer.
#[derive(Debug)]
pub struct FakeUsage {
    answer: Mutex<Result<Vec<Holder>, UsageError>>,
    calls: Mutex<usize>,
}

impl FakeUsage {
    /// Nobody holds the resource.
    pub fn idle() -> Self {
        FakeUsage {
            answer: Mutex::new(Ok(Vec::new())),
            calls: Mutex::new(0),
        }
    }

    /// These containers hold it.
    pub fn held_by(holders: Vec<Holder>) -> Self {
        FakeUsage {
            answer: Mutex::new(Ok(holders)),
            calls: Mutex::new(0),
        }
    }

    /// Sets the answer.
    pub fn set(&self, answer: Result<Vec<Holder>, UsageError>) {
        if let Ok(mut a) = self.answer.lock() {
            *a = answer;
        }
    }

    /// How often it was asked.
    pub fn calls(&self) -> usize {
        self.calls.lock().map(|c| *c).unwrap_or(0)
    }
}

impl Default for FakeUsage {
    fn default() -> Self {
        Self::idle()
    }
}

impl PodResourceUsage for FakeUsage {
    async fn holders(&self, _held: &crate::usage::Held) -> Result<Vec<Holder>, UsageError> {
        if let Ok(mut c) = self.calls.lock() {
            *c += 1;
        }
        self.answer
            .lock()
            .map(|a| a.clone())
            .unwrap_or_else(|_| Ok(Vec::new()))
    }
}
