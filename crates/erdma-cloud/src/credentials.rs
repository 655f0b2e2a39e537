//! Credentials for the ECS API: a static access key, RRSA (OIDC role via STS
//! `AssumeRoleWithOIDC`), the instance RAM role from the metadata service, and the STS token
//! Secret `kube-system/addon.network.token` (key `addon.token.config`, AES-CBC encrypted fields)
//! that ACK writes for add-ons. Secrets are wrapped in [`Secret`], whose `Debug` never prints them.

use crate::encode::{iso8601, nonce, parse_iso8601};
use crate::http::{HttpClient, post_form};
use base64::Engine;
use serde::Deserialize;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Mutex;

/// A secret string. `Debug` and `Display` print `***`; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret value, for signing only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One set of credentials. `Debug` shows only the first 4 characters of the key ID.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key ID.
    pub access_key_id: String,
    /// The access key secret.
    pub access_key_secret: Secret,
    /// The STS security token (temporary credentials only).
    pub security_token: Option<Secret>,
    /// When temporary credentials expire.
    pub expiration: Option<SystemTime>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.access_key_id.chars().take(4).collect();
        f.debug_struct("Credentials")
            .field("access_key_id", &format_args!("{shown}***"))
            .field("access_key_secret", &self.access_key_secret)
            .field("security_token", &self.security_token)
            .field("expiration", &self.expiration.map(iso8601))
            .finish()
    }
}

impl Credentials {
    /// Static access-key credentials.
    pub fn access_key(id: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            access_key_id: id.into(),
            access_key_secret: Secret::new(secret),
            security_token: None,
            expiration: None,
        }
    }
}

/// Why credentials could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// A file (OIDC token) could not be read.
    #[error("credentials ({kind}): cannot read {path}: {source}; fix: {fix}")]
    File {
        /// Credential type.
        kind: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
        /// What to do.
        fix: &'static str,
    },
    /// A remote source (STS, metadata, Secret) answered with an error or garbage.
    #[error("credentials ({kind}): {what}; fix: {fix}")]
    Source {
        /// Credential type.
        kind: &'static str,
        /// What went wrong (never contains secret values).
        what: String,
        /// What to do.
        fix: &'static str,
    },
}

/// Reads the raw `addon.token.config` value of the STS token Secret (implemented with kube by
/// the controller; by a closure in tests).
pub trait SecretSource: Send + Sync {
    /// The bytes of the Secret key, or a message naming the Secret and the error.
    fn read(&self) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + '_>>;
}

/// RRSA settings; [`OidcRole::from_env`] reads the variables the ACK pod-identity webhook injects.
#[derive(Debug, Clone)]
pub struct OidcRole {
    /// `ALIBABA_CLOUD_ROLE_ARN`.
    pub role_arn: String,
    /// `ALIBABA_CLOUD_OIDC_PROVIDER_ARN`.
    pub provider_arn: String,
    /// `ALIBABA_CLOUD_OIDC_TOKEN_FILE` (re-read on every refresh: kubelet rotates it).
    pub token_file: PathBuf,
    /// `RoleSessionName`.
    pub session_name: String,
    /// STS endpoint, e.g. `https://sts-vpc.cn-hangzhou.aliyuncs.com`.
    pub sts_endpoint: String,
}

impl OidcRole {
    /// From the RRSA environment variables; the error names the missing variable.
    pub fn from_env(sts_endpoint: String) -> Result<Self, CredentialError> {
        let var = |name: &'static str| {
            std::env::var(name).map_err(|_| CredentialError::Source {
                kind: "oidc_role_arn",
                what: format!("environment variable {name} is not set"),
                fix: "enable RRSA on the cluster and annotate the controller ServiceAccount with \
                      pod-identity.alibabacloud.com/role-name",
            })
        };
        Ok(Self {
            role_arn: var("ALIBABA_CLOUD_ROLE_ARN")?,
            provider_arn: var("ALIBABA_CLOUD_OIDC_PROVIDER_ARN")?,
            token_file: PathBuf::from(var("ALIBABA_CLOUD_OIDC_TOKEN_FILE")?),
            session_name: "erdma-controller".to_string(),
            sts_endpoint,
        })
    }
}

