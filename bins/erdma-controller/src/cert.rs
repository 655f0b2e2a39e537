//! Webhook TLS: a self-signed CA and a serving certificate for the webhook Service, kept in the
//! Secret `<controller>-webhook-tls` (`ca.crt`, `tls.crt`, `tls.key`, expiry in an annotation),
//! rotated before expiry without a gap, with the CA bundle patched into the
//! MutatingWebhookConfiguration.
//!
//! Rotation is a state machine kept in the Secret (not in any replica's memory), advanced by
//! whichever replica ticks next; every write carries the `resourceVersion` it read, so two replicas
//! never both advance (the loser gets a 409 and re-reads on its next tick):
//!
//! 1. **stable** (no phase annotation): `ca.crt` = A signs `tls.crt`; the `caBundle` is A.
//! 2. due (expiry within `renew_before`, or the [`ANNOTATION_ROTATE`] request) → **staged**: a new
//!    CA B and its serving pair go into `next-ca.crt`/`next-tls.crt`/`next-tls.key`. Replicas keep
//!    serving A's certificate. Every replica makes the `caBundle` a superset of all CAs in the
//!    Secret, so it becomes A+B.
//! 3. staged, and every webhook of the configuration trusts B → **promoted**: B's pair moves into
//!    `tls.crt`/`tls.key`/`ca.crt`, A moves to `previous-ca.crt`. Each replica hot-reloads `tls.crt`
//!    on its next tick and records what it serves in its own annotation
//!    `serving.erdma.alibabacloud.com/<identity>` = `<sha256 of tls.crt> <unix time>`.
//! 4. promoted, and every fresh acknowledgement (younger than `ack_stale_after`; a dead replica's
//!    stops counting after that) names B's certificate → `previous-ca.crt` and the phase are
//!    removed from the Secret: back to stable.
//! 5. Every tick then prunes from the `caBundle` each CA the Secret no longer names (A), reading
//!    the configuration first and the Secret second and writing with the configuration's
//!    `resourceVersion` (see [`CertManager::tick`]).
//!
//! Adding to the `caBundle` uses only what a replica read; removing needs the Secret to have let go
//! of the CA, which it does only after every live replica said it serves the new certificate. A
//! replica with a stale view can at worst leave an extra CA behind for one tick.

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
/// Annotation on the Secret: the rotation phase ([`PHASE_STAGED`] or [`PHASE_PROMOTED`]; absent:
/// stable).
pub const ANNOTATION_PHASE: &str = "erdma.alibabacloud.com/cert-rotation";
/// Annotation on the Secret: expiry of the staged (`next-*`) serving certificate.
pub const ANNOTATION_NEXT_NOT_AFTER: &str = "erdma.alibabacloud.com/next-cert-not-after";
/// Annotation on the Secret (any value): rotate now (an operator's request, e.g. after a key leak).
pub const ANNOTATION_ROTATE: &str = "erdma.alibabacloud.com/rotate";
/// Annotation on the Secret: the fingerprints ([`fingerprint`]) of every CA erdma issued,
/// space-separated. Only these are ever pruned from the `caBundle`: a CA erdma did not issue
/// (the original Go controller's, still serving from its old pods while an upgrade rolls) stays.
pub const ANNOTATION_ISSUED_CAS: &str = "erdma.alibabacloud.com/issued-cas";
/// Prefix of each replica's acknowledgement annotation (`<prefix><identity>`).
pub const ANNOTATION_SERVING_PREFIX: &str = "serving.erdma.alibabacloud.com/";
/// Phase: the new CA is staged and being added to the `caBundle`.
pub const PHASE_STAGED: &str = "staged";
/// Phase: the new certificate is current; the old CA stays trusted until every replica serves it.
pub const PHASE_PROMOTED: &str = "promoted";
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

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn to_secret(
    name: &str,
    namespace: &str,
    b: &CertBundle,
    resource_version: Option<String>,
) -> Secret {
    let secs = unix(b.not_after);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            annotations: Some(BTreeMap::from([
                (ANNOTATION_NOT_AFTER.to_string(), secs.to_string()),
                (ANNOTATION_ISSUED_CAS.to_string(), fingerprint(&b.ca_pem)),
            ])),
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

/// `installed` (the empty Secret the install created, or one left incomplete) with `b` written
/// into it: its type, labels and other annotations kept (the installer's ownership marks), the
/// CAs erdma issued before still recorded, no rotation under way.
fn filled(installed: &Secret, b: &CertBundle) -> Secret {
    let fresh = to_secret(
        installed.metadata.name.as_deref().unwrap_or_default(),
        installed.metadata.namespace.as_deref().unwrap_or_default(),
        b,
        installed.metadata.resource_version.clone(),
    );
    let mut issued = issued_cas(installed);
    let ca = fingerprint(&b.ca_pem);
    if !issued.contains(&ca) {
        issued.push(ca);
    }
    let mut s = installed.clone();
    let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.remove(ANNOTATION_PHASE);
    ann.remove(ANNOTATION_NEXT_NOT_AFTER);
    ann.insert(
        ANNOTATION_NOT_AFTER.to_string(),
        unix(b.not_after).to_string(),
    );
    ann.insert(ANNOTATION_ISSUED_CAS.to_string(), issued.join(" "));
    s.data = fresh.data;
    s.string_data = None;
    s.type_ = installed.type_.clone().or(fresh.type_);
    s
}

/// SHA-256 of a PEM text's certificate bytes (hex), as a replica acknowledges what it serves.
pub fn fingerprint(cert_pem: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert_pem.trim().as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The PEM certificates in a bundle, each normalised (trimmed, one trailing newline).
pub fn pem_blocks(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .map(str::trim)
        .filter(|b| b.ends_with(END))
        .map(|b| format!("{b}\n"))
        .collect()
}

/// The time (Unix seconds) of an acknowledgement `<fingerprint> <time>`; 0 when unreadable.
fn ack_time(v: &str) -> u64 {
    v.split_whitespace()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn data_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|v| !v.trim().is_empty())
}

fn annotation<'a>(s: &'a Secret, key: &str) -> Option<&'a str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The fingerprints of the CAs erdma issued ([`ANNOTATION_ISSUED_CAS`]), plus those the Secret
/// names now (a Secret written before the annotation existed names only erdma's own).
pub fn issued_cas(s: &Secret) -> Vec<String> {
    let mut out: Vec<String> = annotation(s, ANNOTATION_ISSUED_CAS)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for ca in secret_cas(s) {
        let f = fingerprint(&ca);
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// The `caBundle` to keep: every CA the Secret names, and every CA erdma did not issue.
pub fn bundle_to_keep(bundle: &[String], s: &Secret) -> Vec<String> {
    let named = secret_cas(s);
    let issued = issued_cas(s);
    bundle
        .iter()
        .filter(|c| named.contains(c) || !issued.contains(&fingerprint(c)))
        .cloned()
        .collect()
}

/// Every CA the Secret names (current, previous, staged): all must be in the `caBundle`.
pub fn secret_cas(s: &Secret) -> Vec<String> {
    let mut cas = Vec::new();
    for k in ["ca.crt", "previous-ca.crt", "next-ca.crt"] {
        for b in data_text(s, k)
            .as_deref()
            .map(pem_blocks)
            .unwrap_or_default()
        {
            if !cas.contains(&b) {
                cas.push(b);
            }
        }
    }
    cas
}

fn bundle_of(w: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook) -> Vec<String> {
    w.client_config
        .ca_bundle
        .as_ref()
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|t| pem_blocks(&t))
        .unwrap_or_default()
}

/// What one [`CertManager::tick`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    /// This replica loaded a different serving certificate.
    pub reloaded: bool,
    /// The `caBundle` got a CA added.
    pub bundle_extended: bool,
    /// The rotation advanced: `"staged"`, `"promoted"` or `"stable"` (old CA released).
    pub advanced: Option<&'static str>,
    /// A CA the Secret no longer names was removed from the `caBundle`.
    pub bundle_pruned: bool,
}

