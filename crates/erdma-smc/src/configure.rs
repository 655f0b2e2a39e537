//! Turning SMC-R on for one pod network namespace: probe, plan (a list of values), execute.
//!
//! Order of the plan: IPv6 off (optional), the pnet entry for the pod's interface, and only then
//! the switch (`tcp2smc` or the BPF policy), so the first SMC socket already finds its pnet entry.
//! Every step is idempotent. Host-network pods are never touched unless the lab-only
//! `allow_host_netns` is set. An unsupported kernel is a result, not an error, unless `strict`.

use crate::netns::{self, NetnsError};
use crate::pnet::{PnetClient, PnetError, PnetTarget};
use crate::probe::{self, Capabilities, Mechanism, MechanismChoice, Unsupported};
use crate::sysctl::{self, Change, SysctlError, SysctlTree};
use erdma_model::PnetId;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of the pod configuration (agent flags / `smcr-init` flags).
#[derive(Debug, Clone, Serialize)]
pub struct PodOptions {
    /// The pod interface that carries the SMC handshake (`eth0`).
    pub ifname: String,
    /// Set `net.ipv6.conf.{all,default}.disable_ipv6=1` (the original's behaviour; eRDMA SMC
    /// falls back on IPv6).
    pub disable_ipv6: bool,
    /// Allowed mechanism.
    pub mechanism: MechanismChoice,
    /// Fail instead of reporting when the kernel cannot do SMC-R.
    pub strict: bool,
    /// Lab only: allow configuring the host's own namespace.
    pub allow_host_netns: bool,
    /// The host's namespace, to recognise host-network pods (`/proc/1/ns/net`).
    pub host_netns: PathBuf,
    /// `/proc/sys` as seen by this process.
    pub sysctl_root: PathBuf,
}

impl Default for PodOptions {
    fn default() -> Self {
        PodOptions {
            ifname: "eth0".into(),
            disable_ipv6: true,
            mechanism: MechanismChoice::Auto,
            strict: false,
            allow_host_netns: false,
            host_netns: PathBuf::from("/proc/1/ns/net"),
            sysctl_root: PathBuf::from("/proc/sys"),
        }
    }
}

/// One planned host action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Write a sysctl (skipped when it already has the value).
    Sysctl {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// Map the pod interface to the PNET ID.
    Pnet {
        /// PNET ID.
        pnetid: String,
        /// Interface.
        ifname: String,
    },
    /// Add the namespace cookie to the BPF policy map.
    BpfPolicy {
        /// `SO_NETNS_COOKIE` of the pod namespace.
        netns_cookie: u64,
    },
}

/// What happened to a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepResult {
    /// The step.
    #[serde(flatten)]
    pub step: Step,
    /// `changed`, `unchanged` or `absent`.
    pub outcome: &'static str,
}

/// Result of configuring one pod namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodReport {
    /// The namespace path.
    pub netns: String,
    /// Set when nothing was done on purpose (host network).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// What the kernel offers (absent when skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// The mechanism used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Mechanism>,
    /// The namespace cookie (key of the BPF policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns_cookie: Option<u64>,
    /// Steps done.
    pub steps: Vec<StepResult>,
    /// Set when the kernel cannot do SMC-R (then `steps` is empty): "SMC unsupported: …".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

impl PodReport {
    /// True when SMC is on for the namespace.
    pub fn configured(&self) -> bool {
        self.mechanism.is_some() && self.unsupported.is_none() && self.skipped.is_none()
    }
}

/// Configuring a pod failed (the pod's other containers and the agent carry on).
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// The namespace is gone or cannot be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Strict mode and an unsupported kernel.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// A sysctl failed.
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
    /// The pnet entry failed.
    #[error("pnet entry for {ifname}: {source}")]
    Pnet {
        /// Interface.
        ifname: String,
        /// Cause.
        source: PnetError,
    },
    /// The BPF policy failed.
    #[error("BPF socket policy: {0}")]
    Policy(String),
    /// The namespace cookie could not be read.
    #[error("cannot read the network namespace cookie (SO_NETNS_COOKIE, Linux 5.14+): {0}")]
    Cookie(std::io::Error),
}

