//! The device state owner: scans the node, keeps the devices this agent serves, and publishes a
//! new snapshot only when something changed.

use erdma_inventory::Inventory;
use erdma_model::{EriSelector, NodeDevices};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Which devices the agent serves.
#[derive(Debug, Clone)]
pub struct DeviceFilter {
    /// Driver keys (`erdma`, `rxe`, `siw`, or a kernel driver name).
    pub drivers: Vec<String>,
    /// ERI allow-list.
    pub selector: EriSelector,
    /// Instance ID the allow-list is applied with (empty when unknown).
    pub instance_id: String,
}

impl DeviceFilter {
    /// Keeps the devices of the configured drivers that the allow-list exposes.
    pub fn apply(&self, mut node: NodeDevices) -> NodeDevices {
        node.devices.retain(|d| {
            self.drivers.iter().any(|k| k == d.driver_key())
                && self.selector.selects(&self.instance_id, &d.name)
        });
        node
    }
}

/// Full rescans (new or removed devices, driver reloads) happen at least this often; in between,
/// the cheap [`Inventory::refresh`] re-reads port state, operstate and char-device presence.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(5);

/// Scans now and returns the filtered snapshot with a sender that publishes later changes.
pub fn initial(inventory: &Inventory, filter: &DeviceFilter) -> (NodeDevices, NodeDevices) {
    let raw = inventory.scan();
    let served = filter.apply(raw.clone());
    (raw, served)
}

/// Polls the inventory every `interval` until `cancel` fires, publishing on `tx` only when the
/// served snapshot changed.
pub async fn run(
    inventory: Inventory,
    filter: DeviceFilter,
    mut raw: NodeDevices,
    tx: watch::Sender<NodeDevices>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_full = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let full = last_full.elapsed() >= FULL_SCAN_EVERY;
        let inv = inventory.clone();
        let prev = raw.clone();
        // sysfs reads block: keep them off the async workers.
        let scanned =
            tokio::task::spawn_blocking(move || if full { inv.scan() } else { inv.refresh(&prev) })
                .await;
        let Ok(next) = scanned else {
            tracing::error!("inventory scan panicked; keeping the previous snapshot");
            continue;
        };
        if full {
            last_full = tokio::time::Instant::now();
        }
        raw = next;
        let served = filter.apply(raw.clone());
        tx.send_if_modified(|cur| {
            if *cur == served {
                return false;
            }
            log_changes(cur, &served);
            *cur = served;
            true
        });
    }
}

fn log_changes(old: &NodeDevices, new: &NodeDevices) {
    for d in &new.devices {
        match old.device(&d.name) {
            None => tracing::info!(device = %d.name, health = ?d.health, "device appeared"),
            Some(o) if o.health != d.health => {
                tracing::warn!(device = %d.name, health = ?d.health, "device health changed")
            }
            _ => {}
        }
    }
    for d in &old.devices {
        if new.device(&d.name).is_none() {
            tracing::warn!(device = %d.name, "device disappeared");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::{DeviceKind, RdmaDevice};

    #[test]
    fn filter_by_driver_and_allow_list() {
        let mut n = NodeDevices::empty();
        n.devices = vec![
            RdmaDevice::named("erdma_0", DeviceKind::Erdma),
            RdmaDevice::named("erdma_1", DeviceKind::Erdma),
            RdmaDevice::named("rxe0", DeviceKind::Rxe),
        ];
        let f = DeviceFilter {
            drivers: vec!["erdma".into()],
            selector: EriSelector::default(),
            instance_id: String::new(),
        };
        let names: Vec<String> = f
            .apply(n.clone())
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["erdma_0", "erdma_1"]);
        let f = DeviceFilter {
            drivers: vec!["erdma".into(), "rxe".into()],
            selector: EriSelector::parse("i-abc erdma_1/rxe*").unwrap(),
            instance_id: "i-abc".into(),
        };
        let names: Vec<String> = f
            .apply(n.clone())
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["erdma_1", "rxe0"]);
        let f = DeviceFilter {
            instance_id: "i-other".into(),
            ..f
        };
        assert!(f.apply(n).devices.is_empty());
    }
}