/// Where credentials come from (`credentials.type` of the chart).
#[derive(Clone)]
pub enum CredentialSource {
    /// `access_key` (or empty): fixed key from `credential.json`.
    AccessKey(Credentials),
    /// `oidc_role_arn`: RRSA.
    OidcRole(OidcRole),
    /// `ecs_ram_role`: the instance RAM role from the metadata service at this endpoint
    /// (IMDSv2); the role name is discovered when `None`.
    EcsRamRole {
        /// Metadata endpoint, normally `http://100.100.100.200`.
        metadata_endpoint: String,
        /// RAM role name.
        role_name: Option<String>,
    },
    /// `ram_role_sts`: the add-on token Secret.
    StsSecret(Arc<dyn SecretSource>),
}

impl fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AccessKey(c) => f.debug_tuple("AccessKey").field(c).finish(),
            Self::OidcRole(o) => f.debug_tuple("OidcRole").field(o).finish(),
            Self::EcsRamRole {
                metadata_endpoint,
                role_name,
            } => f
                .debug_struct("EcsRamRole")
                .field("metadata_endpoint", metadata_endpoint)
                .field("role_name", role_name)
                .finish(),
            Self::StsSecret(_) => f.write_str("StsSecret"),
        }
    }
}

impl CredentialSource {
    /// The chart's name of this type.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AccessKey(_) => "access_key",
            Self::OidcRole(_) => "oidc_role_arn",
            Self::EcsRamRole { .. } => "ecs_ram_role",
            Self::StsSecret(_) => "ram_role_sts",
        }
    }
}

/// Temporary credentials are refreshed this long before they expire.
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);
/// The STS Secret is re-read at least this often (ACK rotates it in place).
pub const STS_SECRET_REREAD: Duration = Duration::from_secs(5 * 60);

/// Hands out current credentials from a [`CredentialSource`], caching temporary ones until
/// shortly before they expire.
#[derive(Debug)]
pub struct CredentialProvider {
    source: CredentialSource,
    http: HttpClient,
    cache: Mutex<Option<(Credentials, SystemTime)>>,
}

impl CredentialProvider {
    /// A provider for `source`.
    pub fn new(source: CredentialSource) -> Self {
        Self {
            source,
            http: crate::http::client(),
            cache: Mutex::new(None),
        }
    }

    /// The configured type.
    pub fn kind(&self) -> &'static str {
        self.source.kind()
    }

    /// Current credentials (cached, refreshed when due). When a refresh fails but the cached
    /// credentials are still valid, those are returned.
    pub async fn get(&self) -> Result<Credentials, CredentialError> {
        if let CredentialSource::AccessKey(c) = &self.source {
            return Ok(c.clone());
        }
        let mut cache = self.cache.lock().await;
        let now = SystemTime::now();
        if let Some((creds, fetched)) = cache.as_ref() {
            let fresh = creds
                .expiration
                .is_none_or(|exp| exp > now + REFRESH_BEFORE_EXPIRY);
            let reread_due = matches!(self.source, CredentialSource::StsSecret(_))
                && now.duration_since(*fetched).unwrap_or_default() >= STS_SECRET_REREAD;
            if fresh && !reread_due {
                return Ok(creds.clone());
            }
        }
        match self.fetch().await {
            Ok(creds) => {
                *cache = Some((creds.clone(), now));
                Ok(creds)
            }
            Err(e) => match cache.as_ref() {
                Some((creds, _)) if creds.expiration.is_none_or(|exp| exp > now) => {
                    tracing::warn!(kind = self.kind(), error = %e, "credential refresh failed; the current credentials are still valid");
                    Ok(creds.clone())
                }
                _ => Err(e),
            },
        }
    }

    async fn fetch(&self) -> Result<Credentials, CredentialError> {
        match &self.source {
            CredentialSource::AccessKey(c) => Ok(c.clone()),
            CredentialSource::OidcRole(role) => assume_role_with_oidc(&self.http, role).await,
            CredentialSource::EcsRamRole {
                metadata_endpoint,
                role_name,
            } => ecs_ram_role(metadata_endpoint, role_name.as_deref()).await,
            CredentialSource::StsSecret(source) => {
                let raw = source.read().await.map_err(|what| CredentialError::Source {
                    kind: "ram_role_sts",
                    what,
                    fix: "check that the Secret kube-system/addon.network.token exists and that the \
                          controller may get it",
                })?;
                decode_addon_token(&raw)
            }
        }
    }
}

