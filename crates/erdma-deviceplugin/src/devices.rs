//! The plugin's view of the node: which devices it serves, their slots, and the ListAndWatch
//! message for a snapshot.

use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_model::device::NumaNode;
use erdma_model::slot::MAX_DEVICE_ID_LEN;
use erdma_model::{CharDevice, NodeDevices, RdmaDevice, SlotId};
use std::collections::BTreeMap;

/// One device as served: everything Allocate needs, taken from a [`RdmaDevice`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServedDevice {
    /// The inventoried device.
    pub device: RdmaDevice,
}

impl ServedDevice {
    /// Device name.
    pub fn name(&self) -> &str {
        &self.device.name
    }
    /// Healthy now.
    pub fn healthy(&self) -> bool {
        self.device.health.is_healthy()
    }
    /// NUMA node.
    pub fn numa(&self) -> NumaNode {
        self.device.numa_node
    }
    /// Character devices the container needs for this device (uverbs, then umad).
    pub fn char_devices(&self) -> impl Iterator<Item = &CharDevice> {
        self.device.char_devices.all()
    }
}

/// What the kubelet sees of one device: the ListAndWatch message is a function of this list
/// and the slot count, so streams compare these instead of whole messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// Device name.
    pub name: String,
    /// Healthy.
    pub healthy: bool,
    /// NUMA node.
    pub numa: NumaNode,
}

/// The devices served for one snapshot.
#[derive(Debug, Clone)]
pub struct ServedSet {
    /// Devices by name.
    pub devices: BTreeMap<String, ServedDevice>,
    /// `/dev/infiniband/rdma_cm`, when the node has it.
    pub rdma_cm: Option<CharDevice>,
    /// Slots per device.
    pub slots_per_device: u32,
    /// What the kubelet is told, in message order.
    pub advertised: Vec<Advertised>,
}

impl ServedSet {
    /// Builds the served set from a snapshot. Devices whose slot IDs would exceed the kubelet's
    /// 63-character limit are skipped (and logged).
    pub fn from_snapshot(node: &NodeDevices, slots_per_device: u32) -> ServedSet {
        let mut devices = BTreeMap::new();
        let widest = format!("/{}", slots_per_device.saturating_sub(1)).len();
        for d in &node.devices {
            if d.name.len() + widest > MAX_DEVICE_ID_LEN
                || d.name.is_empty()
                || d.name.contains('/')
            {
                tracing::warn!(device = %d.name, "device name cannot form a slot ID of at most {MAX_DEVICE_ID_LEN} characters; not advertised");
                continue;
            }
            devices.insert(d.name.clone(), ServedDevice { device: d.clone() });
        }
        let advertised = devices
            .values()
            .map(|d| Advertised {
                name: d.name().to_string(),
                healthy: d.healthy(),
                numa: d.numa(),
            })
            .collect();
        ServedSet {
            devices,
            rdma_cm: node.rdma_cm.clone(),
            slots_per_device,
            advertised,
        }
    }

    /// The ListAndWatch message for this set, built on demand: 64 devices × 200 slots is 12800
    /// entries, not worth keeping in memory between changes.
    pub fn message(&self) -> api::ListAndWatchResponse {
        list_and_watch_message(self.devices.values(), self.slots_per_device)
    }

    /// The served device a slot belongs to, when the slot exists.
    pub fn slot_device(&self, slot: &SlotId) -> Option<&ServedDevice> {
        self.devices
            .get(&slot.device)
            .filter(|_| slot.index < self.slots_per_device)
    }

    /// Healthy devices, by name.
    pub fn healthy(&self) -> impl Iterator<Item = &ServedDevice> {
        self.devices.values().filter(|d| d.healthy())
    }
}

/// The topology of a device: its NUMA node, or none when unknown (never a fake node 0).
pub fn topology(numa: NumaNode) -> Option<api::TopologyInfo> {
    numa.0.map(|n| api::TopologyInfo {
        nodes: vec![api::NumaNode { id: i64::from(n) }],
    })
}

/// The full ListAndWatch message: `slots_per_device` IDs `"<device>/<i>"` per device.
pub fn list_and_watch_message<'a>(
    devices: impl Iterator<Item = &'a ServedDevice>,
    slots_per_device: u32,
) -> api::ListAndWatchResponse {
    let mut out = Vec::new();
    for d in devices {
        let health = if d.healthy() {
            api::HEALTHY
        } else {
            api::UNHEALTHY
        };
        let topo = topology(d.numa());
        out.reserve(slots_per_device as usize);
        let prefix_len = d.name().len() + 1;
        for i in 0..slots_per_device {
            // Hot for 64 × 200 entries: build the ID without the formatting machinery.
            let mut id = String::with_capacity(prefix_len + 10);
            id.push_str(d.name());
            id.push('/');
            push_decimal(&mut id, i);
            out.push(api::Device {
                id,
                health: health.to_string(),
                topology: topo.clone(),
            });
        }
    }
    api::ListAndWatchResponse { devices: out }
}

/// Appends `n` in decimal.
fn push_decimal(s: &mut String, mut n: u32) {
    let mut buf = [0u8; 10];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &b in &buf[at..] {
        s.push(char::from(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::{DeviceKind, Health};

    fn node() -> NodeDevices {
        let mut a = RdmaDevice::named("erdma_0", DeviceKind::Erdma);
        a.numa_node = NumaNode(Some(1));
        let mut b = RdmaDevice::named("erdma_1", DeviceKind::Erdma);
        b.health = Health::from_reasons(vec!["port 1 is DOWN".into()]);
        let c = RdmaDevice::named("x".repeat(62), DeviceKind::Erdma);
        let mut n = NodeDevices::empty();
        n.devices = vec![a, b, c];
        n
    }

    #[test]
    fn slots_health_and_topology() {
        let set = ServedSet::from_snapshot(&node(), 3);
        let message = set.message();
        let ids: Vec<&str> = message.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "erdma_0/0",
                "erdma_0/1",
                "erdma_0/2",
                "erdma_1/0",
                "erdma_1/1",
                "erdma_1/2"
            ]
        );
        assert_eq!(message.devices[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(message.devices[0].health, "Healthy");
        assert!(
            message.devices[3].topology.is_none(),
            "unknown NUMA is omitted, not 0"
        );
        assert_eq!(message.devices[3].health, "Unhealthy");
        assert!(set.slot_device(&SlotId::new("erdma_0", 2)).is_some());
        assert!(set.slot_device(&SlotId::new("erdma_0", 3)).is_none());
    }

    #[test]
    fn decimal_ids_match_formatting() {
        for n in [0u32, 7, 10, 199, 4_294_967_295] {
            let mut s = String::from("x/");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x/{n}"));
        }
    }
}