/// The pnet table of the current namespace, as the executor needs it.
pub trait PnetTable {
    /// Makes `pnetid` map to `target`; true when something changed.
    fn ensure(&self, pnetid: &PnetId, target: &PnetTarget) -> Result<bool, PnetError>;
}

impl PnetTable for PnetClient {
    fn ensure(&self, pnetid: &PnetId, target: &PnetTarget) -> Result<bool, PnetError> {
        PnetClient::ensure(self, pnetid, target)
    }
}

/// The agent's BPF socket policy: the set of namespace cookies whose TCP sockets become SMC.
pub trait SocketPolicy: Send + Sync {
    /// Adds a namespace; true when it was not there yet.
    fn enable(&self, netns_cookie: u64) -> Result<bool, String>;
    /// Removes a namespace; true when it was there.
    fn disable(&self, netns_cookie: u64) -> Result<bool, String>;
    /// The namespaces in the policy.
    fn enabled(&self) -> Result<Vec<u64>, String>;
}

/// Builds the plan (pure).
pub fn plan(
    mechanism: Mechanism,
    options: &PodOptions,
    pnetid: &PnetId,
    netns_cookie: u64,
) -> Vec<Step> {
    let mut steps = Vec::new();
    if options.disable_ipv6 {
        for key in [sysctl::DISABLE_IPV6_ALL, sysctl::DISABLE_IPV6_DEFAULT] {
            steps.push(Step::Sysctl {
                key: key.into(),
                value: "1".into(),
            });
        }
    }
    steps.push(Step::Pnet {
        pnetid: pnetid.as_str().to_string(),
        ifname: options.ifname.clone(),
    });
    steps.push(match mechanism {
        Mechanism::Tcp2smc => Step::Sysctl {
            key: sysctl::TCP2SMC.into(),
            value: "1".into(),
        },
        Mechanism::BpfPolicy => Step::BpfPolicy { netns_cookie },
    });
    steps
}

/// Runs the plan through the doors, stopping at the first error.
pub fn execute(
    steps: &[Step],
    sysctls: &SysctlTree,
    pnet: &dyn PnetTable,
    policy: Option<&dyn SocketPolicy>,
) -> Result<Vec<StepResult>, ConfigureError> {
    let mut done = Vec::new();
    for step in steps {
        let outcome = match step {
            Step::Sysctl { key, value } => match sysctls.ensure(key, value)? {
                Change::Unchanged => "unchanged",
                Change::Set { .. } => "changed",
                // tcp2smc was probed present; an absent IPv6 tree means IPv6 is off already.
                Change::Absent => "absent",
            },
            Step::Pnet { pnetid, ifname } => {
                let id = PnetId::parse(pnetid).map_err(|e| ConfigureError::Pnet {
                    ifname: ifname.clone(),
                    source: PnetError::Invalid(e.to_string()),
                })?;
                match pnet.ensure(&id, &PnetTarget::Netdev(ifname.clone())) {
                    Ok(true) => "changed",
                    Ok(false) => "unchanged",
                    Err(source) => {
                        return Err(ConfigureError::Pnet {
                            ifname: ifname.clone(),
                            source,
                        });
                    }
                }
            }
            Step::BpfPolicy { netns_cookie } => {
                let p =
                    policy.ok_or_else(|| ConfigureError::Policy("no policy loaded".to_string()))?;
                if p.enable(*netns_cookie).map_err(ConfigureError::Policy)? {
                    "changed"
                } else {
                    "unchanged"
                }
            }
        };
        tracing::info!(?step, outcome, "smc: pod step");
        done.push(StepResult {
            step: step.clone(),
            outcome,
        });
    }
    Ok(done)
}

/// Configures pod namespaces. Cheap to clone; share one per agent.
#[derive(Clone)]
pub struct SmcConfigurator {
    options: PodOptions,
    policy: Option<Arc<dyn SocketPolicy>>,
}