/// STS credentials as returned by `AssumeRoleWithOIDC` and the metadata service.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StsCredentials {
    access_key_id: String,
    access_key_secret: String,
    security_token: String,
    expiration: String,
}

impl StsCredentials {
    fn into_credentials(self, kind: &'static str) -> Result<Credentials, CredentialError> {
        let expiration =
            parse_iso8601(&self.expiration).ok_or_else(|| CredentialError::Source {
                kind,
                what: format!(
                    "expiration {:?} is not yyyy-MM-ddTHH:mm:ssZ",
                    self.expiration
                ),
                fix: "report this: the credential source answered in an unknown format",
            })?;
        Ok(Credentials {
            access_key_id: self.access_key_id,
            access_key_secret: Secret::new(self.access_key_secret),
            security_token: Some(Secret::new(self.security_token)),
            expiration: Some(expiration),
        })
    }
}

async fn assume_role_with_oidc(
    http: &HttpClient,
    role: &OidcRole,
) -> Result<Credentials, CredentialError> {
    const KIND: &str = "oidc_role_arn";
    let token = tokio::fs::read_to_string(&role.token_file)
        .await
        .map_err(|source| CredentialError::File {
            kind: KIND,
            path: role.token_file.clone(),
            source,
            fix: "check that the pod-identity webhook mounted the OIDC token (RRSA enabled, \
                  ServiceAccount annotated)",
        })?;
    let params: Vec<(&str, String)> = vec![
        ("Action", "AssumeRoleWithOIDC".into()),
        ("Version", "2015-04-01".into()),
        ("Format", "JSON".into()),
        ("Timestamp", iso8601(SystemTime::now())),
        ("SignatureNonce", nonce()),
        ("RoleArn", role.role_arn.clone()),
        ("OIDCProviderArn", role.provider_arn.clone()),
        ("OIDCToken", token.trim().to_string()),
        ("RoleSessionName", role.session_name.clone()),
        ("DurationSeconds", "3600".into()),
    ];
    let (status, body) = post_form(http, &role.sts_endpoint, &params)
        .await
        .map_err(|e| CredentialError::Source {
            kind: KIND,
            what: format!("STS {} unreachable: {e}", role.sts_endpoint),
            fix: "check network access to the STS endpoint (VPC endpoint sts-vpc.<region>)",
        })?;
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        credentials: Option<StsCredentials>,
        code: Option<String>,
        message: Option<String>,
    }
    let answer: Answer = serde_json::from_slice(&body).map_err(|e| CredentialError::Source {
        kind: KIND,
        what: format!("STS answered HTTP {status} with a body that is not JSON: {e}"),
        fix: "check the STS endpoint",
    })?;
    match answer.credentials {
        Some(c) if (200..300).contains(&status) => c.into_credentials(KIND),
        _ => Err(CredentialError::Source {
            kind: KIND,
            what: format!(
                "AssumeRoleWithOIDC for {} failed: HTTP {status} {} {}",
                role.role_arn,
                answer.code.unwrap_or_default(),
                answer.message.unwrap_or_default()
            ),
            fix: "check the RAM role's trust policy for the cluster's OIDC provider",
        }),
    }
}

