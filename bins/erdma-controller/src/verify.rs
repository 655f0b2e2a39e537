//! The check made before any ECS write for a node: the instance the node's own object points at
//! (`spec.providerID`, or its InternalIP) must be that node. A node writes its Node object, so a
//! compromised node could name another instance; ECS answers for the instance, not for the
//! node, and the two must agree on the private IP and the VPC.

use erdma_cloud::ecs::Instance;

/// Why an instance is not the node's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// None of the node's InternalIPs is a private IP of the instance.
    #[error(
        "instance {instance} has private IP(s) [{instance_ips}], none of them an InternalIP of node {node} ([{node_ips}]); no ECS change is made for this node; fix: correct the node's spec.providerID (<region>.<instance-id>) or its InternalIP"
    )]
    PrivateIp {
        /// The node.
        node: String,
        /// The instance.
        instance: String,
        /// The node's InternalIPs, comma-separated.
        node_ips: String,
        /// The instance's private IPs, comma-separated.
        instance_ips: String,
    },
    /// The instance is in another VPC than the cluster's.
    #[error(
        "instance {instance} (named by node {node}) is in VPC {instance_vpc}, not the cluster's VPC {cluster_vpc}; no ECS change is made for this node; fix: correct the node's spec.providerID, or config vpcId if the cluster's VPC is another"
    )]
    Vpc {
        /// The node.
        node: String,
        /// The instance.
        instance: String,
        /// The instance's VPC.
        instance_vpc: String,
        /// The cluster's VPC.
        cluster_vpc: String,
    },
}

impl Mismatch {
    /// The metric label of the check that failed: `private_ip` or `vpc`.
    pub fn check(&self) -> &'static str {
        match self {
            Mismatch::PrivateIp { .. } => "private_ip",
            Mismatch::Vpc { .. } => "vpc",
        }
    }
}

/// `Ok` when `instance` is in `cluster_vpc` and one of `node_ips` (the node's InternalIPs) is one
/// of its private IPs. The VPC is checked first: an IP is only meaningful inside one VPC.
pub fn instance_is_node(
    node: &str,
    node_ips: &[String],
    instance: &Instance,
    cluster_vpc: &str,
) -> Result<(), Mismatch> {
    // An empty VPC on either side (unconfigured, or a field ECS left out) matches nothing.
    if cluster_vpc.is_empty() || instance.vpc_id != cluster_vpc {
        return Err(Mismatch::Vpc {
            node: node.to_string(),
            instance: instance.instance_id.clone(),
            instance_vpc: instance.vpc_id.clone(),
            cluster_vpc: cluster_vpc.to_string(),
        });
    }
    let shared = node_ips
        .iter()
        .any(|ip| instance.private_ips.iter().any(|p| same_ip(p, ip)));
    if !shared {
        return Err(Mismatch::PrivateIp {
            node: node.to_string(),
            instance: instance.instance_id.clone(),
            node_ips: node_ips.join(", "),
            instance_ips: instance.private_ips.join(", "),
        });
    }
    Ok(())
}

/// Two addresses are the same when they parse to the same IP (`10.0.0.1` and `010.0.0.1` are
/// not both valid, but IPv6 has many spellings); text that does not parse matches nothing.
fn same_ip(a: &str, b: &str) -> bool {
    match (
        a.trim().parse::<std::net::IpAddr>(),
        b.trim().parse::<std::net::IpAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(vpc: &str, ips: &[&str]) -> Instance {
        Instance {
            instance_id: "i-a".into(),
            instance_type: "ecs.g8ae.4xlarge".into(),
            zone_id: "z".into(),
            vswitch_id: "vsw".into(),
            vpc_id: vpc.into(),
            private_ips: ips.iter().map(|s| s.to_string()).collect(),
            security_group_ids: vec![],
            eni_ids: vec![],
        }
    }

    fn ips(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_node_s_own_instance_passes() {
        let i = instance("vpc-1", &["10.0.0.5"]);
        assert_eq!(
            instance_is_node("n", &ips(&["192.0.2.9", "10.0.0.5"]), &i, "vpc-1"),
            Ok(())
        );
        let v6 = instance("vpc-1", &["2001:db8::1"]);
        assert_eq!(
            instance_is_node("n", &ips(&["2001:0db8:0:0::1"]), &v6, "vpc-1"),
            Ok(())
        );
    }

    #[test]
    fn another_instance_s_ip_is_refused() {
        let i = instance("vpc-1", &["10.0.0.6"]);
        let e = instance_is_node("n", &ips(&["10.0.0.5"]), &i, "vpc-1").unwrap_err();
        assert_eq!(e.check(), "private_ip");
        assert!(e.to_string().contains("10.0.0.6"), "{e}");
        assert!(e.to_string().contains("10.0.0.5"), "{e}");
    }

    #[test]
    fn a_node_without_an_internal_ip_matches_nothing() {
        let i = instance("vpc-1", &["10.0.0.6"]);
        let e = instance_is_node("n", &[], &i, "vpc-1").unwrap_err();
        assert_eq!(e.check(), "private_ip");
        let garbage = instance("vpc-1", &["not-an-ip"]);
        let e = instance_is_node("n", &ips(&["not-an-ip"]), &garbage, "vpc-1").unwrap_err();
        assert_eq!(e.check(), "private_ip");
    }

    #[test]
    fn the_same_ip_in_another_vpc_is_refused() {
        let i = instance("vpc-2", &["10.0.0.5"]);
        let e = instance_is_node("n", &ips(&["10.0.0.5"]), &i, "vpc-1").unwrap_err();
        assert_eq!(e.check(), "vpc");
        assert!(e.to_string().contains("vpc-2"), "{e}");
        // An unknown cluster VPC matches no instance, not even one ECS gave no VPC.
        let no_vpc = instance("", &["10.0.0.5"]);
        assert_eq!(
            instance_is_node("n", &ips(&["10.0.0.5"]), &no_vpc, "")
                .unwrap_err()
                .check(),
            "vpc"
        );
    }
}
