//! The installer download against a real local HTTPS server (rustls, a CA made here and handed to
//! the client as `--driver-installer-ca-file` would): a matching pin runs, a mismatch or a plain
//! `http://` URL or a missing pin runs nothing. Hashes are literals from `sha256sum`.

use erdma_driver::fetch::{FetchError, InstallerTrust, Sha256Pin, fetch_then_run};
use erdma_driver::{Host, Installer, InstallerVersion, NodeHost};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const BODY: &[u8] = b"#!/bin/sh\necho erdma installer\n";
/// `printf '#!/bin/sh\necho erdma installer\n' | sha256sum`
const BODY_SHA256: &str = "466ce7f2c27b137672429fe48143fd75bd1c98d7278e041f0bf33c00396ec3be";
/// `printf 'tampered' | sha256sum`
const TAMPERED_SHA256: &str = "d121be3103007b41edf96f8262925f8c7d61894afe9a041843b631f69445bc57";

struct Server {
    port: u16,
    ca_pem: String,
    requests: Arc<AtomicUsize>,
}

fn ca_and_leaf() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key)).unwrap();
    (ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem())
}

/// Serves `body` to every GET, over TLS when `tls`, counting requests.
fn server(body: &'static [u8], tls: bool) -> Server {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (ca_pem, cert_pem, key_pem) = ca_and_leaf();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let cfg = cfg.clone();
            let counted = counted.clone();
            std::thread::spawn(move || {
                let answer = |s: &mut dyn ReadWrite| {
                    let mut req = Vec::new();
                    let mut byte = [0u8; 1];
                    while !req.ends_with(b"\r\n\r\n") {
                        if s.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        req.push(byte[0]);
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(head.as_bytes());
                    let _ = s.write_all(body);
                    let _ = s.flush();
                };
                if tls {
                    let conn = rustls::ServerConnection::new(cfg).unwrap();
                    let mut s = rustls::StreamOwned::new(conn, tcp);
                    answer(&mut s);
                    s.conn.send_close_notify();
                    let _ = s.flush();
                } else {
                    let mut s = tcp;
                    answer(&mut s);
                }
            });
        }
    });
    Server {
        port,
        ca_pem,
        requests,
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn trust(ca_pem: &str) -> InstallerTrust {
    InstallerTrust {
        extra_ca_pem: Some(ca_pem.to_string()),
        ..InstallerTrust::default()
    }
}

fn pin(hex: &str) -> Sha256Pin {
    Sha256Pin::parse(hex).unwrap()
}

/// The driver installer from `url` that must be refused: the error, and whether it would have run.
fn refused(
    url: &str,
    pin: Option<&Sha256Pin>,
    trust: &InstallerTrust,
    dir: &std::path::Path,
) -> (FetchError, bool) {
    let mut ran = false;
    let err = fetch_then_run(
        url,
        pin,
        "--driver-installer-sha256",
        trust,
        dir,
        "installer.tar.gz",
        |_| ran = true,
    )
    .expect_err("must be refused");
    (err, ran)
}

#[test]
fn matching_pin_runs_the_verified_file() {
    let srv = server(BODY, true);
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "https://localhost:{}/erdma/erdma_installer-1.5.9.tar.gz",
        srv.port
    );
    let ran = fetch_then_run(
        &url,
        Some(&pin(BODY_SHA256)),
        "--driver-installer-sha256",
        &trust(&srv.ca_pem),
        dir.path(),
        "installer.tar.gz",
        |path| {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            (std::fs::read(path).unwrap(), mode)
        },
    )
    .unwrap();
    assert_eq!(ran.0, BODY, "the runner got exactly the verified bytes");
    assert_eq!(ran.1, 0o600);
    assert_eq!(srv.requests.load(Ordering::SeqCst), 1);
}

