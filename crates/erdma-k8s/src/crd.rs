//! The `ERdmaDevice` custom resource (`erdmadevices.network.alibabacloud.com/v1`, cluster-scoped,
//! status subresource): one object per node, named after the node, listing the ERIs the node's
//! agent must use. Field names and JSON names are exactly the original controller's, so objects
//! written by either implementation are read by the other.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The CRD's API group.
pub const GROUP: &str = "network.alibabacloud.com";
/// The CRD's version.
pub const VERSION: &str = "v1";
/// The CRD's full name.
pub const CRD_NAME: &str = "erdmadevices.network.alibabacloud.com";

// The API server refuses objects whose fields break these (what `kubectl get` and erdmactl show
// stays an ID, a MAC, a word): each also admits "", the default of an absent field in the
// original's objects (Go `omitempty`).
/// `instanceID`: `i-` and up to 62 letters, digits or `-` (as `erdma_model::names::is_instance_id`).
pub const INSTANCE_ID_PATTERN: &str = "^(i-[A-Za-z0-9-]{1,62})?$";
/// `mac`: six colon-separated hex octets, either case.
pub const MAC_PATTERN: &str = "^([0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5})?$";
/// `id`: an ENI ID (`eni-…`) or, in local-discovery mode, an ibdev name (at most 64 characters).
pub const DEVICE_ID_PATTERN: &str = "^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})?$";
/// `status.devices[].status`: a word (`Pending`, `Ready`, `Failed`; others are kept, not fatal).
pub const DEVICE_STATE_PATTERN: &str = "^[A-Za-z]{0,32}$";
/// The longest `status.devices[].message`.
pub const MESSAGE_MAX: u32 = 4096;

/// Desired state: the ERIs of one node.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "network.alibabacloud.com",
    version = "v1",
    kind = "ERdmaDevice",
    plural = "erdmadevices",
    singular = "erdmadevice",
    status = "ERdmaDeviceStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ERdmaDeviceSpec {
    /// The ERIs of the node, one per network card.
    #[schemars(length(max = 64))]
    pub devices: Vec<DeviceInfo>,
    /// Whether the instance has jumbo frames enabled (`DescribeInstanceAttribute.EnableJumboFrame`);
    /// the agent then sets the ERI netdev MTU to `--jumbo-frame-mtu`.
    #[serde(
        default,
        rename = "jumboFrame",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub jumbo_frame: bool,
}

/// One ERI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DeviceInfo {
    /// The ECS instance ID (`i-…`).
    #[serde(default, rename = "instanceID")]
    #[schemars(pattern(INSTANCE_ID_PATTERN))]
    pub instance_id: String,
    /// The ENI's MAC as ECS returns it (lower case, colon-separated); the agent matches netdevs by it.
    #[serde(default)]
    #[schemars(pattern(MAC_PATTERN))]
    pub mac: String,
    /// Whether the ERI is the instance's primary ENI.
    #[serde(default, rename = "isPrimaryENI")]
    pub is_primary_eni: bool,
    /// The ENI ID (`eni-…`; in local-discovery mode the ibdev name).
    #[serde(default)]
    #[schemars(pattern(DEVICE_ID_PATTERN))]
    pub id: String,
    /// The network card the ENI is attached to.
    #[serde(default, rename = "networkCardIndex")]
    pub network_card_index: i64,
    /// Queue pairs of the ERI.
    #[serde(default, rename = "queuePair")]
    pub queue_pair: i64,
}

/// Observed state, one entry per ERI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ERdmaDeviceStatus {
    /// Per-device state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub devices: Vec<DeviceStatus>,
}

/// The state of one ERI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DeviceStatus {
    /// The ENI ID (matches `spec.devices[].id`).
    #[serde(default)]
    #[schemars(pattern(DEVICE_ID_PATTERN))]
    pub id: String,
    /// `Pending`, `Ready` or `Failed`.
    #[serde(default)]
    #[schemars(pattern(DEVICE_STATE_PATTERN))]
    pub status: String,
    /// Why it is not Ready.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MESSAGE_MAX))]
    pub message: String,
}

/// The values of [`DeviceStatus::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Attach or conversion in progress.
    Pending,
    /// Attached, `HighPerformance`.
    Ready,
    /// The cloud (or the agent) reported an error; see the message.
    Failed,
}

impl DeviceState {
    /// The JSON value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
        }
    }
    /// Parses the JSON value; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Pending" => Some(Self::Pending),
            "Ready" => Some(Self::Ready),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

impl DeviceStatus {
    /// A status entry.
    pub fn new(id: impl Into<String>, state: DeviceState, message: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: state.as_str().to_string(),
            message: message.into(),
        }
    }
    /// The parsed state (`None` when the value is unknown).
    pub fn state(&self) -> Option<DeviceState> {
        DeviceState::parse(&self.status)
    }
}

impl ERdmaDevice {
    /// Whether the status has one `Ready` entry per spec device (the original's "nothing to do").
    pub fn all_ready(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        !self.spec.devices.is_empty()
            && self.spec.devices.iter().all(|d| {
                status
                    .devices
                    .iter()
                    .any(|s| s.id == d.id && s.state() == Some(DeviceState::Ready))
            })
    }
}

/// The CRD manifest as YAML (what `deploy/crds/` holds).
pub fn crd_yaml() -> Result<String, crate::Error> {
    use kube::CustomResourceExt;
    crate::yaml::to_yaml(&ERdmaDevice::crd())
}
