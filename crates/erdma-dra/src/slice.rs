//! The pure mapping from the node inventory to this node's ResourceSlice.
//!
//! One slice per node (pool = node name, one slice in the pool) with one device per served RDMA
//! device. The device name is the ib device name made a DNS label (`erdma_0` → `erdma-0`, the API
//! server refuses underscores); the ib device name itself is the `ibdev` attribute.

use crate::config::{CapacityModel, DraConfig};
use erdma_model::{NodeDevices, RdmaDevice};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;
use std::path::Path;

/// Capacity name of the sharing unit.
pub const CAP_SHARES: &str = "shares";
/// Capacity name of verbs contexts (rdma cgroup `hca_handle`).
pub const CAP_HCA_HANDLE: &str = "hcaHandle";
/// Capacity name of verbs objects (rdma cgroup `hca_object`).
pub const CAP_HCA_OBJECT: &str = "hcaObject";
/// Standard attribute: the PCIe root complex of the device (KEP-4381 / 5491).
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Standard attribute: the PCI bus ID of the device.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Taint effect used for an unhealthy device: no new allocations; running pods stay (a link
/// flap must not evict every RDMA pod of the node).
pub const TAINT_EFFECT: &str = "NoSchedule";
/// Label on the slices this driver writes, naming the node (for humans and `kubectl -l`).
pub const LABEL_NODE: &str = "erdma.alibabacloud.com/node";

/// The taint key of an unhealthy device: `<driver>/unhealthy`.
pub fn taint_key(driver: &str) -> String {
    format!("{driver}/unhealthy")
}

/// The ResourceSlice device name of an ib device: a DNS label (lowercase letters, digits, `-`,
/// at most 63 characters, alphanumeric at both ends), or `None` when none can be formed.
pub fn device_name(ibdev: &str) -> Option<String> {
    let name: String = ibdev
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    ok.then_some(name)
}

/// The ResourceSlice name of a node's slice for a driver: `<node>-<driver>`.
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{driver}")
}

/// The PCIe root of a PCI function from sysfs: the `pciDDDD:BB` component of the resolved
/// `/sys/bus/pci/devices/<address>` link, when readable.
pub fn pcie_root(sysfs: &Path, pci_address: &str) -> Option<String> {
    let link = std::fs::read_link(sysfs.join("bus/pci/devices").join(pci_address)).ok()?;
    link.components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| c.starts_with("pci") && c.contains(':'))
        .map(str::to_string)
}

/// PCIe roots of the devices of a snapshot, by ib device name.
pub fn pcie_roots(sysfs: &Path, node: &NodeDevices) -> BTreeMap<String, String> {
    node.devices
        .iter()
        .filter_map(|d| {
            let pci = d.pci.as_ref()?;
            Some((d.name.clone(), pcie_root(sysfs, &pci.address)?))
        })
        .collect()
}

/// Everything the mapping reads, besides the served devices.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// ECS instance ID of the node, when known.
    pub instance_id: Option<String>,
    /// PCIe roots by ib device name.
    pub pcie_roots: BTreeMap<String, String>,
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn capacity(total: u64, default: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(total.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(default.to_string())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("1".into()),
                max: Some(Quantity(total.to_string())),
                step: Some(Quantity("1".into())),
            }),
            valid_values: None,
        }),
    }
}

/// The capacities of one device.
pub fn capacities(model: &CapacityModel) -> BTreeMap<String, DeviceCapacity> {
    BTreeMap::from([
        (CAP_SHARES.to_string(), capacity(model.shares, 1)),
        (
            CAP_HCA_HANDLE.to_string(),
            capacity(model.hca_handles, model.hca_handles_default),
        ),
        (
            CAP_HCA_OBJECT.to_string(),
            capacity(model.hca_objects, model.hca_objects_default),
        ),
    ])
}

/// The ResourceSlice device of one served RDMA device, or `None` when its name cannot form a
/// device name.
pub fn device(
    d: &RdmaDevice,
    driver: &str,
    model: &CapacityModel,
    facts: &NodeFacts,
) -> Option<Device> {
    let name = device_name(&d.name)?;
    let mut attrs = BTreeMap::new();
    attrs.insert("ibdev".to_string(), string(&d.name));
    attrs.insert("driver".to_string(), string(d.driver_key()));
    if let Some(mode) = d.mode {
        attrs.insert("mode".to_string(), string(mode.name()));
    }
    if let Some(n) = d.numa_node.0 {
        attrs.insert(
            "numaNode".to_string(),
            DeviceAttribute {
                int: Some(i64::from(n)),
                ..Default::default()
            },
        );
    }
    if let Some(p) = &d.pnet_id {
        attrs.insert("pnetId".to_string(), string(p.as_str()));
    }
    if let Some(n) = &d.netdev {
        attrs.insert("netdev".to_string(), string(&n.name));
        if let Some(mac) = &n.mac {
            attrs.insert("mac".to_string(), string(mac.to_string()));
        }
    }
    if let Some(i) = &facts.instance_id {
        attrs.insert("instanceId".to_string(), string(i));
    }
    if let Some(pci) = &d.pci {
        attrs.insert(ATTR_PCI_BUS_ID.to_string(), string(&pci.address));
    }
    if let Some(root) = facts.pcie_roots.get(&d.name) {
        attrs.insert(ATTR_PCIE_ROOT.to_string(), string(root));
    }
    let taints = (!d.health.is_healthy()).then(|| {
        vec![DeviceTaint {
            key: taint_key(driver),
            value: Some(taint_value(d.health.reasons())),
            effect: TAINT_EFFECT.to_string(),
            time_added: None,
        }]
    });
    Some(Device {
        name,
        attributes: Some(attrs),
        capacity: Some(capacities(model)),
        allow_multiple_allocations: Some(true),
        taints,
        ..Default::default()
    })
}

