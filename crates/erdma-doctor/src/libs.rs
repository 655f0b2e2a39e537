//! Whether an image has the RDMA user-space libraries: `libibverbs.so.1` and the eRDMA provider
//! (`libibverbs/liberdma-rdmav<ABI>.so`, rdma-core's provider naming), judged from `ls` output.

use serde::Serialize;

/// Paths `doctor pod --exec` lists in the container (Debian/Ubuntu multiarch and RPM layouts).
pub const PROBE_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
    "/usr/lib/aarch64-linux-gnu/libibverbs.so.1",
    "/usr/lib64/libibverbs.so.1",
    "/usr/lib/x86_64-linux-gnu/libibverbs",
    "/usr/lib/aarch64-linux-gnu/libibverbs",
    "/usr/lib64/libibverbs",
];

/// What the listing showed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RdmaLibs {
    /// Path of `libibverbs.so.1`, if present.
    pub libibverbs: Option<String>,
    /// Path of the eRDMA provider, if present.
    pub erdma_provider: Option<String>,
    /// Other providers found (file names), e.g. `libmlx5-rdmav34.so`.
    pub other_providers: Vec<String>,
}

/// Parses `ls -1 <PROBE_PATHS…>` stdout (files first, then `dir:` blocks; missing paths only on
/// stderr).
pub fn parse_ls(stdout: &str) -> RdmaLibs {
    let mut libs = RdmaLibs::default();
    let mut dir: Option<String> = None;
    for line in stdout.lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        if let Some(d) = line.strip_suffix(':') {
            dir = Some(d.to_string());
            continue;
        }
        let path = match &dir {
            Some(d) if !line.starts_with('/') => format!("{d}/{line}"),
            _ => line.to_string(),
        };
        let file = path.rsplit('/').next().unwrap_or(&path).to_string();
        if file.starts_with("libibverbs.so") && !path.contains("/libibverbs/") {
            libs.libibverbs.get_or_insert(path);
        } else if file.contains("-rdmav") && file.ends_with(".so") {
            if file.starts_with("liberdma-") {
                libs.erdma_provider.get_or_insert(path);
            } else if !libs.other_providers.contains(&file) {
                libs.other_providers.push(file);
            }
        }
    }
    libs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ubuntu_with_erdma_provider() {
        let out = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1\n\n/usr/lib/x86_64-linux-gnu/libibverbs:\nlibefa-rdmav34.so\nliberdma-rdmav34.so\nlibmlx5-rdmav34.so\n";
        let l = parse_ls(out);
        assert_eq!(
            l.libibverbs.as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
        );
        assert_eq!(
            l.erdma_provider.as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libibverbs/liberdma-rdmav34.so")
        );
        assert_eq!(
            l.other_providers,
            vec!["libefa-rdmav34.so", "libmlx5-rdmav34.so"]
        );
    }

    #[test]
    fn stock_jammy_providers_lack_erdma() {
        // Ubuntu 22.04's ibverbs-providers (rdma-core 39) has no erdma provider.
        let out = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1\n\n/usr/lib/x86_64-linux-gnu/libibverbs:\nlibmlx5-rdmav34.so\nlibrxe-rdmav34.so\n";
        let l = parse_ls(out);
        assert!(l.libibverbs.is_some());
        assert_eq!(l.erdma_provider, None);
        assert_eq!(parse_ls(""), RdmaLibs::default());
    }
}