async fn ecs_ram_role(
    endpoint: &str,
    role_name: Option<&str>,
) -> Result<Credentials, CredentialError> {
    const KIND: &str = "ecs_ram_role";
    const BASE: &str = "/latest/meta-data/ram/security-credentials/";
    let imds = crate::imds::ImdsClient::new(endpoint).map_err(|e| CredentialError::Source {
        kind: KIND,
        what: format!("metadata endpoint {endpoint}: {e}"),
        fix: "the controller must run on an ECS instance (hostNetwork not needed)",
    })?;
    let role = match role_name {
        Some(r) => r.to_string(),
        None => {
            let listed = imds.get(BASE).await.map_err(|e| CredentialError::Source {
                kind: KIND,
                what: format!("listing RAM roles: {e}"),
                fix: "attach a RAM role to the node's ECS instance",
            })?;
            listed
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .ok_or_else(|| CredentialError::Source {
                    kind: KIND,
                    what: "the instance has no RAM role".into(),
                    fix: "attach a RAM role to the node's ECS instance",
                })?
                .to_string()
        }
    };
    let body = imds
        .get(&format!("{BASE}{role}"))
        .await
        .map_err(|e| CredentialError::Source {
            kind: KIND,
            what: format!("credentials of RAM role {role}: {e}"),
            fix: "check the RAM role attached to the instance",
        })?;
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        code: Option<String>,
        #[serde(flatten)]
        creds: StsCredentials,
    }
    let answer: Answer = serde_json::from_str(&body).map_err(|e| CredentialError::Source {
        kind: KIND,
        what: format!("credentials of RAM role {role} are not the expected JSON: {e}"),
        fix: "check the metadata service",
    })?;
    if answer.code.as_deref().is_some_and(|c| c != "Success") {
        return Err(CredentialError::Source {
            kind: KIND,
            what: format!("metadata service answered Code={:?}", answer.code),
            fix: "check the RAM role attached to the instance",
        });
    }
    answer.creds.into_credentials(KIND)
}

/// Decodes the ACK add-on token (`addon.token.config`): JSON with `access.key.id`,
/// `access.key.secret`, `security.token` (each base64 of IV ‖ AES-CBC ciphertext, PKCS#7 padded,
/// key = `keyring`) and `expiration`.
pub fn decode_addon_token(raw: &[u8]) -> Result<Credentials, CredentialError> {
    const KIND: &str = "ram_role_sts";
    #[derive(Deserialize)]
    struct Token {
        #[serde(rename = "access.key.id")]
        id: String,
        #[serde(rename = "access.key.secret")]
        secret: String,
        #[serde(rename = "security.token")]
        token: String,
        expiration: String,
        keyring: String,
    }
    let bad = |what: String| CredentialError::Source {
        kind: KIND,
        what,
        fix: "the Secret kube-system/addon.network.token key addon.token.config is not an ACK \
              add-on token; recreate it or use another credentials.type",
    };
    let t: Token =
        serde_json::from_slice(raw).map_err(|e| bad(format!("addon.token.config: {e}")))?;
    let key = t.keyring.as_bytes();
    let field = |name: &str, value: &str| -> Result<String, CredentialError> {
        let plain = aes_cbc_decrypt(value, key).map_err(|e| bad(format!("{name}: {e}")))?;
        String::from_utf8(plain).map_err(|_| bad(format!("{name}: decrypted value is not UTF-8")))
    };
    let expiration = parse_iso8601(&t.expiration).ok_or_else(|| {
        bad(format!(
            "expiration {:?} is not yyyy-MM-ddTHH:mm:ssZ",
            t.expiration
        ))
    })?;
    Ok(Credentials {
        access_key_id: field("access.key.id", &t.id)?,
        access_key_secret: Secret::new(field("access.key.secret", &t.secret)?),
        security_token: Some(Secret::new(field("security.token", &t.token)?)),
        expiration: Some(expiration),
    })
}

fn aes_cbc_decrypt(b64: &str, key: &[u8]) -> Result<Vec<u8>, String> {
    use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};
    let data = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("not base64 ({e})"))?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return Err(format!("{} bytes is not IV + whole AES blocks", data.len()));
    }
    let (iv, ct) = data.split_at(16);
    let mut buf = ct.to_vec();
    let plain = match key.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_mut::<Pkcs7>(&mut buf)
            .map_err(|_| "bad padding (wrong keyring?)".to_string())?
            .to_vec(),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_mut::<Pkcs7>(&mut buf)
            .map_err(|_| "bad padding (wrong keyring?)".to_string())?
            .to_vec(),
        32 => cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_mut::<Pkcs7>(&mut buf)
            .map_err(|_| "bad padding (wrong keyring?)".to_string())?
            .to_vec(),
        n => {
            return Err(format!(
                "keyring of {n} bytes is not an AES key (16, 24 or 32)"
            ));
        }
    };
    Ok(plain)
}

