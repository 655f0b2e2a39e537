//! What the lab kubelet reads from the API server for a manifest pod (`pod run --api-server
//! HOST:PORT --service-account-dir DIR`), before the pod is planned: the pod first goes through
//! the ServiceAccount admission the API server would have applied (its service account must
//! exist; the token volume is added unless automount is off), then the ConfigMaps and Secrets it
//! references, the Services of its namespace (for the service variables) and its service
//! account's token (`DIR/<namespace>/<name>/token`, written by `apiserver
//! --service-account-dir`, as the kubelet gets one from the TokenRequest API) are read.

use crate::error::{FakeKubeletError, Result};
use crate::podspec::manifest::ManifestPod;
use crate::podspec::objects::{self, ApiObjects};
use crate::podspec::serviceaccount::{self, Admitted};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use kube::Api;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How the lab kubelet reaches the API server.
#[derive(Clone)]
pub struct ApiAccess {
    /// The kubelet's client (no credentials: the lab API server lets it read anything).
    pub client: kube::Client,
    /// The API server as pods reach it (`KUBERNETES_SERVICE_HOST`).
    pub host: String,
    /// Its port (`KUBERNETES_SERVICE_PORT`).
    pub port: u16,
    /// Where `apiserver --service-account-dir` wrote `ca.crt` and the tokens.
    pub service_account_dir: PathBuf,
}

impl std::fmt::Debug for ApiAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiAccess")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("service_account_dir", &self.service_account_dir)
            .finish_non_exhaustive()
    }
}

/// `HOST:PORT` (`[v6]:PORT` for an IPv6 address) of `--api-server`.
pub fn parse_host_port(s: &str) -> std::result::Result<(String, u16), String> {
    let bad = || format!("{s:?} must be HOST:PORT, e.g. 10.89.0.1:6443");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok((host.to_string(), port))
}

/// The kubelet's client for `https://HOST:PORT`, trusting `DIR/ca.crt`.
pub async fn client(host: &str, port: u16, sa_dir: &std::path::Path) -> Result<kube::Client> {
    let ca = sa_dir.join("ca.crt");
    if !ca.is_file() {
        return Err(FakeKubeletError::Refused(format!(
            "{} is missing: --service-account-dir names the directory `apiserver --tls --service-account-dir` wrote",
            ca.display()
        )));
    }
    let server = if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
         contexts:\n- name: lab\n  context: {{cluster: lab, user: kubelet}}\ncurrent-context: lab\n\
         users:\n- name: kubelet\n  user: {{}}\n",
        ca.display()
    );
    let bad = |e: String| FakeKubeletError::Refused(format!("the API server at {server}: {e}"));
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| bad(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(cfg).map_err(|e| bad(e.to_string()))
}

fn api_error(what: String) -> impl FnOnce(kube::Error) -> FakeKubeletError {
    move |e| {
        FakeKubeletError::Refused(format!(
            "{what}: {e}. Fix: check the API server (--api-server) is the lab's and serving"
        ))
    }
}

/// The ServiceAccount admission, then the reads (see the module documentation). `m` is
/// changed as the admission changes it.
pub async fn prepare(m: &mut ManifestPod, access: &ApiAccess) -> Result<ApiObjects> {
    let ns = m
        .pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let pod_name = m.pod.metadata.name.clone().unwrap_or_default();
    let who = format!("pod {ns}/{pod_name} ({})", m.source);
    let spec = m.pod.spec.clone().unwrap_or_default();
    let sa = serviceaccount::service_account_name(&spec);
    let mut notes = BTreeMap::new();
    let accounts: Api<ServiceAccount> = Api::namespaced(access.client.clone(), &ns);
    let account = accounts
        .get_opt(&sa)
        .await
        .map_err(api_error(format!("{who}: read ServiceAccount {ns}/{sa}")))?;
    let Some(account) = account else {
        return Err(FakeKubeletError::Refused(format!(
            "{who}: spec.serviceAccountName: error looking up service account {ns}/{sa}: serviceaccount {sa:?} not found (the API server's ServiceAccount admission refuses the pod). Fix: create it (apiserver --objects with the chart's ServiceAccount), or name one that exists"
        )));
    };
    let admitted = serviceaccount::admit(&mut m.pod, &account);
    let note = match &admitted {
        Admitted::Mounted { volume, containers } => format!(
            "the ServiceAccount admission added volume {volume} ({}) for {}",
            serviceaccount::TOKEN_MOUNT_PATH,
            containers.join(", ")
        ),
        Admitted::NotRequested { by } => {
            format!("no token mounted: automountServiceAccountToken is false on the {by}")
        }
        Admitted::AlreadyAdmitted => {
            "the pod has its kube-api-access volume already (it went through the ServiceAccount admission)".into()
        }
    };
    notes.insert("service_account_admission".to_string(), note);
    if matches!(admitted, Admitted::NotRequested { .. }) {
        notes.insert(
            "service_account".into(),
            "not requested (automountServiceAccountToken: false)".into(),
        );
    }
    let spec = m.pod.spec.clone().unwrap_or_default();
    let (cms, secrets) = objects::references(&spec);
    let mut out = ApiObjects {
        master: Some((access.host.clone(), access.port)),
        notes,
        ..Default::default()
    };
    let cm_api: Api<ConfigMap> = Api::namespaced(access.client.clone(), &ns);
    for name in cms {
        let got = cm_api
            .get_opt(&name)
            .await
            .map_err(api_error(format!("{who}: read ConfigMap {ns}/{name}")))?;
        out.config_maps.insert(name, got);
    }
    let secret_api: Api<Secret> = Api::namespaced(access.client.clone(), &ns);
    for name in secrets {
        let got = secret_api
            .get_opt(&name)
            .await
            .map_err(api_error(format!("{who}: read Secret {ns}/{name}")))?;
        out.secrets.insert(name, got);
    }
    if spec.enable_service_links != Some(false) {
        let services: Api<Service> = Api::namespaced(access.client.clone(), &ns);
        out.services = services
            .list(&Default::default())
            .await
            .map_err(api_error(format!("{who}: list the Services of {ns}")))?
            .items;
    }
    let token = access.service_account_dir.join(&ns).join(&sa).join("token");
    out.token = std::fs::read_to_string(&token).map_err(|e| {
        format!(
            "{}: {e}. Fix: apiserver --service-account-dir writes a token for each ServiceAccount it has at start; load this one with --objects",
            token.display()
        )
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port() {
        assert_eq!(
            parse_host_port("10.89.0.1:6443"),
            Ok(("10.89.0.1".into(), 6443))
        );
        assert_eq!(
            parse_host_port("[fd00::1]:443"),
            Ok(("fd00::1".into(), 443))
        );
        assert_eq!(
            parse_host_port("kubernetes.default.svc:443"),
            Ok(("kubernetes.default.svc".into(), 443))
        );
        assert!(parse_host_port("10.89.0.1").is_err());
        assert!(parse_host_port(":6443").is_err());
        assert!(parse_host_port("h:99999").is_err());
    }
}