/// A short label-value-shaped summary of why a device is unhealthy (the full reasons are in the
/// agent's logs, `erdmactl devices` and the ERdmaDevice status).
pub fn taint_value(reasons: &[String]) -> String {
    let all = reasons.join(" ").to_ascii_lowercase();
    let v = if all.contains("gone") {
        "device-gone"
    } else if all.contains("down") || all.contains("carrier") {
        "link-down"
    } else if all.contains("char") || all.contains("uverbs") {
        "no-char-device"
    } else {
        "unhealthy"
    };
    v.to_string()
}

/// The devices of the slice for a served snapshot (already passed through the device plugin's
/// [`erdma_model::DeviceSelection`]), sorted by name. Devices whose name cannot form a device
/// name, or collides with another after mapping, are left out with a warning.
pub fn devices(served: &NodeDevices, cfg: &DraConfig, facts: &NodeFacts) -> Vec<Device> {
    let mut out: BTreeMap<String, Device> = BTreeMap::new();
    for d in &served.devices {
        let Some(dev) = device(d, &cfg.driver_name, &cfg.capacity, facts) else {
            tracing::warn!(device = %d.name, "ib device name cannot form a DRA device name (a DNS label); not published");
            continue;
        };
        if out.contains_key(&dev.name) {
            tracing::warn!(device = %d.name, name = %dev.name, "two ib devices map to the same DRA device name; the second is not published");
            continue;
        }
        out.insert(dev.name.clone(), dev);
    }
    out.into_values().collect()
}

