//! Looking for another device plugin that serves this plugin's resource on the node: live sockets
//! of known other plugins in the device-plugin directory, and device IDs the kubelet holds for the
//! resource that this plugin does not advertise. The verdict and its texts are
//! [`erdma_model::coexistence`]; this module only gathers the evidence.

use crate::PluginConfig;
use erdma_kubelet::podresources::{Holders, PodResourcesClient};
use erdma_model::coexistence::{self, Evidence};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Gathers [`Evidence`] for one plugin configuration.
#[derive(Debug, Clone)]
pub struct Observer {
    /// The device-plugin directory.
    pub dir: PathBuf,
    /// This plugin's own socket file name.
    pub own_socket: String,
    /// The kubelet's pod-resources API (one connection kept for every look; the owner's, with
    /// [`Observer::with_holders`]).
    pub pod_resources: PodResourcesClient,
    /// The extended resource.
    pub resource: String,
}

impl Observer {
    /// The observer for the plugin `cfg` describes.
    pub fn new(cfg: &PluginConfig) -> Self {
        Observer {
            dir: cfg.kubelet_dir.clone(),
            own_socket: cfg.socket_name(),
            pod_resources: PodResourcesClient::new(cfg.pod_resources_socket.as_deref().unwrap_or(
                std::path::Path::new(erdma_kubelet::podresources::v1::DEFAULT_SOCKET),
            )),
            resource: cfg.resource_name.clone(),
        }
    }

    /// Asks `GetAllocatableResources` on the connection of `holders`, the process's one owner of
    /// the pod-resources answer, instead of one of its own.
    pub fn with_holders(mut self, holders: &Holders) -> Self {
        self.pod_resources = holders.client().clone();
        self
    }

    /// One observation; `served` are the RDMA device names this plugin advertises now. A directory
    /// or kubelet that cannot be read gives no evidence (logged at debug: the kubelet may not have
    /// started yet, or predate `GetAllocatableResources`).
    pub async fn observe(&self, served: &BTreeSet<String>) -> Vec<Evidence> {
        let mut evidence = Vec::new();
        let dir = self.dir.clone();
        let own = self.own_socket.clone();
        // Only sockets of other plugins are connected to: not our own (its server would accept
        // and drop a connection every look), nor anything unrelated.
        let recognised = move |name: &str| coexistence::classify_socket(name, &own).is_some();
        match tokio::task::spawn_blocking(move || {
            erdma_host::plugin_dir::sockets_named(&dir, recognised)
        })
        .await
        {
            Ok(Ok(sockets)) => {
                for s in sockets {
                    let Some(plugin) = coexistence::classify_socket(&s.file_name, &self.own_socket)
                    else {
                        continue;
                    };
                    if s.live {
                        evidence.push(Evidence::Socket {
                            file: s.file_name,
                            plugin,
                        });
                    } else {
                        tracing::debug!(socket = %s.file_name, "stale socket of {} (nobody listens)", plugin.describe());
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(dir = %self.dir.display(), "cannot list the device-plugin directory: {e}")
            }
            Err(e) => tracing::debug!("device-plugin directory scan task failed: {e}"),
        }
        match self.pod_resources.allocatable(&self.resource).await {
            Ok(ids) => {
                let foreign =
                    coexistence::foreign_device_ids(ids.iter().map(String::as_str), served);
                if let Some(example) = foreign.first() {
                    evidence.push(Evidence::KubeletDevices {
                        foreign: foreign.len(),
                        example: example.clone(),
                    });
                }
            }
            Err(e) => tracing::debug!("kubelet device list unavailable: {e}"),
        }
        evidence
    }
}
