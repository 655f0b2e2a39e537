//! The eRDMA driver installer's identity as users write it: the version (part of a download URL),
//! the SHA-256 pin, the download base URL. Parsed the same way by the agent's flags and by install
//! validation (`erdmactl install`, mirrored by the Helm chart's schema).

use serde::Serialize;

/// Where installers are downloaded from by default (the VPC-internal mirror the original uses,
/// over HTTPS instead of HTTP).
pub const DEFAULT_INSTALLER_BASE_URL: &str = "https://mirrors.cloud.aliyuncs.com/erdma";

/// The installer version the original agent uses (`--erdma-installer-version`).
pub const DEFAULT_INSTALLER_VERSION: &str = "1.5.9";

/// A validated installer version: dot-separated decimal numbers, e.g. `1.5.9`. It becomes part of a
/// download URL, so nothing else is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct InstallerVersion(String);

/// Error for an installer version that is not `N(.N)*`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid --erdma-installer-version {0:?}: expected dot-separated numbers such as {DEFAULT_INSTALLER_VERSION}"
)]
pub struct InvalidInstallerVersion(pub String);

impl InstallerVersion {
    /// Validates a version string.
    pub fn parse(s: &str) -> Result<Self, InvalidInstallerVersion> {
        let ok = !s.is_empty()
            && s.split('.')
                .all(|p| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()));
        if ok {
            Ok(InstallerVersion(s.to_string()))
        } else {
            Err(InvalidInstallerVersion(s.to_string()))
        }
    }

    /// The version text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for InstallerVersion {
    fn default() -> Self {
        InstallerVersion(DEFAULT_INSTALLER_VERSION.to_string())
    }
}

/// A pinned SHA-256 (64 hex digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sha256Pin(String);

impl Sha256Pin {
    /// Parses 64 hex digits (any case; `sha256:` prefix allowed).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let t = t.strip_prefix("sha256:").unwrap_or(t).to_ascii_lowercase();
        if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Sha256Pin(t))
        } else {
            Err(format!(
                "{s:?} is not a SHA-256 (expected 64 hex digits, as `sha256sum` prints)"
            ))
        }
    }

    /// The lowercase hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks a download base URL: `https://…`, or `http://…` only when `allow_insecure` (the pin is
/// still checked then).
pub fn check_base_url(url: &str, allow_insecure: bool) -> Result<(), String> {
    let rest = if let Some(r) = url.strip_prefix("https://") {
        r
    } else if let Some(r) = url.strip_prefix("http://") {
        if !allow_insecure {
            return Err(format!(
                "{url:?} is plain HTTP: use an https:// URL, or accept the risk explicitly (--allow-insecure-driver-download)"
            ));
        }
        r
    } else {
        return Err(format!("{url:?} is not an https:// URL"));
    };
    if rest.is_empty() || rest.starts_with('/') || rest.chars().any(char::is_whitespace) {
        return Err(format!("{url:?} has no host, or has spaces"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_pins_and_urls() {
        assert!(InstallerVersion::parse("1.5.9").is_ok());
        for bad in ["", "1..2", "1.5.9;rm", "../1", "1.5.9 "] {
            assert!(InstallerVersion::parse(bad).is_err(), "{bad:?}");
        }
        let hex = "ab".repeat(32);
        assert_eq!(
            Sha256Pin::parse(&format!("sha256:{}", hex.to_uppercase()))
                .unwrap()
                .as_str(),
            hex
        );
        assert!(Sha256Pin::parse("abc").is_err());
        assert!(check_base_url(DEFAULT_INSTALLER_BASE_URL, false).is_ok());
        assert!(check_base_url("http://10.0.0.1/erdma", false).is_err());
        assert!(check_base_url("http://10.0.0.1/erdma", true).is_ok());
        for bad in ["ftp://x", "https://", "https:///x", "https://a b"] {
            assert!(check_base_url(bad, true).is_err(), "{bad:?}");
        }
    }
}
