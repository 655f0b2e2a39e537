//! What the chart's templates ask of the cluster (Helm's `.Capabilities`): the Kubernetes
//! version and the API kinds the API server serves. `helm install` reads both from the API
//! server; `helm template` assumes its defaults, and so does [`Cluster::offline`].

use crate::Error;
use std::collections::BTreeSet;

/// `admissionregistration.k8s.io/v1` `ValidatingAdmissionPolicy` (Kubernetes 1.30+): the agents'
/// node-scope policy is rendered only where it is served.
pub const VALIDATING_ADMISSION_POLICY: &str =
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// The Prometheus Operator's `ServiceMonitor`: rendered where served (or trusted to be).
pub const SERVICE_MONITOR: &str = "monitoring.coreos.com/v1/ServiceMonitor";

/// The kinds [`Cluster::discover`] asks the API server about: every one a template tests.
const ASKED: [&str; 2] = [VALIDATING_ADMISSION_POLICY, SERVICE_MONITOR];

/// The cluster the manifests are rendered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Kubernetes `(major, minor)`.
    pub version: (u32, u32),
    /// Served kinds as `group/version/Kind` (`v1/Kind` for the core group).
    pub served: BTreeSet<String>,
}

/// The Kubernetes version `helm template` (Helm 4, the engine of the chart's CI) assumes
/// without a cluster; offline renders assume the same, so they equal the chart's CI renders.
pub const OFFLINE_VERSION: (u32, u32) = (1, 36);

impl Cluster {
    /// `helm template` without `--kube-version` or `--api-versions`: [`OFFLINE_VERSION`] and no
    /// optional kind served (Helm's default set names group versions only, never kinds).
    pub fn offline() -> Self {
        Cluster {
            version: OFFLINE_VERSION,
            served: BTreeSet::new(),
        }
    }

    /// A cluster of the given version serving the given `group/version/Kind`s.
    pub fn with(version: (u32, u32), served: &[&str]) -> Self {
        Cluster {
            version,
            served: served.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Whether the API server serves `group/version/Kind` (`.Capabilities.APIVersions.Has`).
    pub fn serves(&self, kind: &str) -> bool {
        self.served.contains(kind)
    }

    /// Whether the Kubernetes version is at least `major.minor` (`semverCompare ">=M.m-0"`).
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        self.version >= (major, minor)
    }

    /// Asks the API server: `/version`, and discovery of each group version a template tests
    /// (a group version the server does not know serves none of its kinds).
    pub async fn discover(client: &kube::Client) -> Result<Self, Error> {
        let info = client
            .apiserver_version()
            .await
            .map_err(|source| Error::Kube {
                what: "read the API server's /version".into(),
                source,
            })?;
        let version = parse_version(&info.git_version).ok_or_else(|| {
            Error::Invalid(format!(
                "the API server's /version gitVersion {:?} is not a Kubernetes version (vMAJOR.MINOR.PATCH)",
                info.git_version
            ))
        })?;
        let mut served = BTreeSet::new();
        for gvk in ASKED {
            let Some((gv, kind)) = gvk.rsplit_once('/') else {
                continue;
            };
            let list = if gv.contains('/') {
                client.list_api_group_resources(gv).await
            } else {
                client.list_core_api_resources(gv).await
            };
            match list {
                Ok(list) if list.resources.iter().any(|r| r.kind == kind) => {
                    served.insert(gvk.to_string());
                }
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    return Err(Error::Kube {
                        what: format!("discover {gv}"),
                        source,
                    });
                }
            }
        }
        Ok(Cluster { version, served })
    }
}

/// `(major, minor)` of a `gitVersion` such as `v1.30.2` or `v1.31.1-aliyun.1`.
pub fn parse_version(git_version: &str) -> Option<(u32, u32)> {
    let mut parts = git_version.strip_prefix('v')?.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_versions_of_vendors_parse_to_major_and_minor() {
        assert_eq!(parse_version("v1.30.2"), Some((1, 30)));
        assert_eq!(parse_version("v1.31.1-aliyun.1"), Some((1, 31)));
        assert_eq!(parse_version("v1.29.0+k3s1"), Some((1, 29)));
        assert_eq!(parse_version("1.30.0"), None);
        assert_eq!(parse_version("vX.30"), None);
    }

    #[test]
    fn version_comparison_is_by_major_then_minor() {
        let c = Cluster::with((1, 30), &[]);
        assert!(c.at_least(1, 30) && c.at_least(1, 9) && !c.at_least(1, 31));
        assert!(!Cluster::with((1, 29), &[]).at_least(1, 30));
    }
}
