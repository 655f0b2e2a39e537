//! Driver configuration and the capacity model.

use std::path::PathBuf;

/// Capacity advertised per device (KEP-5075 consumable capacity) and what a claim gets when it
/// does not ask for an amount (the `requestPolicy.default`).
///
/// `shares` is the sharing unit (the device plugin's slots); `hcaHandle` and `hcaObject` are the
/// kernel rdma cgroup's limits (`rdma.max` `hca_handle=` / `hca_object=`): what a claim consumes of
/// them is handed to the runtime side (the NRI plugin) to enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityModel {
    /// Shares per device (default 200, the device plugin's slots per device).
    pub shares: u64,
    /// Verbs contexts (`hca_handle`) per device.
    pub hca_handles: u64,
    /// Contexts a claim gets by default.
    pub hca_handles_default: u64,
    /// Verbs objects (QPs, CQs, MRs, PDs…; `hca_object`) per device.
    pub hca_objects: u64,
    /// Objects a claim gets by default.
    pub hca_objects_default: u64,
}

impl Default for CapacityModel {
    /// 200 shares; 1000 contexts (4 per claim by default, so 200 default claims fit) and
    /// 2 000 000 objects (8000 per claim by default).
    fn default() -> Self {
        CapacityModel {
            shares: 200,
            hca_handles: 1000,
            hca_handles_default: 4,
            hca_objects: 2_000_000,
            hca_objects_default: 8000,
        }
    }
}

impl CapacityModel {
    /// Checks the values; the error names the value and the fix.
    pub fn validate(&self) -> Result<(), String> {
        let pairs = [
            ("shares", self.shares, 1),
            ("hcaHandle", self.hca_handles, self.hca_handles_default),
            ("hcaObject", self.hca_objects, self.hca_objects_default),
        ];
        for (name, total, default) in pairs {
            if total == 0 || default == 0 || default > total {
                return Err(format!(
                    "capacity {name}: total {total} and default per claim {default} must be positive with default <= total"
                ));
            }
        }
        Ok(())
    }
}

/// Everything the driver needs to know.
#[derive(Debug, Clone)]
pub struct DraConfig {
    /// Driver name (`erdma.alibabacloud.com`).
    pub driver_name: String,
    /// This node's name (the ResourceSlice's `nodeName` and the pool name).
    pub node_name: String,
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// Directory the per-claim CDI specs are written to (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The capacity model.
    pub capacity: CapacityModel,
    /// sysfs root, to find each device's PCIe root (`/sys`).
    pub sysfs: PathBuf,
}

impl DraConfig {
    /// Defaults for a node.
    pub fn new(node_name: impl Into<String>) -> Self {
        DraConfig {
            driver_name: erdma_model::names::DRA_DRIVER.to_string(),
            node_name: node_name.into(),
            kubelet_dir: PathBuf::from("/var/lib/kubelet"),
            cdi_dir: PathBuf::from("/var/run/cdi"),
            capacity: CapacityModel::default(),
            sysfs: PathBuf::from("/sys"),
        }
    }

    /// `<kubelet>/plugins_registry/<driver>-reg.sock`, the socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<kubelet>/plugins/<driver>`, the driver's own directory.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(&self.driver_name)
    }

    /// `<kubelet>/plugins/<driver>/dra.sock`, the DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// `<kubelet>/plugins/<driver>/checkpoint.json`, the prepared claims.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.plugin_dir().join("checkpoint.json")
    }

    /// The pool name: the node name (one pool per node, as the kubelet plugins do).
    pub fn pool_name(&self) -> &str {
        &self.node_name
    }

    /// Checks values a user can get wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_name.is_empty() {
            return Err(
                "node name is empty: set NODE_NAME (the downward API spec.nodeName)".into(),
            );
        }
        if !self.driver_name.contains('.')
            || !self
                .driver_name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        {
            return Err(format!(
                "driver name {:?} is not a DNS subdomain with a dot (e.g. erdma.alibabacloud.com)",
                self.driver_name
            ));
        }
        self.capacity.validate()
    }
}