/// The whole ResourceSlice for this node with pool generation `generation`.
pub fn resource_slice(devices: Vec<Device>, cfg: &DraConfig, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&cfg.node_name, &cfg.driver_name)),
            labels: Some(BTreeMap::from([(
                LABEL_NODE.to_string(),
                label_value(&cfg.node_name),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: cfg.driver_name.clone(),
            node_name: Some(cfg.node_name.clone()),
            pool: ResourcePool {
                name: cfg.pool_name().to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// The owner reference of this node's ResourceSlices: their Node (`v1`, `Node`, name, UID), as
/// the controller, so that the garbage collector deletes them with the Node.
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// A node name as a label value (at most 63 characters; longer names are cut).
fn label_value(node: &str) -> String {
    let cut: String = node.chars().take(63).collect();
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Finds the served ib device of a ResourceSlice device name.
pub fn find_device<'a>(served: &'a NodeDevices, name: &str) -> Option<&'a RdmaDevice> {
    served
        .devices
        .iter()
        .find(|d| device_name(&d.name).as_deref() == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::address::MacAddr;
    use erdma_model::device::{AddressSource, NetDev, NetdevPairing, NumaNode, PciInfo};
    use erdma_model::driver::DeviceMode;
    use erdma_model::pnet::PnetId;
    use erdma_model::{DeviceKind, DeviceSelection, Health};

    fn erdma(name: &str) -> RdmaDevice {
        let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
        d.driver = Some("erdma".into());
        d.mode = Some(DeviceMode::Iwarp);
        d.numa_node = NumaNode(Some(1));
        d.pci = Some(PciInfo {
            address: "0000:00:06.0".into(),
            vendor: Some(0x1ded),
            device: Some(0x107f),
        });
        d
    }

    fn cfg() -> DraConfig {
        DraConfig::new("node-a")
    }

    #[test]
    fn device_names_are_dns_labels() {
        assert_eq!(device_name("erdma_0").as_deref(), Some("erdma-0"));
        assert_eq!(device_name("rxe0").as_deref(), Some("rxe0"));
        assert_eq!(device_name("MLX5_1").as_deref(), Some("mlx5-1"));
        assert_eq!(device_name("_x"), None);
        assert_eq!(device_name(&"a".repeat(64)), None);
    }

    #[test]
    fn attributes_capacity_and_sharing() {
        let mut d = erdma("erdma_0");
        d.pnet_id = Some(PnetId::parse("00163E0A0B0C").expect("pnet"));
        d.netdev = Some(NetDev {
            name: "eth1".into(),
            paired_by: NetdevPairing::GuidMac,
            mac: Some("00:16:3e:0a:0b:0c".parse::<MacAddr>().expect("mac")),
            operstate: Some("up".into()),
            link_up: Some(true),
            mtu: Some(1500),
            ipv4: vec![],
            ipv4_source: AddressSource::None,
            pci_address: None,
        });
        let facts = NodeFacts {
            instance_id: Some("i-abc".into()),
            pcie_roots: BTreeMap::from([("erdma_0".to_string(), "pci0000:00".to_string())]),
        };
        let dev = device(
            &d,
            "erdma.alibabacloud.com",
            &CapacityModel::default(),
            &facts,
        )
        .expect("device");
        assert_eq!(dev.name, "erdma-0");
        assert_eq!(dev.allow_multiple_allocations, Some(true));
        assert!(dev.taints.is_none());
        let attrs = dev.attributes.expect("attributes");
        let s = |k: &str| attrs.get(k).and_then(|a| a.string.clone());
        assert_eq!(s("ibdev").as_deref(), Some("erdma_0"));
        assert_eq!(s("mode").as_deref(), Some("iwarp"));
        assert_eq!(s("pnetId").as_deref(), Some("00163E0A0B0C"));
        assert_eq!(s("netdev").as_deref(), Some("eth1"));
        assert_eq!(s("mac").as_deref(), Some("00:16:3e:0a:0b:0c"));
        assert_eq!(s("instanceId").as_deref(), Some("i-abc"));
        assert_eq!(s(ATTR_PCIE_ROOT).as_deref(), Some("pci0000:00"));
        assert_eq!(s(ATTR_PCI_BUS_ID).as_deref(), Some("0000:00:06.0"));
        assert_eq!(attrs.get("numaNode").and_then(|a| a.int), Some(1));
        let cap = dev.capacity.expect("capacity");
        assert_eq!(cap[CAP_SHARES].value.0, "200");
        assert_eq!(cap[CAP_HCA_HANDLE].value.0, "1000");
        assert_eq!(cap[CAP_HCA_OBJECT].value.0, "2000000");
        let policy = cap[CAP_HCA_HANDLE].request_policy.as_ref().expect("policy");
        assert_eq!(policy.default.as_ref().map(|q| q.0.as_str()), Some("4"));
        assert_eq!(
            cap[CAP_SHARES]
                .request_policy
                .as_ref()
                .and_then(|p| p.default.as_ref())
                .map(|q| q.0.as_str()),
            Some("1")
        );
    }

    #[test]
    fn unknown_numa_is_omitted_not_zero() {
        let mut d = erdma("erdma_0");
        d.numa_node = NumaNode::UNKNOWN;
        let dev =
            device(&d, "x.y", &CapacityModel::default(), &NodeFacts::default()).expect("device");
        assert!(!dev.attributes.expect("attrs").contains_key("numaNode"));
    }

    #[test]
    fn unhealthy_device_is_tainted_not_dropped() {
        let mut d = erdma("erdma_1");
        d.health = Health::from_reasons(vec!["port 1 is DOWN (netdev eth2 is down)".into()]);
        let mut node = NodeDevices::empty();
        node.devices = vec![erdma("erdma_0"), d];
        let devs = devices(&node, &cfg(), &NodeFacts::default());
        assert_eq!(devs.len(), 2);
        assert!(devs[0].taints.is_none());
        let taints = devs[1].taints.as_ref().expect("tainted");
        assert_eq!(taints[0].key, "erdma.alibabacloud.com/unhealthy");
        assert_eq!(taints[0].effect, "NoSchedule");
        assert_eq!(taints[0].value.as_deref(), Some("link-down"));
    }

    #[test]
    fn same_selection_rules_as_the_device_plugin() {
        let mut node = NodeDevices::empty();
        node.devices = vec![
            erdma("erdma_0"),
            RdmaDevice::named("rxe0", DeviceKind::Rxe),
            RdmaDevice::named("mlx5_0", DeviceKind::Other),
        ];
        let (served, excluded) = DeviceSelection::default().apply(&node);
        let devs = devices(&served, &cfg(), &NodeFacts::default());
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["erdma-0"]);
        assert_eq!(excluded.len(), 2);
    }

    #[test]
    fn owned_by_the_node_as_its_controller() {
        let o = serde_json::to_value(node_owner("node-a", "6b1f0c0e-uid")).expect("serialises");
        assert_eq!(
            o,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "name": "node-a",
                "uid": "6b1f0c0e-uid",
                "controller": true,
            })
        );
    }

    #[test]
    fn slice_is_node_local_with_one_slice_pool() {
        let s = resource_slice(vec![], &cfg(), 3);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("node-a-erdma.alibabacloud.com")
        );
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.pool.generation, 3);
        assert_eq!(s.spec.pool.resource_slice_count, 1);
        assert_eq!(s.spec.driver, "erdma.alibabacloud.com");
    }

    #[test]
    fn pcie_root_from_sysfs_link() {
        let dir = tempfile::tempdir().expect("tmp");
        let devs = dir.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devs).expect("mkdir");
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:02.0/0000:01:00.0",
            devs.join("0000:01:00.0"),
        )
        .expect("symlink");
        assert_eq!(
            pcie_root(dir.path(), "0000:01:00.0").as_deref(),
            Some("pci0000:00")
        );
        assert_eq!(pcie_root(dir.path(), "0000:02:00.0"), None);
    }
}
