//! Shared helpers: hand-built inventories, a fake kubelet and a running plugin.
#![allow(dead_code)]

use erdma_deviceplugin::{Metrics, Plugin, PluginConfig};
use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig, StateFile};
use erdma_model::device::NumaNode;
use erdma_model::{
    CharDevice, CharDevices, DeviceKind, DeviceMode, Health, MacAddr, NodeDevices, PnetId,
    RdmaDevice,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const RESOURCE: &str = "aliyun/erdma";

/// How long a test waits for something that must happen. Generous on purpose: CI shares two cores
/// with other builds, so a test asserts that it happens, not how fast. The latency targets (health
/// change and kubelet restart) are gates in `scripts/bench.sh`.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A short temp dir (Unix socket paths must stay under 108 bytes).
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dp")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

pub fn device(name: &str, uverbs: u32, numa: Option<u32>, mac_last: u8) -> RdmaDevice {
    let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
    d.driver = Some("erdma".into());
    d.mode = Some(DeviceMode::Iwarp);
    d.numa_node = NumaNode(numa);
    d.char_devices = CharDevices {
        uverbs: Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{uverbs}"),
            major: Some(231),
            minor: Some(192 + uverbs),
            present: true,
        }),
        umad: vec![],
    };
    let mac: MacAddr = format!("00:16:3e:0a:1b:{mac_last:02x}")
        .parse()
        .expect("mac");
    d.pnet_id = Some(PnetId::from_mac(mac));
    d.health = Health::Healthy;
    d
}

pub fn node(devices: Vec<RdmaDevice>) -> NodeDevices {
    let mut n = NodeDevices::empty();
    n.devices = devices;
    n.rdma_cm = Some(CharDevice {
        path: "/dev/infiniband/rdma_cm".into(),
        major: Some(10),
        minor: Some(58),
        present: true,
    });
    n
}

pub fn two_numa_node() -> NodeDevices {
    node(vec![
        device("erdma_0", 0, Some(0), 1),
        device("erdma_1", 1, Some(1), 2),
        device("erdma_2", 2, Some(1), 3),
    ])
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub kubelet: FakeKubelet,
    pub devices: watch::Sender<NodeDevices>,
    pub cancel: CancellationToken,
    pub plugin: JoinHandle<Result<(), erdma_deviceplugin::PluginError>>,
    pub metrics: Arc<Metrics>,
    pub cfg: PluginConfig,
}

pub async fn start(
    node: NodeDevices,
    tweak: impl FnOnce(&mut PluginConfig, &mut FakeKubeletConfig),
) -> Harness {
    let dir = short_tempdir();
    let mut cfg = PluginConfig::new(dir.path());
    cfg.slots_per_device = 4;
    let mut kcfg = FakeKubeletConfig::new(dir.path());
    tweak(&mut cfg, &mut kcfg);
    let kubelet = FakeKubelet::start(kcfg).await.expect("fake kubelet starts");
    let (devices, rx) = watch::channel(node);
    let metrics = Arc::new(Metrics::new());
    let cancel = CancellationToken::new();
    let plugin = tokio::spawn(Plugin::new(cfg.clone(), rx, metrics.clone()).run(cancel.clone()));
    let h = Harness {
        dir,
        kubelet,
        devices,
        cancel,
        plugin,
        metrics,
        cfg,
    };
    h.wait_registered(1).await;
    h
}

impl Harness {
    pub async fn wait_registered(&self, registrations: u64) -> StateFile {
        self.kubelet
            .wait_for(Duration::from_secs(5), |s| {
                s.registrations >= registrations
                    && s.resources
                        .get(RESOURCE)
                        .is_some_and(|r| r.connected && r.updates > 0)
            })
            .await
            .expect("plugin registers and sends devices")
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        self.plugin.await.expect("plugin task").expect("plugin ran");
        self.kubelet.shutdown().await;
    }
}