impl SmcConfigurator {
    /// A configurator; `policy` is the loaded BPF policy on kernels that support it.
    pub fn new(options: PodOptions, policy: Option<Arc<dyn SocketPolicy>>) -> Self {
        SmcConfigurator { options, policy }
    }

    /// The options.
    pub fn options(&self) -> &PodOptions {
        &self.options
    }

    /// Turns SMC-R on for the namespace at `netns_path` with `pnetid` on the pod interface.
    /// Blocking (it enters the namespace on a thread); call it from `spawn_blocking`.
    pub fn configure_pod(
        &self,
        netns_path: &Path,
        pnetid: &PnetId,
    ) -> Result<PodReport, ConfigureError> {
        let mut report = PodReport {
            netns: netns_path.display().to_string(),
            skipped: None,
            capabilities: None,
            mechanism: None,
            netns_cookie: None,
            steps: Vec::new(),
            unsupported: None,
        };
        if !self.options.allow_host_netns && netns::is_same(netns_path, &self.options.host_netns)? {
            report.skipped = Some(format!(
                "{} is the host network namespace ({}): host-network pods are never configured",
                netns_path.display(),
                self.options.host_netns.display()
            ));
            return Ok(report);
        }
        let this = self.clone();
        let id = pnetid.clone();
        netns::run_in(netns_path, move || this.configure_current(&id, report))?
    }

    /// Same, for the calling thread's own namespace (the `smcr-init` path).
    pub fn configure_current(
        &self,
        pnetid: &PnetId,
        mut report: PodReport,
    ) -> Result<PodReport, ConfigureError> {
        let sysctls = SysctlTree::new(&self.options.sysctl_root);
        let caps = probe::probe(&sysctls);
        let choice = probe::choose(&caps, self.options.mechanism, self.policy.is_some());
        report.capabilities = Some(caps);
        let mechanism = match choice {
            Ok(m) => m,
            Err(u) if self.options.strict => return Err(u.into()),
            Err(u) => {
                tracing::warn!(netns = %report.netns, reason = %u, "smc: pod not configured");
                report.unsupported = Some(u.to_string());
                return Ok(report);
            }
        };
        let cookie = netns::current_cookie().map_err(ConfigureError::Cookie)?;
        let pnet = PnetClient::open().map_err(|source| ConfigureError::Pnet {
            ifname: self.options.ifname.clone(),
            source,
        })?;
        let steps = plan(mechanism, &self.options, pnetid, cookie);
        report.steps = execute(&steps, &sysctls, &pnet, self.policy.as_deref())?;
        report.mechanism = Some(mechanism);
        report.netns_cookie = Some(cookie);
        Ok(report)
    }

    /// Removes a pod namespace from the BPF policy (pod deleted). Namespaces configured with
    /// `tcp2smc` need nothing: the setting dies with the namespace.
    pub fn release_pod(&self, netns_cookie: u64) -> Result<bool, ConfigureError> {
        match &self.policy {
            Some(p) => p.disable(netns_cookie).map_err(ConfigureError::Policy),
            None => Ok(false),
        }
    }

