//! The kubelet's side of DRA (test support): finds a driver's registration socket in a
//! `plugins_registry` directory as the plugin watcher does, asks `GetInfo`, validates it like the
//! kubelet (type `DRAPlugin`, a supported `v1.DRAPlugin` service, an absolute endpoint that is a
//! socket), reports the verdict with `NotifyRegistrationStatus`, and then calls
//! `NodePrepareResources` / `NodeUnprepareResources` on the driver's service socket.
//!
//! Scheduling is not modelled: the allocation the scheduler would write into a ResourceClaim's
//! status is written by the test.

use crate::{FakeKubeletError, Result};
use erdma_kubelet::dra::v1 as dra;
use erdma_kubelet::dra::v1::dra_plugin_client::DraPluginClient;
use erdma_kubelet::pluginregistration::v1 as reg;
use erdma_kubelet::pluginregistration::v1::registration_client::RegistrationClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Service names this fake kubelet accepts, best first (a 1.34+ kubelet).
pub const SUPPORTED_SERVICES: &[&str] = &[dra::DRA_PLUGIN_SERVICE];

/// A registered DRA driver.
#[derive(Debug, Clone)]
pub struct DraDriverClient {
    /// What `GetInfo` returned.
    pub info: reg::PluginInfo,
    /// The registration socket it was found at.
    pub registration_socket: PathBuf,
    channel: Channel,
}

fn rpc(call: &'static str, endpoint: &Path) -> impl FnOnce(tonic::Status) -> FakeKubeletError {
    let endpoint = endpoint.display().to_string();
    move |status| FakeKubeletError::Rpc {
        call,
        endpoint,
        status: Box::new(status),
    }
}

/// Validates `GetInfo` as the kubelet's DRA registration handler does; the error is what the
/// kubelet would send in `NotifyRegistrationStatus`.
pub fn validate_info(info: &reg::PluginInfo) -> std::result::Result<(), String> {
    if info.r#type != reg::DRA_PLUGIN {
        return Err(format!(
            "plugin type {:?} is not {}",
            info.r#type,
            reg::DRA_PLUGIN
        ));
    }
    if info.name.is_empty() {
        return Err("plugin name is empty".into());
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| SUPPORTED_SERVICES.contains(&v.as_str()))
    {
        return Err(format!(
            "none of the versions {:?} is supported (supported: {SUPPORTED_SERVICES:?})",
            info.supported_versions
        ));
    }
    let ep = Path::new(&info.endpoint);
    if !ep.is_absolute() || !uds::is_socket(ep) {
        return Err(format!(
            "endpoint {:?} is not an absolute path of a socket",
            info.endpoint
        ));
    }
    Ok(())
}

/// The registration sockets in a `plugins_registry` directory (hidden files are ignored, as the
/// plugin watcher ignores them), sorted.
pub fn registration_sockets(registry: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(registry).map_err(|source| FakeKubeletError::Io {
        what: "read plugins_registry",
        path: registry.to_path_buf(),
        source,
    })?;
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && uds::is_socket(p)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Registers the DRA driver `name` found in `registry`: GetInfo, validation, Notify (with the
/// verdict), and a connection to its service socket. A refused registration is an error after
/// the driver was told why.
pub async fn register(registry: &Path, name: &str) -> Result<DraDriverClient> {
    for sock in registration_sockets(registry)? {
        let ch = uds::connect(&sock, ClientAuthority::Localhost, DIAL_TIMEOUT).await?;
        let mut rc = RegistrationClient::new(ch);
        let info = rc
            .get_info(reg::InfoRequest {})
            .await
            .map_err(rpc("GetInfo", &sock))?
            .into_inner();
        if info.name != name {
            continue;
        }
        let verdict = validate_info(&info);
        rc.notify_registration_status(reg::RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict.clone().err().unwrap_or_default(),
        })
        .await
        .map_err(rpc("NotifyRegistrationStatus", &sock))?;
        if let Err(e) = verdict {
            return Err(FakeKubeletError::Refused(format!(
                "DRA driver {name} at {}: {e}",
                sock.display()
            )));
        }
        let endpoint = PathBuf::from(&info.endpoint);
        let channel = uds::connect(&endpoint, ClientAuthority::Localhost, DIAL_TIMEOUT).await?;
        return Ok(DraDriverClient {
            info,
            registration_socket: sock,
            channel,
        });
    }
    Err(FakeKubeletError::Refused(format!(
        "no registration socket of DRA driver {name} in {}",
        registry.display()
    )))
}

/// A claim's identity as the kubelet sends it.
pub fn claim(namespace: &str, name: &str, uid: &str) -> dra::Claim {
    dra::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

impl DraDriverClient {
    /// `NodePrepareResources`, checking that every claim got an entry (the kubelet retries the
    /// missing ones; a test wants to know).
    pub async fn prepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodePrepareResourcesResponse> {
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        let resp = DraPluginClient::new(self.channel.clone())
            .node_prepare_resources(dra::NodePrepareResourcesRequest { claims })
            .await
            .map_err(rpc("NodePrepareResources", Path::new(&self.info.endpoint)))?
            .into_inner();
        if let Some(missing) = uids.iter().find(|u| !resp.claims.contains_key(*u)) {
            return Err(FakeKubeletError::Refused(format!(
                "NodePrepareResources answered without claim {missing}"
            )));
        }
        Ok(resp)
    }

    /// Opens `DRAResourceHealth.NodeWatchResources` (`v1alpha1`, what 1.34 to 1.36 kubelets
    /// call) on the driver's service socket, as the kubelet does after registration.
    pub async fn watch_health(
        &self,
    ) -> Result<tonic::Streaming<erdma_kubelet::dra_health::v1alpha1::NodeWatchResourcesResponse>>
    {
        use erdma_kubelet::dra_health::v1alpha1 as health;
        let stream =
            health::dra_resource_health_client::DraResourceHealthClient::new(self.channel.clone())
                .node_watch_resources(health::NodeWatchResourcesRequest {})
                .await
                .map_err(rpc("NodeWatchResources", Path::new(&self.info.endpoint)))?
                .into_inner();
        Ok(stream)
    }

    /// `NodeUnprepareResources`, checking that every claim got an entry.
    pub async fn unprepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodeUnprepareResourcesResponse> {
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        let resp = DraPluginClient::new(self.channel.clone())
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest { claims })
            .await
            .map_err(rpc(
                "NodeUnprepareResources",
                Path::new(&self.info.endpoint),
            ))?
            .into_inner();
        if let Some(missing) = uids.iter().find(|u| !resp.claims.contains_key(*u)) {
            return Err(FakeKubeletError::Refused(format!(
                "NodeUnprepareResources answered without claim {missing}"
            )));
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_validated_like_the_kubelet() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("dra.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let good = reg::PluginInfo {
            r#type: reg::DRA_PLUGIN.into(),
            name: "erdma.alibabacloud.com".into(),
            endpoint: sock.display().to_string(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        };
        assert_eq!(validate_info(&good), Ok(()));
        let with = |f: &dyn Fn(&mut reg::PluginInfo)| {
            let mut i = good.clone();
            f(&mut i);
            validate_info(&i).expect_err("refused")
        };
        assert!(with(&|i| i.r#type = "DevicePlugin".into()).contains("is not DRAPlugin"));
        assert!(
            with(&|i| i.supported_versions = vec!["v1beta1.DRAPlugin".into()])
                .contains("none of the versions")
        );
        assert!(with(&|i| i.endpoint = "dra.sock".into()).contains("not an absolute path"));
        assert!(with(&|i| i.name.clear()).contains("name is empty"));
    }
}
