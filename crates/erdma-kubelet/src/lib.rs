//! Kubelet gRPC APIs for erdma.
//!
//! - [`deviceplugin::v1beta1`]: the device-plugin API (Registration on `kubelet.sock`, the
//!   DevicePlugin service a plugin serves), including `cdi_devices`.
//! - [`podresources::v1`]: the pod-resources API the kubelet serves, and
//!   [`podresources::PodResourcesClient`], the one client of it (`list(held)` → the containers holding devices through the device
//!   plugin or a DRA claim), and [`podresources::Holders`], the one owner of its answer (refreshed
//!   on pokes, socket re-creation and a safety timer; published on a `watch` channel).
//! - [`pluginregistration::v1`]: the plugin-watcher registration API a plugin serves on a socket in
//!   `plugins_registry/` (used by DRA drivers).
//! - [`dra::v1`]: the DRA kubelet plugin API (`NodePrepareResources` / `NodeUnprepareResources`).
//! - [`dra_health`]: the DRA resource-health stream (`NodeWatchResources`, `v1alpha1` and `v1`).
//!
//! The Rust code is generated from `proto/**/*.proto` and checked in under `src/gen/`, so normal
//! builds need neither protoc nor prost-build; the test `generated_code_is_fresh` fails when it is
//! stale. [`uds`] has the Unix-socket server and client helpers; [`authority`] makes servers accept
//! the socket path as `:authority`, as old kubelets sent it.

pub mod authority;
pub mod uds;

/// Device-plugin API.
pub mod deviceplugin {
    /// `package v1beta1` (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        include!("gen/deviceplugin_v1beta1.rs");

        /// API version a plugin registers with.
        pub const VERSION: &str = "v1beta1";
        /// Versions the kubelet accepts in `Register`.
        pub const SUPPORTED_VERSIONS: &[&str] = &["v1beta1"];
        /// Health value of a usable device.
        pub const HEALTHY: &str = "Healthy";
        /// Health value of an unusable device.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// Default device-plugin directory.
        pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
        /// File name of the kubelet's registration socket in that directory.
        pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";
        /// Timeout the kubelet applies to PreStartContainer.
        pub const PRE_START_CONTAINER_TIMEOUT_SECS: u64 = 30;
    }
}

/// Pod-resources API.
pub mod podresources {
    /// `package v1` (`k8s.io/kubelet/pkg/apis/podresources/v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        include!("gen/podresources_v1.rs");

        /// Default socket of the pod-resources API.
        pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
    }

    mod cache;
    mod client;
    pub use cache::{
        Answered, FRESH_WITHIN, HolderCache, Holders, POKE_DELAY, RETRY_AFTER_FAILURE,
        SAFETY_REFRESH, SETTLE_WITHIN, SOCKET_SETTLE, Snapshot,
    };
    pub use client::{
        ClaimedDevice, Held, Holder, ListError, PodResourcesClient, TIMEOUT, holders_in,
    };
}

/// Plugin-watcher registration API.
pub mod pluginregistration {
    /// `package pluginregistration` (`k8s.io/kubelet/pkg/apis/pluginregistration/v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        include!("gen/pluginregistration_v1.rs");

        /// `PluginInfo.type` of a DRA driver.
        pub const DRA_PLUGIN: &str = "DRAPlugin";
        /// `PluginInfo.type` of a device plugin registering through the plugin watcher.
        pub const DEVICE_PLUGIN: &str = "DevicePlugin";
        /// `PluginInfo.type` of a CSI driver.
        pub const CSI_PLUGIN: &str = "CSIPlugin";
        /// Default directory the kubelet watches for registration sockets.
        pub const PLUGINS_REGISTRY_PATH: &str = "/var/lib/kubelet/plugins_registry/";
    }
}

/// DRA kubelet plugin API.
pub mod dra {
    /// `package k8s.io.kubelet.pkg.apis.dra.v1` (`k8s.io/kubelet/pkg/apis/dra/v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        include!("gen/dra_v1.rs");

        /// The service name a driver lists in `PluginInfo.supported_versions` for this API.
        pub const DRA_PLUGIN_SERVICE: &str = "v1.DRAPlugin";
        /// Default parent directory of a driver's service socket (`<this>/<driver>/dra.sock`).
        pub const PLUGINS_PATH: &str = "/var/lib/kubelet/plugins/";
    }
}

/// The kubelet's DRA resource-health API (`DRAResourceHealth.NodeWatchResources`), served by a
/// DRA driver on its service socket: `v1alpha1` (kubelets 1.34 to 1.36, deprecated from 1.37) and
/// `v1` (newer kubelets), the same messages.
pub mod dra_health {
    /// `package v1alpha1` (`k8s.io/kubelet/pkg/apis/dra-health/v1alpha1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1alpha1 {
        include!("gen/dra_health_v1alpha1.rs");
    }
    /// `package v1` (`k8s.io/kubelet/pkg/apis/dra-health/v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        include!("gen/dra_health_v1.rs");
    }
}

/// True when `name` is an extended resource name the kubelet accepts from a device plugin:
/// `<domain>/<name>`, both parts non-empty DNS-ish tokens, not in the `kubernetes.io/` namespace.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, short)) = name.split_once('/') else {
        return false;
    };
    let token_ok = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || extra.contains(&b))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    let kube = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    !kube
        && !name.starts_with("requests.")
        && token_ok(domain, b".")
        && token_ok(short, b"._")
        && short.len() <= 63
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        assert!(is_extended_resource_name("aliyun/erdma"));
        assert!(is_extended_resource_name("rdma.example.com/hca_1"));
        for bad in [
            "erdma",
            "kubernetes.io/erdma",
            "/erdma",
            "aliyun/",
            "a b/c",
            "aliyun/erdma/x",
            "node.kubernetes.io/x",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }
}