/// Keeps the webhook certificate and rotates it without a gap (see the module docs). One per
/// replica; replicas coordinate only through the Secret and the webhook configuration.
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
    /// This replica's identity (its acknowledgement annotation's name; the pod name).
    pub identity: String,
    /// Validity of generated certificates.
    pub validity: Duration,
    /// Rotate when less than this is left.
    pub renew_before: Duration,
    /// A replica's acknowledgement older than this no longer counts (the replica is gone).
    pub ack_stale_after: Duration,
}

impl CertManager {
    /// A manager with the default validity, renewal margin and a 5-minute acknowledgement window
    /// (replicas tick more often than that).
    pub fn new(
        client: Client,
        namespace: &str,
        secret_name: &str,
        webhook_name: &str,
        names: Vec<String>,
        identity: &str,
    ) -> Self {
        CertManager {
            client,
            namespace: namespace.into(),
            secret_name: secret_name.into(),
            webhook_name: webhook_name.into(),
            names,
            identity: identity.into(),
            validity: VALIDITY,
            renew_before: RENEW_BEFORE,
            ack_stale_after: Duration::from_secs(300),
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn webhooks(&self) -> Api<MutatingWebhookConfiguration> {
        Api::all(self.client.clone())
    }

    /// The Secret, with a fresh bundle written into it when it has none (the install creates it
    /// empty: the controller may read and update this one Secret but create none). Concurrent
    /// writers: the 409 loser re-reads.
    pub async fn secret(&self) -> anyhow::Result<Secret> {
        let api = self.secrets();
        for _ in 0..3 {
            let Some(s) = api.get_opt(&self.secret_name).await? else {
                anyhow::bail!(
                    "Secret {}/{} does not exist; the chart and erdmactl install create it (empty) and the controller writes the webhook certificate into it, as it may not create Secrets; fix: upgrade or install again",
                    self.namespace,
                    self.secret_name
                );
            };
            if from_secret(&s).is_some() {
                return Ok(s);
            }
            let fresh = generate(&self.names, self.validity)?;
            match api
                .replace(
                    &self.secret_name,
                    &PostParams::default(),
                    &filled(&s, &fresh),
                )
                .await
            {
                Ok(s) => {
                    tracing::info!(secret = %self.secret_name, "webhook certificate generated");
                    return Ok(s);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!(
            "Secret {}/{} keeps changing; retry later",
            self.namespace,
            self.secret_name
        )
    }

    /// The current serving bundle (creating the Secret when missing).
    pub async fn current(&self) -> anyhow::Result<CertBundle> {
        let s = self.secret().await?;
        from_secret(&s).ok_or_else(|| anyhow::anyhow!("Secret {} is incomplete", self.secret_name))
    }

    /// Asks for a rotation now (what `kubectl annotate secret … erdma.alibabacloud.com/rotate=now`
    /// does); the next tick of any replica starts it.
    pub async fn request_rotation(&self) -> anyhow::Result<()> {
        self.annotate(ANNOTATION_ROTATE, "now", false).await
    }

    /// Sets one annotation on the Secret by read-modify-`update` (the controller's Role grants
    /// `get`/`update` on this one Secret, no `patch`), re-reading on a conflict.
    /// With `prune_stale`, other replicas' acknowledgements older than `ack_stale_after` are
    /// removed in the same write (pods get new names on restart; the annotations must not pile up).
    async fn annotate(&self, key: &str, value: &str, prune_stale: bool) -> anyhow::Result<()> {
        let api = self.secrets();
        let now = unix(SystemTime::now());
        for _ in 0..5 {
            let mut s = self.secret().await?;
            let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
            if prune_stale {
                ann.retain(|k, v| {
                    !k.starts_with(ANNOTATION_SERVING_PREFIX)
                        || ack_time(v) + self.ack_stale_after.as_secs() >= now
                });
            }
            ann.insert(key.to_string(), value.to_string());
            match api
                .replace(&self.secret_name, &PostParams::default(), &s)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!(
            "Secret {}/{} keeps changing; annotation {key} not set this time",
            self.namespace,
            self.secret_name
        )
    }

    /// One step of this replica: serve the Secret's current certificate (hot reload), record
    /// that it does, keep every CA of the Secret in the `caBundle`, and advance a rotation when its
    /// condition holds. Call it at startup before serving, then periodically.
    pub async fn tick(&self, slot: &crate::webhook::CertSlot) -> anyhow::Result<Tick> {
        let mut out = Tick::default();
        let secret = self.secret().await?;
        let cur = from_secret(&secret)
            .ok_or_else(|| anyhow::anyhow!("Secret {} is incomplete", self.secret_name))?;
        if slot.cert_pem() != cur.cert_pem {
            slot.replace(&cur.cert_pem, &cur.key_pem)?;
            tracing::info!(secret = %self.secret_name, "serving the rotated webhook certificate");
            out.reloaded = true;
        }
        let ack = format!(
            "{} {}",
            fingerprint(&slot.cert_pem()),
            unix(SystemTime::now())
        );
        let key = format!("{ANNOTATION_SERVING_PREFIX}{}", self.identity);
        self.annotate(&key, &ack, true).await?;
        out.bundle_extended = self.extend_bundle(&secret_cas(&secret)).await?;
        out.advanced = self.advance().await?;
        out.bundle_pruned = self.prune_bundle().await?;
        Ok(out)
    }

    /// Adds the missing `cas` to every webhook's `caBundle` (never removes one). Absent
    /// configuration: nothing to do.
    async fn extend_bundle(&self, cas: &[String]) -> anyhow::Result<bool> {
        let api = self.webhooks();
        let Some(mut mwc) = api.get_opt(&self.webhook_name).await? else {
            tracing::debug!(name = %self.webhook_name, "no MutatingWebhookConfiguration; caBundle not patched");
            return Ok(false);
        };
        let mut changed = false;
        for w in mwc.webhooks.iter_mut().flatten() {
            let mut have = bundle_of(w);
            let before = have.len();
            for ca in cas {
                if !have.contains(ca) {
                    have.push(ca.clone());
                }
            }
            if have.len() != before || w.client_config.ca_bundle.is_none() {
                w.client_config.ca_bundle = Some(ByteString(have.concat().into_bytes()));
                changed = true;
            }
        }
        if changed {
            api.replace(&self.webhook_name, &PostParams::default(), &mwc)
                .await?;
            tracing::info!(name = %self.webhook_name, "caBundle extended");
        }
        Ok(changed)
    }

    /// Whether every webhook of the configuration trusts `ca` (absent configuration: yes, no
    /// caller to protect).
    async fn bundle_trusts(&self, ca: &[String]) -> anyhow::Result<bool> {
        Ok(match self.webhooks().get_opt(&self.webhook_name).await? {
            None => true,
            Some(mwc) => mwc
                .webhooks
                .iter()
                .flatten()
                .all(|w| ca.iter().all(|c| bundle_of(w).contains(c))),
        })
    }

    /// Removes from every webhook's `caBundle` the CAs the Secret no longer names. The
    /// configuration is read *before* the Secret and written with its `resourceVersion`: a CA
    /// staged after the Secret read cannot be in the bundle read earlier, and any bundle change
    /// after that read makes this write a 409. So only CAs no replica can be serving are dropped.
    async fn prune_bundle(&self) -> anyhow::Result<bool> {
        let api = self.webhooks();
        let Some(mut mwc) = api.get_opt(&self.webhook_name).await? else {
            return Ok(false);
        };
        let Some(secret) = self.secrets().get_opt(&self.secret_name).await? else {
            return Ok(false);
        };
        if secret_cas(&secret).is_empty() {
            return Ok(false);
        }
        let mut changed = false;
        for w in mwc.webhooks.iter_mut().flatten() {
            let have = bundle_of(w);
            let kept = bundle_to_keep(&have, &secret);
            if kept.len() != have.len() && !kept.is_empty() {
                w.client_config.ca_bundle = Some(ByteString(kept.concat().into_bytes()));
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api
            .replace(&self.webhook_name, &PostParams::default(), &mwc)
            .await
        {
            Ok(_) => {
                tracing::info!(name = %self.webhook_name, "CA no longer served dropped from the caBundle");
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Advances the rotation by at most one phase, from a fresh read of the Secret.
    async fn advance(&self) -> anyhow::Result<Option<&'static str>> {
        let api = self.secrets();
        let s = self.secret().await?;
        let Some(cur) = from_secret(&s) else {
            return Ok(None);
        };
        let mut next = s.clone();
        let ann = next.metadata.annotations.get_or_insert_with(BTreeMap::new);
        let data = next.data.get_or_insert_with(BTreeMap::new);
        let phase = match annotation(&s, ANNOTATION_PHASE) {
            None => {
                let due = cur.not_after <= SystemTime::now() + self.renew_before
                    || annotation(&s, ANNOTATION_ROTATE).is_some();
                if !due {
                    return Ok(None);
                }
                let fresh = generate(&self.names, self.validity)?;
                let mut issued = issued_cas(&s);
                issued.push(fingerprint(&fresh.ca_pem));
                ann.insert(ANNOTATION_ISSUED_CAS.into(), issued.join(" "));
                data.insert("next-ca.crt".into(), ByteString(fresh.ca_pem.into_bytes()));
                data.insert(
                    "next-tls.crt".into(),
                    ByteString(fresh.cert_pem.into_bytes()),
                );
                data.insert(
                    "next-tls.key".into(),
                    ByteString(fresh.key_pem.into_bytes()),
                );
                ann.insert(
                    ANNOTATION_NEXT_NOT_AFTER.into(),
                    unix(fresh.not_after).to_string(),
                );
                ann.remove(ANNOTATION_ROTATE);
                ann.insert(ANNOTATION_PHASE.into(), PHASE_STAGED.into());
                PHASE_STAGED
            }
            Some(PHASE_STAGED) => {
                let (Some(nca), Some(ncrt), Some(nkey), Some(nna)) = (
                    data_text(&s, "next-ca.crt"),
                    data_text(&s, "next-tls.crt"),
                    data_text(&s, "next-tls.key"),
                    annotation(&s, ANNOTATION_NEXT_NOT_AFTER).map(str::to_string),
                ) else {
                    anyhow::bail!(
                        "Secret {} is in phase {PHASE_STAGED} without next-ca.crt/next-tls.crt/next-tls.key; remove the {ANNOTATION_PHASE} annotation to restart the rotation",
                        self.secret_name
                    );
                };
                if !self.bundle_trusts(&pem_blocks(&nca)).await? {
                    return Ok(None);
                }
                data.insert(
                    "previous-ca.crt".into(),
                    ByteString(cur.ca_pem.into_bytes()),
                );
                data.insert("ca.crt".into(), ByteString(nca.into_bytes()));
                data.insert("tls.crt".into(), ByteString(ncrt.into_bytes()));
                data.insert("tls.key".into(), ByteString(nkey.into_bytes()));
                for k in ["next-ca.crt", "next-tls.crt", "next-tls.key"] {
                    data.remove(k);
                }
                ann.insert(ANNOTATION_NOT_AFTER.into(), nna);
                ann.remove(ANNOTATION_NEXT_NOT_AFTER);
                ann.insert(ANNOTATION_PHASE.into(), PHASE_PROMOTED.into());
                PHASE_PROMOTED
            }
            Some(PHASE_PROMOTED) => {
                let want = fingerprint(&cur.cert_pem);
                let now = unix(SystemTime::now());
                let stale = self.ack_stale_after.as_secs();
                let mut fresh_acks = 0;
                let mut stale_keys = Vec::new();
                for (k, v) in s.metadata.annotations.iter().flatten() {
                    let Some(who) = k.strip_prefix(ANNOTATION_SERVING_PREFIX) else {
                        continue;
                    };
                    let fp = v.split_whitespace().next().unwrap_or("");
                    if ack_time(v) + stale < now {
                        stale_keys.push(k.clone());
                        continue;
                    }
                    if fp != want {
                        tracing::debug!(replica = %who, "still serving the previous certificate; old CA kept");
                        return Ok(None);
                    }
                    fresh_acks += 1;
                }
                if fresh_acks == 0 {
                    return Ok(None);
                }
                data.remove("previous-ca.crt");
                ann.remove(ANNOTATION_PHASE);
                for k in stale_keys {
                    ann.remove(&k);
                }
                "stable"
            }
            Some(other) => anyhow::bail!(
                "Secret {} has unknown {ANNOTATION_PHASE}={other:?}; remove the annotation",
                self.secret_name
            ),
        };
        match api
            .replace(&self.secret_name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %self.secret_name, phase, "webhook certificate rotation advanced");
                Ok(Some(phase))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