    /// An empty report for the current namespace (for [`Self::configure_current`]).
    pub fn report_for(netns: &str) -> PodReport {
        PodReport {
            netns: netns.to_string(),
            skipped: None,
            capabilities: None,
            mechanism: None,
            netns_cookie: None,
            steps: Vec::new(),
            unsupported: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// The pnet table semantics of the kernel (one PNET ID per netdev, EEXIST-as-unchanged).
    #[derive(Default)]
    struct Table(RefCell<Vec<(String, String)>>);
    impl PnetTable for Table {
        fn ensure(&self, id: &PnetId, t: &PnetTarget) -> Result<bool, PnetError> {
            let PnetTarget::Netdev(dev) = t else {
                unreachable!()
            };
            let mut rows = self.0.borrow_mut();
            if let Some((other, _)) = rows.iter().find(|(_, d)| d == dev) {
                if other == id.as_str() {
                    return Ok(false);
                }
                return Err(PnetError::Invalid(format!(
                    "{dev} already has PNET ID {other}"
                )));
            }
            rows.push((id.as_str().to_string(), dev.clone()));
            Ok(true)
        }
    }

    #[derive(Default)]
    struct Policy(Mutex<BTreeSet<u64>>);
    impl SocketPolicy for Policy {
        fn enable(&self, c: u64) -> Result<bool, String> {
            Ok(self.0.lock().unwrap().insert(c))
        }
        fn disable(&self, c: u64) -> Result<bool, String> {
            Ok(self.0.lock().unwrap().remove(&c))
        }
        fn enabled(&self) -> Result<Vec<u64>, String> {
            Ok(self.0.lock().unwrap().iter().copied().collect())
        }
    }

    fn tree(ipv6: bool) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("net/smc")).unwrap();
        std::fs::write(d.path().join("net/smc/tcp2smc"), "0\n").unwrap();
        if ipv6 {
            for c in ["all", "default"] {
                std::fs::create_dir_all(d.path().join(format!("net/ipv6/conf/{c}"))).unwrap();
                std::fs::write(
                    d.path().join(format!("net/ipv6/conf/{c}/disable_ipv6")),
                    "0\n",
                )
                .unwrap();
            }
        }
        d
    }

    fn read(d: &tempfile::TempDir, rel: &str) -> String {
        std::fs::read_to_string(d.path().join(rel)).unwrap()
    }

    #[test]
    fn tcp2smc_path_on_a_fake_proc_sys_is_idempotent() {
        let d = tree(true);
        let sys = SysctlTree::new(d.path());
        let id = PnetId::parse("00163e0a1b2c").unwrap();
        let steps = plan(Mechanism::Tcp2smc, &PodOptions::default(), &id, 0);
        let table = Table::default();
        let first = execute(&steps, &sys, &table, None).unwrap();
        let outcomes: Vec<_> = first.iter().map(|s| s.outcome).collect();
        assert_eq!(outcomes, ["changed", "changed", "changed", "changed"]);
        assert_eq!(read(&d, "net/smc/tcp2smc"), "1\n");
        assert_eq!(read(&d, "net/ipv6/conf/all/disable_ipv6"), "1\n");
        assert_eq!(read(&d, "net/ipv6/conf/default/disable_ipv6"), "1\n");
        assert_eq!(
            *table.0.borrow(),
            [("00163E0A1B2C".to_string(), "eth0".to_string())]
        );
        // The switch is the last step, after the pnet entry.
        assert!(matches!(steps.last(), Some(Step::Sysctl { key, .. }) if key == "net.smc.tcp2smc"));
        let second = execute(&steps, &sys, &table, None).unwrap();
        assert!(
            second.iter().all(|s| s.outcome == "unchanged"),
            "{second:?}"
        );
    }

    #[test]
    fn ipv6_option_and_kernels_without_ipv6() {
        let id = PnetId::parse("ABC").unwrap();
        let keep = PodOptions {
            disable_ipv6: false,
            ..PodOptions::default()
        };
        let steps = plan(Mechanism::Tcp2smc, &keep, &id, 0);
        assert_eq!(steps.len(), 2);
        let d = tree(true);
        execute(&steps, &SysctlTree::new(d.path()), &Table::default(), None).unwrap();
        assert_eq!(read(&d, "net/ipv6/conf/all/disable_ipv6"), "0\n");
        // No IPv6 in the kernel: the step is "absent", not an error.
        let d = tree(false);
        let r = execute(
            &plan(Mechanism::Tcp2smc, &PodOptions::default(), &id, 0),
            &SysctlTree::new(d.path()),
            &Table::default(),
            None,
        )
        .unwrap();
        assert_eq!(r[0].outcome, "absent");
        assert_eq!(r[3].outcome, "changed");
    }

