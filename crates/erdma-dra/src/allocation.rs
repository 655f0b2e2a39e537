//! What a ResourceClaim's allocation asks of this driver on this node (pure).
//!
//! The claim is read by a GET at prepare time ([`crate::claims`]); this module keeps the results
//! of this driver, checks they are in this node's pool, and refuses what the driver cannot honour
//! instead of ignoring it: opaque configuration for this driver (erdma defines no opaque
//! parameters). `adminAccess` results are honoured by the caller (prepared without consuming a
//! share and without an rdma limit).

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim,
};

/// `source` of an allocation configuration copied from the DeviceClass.
const SOURCE_FROM_CLASS: &str = "FromClass";

/// The request name a container refers to: `main` of an allocation result's `main/sub` (a
/// subrequest of a `firstAvailable` list); a plain request name as it is. The kubelet matches a
/// container's `resources.claims[].request` against the prepared devices' request names
/// exactly, so the driver answers with this.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(main, _)| main)
}

/// True when `result` was allocated for admin access (`adminAccess: true`): monitoring access
/// that the scheduler does not count against the device.
pub fn is_admin(result: &DeviceRequestAllocationResult) -> bool {
    result.admin_access == Some(true)
}

/// The allocation results of `driver` in a claim, checked: the claim is allocated, at least one
/// result is this driver's, each is in `pool` (this node's), and no opaque configuration for
/// `driver` applies to them. The error names the claim's field and the fix; the caller prefixes
/// the claim.
pub fn our_results(
    claim: &ResourceClaim,
    driver: &str,
    pool: &str,
) -> Result<Vec<DeviceRequestAllocationResult>, String> {
    let Some(devices) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(format!(
            "is not allocated (status.allocation is empty); has the scheduler allocated it to node pool {pool:?}?"
        ));
    };
    let ours: Vec<DeviceRequestAllocationResult> = devices
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == driver)
        .cloned()
        .collect();
    if ours.is_empty() {
        return Err(format!(
            "has no devices of driver {driver} allocated (status.allocation.devices.results names other drivers only)"
        ));
    }
    for r in &ours {
        if r.pool != pool {
            return Err(format!(
                "device {} is from pool {:?}, not this node's pool {pool:?} (allocated to another node)",
                r.device, r.pool
            ));
        }
    }
    for (i, config) in devices.config.iter().flatten().enumerate() {
        refuse_opaque(i, config, driver, &ours)?;
    }
    Ok(ours)
}

/// Refuses an opaque configuration of `driver` that applies to one of `ours`.
fn refuse_opaque(
    index: usize,
    config: &DeviceAllocationConfiguration,
    driver: &str,
    ours: &[DeviceRequestAllocationResult],
) -> Result<(), String> {
    let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else {
        return Ok(());
    };
    let requests = config.requests.as_deref().unwrap_or_default();
    let applies = requests.is_empty()
        || ours.iter().any(|r| {
            requests
                .iter()
                .any(|q| q == &r.request || q == base_request(&r.request))
        });
    if !applies {
        return Ok(());
    }
    let mut parameters = opaque.parameters.0.to_string();
    if parameters.len() > 200 {
        let cut = (0..=200)
            .rev()
            .find(|i| parameters.is_char_boundary(*i))
            .unwrap_or(0);
        parameters.truncate(cut);
        parameters.push('…');
    }
    let (field, fix) = if config.source == SOURCE_FROM_CLASS {
        (
            "its DeviceClass's spec.config[].opaque",
            "remove the opaque config for this driver from the DeviceClass",
        )
    } else {
        (
            "spec.devices.config[].opaque",
            "remove it from the claim (or its ResourceClaimTemplate); ask for shares, hcaHandle or hcaObject in the request's capacity.requests instead",
        )
    };
    Err(format!(
        "{field} (status.allocation.devices.config[{index}]) sets parameters {parameters} for driver {driver}, which defines no opaque parameters; not preparing: {fix}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, OpaqueDeviceConfiguration, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

    const DRIVER: &str = "erdma.alibabacloud.com";
    const POOL: &str = "node-a";

    fn result(driver: &str, pool: &str, request: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: "erdma-0".into(),
            request: request.into(),
            ..Default::default()
        }
    }

    fn claim(
        results: Vec<DeviceRequestAllocationResult>,
        config: Vec<DeviceAllocationConfiguration>,
    ) -> ResourceClaim {
        ResourceClaim {
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        config: Some(config),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn opaque(driver: &str, source: &str, requests: &[&str]) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(serde_json::json!({"mtu": 9000})),
            }),
            requests: Some(requests.iter().map(|r| r.to_string()).collect()),
            source: source.into(),
        }
    }

    #[test]
    fn a_subrequest_answers_under_its_main_request() {
        assert_eq!(base_request("rdma/fast"), "rdma");
        assert_eq!(base_request("rdma"), "rdma");
        assert_eq!(
            base_request("container-0-request-0"),
            "container-0-request-0"
        );
    }

    #[test]
    fn keeps_this_drivers_results_and_refuses_other_pools() {
        let c = claim(
            vec![
                result("gpu.example.com", POOL, "gpu"),
                result(DRIVER, POOL, "rdma/fast"),
            ],
            vec![],
        );
        let ours = our_results(&c, DRIVER, POOL).expect("allocated here");
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].request, "rdma/fast");

        let elsewhere = claim(vec![result(DRIVER, "node-b", "rdma")], vec![]);
        let e = our_results(&elsewhere, DRIVER, POOL).expect_err("other node");
        assert!(e.contains("\"node-b\"") && e.contains("\"node-a\""), "{e}");

        let others = claim(vec![result("gpu.example.com", POOL, "gpu")], vec![]);
        let e = our_results(&others, DRIVER, POOL).expect_err("no result of ours");
        assert!(
            e.contains("no devices of driver erdma.alibabacloud.com"),
            "{e}"
        );

        let e = our_results(&ResourceClaim::default(), DRIVER, POOL).expect_err("unallocated");
        assert!(e.contains("status.allocation is empty"), "{e}");
    }

    #[test]
    fn opaque_config_for_this_driver_is_refused_naming_field_and_parameters() {
        let c = claim(
            vec![result(DRIVER, POOL, "rdma/fast")],
            vec![opaque(DRIVER, "FromClaim", &["rdma"])],
        );
        let e = our_results(&c, DRIVER, POOL).expect_err("refused");
        assert!(e.contains("spec.devices.config[].opaque"), "{e}");
        assert!(e.contains("status.allocation.devices.config[0]"), "{e}");
        assert!(e.contains(r#"{"mtu":9000}"#), "{e}");
        assert!(e.contains("remove it from the claim"), "{e}");

        let from_class = claim(
            vec![result(DRIVER, POOL, "rdma")],
            vec![opaque(DRIVER, "FromClass", &[])],
        );
        let e = our_results(&from_class, DRIVER, POOL).expect_err("refused");
        assert!(e.contains("DeviceClass"), "{e}");
    }

    #[test]
    fn opaque_config_of_other_drivers_or_other_requests_is_not_ours() {
        let c = claim(
            vec![result(DRIVER, POOL, "rdma")],
            vec![
                opaque("gpu.example.com", "FromClaim", &[]),
                opaque(DRIVER, "FromClaim", &["gpu"]),
            ],
        );
        assert_eq!(our_results(&c, DRIVER, POOL).expect("prepared").len(), 1);
    }
}