#[test]
fn mismatch_is_refused_and_nothing_runs() {
    let srv = server(b"tampered", true);
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "https://localhost:{}/erdma/erdma_installer-1.5.9.tar.gz",
        srv.port
    );
    let (err, ran) = refused(
        &url,
        Some(&pin(BODY_SHA256)),
        &trust(&srv.ca_pem),
        dir.path(),
    );
    assert!(!ran, "a mismatching installer must not run");
    assert_eq!(
        err,
        FetchError::Mismatch {
            url: url.clone(),
            expected: BODY_SHA256.into(),
            actual: TAMPERED_SHA256.into(),
            flag: "--driver-installer-sha256",
        }
    );
    let text = err.to_string();
    for part in [
        url.as_str(),
        BODY_SHA256,
        TAMPERED_SHA256,
        "update --driver-installer-sha256",
    ] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn plain_http_is_refused_before_connecting() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!(
        "http://127.0.0.1:{}/erdma/erdma_installer-1.5.9.tar.gz",
        listener.local_addr().unwrap().port()
    );
    let dir = tempfile::tempdir().unwrap();
    let (err, ran) = refused(
        &url,
        Some(&pin(BODY_SHA256)),
        &InstallerTrust::default(),
        dir.path(),
    );
    assert!(!ran);
    assert_eq!(err, FetchError::InsecureUrl { url: url.clone() });
    assert!(err.to_string().contains("--allow-insecure-driver-download"));
    assert_eq!(
        listener.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "no connection was made"
    );
}

#[test]
fn plain_http_with_the_opt_in_still_checks_the_pin() {
    let srv = server(BODY, false);
    let url = format!("http://127.0.0.1:{}/erdma/env_setup.sh", srv.port);
    let insecure = InstallerTrust {
        allow_insecure_http: true,
        ..InstallerTrust::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let ok = fetch_then_run(
        &url,
        Some(&pin(BODY_SHA256)),
        "--gpu-installer-sha256",
        &insecure,
        dir.path(),
        "env_setup.sh",
        |p| std::fs::read(p).unwrap(),
    );
    assert_eq!(ok.unwrap(), BODY);
    let mut ran = false;
    let err = fetch_then_run(
        &url,
        Some(&pin(TAMPERED_SHA256)),
        "--gpu-installer-sha256",
        &insecure,
        dir.path(),
        "env_setup2.sh",
        |_| ran = true,
    )
    .unwrap_err();
    assert!(!ran);
    assert!(matches!(err, FetchError::Mismatch { .. }), "{err}");
}

#[test]
fn missing_pin_or_untrusted_certificate_runs_nothing() {
    let srv = server(BODY, true);
    let url = format!(
        "https://localhost:{}/erdma/erdma_installer-1.5.9.tar.gz",
        srv.port
    );
    let dir = tempfile::tempdir().unwrap();
    let (err, ran) = refused(&url, None, &trust(&srv.ca_pem), dir.path());
    assert!(!ran);
    assert!(
        err.to_string()
            .starts_with("driver install needs --driver-installer-sha256"),
        "{err}"
    );
    assert_eq!(
        srv.requests.load(Ordering::SeqCst),
        0,
        "not even downloaded"
    );
    // The server's CA is not among the trusted roots: the TLS handshake fails.
    let (err, ran) = refused(
        &url,
        Some(&pin(BODY_SHA256)),
        &InstallerTrust::default(),
        dir.path(),
    );
    assert!(!ran);
    assert!(matches!(err, FetchError::Transport { .. }), "{err}");
    assert_eq!(srv.requests.load(Ordering::SeqCst), 0);
}

#[test]
fn node_host_without_a_pin_reports_the_missing_flag() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("tmp")).unwrap();
    let host = NodeHost::with_roots(
        root.path(),
        root.path(),
        root.path(),
        erdma_driver::HostNamespaces::host(),
    );
    let err = host
        .run_installer(&Installer::Standard {
            version: InstallerVersion::parse("1.5.9").unwrap(),
            force_mad: false,
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("driver install needs --driver-installer-sha256"),
        "{err}"
    );
    assert!(
        err.contains("https://mirrors.cloud.aliyuncs.com/erdma/erdma_installer-1.5.9.tar.gz"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(root.path().join("tmp")).unwrap().count(),
        0,
        "the download directory is cleaned up"
    );
}