    #[test]
    fn bpf_path_adds_the_cookie_once_and_release_removes_it() {
        let d = tree(true);
        let id = PnetId::parse("ABC").unwrap();
        let policy = Arc::new(Policy::default());
        let steps = plan(Mechanism::BpfPolicy, &PodOptions::default(), &id, 4242);
        assert_eq!(steps.last(), Some(&Step::BpfPolicy { netns_cookie: 4242 }));
        let sys = SysctlTree::new(d.path());
        let table = Table::default();
        let r = execute(&steps, &sys, &table, Some(policy.as_ref())).unwrap();
        assert_eq!(r.last().unwrap().outcome, "changed");
        assert_eq!(read(&d, "net/smc/tcp2smc"), "0\n", "tcp2smc untouched");
        let r = execute(&steps, &sys, &table, Some(policy.as_ref())).unwrap();
        assert_eq!(r.last().unwrap().outcome, "unchanged");
        assert_eq!(policy.enabled().unwrap(), [4242]);
        let c = SmcConfigurator::new(PodOptions::default(), Some(policy.clone()));
        assert!(c.release_pod(4242).unwrap());
        assert!(!c.release_pod(4242).unwrap());
        assert!(policy.enabled().unwrap().is_empty());
        // Without a policy the step is an error, not a silent success.
        let e = execute(&steps, &sys, &table, None).unwrap_err();
        assert!(e.to_string().contains("no policy loaded"), "{e}");
    }

    #[test]
    fn pnet_conflict_stops_before_the_switch() {
        let d = tree(true);
        let table = Table::default();
        table.0.borrow_mut().push(("OTHER".into(), "eth0".into()));
        let id = PnetId::parse("ABC").unwrap();
        let steps = plan(Mechanism::Tcp2smc, &PodOptions::default(), &id, 0);
        let e = execute(&steps, &SysctlTree::new(d.path()), &table, None).unwrap_err();
        assert!(
            e.to_string().contains("pnet entry for eth0") && e.to_string().contains("OTHER"),
            "{e}"
        );
        assert_eq!(read(&d, "net/smc/tcp2smc"), "0\n", "SMC not switched on");
    }

    #[test]
    fn host_network_namespace_is_never_touched() {
        let c = SmcConfigurator::new(
            PodOptions {
                host_netns: PathBuf::from("/proc/self/ns/net"),
                ..PodOptions::default()
            },
            None,
        );
        let id = PnetId::parse("ABC").unwrap();
        let r = c
            .configure_pod(Path::new("/proc/thread-self/ns/net"), &id)
            .unwrap();
        assert!(
            r.skipped
                .unwrap()
                .contains("host-network pods are never configured")
        );
        assert!(r.steps.is_empty() && r.capabilities.is_none());
    }

    /// A real private namespace on a kernel without SMC: the pod gets a clear "SMC unsupported"
    /// result, and an error only in strict mode; a vanished namespace is a clear error.
    #[test]
    #[ignore = "needs root and a kernel without SMC; run with --ignored by scripts/test.sh on the CI host (its kernel has no smc) and by crates/erdma-smc/lab/run-smcr.sh in the 7.3 VM"]
    fn real_namespace_without_smc_unsupported_and_gone() {
        crate::testing::require_kernel_without_smc();
        let (ns, stop) = crate::testing::private_netns();
        let id = PnetId::parse("ABC").unwrap();
        let opts = PodOptions {
            host_netns: PathBuf::from("/proc/self/ns/net"),
            ..PodOptions::default()
        };
        let c = SmcConfigurator::new(opts.clone(), None);
        let r = c.configure_pod(&ns, &id).unwrap();
        let u = r.unsupported.clone().unwrap();
        assert!(
            u.starts_with("SMC unsupported: ") && u.contains("modprobe smc"),
            "{u}"
        );
        assert!(!r.configured());
        assert!(r.steps.is_empty());
        assert!(!r.capabilities.unwrap().smc);
        let strict = SmcConfigurator::new(
            PodOptions {
                strict: true,
                ..opts
            },
            None,
        );
        let e = strict.configure_pod(&ns, &id).unwrap_err();
        assert!(matches!(e, ConfigureError::Unsupported(_)), "{e}");
        drop(stop);
        let e = c
            .configure_pod(Path::new("/proc/self/task/999999999/ns/net"), &id)
            .unwrap_err();
        assert!(e.to_string().contains("is gone"), "{e}");
    }
}
