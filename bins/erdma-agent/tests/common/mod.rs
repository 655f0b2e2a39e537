//! Set-up shared by the DRA tests: the fixture node's served devices and the agent's DRA driver
//! (`resource_api::run_dra`) started on it, with its kubelet, CDI and device-plugin directories in
//! a temporary directory.

// Each test file is its own crate and uses only some of these helpers: the others would be dead
// code there.
#![allow(dead_code)]

use erdma_agent::cluster::Cluster;
use erdma_agent::resource_api::{self, DraSettings};
use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_model::{DeviceSelection, NodeDevices};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The extended resource the agent serves.
pub const RESOURCE: &str = "aliyun/erdma";

/// The `erdma-iwarp` fixture node and the devices the agent serves on it.
pub fn served_fixture() -> (NodeTree, NodeDevices) {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs(BTreeMap::new())),
    });
    let (served, _) = DeviceSelection::default().apply(&inv.scan());
    (tree, served)
}

/// The agent's DRA driver (`resource_api::run_dra`) on a fixture node, with its kubelet and CDI
/// directories in a temporary directory.
pub struct RunningDra {
    /// Holds `kubelet/`, `cdi/` and `device-plugins/`.
    pub dir: tempfile::TempDir,
    /// What `/healthz` shows of the driver.
    pub view: watch::Receiver<Option<resource_api::DraView>>,
    /// The served devices: a change makes the driver publish its ResourceSlice again.
    pub served: watch::Sender<NodeDevices>,
    /// Stops the driver.
    pub cancel: CancellationToken,
    /// The driver's task.
    pub run: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// NodePrepareResources calls that prepared a claim (the agent refreshes its holders then).
    pub prepares: Arc<std::sync::atomic::AtomicUsize>,
}

impl RunningDra {
    /// The kubelet's device-plugin directory the driver watches (with [`start_dra_retiring`]).
    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }
}

/// The driver without metrics and without looking at the device plugin's resource.
pub fn start_dra(
    tree: &NodeTree,
    served: NodeDevices,
    cluster: Cluster,
    instance_id: Option<String>,
) -> RunningDra {
    start(tree, served, cluster, instance_id, None, false)
}

/// The driver with `metrics`.
pub fn start_dra_with(
    tree: &NodeTree,
    served: NodeDevices,
    cluster: Cluster,
    instance_id: Option<String>,
    metrics: Option<erdma_agent::metrics::DraMetrics>,
) -> RunningDra {
    start(tree, served, cluster, instance_id, metrics, false)
}

/// The driver on a node the device plugin served: it removes [`RESOURCE`] from the node's
/// status once the kubelet let the plugin of [`RunningDra::plugin_dir`] go.
pub fn start_dra_retiring(tree: &NodeTree, served: NodeDevices, cluster: Cluster) -> RunningDra {
    start(tree, served, cluster, None, None, true)
}

fn start(
    tree: &NodeTree,
    served: NodeDevices,
    cluster: Cluster,
    instance_id: Option<String>,
    metrics: Option<erdma_agent::metrics::DraMetrics>,
    retire_device_plugin: bool,
) -> RunningDra {
    let dir = tempfile::Builder::new()
        .prefix("wt")
        .tempdir_in("/tmp")
        .unwrap();
    let device_plugin_dir = retire_device_plugin.then(|| {
        let d = dir.path().join("device-plugins");
        std::fs::create_dir_all(&d).unwrap();
        d
    });
    let (view_tx, view) = watch::channel(None);
    let cancel = CancellationToken::new();
    let (served_tx, served_rx) = watch::channel(served);
    let prepares = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = prepares.clone();
    let run = tokio::spawn(resource_api::run_dra(
        DraSettings {
            kubelet_root_dir: dir.path().join("kubelet"),
            cdi_dir: dir.path().join("cdi"),
            sysfs: tree.sys().to_path_buf(),
            on_prepare: Some(Arc::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })),
            metrics,
            resource_name: RESOURCE.into(),
            device_plugin_dir,
        },
        cluster,
        served_rx,
        instance_id,
        view_tx,
        cancel.clone(),
    ));
    RunningDra {
        dir,
        view,
        served: served_tx,
        cancel,
        run,
        prepares,
    }
}

/// Waits (up to 5 s) until `f` holds; panics naming `what` when it never does.
pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
