//! Verified installer downloads: HTTPS only (plain `http://` only with an explicit, loudly logged
//! opt-in), and the body's SHA-256 must equal a pinned value before anything runs it. There is no
//! built-in pin: Alibaba Cloud publishes no checksum or signature for the installer that we could
//! find, so the operator pins what they verified (`--driver-installer-sha256`); without a pin the
//! installer path refuses to run and says so.

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use erdma_model::installer::DEFAULT_INSTALLER_BASE_URL;
/// Largest installer accepted.
pub const MAX_INSTALLER_BYTES: usize = 512 << 20;

pub use erdma_model::installer::Sha256Pin;

/// Lowercase hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How installers are fetched and what they are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallerTrust {
    /// Base URL; the standard installer is `<base>/erdma_installer-<version>.tar.gz`, the GPU
    /// one `<base>/env_setup.sh` (`--driver-installer-base-url`).
    pub base_url: String,
    /// Pin of the standard installer tarball of the configured version
    /// (`--driver-installer-sha256`).
    pub standard_sha256: Option<Sha256Pin>,
    /// Pin of `env_setup.sh` (`--gpu-installer-sha256`).
    pub gpu_sha256: Option<Sha256Pin>,
    /// Extra trusted CA certificates (PEM), on top of the Mozilla roots
    /// (`--driver-installer-ca-file`).
    pub extra_ca_pem: Option<String>,
    /// Accept `http://` URLs (`--allow-insecure-driver-download`); the hash is still checked.
    pub allow_insecure_http: bool,
}

impl Default for InstallerTrust {
    fn default() -> Self {
        InstallerTrust {
            base_url: DEFAULT_INSTALLER_BASE_URL.to_string(),
            standard_sha256: None,
            gpu_sha256: None,
            extra_ca_pem: None,
            allow_insecure_http: false,
        }
    }
}

/// Why an installer was not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No pin configured.
    #[error(
        "driver install needs {flag}: refusing to run {url} unverified (download it on a trusted machine, check it, run `sha256sum` on it and pass the digest as {flag})"
    )]
    MissingPin {
        /// The installer URL.
        url: String,
        /// The flag that pins it.
        flag: &'static str,
    },
    /// A plain-HTTP URL without the opt-in.
    #[error(
        "refusing to download the driver installer over plain HTTP: {url} (use an https:// URL via --driver-installer-base-url, or accept the risk with --allow-insecure-driver-download)"
    )]
    InsecureUrl {
        /// The URL.
        url: String,
    },
    /// The body's hash is not the pinned one.
    #[error(
        "driver installer {url} has SHA-256 {actual}, expected {expected}: not run (the file changed on the mirror or in transit; if the vendor released a new installer, verify it and update {flag}, otherwise treat it as tampering)"
    )]
    Mismatch {
        /// The URL.
        url: String,
        /// The pinned hash.
        expected: String,
        /// The downloaded body's hash.
        actual: String,
        /// The flag that pins it.
        flag: &'static str,
    },
    /// Download failure.
    #[error("downloading the driver installer {url} failed: {detail}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        detail: String,
    },
}

struct Target {
    tls: bool,
    host: String,
    port: u16,
    path: String,
}

fn parse_url(url: &str) -> Result<Target, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err("only https:// (or opted-in http://) URLs are supported".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err("the URL needs a host and no user information".into());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h.to_string(),
            p.parse::<u16>().map_err(|_| format!("bad port {p:?}"))?,
        ),
        _ => (authority.to_string(), if tls { 443 } else { 80 }),
    };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("the URL path has spaces or control characters".into());
    }
    Ok(Target {
        tls,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        path: path.to_string(),
    })
}

fn client_config(extra_ca_pem: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_ca_pem {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let c = c.map_err(|e| format!("--driver-installer-ca-file: {e}"))?;
            roots
                .add(c)
                .map_err(|e| format!("--driver-installer-ca-file: {e}"))?;
        }
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// GETs `url` (HTTP/1.0, no redirects followed), returning the body of a 200.
fn get(url: &str, trust: &InstallerTrust, timeout: Duration) -> Result<Vec<u8>, String> {
    let t = parse_url(url)?;
    let tcp = TcpStream::connect((t.host.as_str(), t.port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: erdma-agent\r\nAccept: */*\r\n\r\n",
        t.path, t.host
    );
    let mut raw = Vec::new();
    let limit = (MAX_INSTALLER_BYTES + (64 << 10)) as u64;
    if t.tls {
        let name = ServerName::try_from(t.host.clone()).map_err(|e| e.to_string())?;
        let conn =
            rustls::ClientConnection::new(client_config(trust.extra_ca_pem.as_deref())?, name)
                .map_err(|e| e.to_string())?;
        let mut s = rustls::StreamOwned::new(conn, tcp);
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        match (&mut s).take(limit).read_to_end(&mut raw) {
            Ok(_) => {}
            // A server closing without close_notify: the hash decides whether the body is whole.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(e.to_string()),
        }
    } else {
        let mut s = tcp;
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        (&mut s)
            .take(limit)
            .read_to_end(&mut raw)
            .map_err(|e| e.to_string())?;
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP response header")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        let location = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
            })
            .map(|(_, v)| format!(" (redirect to {}; configure that URL)", v.trim()))
            .unwrap_or_default();
        return Err(format!("HTTP status {status}{location}"));
    }
    let body = raw.split_off(split + 4);
    if body.len() > MAX_INSTALLER_BYTES {
        return Err(format!("larger than {MAX_INSTALLER_BYTES} bytes"));
    }
    Ok(body)
}

/// Downloads `url` and checks it against `pin`; only a verified body is returned. Refuses before
/// any connection when the pin is missing or the URL is plain HTTP without the opt-in.
pub fn fetch_verified(
    url: &str,
    pin: Option<&Sha256Pin>,
    flag: &'static str,
    trust: &InstallerTrust,
    timeout: Duration,
) -> Result<Vec<u8>, FetchError> {
    if url.starts_with("http://") {
        if !trust.allow_insecure_http {
            return Err(FetchError::InsecureUrl { url: url.into() });
        }
        tracing::warn!(%url, "INSECURE: downloading the driver installer over plain HTTP (--allow-insecure-driver-download); only the pinned SHA-256 protects this node");
    }
    let Some(pin) = pin else {
        return Err(FetchError::MissingPin {
            url: url.into(),
            flag,
        });
    };
    let body = get(url, trust, timeout).map_err(|detail| FetchError::Transport {
        url: url.into(),
        detail,
    })?;
    let actual = sha256_hex(&body);
    if actual != pin.as_str() {
        return Err(FetchError::Mismatch {
            url: url.into(),
            expected: pin.as_str().into(),
            actual,
            flag,
        });
    }
    tracing::info!(%url, sha256 = %actual, bytes = body.len(), "driver installer verified");
    Ok(body)
}

/// Downloads and verifies `url`, writes it to `dir/file_name` (mode 0600), and only then calls
/// `run` with that path. On any refusal `run` is never called.
pub fn fetch_then_run<R>(
    url: &str,
    pin: Option<&Sha256Pin>,
    flag: &'static str,
    trust: &InstallerTrust,
    dir: &Path,
    file_name: &str,
    run: impl FnOnce(&Path) -> R,
) -> Result<R, FetchError> {
    let body = fetch_verified(url, pin, flag, trust, Duration::from_secs(300))?;
    let path = dir.join(file_name);
    let write = || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(&body)?;
        f.sync_all()
    };
    write().map_err(|e| FetchError::Transport {
        url: url.into(),
        detail: format!("writing {}: {e}", path.display()),
    })?;
    Ok(run(&path))
}
