//! Plugin configuration.

use std::path::{Path, PathBuf};

/// Default resource name, kept from the original plugin.
pub use erdma_model::names::RESOURCE as DEFAULT_RESOURCE_NAME;
/// Default number of shared slots advertised per device, kept from the original plugin.
pub const DEFAULT_SLOTS_PER_DEVICE: u32 = 200;
/// Suffix of the plugin socket name, kept from the original plugin (`<x>-erdma.sock`).
pub const SOCKET_SUFFIX: &str = "-erdma.sock";

/// CDI mode: the plugin writes a CDI spec and answers Allocate with `cdi_devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiConfig {
    /// Directory of the spec file (`/var/run/cdi` on a node).
    pub spec_dir: PathBuf,
    /// CDI kind, `<vendor>/<class>` (default `aliyun.com/erdma`).
    pub kind: String,
}

/// The default of [`PluginConfig::safety_poll`]: an idle agent wakes for it six times a minute.
pub const DEFAULT_SAFETY_POLL: std::time::Duration = std::time::Duration::from_secs(10);

/// Everything the plugin needs to know.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// Extended resource name (`aliyun/erdma`).
    pub resource_name: String,
    /// Device-plugin directory holding `kubelet.sock`.
    pub kubelet_dir: PathBuf,
    /// Shared slots advertised per device.
    pub slots_per_device: u32,
    /// Every container gets every usable device, whatever slots it was given.
    pub allocate_all_devices: bool,
    /// Ask the kubelet for PreStartContainer (SMC-R pre-start mode).
    pub pre_start_required: bool,
    /// CDI mode, when enabled.
    pub cdi: Option<CdiConfig>,
    /// The kubelet's pod-resources socket, used to count slots in use.
    pub pod_resources_socket: Option<PathBuf>,
    /// How often the registered plugin checks its socket and `kubelet.sock` while an inotify
    /// watch on the directory is live (events carry kubelet restarts; this bounds what a lost
    /// event costs). Without a live watch the check runs every second.
    pub safety_poll: std::time::Duration,
}

impl PluginConfig {
    /// The defaults for a kubelet directory.
    pub fn new(kubelet_dir: impl Into<PathBuf>) -> Self {
        PluginConfig {
            resource_name: DEFAULT_RESOURCE_NAME.to_string(),
            kubelet_dir: kubelet_dir.into(),
            slots_per_device: DEFAULT_SLOTS_PER_DEVICE,
            allocate_all_devices: false,
            pre_start_required: false,
            cdi: None,
            pod_resources_socket: None,
            safety_poll: DEFAULT_SAFETY_POLL,
        }
    }

    /// The plugin's socket file name: derived only from the resource name, so a restarted agent
    /// finds and replaces its own stale socket and never touches another plugin's.
    /// `aliyun/erdma` gives `erdma-aliyun_erdma-erdma.sock`.
    pub fn socket_name(&self) -> String {
        socket_name(&self.resource_name)
    }

    /// Full path of the plugin socket.
    pub fn socket_path(&self) -> PathBuf {
        self.kubelet_dir.join(self.socket_name())
    }

    /// Path of `kubelet.sock`.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join(erdma_kubelet::deviceplugin::v1beta1::KUBELET_SOCKET_NAME)
    }

    /// Checks values a user can get wrong; the error names the value and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if !erdma_kubelet::is_extended_resource_name(&self.resource_name) {
            return Err(format!(
                "resource name {:?} is not an extended resource name (expected <domain>/<name> outside kubernetes.io, e.g. aliyun/erdma)",
                self.resource_name
            ));
        }
        if self.slots_per_device == 0 || self.slots_per_device > 100_000 {
            return Err(format!(
                "slots per device {} is out of range (expected 1..=100000; the original used 200)",
                self.slots_per_device
            ));
        }
        let len = self.socket_path().as_os_str().len();
        if len > erdma_kubelet::uds::MAX_SOCKET_PATH {
            return Err(format!(
                "plugin socket path {} is {len} bytes, longer than a Unix socket allows ({}); use a shorter kubelet directory",
                self.socket_path().display(),
                erdma_kubelet::uds::MAX_SOCKET_PATH
            ));
        }
        Ok(())
    }
}

/// Socket file name for a resource name (see [`PluginConfig::socket_name`]).
pub fn socket_name(resource_name: &str) -> String {
    let derived: String = resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("erdma-{derived}{SOCKET_SUFFIX}")
}

/// True when `path` names a socket of this plugin for `resource_name`.
pub fn is_own_socket(path: &Path, resource_name: &str) -> bool {
    path.file_name().and_then(|n| n.to_str()) == Some(socket_name(resource_name).as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_name_is_stable_and_keeps_the_suffix() {
        assert_eq!(socket_name("aliyun/erdma"), "erdma-aliyun_erdma-erdma.sock");
        assert_eq!(
            socket_name("example.com/rdma"),
            "erdma-example_com_rdma-erdma.sock"
        );
        assert!(socket_name("x/y").ends_with(SOCKET_SUFFIX));
        // Different resources never share a socket; terway's `-erdma-eni.sock` is not ours.
        assert_ne!(socket_name("aliyun/erdma"), socket_name("aliyun/erdma2"));
        assert!(!is_own_socket(
            Path::new("/d/123-erdma-eni.sock"),
            "aliyun/erdma"
        ));
        assert!(!is_own_socket(
            Path::new("/d/1700000000-erdma.sock"),
            "aliyun/erdma"
        ));
    }

    #[test]
    fn validation_names_the_bad_value() {
        let mut c = PluginConfig::new("/tmp/dp");
        assert!(c.validate().is_ok());
        c.resource_name = "erdma".into();
        assert!(c.validate().unwrap_err().contains("\"erdma\""));
        let mut c = PluginConfig::new("/tmp/dp");
        c.slots_per_device = 0;
        assert!(c.validate().unwrap_err().contains("slots per device 0"));
        let c = PluginConfig::new(format!("/tmp/{}", "d".repeat(100)));
        assert!(
            c.validate()
                .unwrap_err()
                .contains("shorter kubelet directory")
        );
    }
}
