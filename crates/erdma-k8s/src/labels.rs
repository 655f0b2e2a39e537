//! Names shared with the original controller: labels, annotations, finalizer, resource name.

pub use erdma_model::names::{LABEL_INSTANCE_ID, LABEL_NODE_NAME};
/// The original's finalizer; only ever removed (never added), as the original does.
pub const FINALIZER: &str = "network.alibabacloud.com/erdma-controller";
pub use erdma_model::names::{RESOURCE as RESOURCE_ERDMA, SMCR_ANNOTATION as ANNOTATION_SMCR};
/// The ServiceAccount annotation RRSA uses.
pub const ANNOTATION_RRSA_ROLE: &str = "pod-identity.alibabacloud.com/role-name";
/// ENI tag: who created it.
pub const TAG_CREATOR: &str = "creator";
/// Value of [`TAG_CREATOR`].
pub const TAG_CREATOR_VALUE: &str = "alibabacloud-erdma-controller";
/// ENI tag: the instance.
pub const TAG_INSTANCE_ID: &str = "instance-id";
/// ENI tag terway's block list keys on.
pub const TAG_TERWAY_EXCLUDED: &str = "terway.alibabacloud.com/excluded";
/// The field manager / Event reporter name.
pub const MANAGER: &str = "erdma-controller";

/// The labels of the `ERdmaDevice` of `node` on `instance`.
pub fn erdma_device_labels(
    node: &str,
    instance: &str,
) -> std::collections::BTreeMap<String, String> {
    [
        (LABEL_INSTANCE_ID.to_string(), instance.to_string()),
        (LABEL_NODE_NAME.to_string(), node.to_string()),
    ]
    .into_iter()
    .collect()
}
