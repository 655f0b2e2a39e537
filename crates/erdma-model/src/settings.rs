//! The one description of the agent's settings: for each, its agent flag, its key in the agent's
//! config file, where the chart takes it from (`deploy/helm/values.yaml`), the `erdmactl install`
//! flag that sets that chart value, and its default. Plain data: the agent's flags (`cli.rs`),
//! its config file, the chart's values and schema, and `erdmactl install` are each checked
//! against [`AGENT_SETTINGS`] by tests of their own, so that a setting added, renamed or
//! defaulted in one place and not the others fails a test.

/// How the chart sets an agent setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    /// Not from the chart: the agent's default, or `agent.extraArgs`.
    None,
    /// The value at `path` (dotted, in `values.yaml`), whose chart default is `default` (the
    /// YAML scalar as written; lists comma-joined), passed to the flag as it is.
    Value {
        /// Dotted path in `values.yaml`.
        path: &'static str,
        /// Its default there.
        default: &'static str,
    },
    /// Derived by the chart's template from the value at `path` (a port, a directory, a switch),
    /// whose chart default is `default`.
    Derived {
        /// Dotted path in `values.yaml`.
        path: &'static str,
        /// Its default there.
        default: &'static str,
    },
    /// Always set by the chart, from no value (the host paths of the DaemonSet).
    Fixed,
    /// Set by the chart through the container's environment (`NODE_NAME`).
    Env,
}

/// The agent's default of a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentDefault {
    /// This value; the flag's help says `[default: <value>`.
    Value(&'static str),
    /// Computed from other settings or the environment; the flag's help says how.
    Computed,
    /// Unset.
    Unset,
}

/// One agent setting and where it is described.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The agent's flag, without `--`.
    pub flag: &'static str,
    /// The environment variable the flag reads when it is not given.
    pub env: Option<&'static str>,
    /// The config file's key (`None`: not accepted in the file).
    pub file_key: Option<&'static str>,
    /// The config file's other spelling (the chart's value name), if any.
    pub file_alias: Option<&'static str>,
    /// How the chart sets it.
    pub chart: Chart,
    /// The `erdmactl install` flag that sets the chart value, without `--`.
    pub install: Option<&'static str>,
    /// The agent's default.
    pub default: AgentDefault,
}

/// A setting with a flag and a file key of the same name, not in the chart nor `erdmactl
/// install`.
const fn agent_only(flag: &'static str, default: AgentDefault) -> Setting {
    Setting {
        flag,
        env: None,
        file_key: Some(flag),
        file_alias: None,
        chart: Chart::None,
        install: None,
        default,
    }
}

/// `flag` from the chart value `path` (default `chart_default`), set by `erdmactl install
/// --install`.
const fn charted(
    flag: &'static str,
    path: &'static str,
    chart_default: &'static str,
    install: Option<&'static str>,
    default: AgentDefault,
) -> Setting {
    Setting {
        flag,
        env: None,
        file_key: Some(flag),
        file_alias: None,
        chart: Chart::Value {
            path,
            default: chart_default,
        },
        install,
        default,
    }
}

/// A setting whose config file also accepts `alias`.
const fn alias(s: Setting, alias: &'static str) -> Setting {
    Setting {
        file_alias: Some(alias),
        ..s
    }
}

/// A setting that the chart derives from the value at `path`.
const fn derived(s: Setting, path: &'static str, chart_default: &'static str) -> Setting {
    Setting {
        chart: Chart::Derived {
            path,
            default: chart_default,
        },
        ..s
    }
}

/// A setting that the chart always sets.
const fn fixed(s: Setting) -> Setting {
    Setting {
        chart: Chart::Fixed,
        ..s
    }
}

/// A setting that also reads `env`.
const fn with_env(s: Setting, env: &'static str) -> Setting {
    Setting {
        env: Some(env),
        ..s
    }
}

/// A setting that the config file does not take.
const fn flag_only(s: Setting) -> Setting {
    Setting {
        file_key: None,
        ..s
    }
}