/// Encrypts like the ACK add-on token writer does (random IV ‖ AES-CBC, PKCS#7), base64. Used by
/// the emulator and tests to build Secrets.
pub fn aes_cbc_encrypt(plain: &[u8], key: &[u8], iv: [u8; 16]) -> Result<String, String> {
    use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
    let mut buf = plain.to_vec();
    buf.resize(plain.len() + 16 - plain.len() % 16, 0);
    let ct = match key.len() {
        16 => cbc::Encryptor::<aes::Aes128>::new_from_slices(key, &iv)
            .map_err(|e| e.to_string())?
            .encrypt_padded_mut::<Pkcs7>(&mut buf, plain.len())
            .map_err(|e| e.to_string())?
            .to_vec(),
        32 => cbc::Encryptor::<aes::Aes256>::new_from_slices(key, &iv)
            .map_err(|e| e.to_string())?
            .encrypt_padded_mut::<Pkcs7>(&mut buf, plain.len())
            .map_err(|e| e.to_string())?
            .to_vec(),
        n => return Err(format!("key of {n} bytes not supported here")),
    };
    let mut out = iv.to_vec();
    out.extend_from_slice(&ct);
    Ok(base64::engine::general_purpose::STANDARD.encode(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_secrets() {
        let c = Credentials {
            access_key_id: "LTAI5tSecretish".into(),
            access_key_secret: Secret::new("super-secret-value"),
            security_token: Some(Secret::new("token-value")),
            expiration: None,
        };
        let shown = format!("{c:?} {:?}", CredentialSource::AccessKey(c.clone()));
        assert!(!shown.contains("super-secret-value"), "{shown}");
        assert!(!shown.contains("token-value"), "{shown}");
        assert!(!shown.contains("LTAI5tSecretish"), "{shown}");
        assert!(shown.contains("LTAI***"), "{shown}");
    }

    /// Ciphertext produced by `openssl enc -aes-128-cbc` (AES-128-CBC, PKCS7, IV prefix), not by our
    /// encrypt function: key `0123456789abcdef`, IV 16 × 0x01, plaintext `AKIDEXAMPLE`.
    #[test]
    fn addon_token_decrypts_an_independent_ciphertext() {
        let id = PY_CIPHERTEXT;
        let ours = aes_cbc_encrypt(b"AKIDEXAMPLE", b"0123456789abcdef", [1; 16]).unwrap();
        assert_eq!(ours, id, "our encryptor agrees with the independent one");
        let secret = aes_cbc_encrypt(b"sk-value", b"0123456789abcdef", [2; 16]).unwrap();
        let token = aes_cbc_encrypt(b"sts-token", b"0123456789abcdef", [3; 16]).unwrap();
        let raw = serde_json::json!({
            "access.key.id": id, "access.key.secret": secret, "security.token": token,
            "expiration": "2030-01-01T00:00:00Z", "keyring": "0123456789abcdef"
        });
        let c = decode_addon_token(raw.to_string().as_bytes()).expect("decodes");
        assert_eq!(c.access_key_id, "AKIDEXAMPLE");
        assert_eq!(c.access_key_secret.expose(), "sk-value");
        assert_eq!(
            c.security_token.as_ref().map(Secret::expose),
            Some("sts-token")
        );

        let wrong = serde_json::json!({
            "access.key.id": id, "access.key.secret": secret, "security.token": token,
            "expiration": "2030-01-01T00:00:00Z", "keyring": "fedcba9876543210"
        });
        let err = decode_addon_token(wrong.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("access.key.id"), "{err}");
        assert!(!err.to_string().contains("sk-value"));
        let err = decode_addon_token(b"{}").unwrap_err();
        assert!(err.to_string().contains("addon.token.config"), "{err}");
    }

    const PY_CIPHERTEXT: &str = "AQEBAQEBAQEBAQEBAQEBAc0Ota/9Ny6SXDuRU7WHy84=";
}
