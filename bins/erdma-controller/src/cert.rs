//! Webhook TLS: a self-signed CA and a serving certificate for the webhook Service, kept in the
//! Secret `<controller>-webhook-cert` (`ca.crt`, `tls.crt`, `tls.key`, expiry in an annotation),
//! rotated before expiry, with the CA bundle patched into the MutatingWebhookConfiguration.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Annotation on the Secret: when the serving certificate expires (Unix seconds).
pub const ANNOTATION_NOT_AFTER: &str = "erdma.alibabacloud.com/cert-not-after";
/// Validity of a generated certificate.
pub const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Rotate when less than this is left.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A CA + serving certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct CertBundle {
    /// CA certificate (PEM): the `caBundle`.
    pub ca_pem: String,
    /// Serving certificate (PEM).
    pub cert_pem: String,
    /// Serving key (PEM).
    pub key_pem: String,
    /// Expiry of the serving certificate.
    pub not_after: SystemTime,
}

impl std::fmt::Debug for CertBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertBundle")
            .field("not_after", &self.not_after)
            .field("key_pem", &"***")
            .finish()
    }
}

/// The DNS names of the webhook Service.
pub fn dns_names(service: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.{cluster_domain}"),
    ]
}

/// Generates a CA and a serving certificate for `names`, valid from now for `validity`.
pub fn generate(names: &[String], validity: Duration) -> anyhow::Result<CertBundle> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = SystemTime::now();
    let to_odt = |t: SystemTime| -> anyhow::Result<time::OffsetDateTime> {
        let secs = t.duration_since(UNIX_EPOCH)?.as_secs() as i64;
        Ok(time::OffsetDateTime::from_unix_timestamp(secs)?)
    };
    let not_before = to_odt(now - Duration::from_secs(300))?;
    let not_after_t = now + validity;
    let not_after = to_odt(not_after_t)?;

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "erdma-controller-webhook-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = to_odt(now + validity + Duration::from_secs(24 * 3600))?;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;

    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        names.get(2).cloned().unwrap_or_default(),
    );
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_key = KeyPair::generate()?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;
    Ok(CertBundle {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
        not_after: UNIX_EPOCH
            + Duration::from_secs(not_after_t.duration_since(UNIX_EPOCH)?.as_secs()),
    })
}

fn from_secret(s: &Secret) -> Option<CertBundle> {
    let data = s.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|v| !v.is_empty())
    };
    let not_after: u64 = s
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_NOT_AFTER)?
        .parse()
        .ok()?;
    Some(CertBundle {
        ca_pem: text("ca.crt")?,
        cert_pem: text("tls.crt")?,
        key_pem: text("tls.key")?,
        not_after: UNIX_EPOCH + Duration::from_secs(not_after),
    })
}

fn to_secret(
    name: &str,
    namespace: &str,
    b: &CertBundle,
    resource_version: Option<String>,
) -> Secret {
    let secs = b
        .not_after
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_NOT_AFTER.to_string(),
                secs.to_string(),
            )])),
            resource_version,
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (
                "ca.crt".to_string(),
                ByteString(b.ca_pem.clone().into_bytes()),
            ),
            (
                "tls.crt".to_string(),
                ByteString(b.cert_pem.clone().into_bytes()),
            ),
            (
                "tls.key".to_string(),
                ByteString(b.key_pem.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    }
}

/// Keeps the webhook certificate: [`CertManager::ensure`] returns a valid bundle, creating or
/// rotating the Secret when needed (`rotate` false: only create when missing, for non-leaders).
#[derive(Clone)]
pub struct CertManager {
    /// Kubernetes client.
    pub client: Client,
    /// Controller namespace.
    pub namespace: String,
    /// The Secret's name.
    pub secret_name: String,
    /// The MutatingWebhookConfiguration to patch.
    pub webhook_name: String,
    /// SANs.
    pub names: Vec<String>,
}

impl CertManager {
    /// The current bundle, creating the Secret when missing and replacing it when it expires
    /// within [`RENEW_BEFORE`] (only when `rotate`). Concurrent creators converge: a 409 re-reads.
    pub async fn ensure(&self, rotate: bool) -> anyhow::Result<CertBundle> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        for _ in 0..3 {
            let current = api.get_opt(&self.secret_name).await?;
            let bundle = current.as_ref().and_then(from_secret);
            let due = bundle
                .as_ref()
                .is_none_or(|b| b.not_after <= SystemTime::now() + RENEW_BEFORE);
            if let Some(b) = &bundle
                && (!due || !rotate)
            {
                return Ok(b.clone());
            }
            let fresh = generate(&self.names, VALIDITY)?;
            let result = match &current {
                None => {
                    api.create(
                        &PostParams::default(),
                        &to_secret(&self.secret_name, &self.namespace, &fresh, None),
                    )
                    .await
                }
                Some(s) => {
                    api.replace(
                        &self.secret_name,
                        &PostParams::default(),
                        &to_secret(
                            &self.secret_name,
                            &self.namespace,
                            &fresh,
                            s.metadata.resource_version.clone(),
                        ),
                    )
                    .await
                }
            };
            match result {
                Ok(_) => {
                    tracing::info!(secret = %self.secret_name, "webhook certificate generated");
                    return Ok(fresh);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!(
            "Secret {}/{} keeps changing; retry later",
            self.namespace,
            self.secret_name
        )
    }

    /// Writes `ca_pem` as the `caBundle` of every webhook of the configuration (no-op when it is
    /// already there; absent configuration: nothing to do).
    pub async fn patch_ca_bundle(&self, ca_pem: &str) -> anyhow::Result<bool> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let Some(mut mwc) = api.get_opt(&self.webhook_name).await? else {
            tracing::info!(name = %self.webhook_name, "no MutatingWebhookConfiguration; caBundle not patched");
            return Ok(false);
        };
        let want = ByteString(ca_pem.as_bytes().to_vec());
        let mut changed = false;
        for w in mwc.webhooks.iter_mut().flatten() {
            if w.client_config.ca_bundle.as_ref() != Some(&want) {
                w.client_config.ca_bundle = Some(want.clone());
                changed = true;
            }
        }
        if changed {
            api.replace(&self.webhook_name, &PostParams::default(), &mwc)
                .await?;
            tracing::info!(name = %self.webhook_name, "caBundle patched");
        }
        Ok(changed)
    }
}