use AgentDefault::{Computed, Unset, Value};

/// Every setting of the agent, in the order of its `--help`.
pub const AGENT_SETTINGS: &[Setting] = &[
    agent_only("sysfs-root", Value("/sys")),
    fixed(agent_only("dev-root", Value("/dev"))),
    derived(
        agent_only("kubelet-dir", Value("/var/lib/kubelet/device-plugins")),
        "kubeletRootDir",
        "/var/lib/kubelet",
    ),
    derived(
        agent_only("pod-resources-socket", Unset),
        "kubeletRootDir",
        "/var/lib/kubelet",
    ),
    agent_only("resource-name", Value("aliyun/erdma")),
    agent_only("rdma-driver", Value("erdma")),
    agent_only("slots-per-device", Value("200")),
    alias(
        charted(
            "allocate-all-devices",
            "agent.allocateAllDevices",
            "false",
            Some("allocate-all-devices"),
            Value("false"),
        ),
        "allocateAllDevices",
    ),
    derived(
        agent_only("metrics-addr", Value("0.0.0.0:9101")),
        "agent.metricsPort",
        "9101",
    ),
    agent_only("instance-id", Unset),
    alias(
        charted(
            "prefer-driver",
            "agent.preferDriver",
            "",
            Some("prefer-driver"),
            Value("auto"),
        ),
        "preferDriver",
    ),
    // The chart always passes it: the agent does SMC-R with and without the webhook (whose
    // init container only checks the agent's work).
    fixed(agent_only(
        "deviceplugin-prestart-container",
        Value("false"),
    )),
    alias(
        charted(
            "local-eri-discovery",
            "config.localERIDiscovery",
            "false",
            Some("local-eri-discovery"),
            Value("false"),
        ),
        "localERIDiscovery",
    ),
    alias(
        charted(
            "exposed-local-eris",
            "agent.exposedLocalERIs",
            "i-XXX erdma_0/erdma_1",
            Some("exposed-local-eris"),
            Unset,
        ),
        "exposedLocalERIs",
    ),
    alias(
        charted(
            "filter-cluster-eris",
            "agent.filterClusterERIs",
            "false",
            Some("filter-cluster-eris"),
            Value("false"),
        ),
        "filterClusterERIs",
    ),
    alias(
        charted(
            "jumbo-frame-mtu",
            "agent.jumboFrameMTU",
            "8500",
            Some("jumbo-frame-mtu"),
            Value("8500"),
        ),
        "jumboFrameMTU",
    ),
    alias(
        charted(
            "erdma-installer-version",
            "agent.driverInstaller.version",
            "",
            Some("erdma-installer-version"),
            Value("1.5.9"),
        ),
        "erdmaInstallerVersion",
    ),
    charted(
        "driver-installer-sha256",
        "agent.driverInstaller.sha256",
        "",
        Some("driver-installer-sha256"),
        Unset,
    ),
    charted(
        "gpu-installer-sha256",
        "agent.driverInstaller.gpuSha256",
        "",
        Some("gpu-installer-sha256"),
        Unset,
    ),
    charted(
        "driver-installer-base-url",
        "agent.driverInstaller.baseURL",
        "",
        Some("driver-installer-base-url"),
        Value("https://mirrors.cloud.aliyuncs.com/erdma"),
    ),
    agent_only("driver-installer-ca-file", Unset),
    charted(
        "allow-insecure-driver-download",
        "agent.driverInstaller.allowInsecureDownload",
        "false",
        Some("allow-insecure-driver-download"),
        Value("false"),
    ),
    agent_only("force-driver-reload", Value("false")),
    agent_only("setup-eri-netdev", Computed),
    agent_only("setup-smc-pnet", Computed),
    agent_only("kubeconfig", Unset),
    Setting {
        chart: Chart::Env,
        ..flag_only(with_env(agent_only("node-name", Unset), "NODE_NAME"))
    },
    alias(
        agent_only("request-timeout", Value("70s")),
        "requestTimeout",
    ),
    flag_only(agent_only("metadata-endpoint", Unset)),
    agent_only("cdi-spec-dir", Unset),
    agent_only("poll-interval-ms", Value("10000")),
    alias(
        charted("log-format", "logFormat", "text", None, Value("text")),
        "logFormat",
    ),
    alias(
        charted("log-level", "logLevel", "info", None, Computed),
        "logLevel",
    ),
    with_env(
        charted("cri-socket", "agent.criSocket", "", None, Computed),
        "RUNTIME_SOCK",
    ),
    agent_only("smcr-strict", Value("false")),
    agent_only("smcr-keep-ipv6", Value("false")),
    agent_only("bpf-pin-dir", Value("/sys/fs/bpf/erdma-smc")),
    charted("nri", "agent.nri", "auto", None, Value("auto")),
    agent_only("nri-socket", Value("/var/run/nri/nri.sock")),
    charted(
        "nri-memlock",
        "agent.nriMemlock",
        "unlimited",
        None,
        Value("unlimited"),
    ),
    charted("nri-rdma-max", "agent.nriRdmaMax", "", None, Value("none")),
    agent_only("nri-allow-annotation-raise", Value("false")),
    agent_only("nri-budget-ms", Value("800")),
    flag_only(agent_only("config-path", Unset)),
    alias(
        derived(
            agent_only("resource-api", Value("device-plugin")),
            "dra.enabled",
            "false",
        ),
        "resourceAPI",
    ),
    derived(
        agent_only("kubelet-root-dir", Value("/var/lib/kubelet")),
        "kubeletRootDir",
        "/var/lib/kubelet",
    ),
    charted(
        "rdma-usage",
        "agent.rdmaUsage.enabled",
        "true",
        None,
        Value("true"),
    ),
    // Per-pod usage (pod names) to non-loopback clients too; no chart value: an operator who
    // wants it passes it in agent.extraArgs.
    agent_only("usage-remote", Value("false")),
];

