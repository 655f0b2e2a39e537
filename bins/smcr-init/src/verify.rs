//! `smcr-init verify`: what the webhook injects. It changes nothing and needs no privilege: the
//! agent configured this pod's network namespace at PreStartContainer (or NRI sandbox creation)
//! before this container started; this reads the result from inside the namespace and reports
//! it in the pod's log, so that the pod's owner sees whether its TCP goes over SMC-R.
//!
//! It refuses to run in the node's network namespace: a `hostNetwork` pod gets the same address
//! as its node (`ERDMA_POD_IP` = `ERDMA_HOST_IP`, both from the downward API), or the namespace
//! is the one `--host-netns` names.

use erdma_smc::probe::{self, Mechanism};
use erdma_smc::sysctl::{DISABLE_IPV6_ALL, SysctlTree, TCP2SMC};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Exit status when the namespace is the node's (documented in the CLI's help).
pub const EXIT_HOST_NETNS: u8 = 3;

/// The pod's IP (downward API `status.podIP`), set by the webhook.
pub const ENV_POD_IP: &str = "ERDMA_POD_IP";
/// The node's IP (downward API `status.hostIP`), set by the webhook.
pub const ENV_HOST_IP: &str = "ERDMA_HOST_IP";

/// Why this process runs in the node's network namespace, when it does.
pub fn host_network(
    pod_ip: Option<&str>,
    host_ip: Option<&str>,
    host_netns: Option<&Path>,
) -> anyhow::Result<Option<String>> {
    let (pod_ip, host_ip) = (
        pod_ip.map(str::trim).unwrap_or_default(),
        host_ip.map(str::trim).unwrap_or_default(),
    );
    if !pod_ip.is_empty() && pod_ip == host_ip {
        return Ok(Some(format!(
            "the pod's IP {pod_ip} is its node's ({ENV_POD_IP} = {ENV_HOST_IP}): a hostNetwork pod shares the node's network namespace"
        )));
    }
    if let Some(host) = host_netns
        && erdma_smc::netns::is_same(Path::new("/proc/thread-self/ns/net"), host)?
    {
        return Ok(Some(format!(
            "this network namespace is {} (the node's)",
            host.display()
        )));
    }
    Ok(None)
}

/// The refusal for the node's namespace, with the fix.
pub fn refusal(why: &str) -> String {
    format!(
        "refusing to act on the node's network namespace: {why}. SMC-R is never configured for hostNetwork pods. Fix: run the pod without hostNetwork, or remove the network.alibabacloud.com/erdma-smcr annotation"
    )
}

/// What `verify` found in its own namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// `uname -r`.
    pub kernel: String,
    /// The SMC module answers (its generic-netlink family resolves).
    pub smc: bool,
    /// Why SMC is not usable, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smc_detail: Option<String>,
    /// How this namespace's TCP sockets become SMC, when they do.
    pub mechanism: Option<Mechanism>,
    /// `net.ipv6.conf.all.disable_ipv6` here (`None`: no IPv6 in this kernel).
    pub ipv6_disabled: Option<bool>,
}

impl Verified {
    /// SMC-R is in effect for this namespace.
    pub fn enabled(&self) -> bool {
        self.mechanism.is_some()
    }

    /// The one-line report on stdout.
    pub fn line(&self) -> String {
        let ipv6 = match self.ipv6_disabled {
            Some(true) => "IPv6 off",
            Some(false) => "IPv6 on",
            None => "no IPv6",
        };
        match (self.smc, self.mechanism) {
            (_, Some(m)) => format!(
                "SMC-R enabled for this pod by the erdma agent ({}); {ipv6}",
                serde_json::to_string(&m)
                    .unwrap_or_default()
                    .trim_matches('"')
            ),
            (true, None) => format!(
                "SMC-R not enabled for this pod: the erdma agent did not configure its network namespace (see the pod's Events); the pod runs on TCP; {ipv6}"
            ),
            (false, None) => format!(
                "SMC unsupported: {}; the pod runs on TCP",
                self.smc_detail
                    .as_deref()
                    .unwrap_or("no SMC in this kernel")
            ),
        }
    }
}

/// Reads this namespace's SMC-R state (no writes, no privilege).
pub fn observe(sysctl_root: &Path) -> Verified {
    let sysctls = SysctlTree::new(PathBuf::from(sysctl_root));
    let caps = probe::probe(&sysctls);
    let tcp2smc = sysctls
        .read(TCP2SMC)
        .ok()
        .flatten()
        .map(|v| v.trim() == "1");
    let mechanism = if tcp2smc == Some(true) {
        Some(Mechanism::Tcp2smc)
    } else if caps.ipproto_smc && probe::tcp_sockets_become_smc().unwrap_or(false) {
        Some(Mechanism::BpfPolicy)
    } else {
        None
    };
    let ipv6_disabled = sysctls
        .read(DISABLE_IPV6_ALL)
        .ok()
        .flatten()
        .map(|v| v.trim() == "1");
    Verified {
        kernel: caps.kernel,
        smc: caps.smc,
        smc_detail: caps.smc_detail,
        mechanism,
        ipv6_disabled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_address_is_the_nodes_namespace() {
        let why = host_network(Some("192.0.2.7"), Some("192.0.2.7"), None)
            .unwrap()
            .expect("refused");
        assert!(
            why.contains("192.0.2.7") && why.contains("hostNetwork"),
            "{why}"
        );
        assert_eq!(
            host_network(Some("198.51.100.9"), Some("192.0.2.7"), None).unwrap(),
            None
        );
        // Outside a pod (no downward API): nothing to compare.
        assert_eq!(host_network(None, None, None).unwrap(), None);
        assert_eq!(host_network(Some(""), Some(""), None).unwrap(), None);
    }

    #[test]
    fn the_report_says_what_runs_over_what() {
        let mut v = Verified {
            kernel: "6.12.0".into(),
            smc: true,
            smc_detail: None,
            mechanism: Some(Mechanism::BpfPolicy),
            ipv6_disabled: Some(true),
        };
        assert_eq!(
            v.line(),
            "SMC-R enabled for this pod by the erdma agent (bpf_policy); IPv6 off"
        );
        v.mechanism = None;
        assert!(v.line().starts_with("SMC-R not enabled for this pod"));
        v.smc = false;
        v.smc_detail = Some("kernel 7.3 has no SMC".into());
        assert_eq!(
            v.line(),
            "SMC unsupported: kernel 7.3 has no SMC; the pod runs on TCP"
        );
    }
}
