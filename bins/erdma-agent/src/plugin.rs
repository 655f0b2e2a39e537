//! The kubelet device plugin of a device-plugin node, as the plan configures it (allocate-all,
//! pre-start, CDI, the pod-resources socket), with the watch for another plugin serving the
//! same resource and the SMC-R hook in PreStartContainer (or handed to NRI).

use crate::health::HealthSources;
use crate::plan::AgentPlan;
use crate::smcr::SmcrHook;
use crate::tasks::{Serving, Shared, Tasks};
use crate::{cli::Settings, coexistence, smcr};
use anyhow::Context;
use erdma_deviceplugin::{CdiConfig, Metrics, Plugin, PluginConfig};
use erdma_model::NodeDevices;
use erdma_smc::configure::SocketPolicy;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The CDI kind of the device plugin's specs.
const CDI_KIND: &str = "aliyun.com/erdma";

/// The device plugin's configuration from the plan and the settings.
pub fn config(plan: &AgentPlan, s: &Settings) -> PluginConfig {
    let mut cfg = PluginConfig::new(&plan.sockets.kubelet_dir);
    cfg.resource_name = s.resource_name.clone();
    cfg.slots_per_device = s.slots_per_device;
    cfg.allocate_all_devices = plan.allocate_all;
    cfg.pre_start_required = plan.pre_start_required;
    cfg.pod_resources_socket = plan.sockets.pod_resources.clone();
    cfg.cdi = plan.sockets.cdi.clone().map(|spec_dir| CdiConfig {
        spec_dir,
        kind: CDI_KIND.into(),
    });
    cfg
}

/// The device plugin, for the agent to await, beside the watch for another plugin and the
/// SMC-R hook (awaiting the BPF probe `smcr_probe`): the hook goes into PreStartContainer, or is
/// returned for NRI when the plan runs NRI.
pub async fn start(
    shared: Shared<'_>,
    served: &watch::Receiver<NodeDevices>,
    plugin_metrics: Arc<Metrics>,
    smcr_probe: Option<JoinHandle<Option<Arc<dyn SocketPolicy>>>>,
    health: &mut HealthSources,
    tasks: &mut Tasks,
) -> anyhow::Result<(Serving, Option<Arc<SmcrHook>>)> {
    let cfg = config(shared.plan, shared.settings);
    let observer =
        erdma_deviceplugin::coexistence::Observer::new(&cfg).with_holders(shared.holders);
    // With a pod-resources socket the plugin reads the one owner (and pokes it after each
    // Allocate); without one, preferred allocation ignores slots in use, as configured, and an
    // Allocate still pokes the owner that SMC-R, NRI and the reload guard read.
    let mut plugin = Plugin::new(cfg.clone(), served.clone(), plugin_metrics);
    plugin = if cfg.pod_resources_socket.is_some() {
        plugin.with_holders(shared.holders.clone())
    } else {
        let poke = shared.holders.clone();
        plugin.on_allocate(Arc::new(move || poke.poke()))
    };
    let reclaimer = plugin.reclaimer();
    let conflict = &mut health.device_plugin_conflict;
    coexistence::start(observer, reclaimer, shared, served, conflict, tasks);
    let hook = smcr::start(smcr_probe, shared, served, &mut health.smcr, tasks).await?;
    let for_nri = match hook {
        Some(hook) if shared.plan.nri => Some(hook),
        Some(hook) => {
            plugin = plugin.with_pre_start(hook);
            None
        }
        None => None,
    };
    let run = tasks
        .pending
        .track("the device plugin", plugin.run(tasks.cancel.clone()));
    Ok((
        Box::pin(async move { (run.await.context("device plugin"), None) }),
        for_nri,
    ))
}