/// The setting of agent flag `flag` (without `--`).
pub fn by_flag(flag: &str) -> Option<&'static Setting> {
    AGENT_SETTINGS.iter().find(|s| s.flag == flag)
}

impl Setting {
    /// The chart's values path, when the chart takes the setting from a value.
    pub fn chart_path(&self) -> Option<&'static str> {
        match self.chart {
            Chart::Value { path, .. } | Chart::Derived { path, .. } => Some(path),
            Chart::None | Chart::Fixed | Chart::Env => None,
        }
    }

    /// The chart default of [`Setting::chart_path`].
    pub fn chart_default(&self) -> Option<&'static str> {
        match self.chart {
            Chart::Value { default, .. } | Chart::Derived { default, .. } => Some(default),
            Chart::None | Chart::Fixed | Chart::Env => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn names_are_unique_and_spelled_as_their_places_spell_them() {
        let mut flags = BTreeSet::new();
        let mut keys = BTreeSet::new();
        let mut installs = BTreeSet::new();
        for s in AGENT_SETTINGS {
            assert!(flags.insert(s.flag), "flag {} twice", s.flag);
            assert!(
                s.flag
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{}",
                s.flag
            );
            for k in s.file_key.iter().chain(&s.file_alias) {
                assert!(keys.insert(*k), "file key {k} twice");
            }
            if let Some(i) = s.install {
                assert!(installs.insert(i), "install flag {i} twice");
                assert!(
                    s.chart_path().is_some(),
                    "{}: install sets a chart value",
                    s.flag
                );
            }
            if s.file_alias.is_some() {
                assert!(s.file_key.is_some(), "{}: an alias of no key", s.flag);
            }
        }
        assert_eq!(
            by_flag("nri").map(|s| s.chart_path()),
            Some(Some("agent.nri"))
        );
        assert!(by_flag("nope").is_none());
    }
}
