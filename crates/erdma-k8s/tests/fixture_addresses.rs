//! Fixtures hold only addresses nothing dials: loopback, the documentation ranges and the other
//! kinds `erdma_k8s::dial_guard::never_dialled` accepts. A fixture with a private or public
//! address once made the fake API server's pod proxy connect out of the machine; this walk
//! keeps such an address out of every fixture directory.

use erdma_k8s::dial_guard::never_dialled;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The directories of captured and written test data, relative to the repository root.
/// `*` stands for every crate or binary directory.
const FIXTURE_DIRS: &[&str] = &[
    "testdata",
    "crates/*/testdata",
    "crates/*/tests/snapshots",
    "bins/*/tests/snapshots",
    "deploy/helm/ci/values",
    "deploy/helm/ci/contract",
    "deploy/helm/ci/upgrade",
    "examples/pytorch-mnist/manifests",
];

fn word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// IPv4 literals: four dotted decimal octets not glued to a word (`v1.2.3.4`) or to more
/// dotted numbers (a version `5.10.134.1.2`). A node name `cn-hangzhou.10.0.1.23` counts.
fn ipv4_literals(text: &str) -> Vec<(usize, String, IpAddr)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        let run = &text[start..i];
        let lead = run.len() - run.trim_start_matches('.').len();
        let trimmed = run.trim_matches('.');
        let (s, e) = (start + lead, start + lead + trimmed.len());
        let glued_before = lead == 0 && s > 0 && word(b[s - 1]);
        let glued_after = e == i && e < b.len() && word(b[e]);
        let parts: Vec<&str> = trimmed.split('.').collect();
        if glued_before || glued_after || parts.len() != 4 {
            continue;
        }
        if parts
            .iter()
            .all(|p| (1..=3).contains(&p.len()) && p.parse::<u8>().is_ok())
            && let Ok(ip) = trimmed.parse::<IpAddr>()
        {
            out.push((s, trimmed.to_string(), ip));
        }
    }
    out
}

/// IPv6 literals: a run of hex digits and colons with at least two colons that parses as an
/// address, not glued to a word (`std::net`) and not the head of a dotted IPv4 tail
/// (`::ffff:192.0.2.1`, whose IPv4 part [`ipv4_literals`] finds).
fn ipv6_literals(text: &str) -> Vec<(usize, String, IpAddr)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_hexdigit() || b[i] == b':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_hexdigit() || b[i] == b':') {
            i += 1;
        }
        let run = &text[start..i];
        let glued =
            (start > 0 && word(b[start - 1])) || (i < b.len() && (word(b[i]) || b[i] == b'.'));
        if glued || run.matches(':').count() < 2 {
            continue;
        }
        let candidates = [run, run.strip_suffix(':').unwrap_or(run)];
        if let Some((lit, ip)) = candidates
            .iter()
            .find_map(|c| c.parse::<std::net::Ipv6Addr>().ok().map(|ip| (*c, ip)))
        {
            out.push((start, lit.to_string(), IpAddr::V6(ip)));
        }
    }
    out
}

/// Each dialable address in `text`: line number, the literal, the address.
fn dialable(text: &str) -> Vec<(usize, String, IpAddr)> {
    let mut found: Vec<_> = ipv4_literals(text);
    found.extend(ipv6_literals(text));
    found.sort_by_key(|(at, _, _)| *at);
    found
        .into_iter()
        .filter(|(_, _, ip)| !never_dialled(*ip))
        .map(|(at, lit, ip)| (text[..at].matches('\n').count() + 1, lit, ip))
        .collect()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn expand(pattern: &str) -> Vec<PathBuf> {
    let root = repo_root();
    match pattern.split_once("/*/") {
        None => vec![root.join(pattern)],
        Some((parent, rest)) => std::fs::read_dir(root.join(parent))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.path().join(rest))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.filter_map(|e| e.ok()) {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(&path, files),
            Ok(t) if t.is_file() => files.push(path),
            _ => {}
        }
    }
}

#[test]
fn no_fixture_holds_an_address_a_test_could_dial() {
    let root = repo_root();
    let mut files = Vec::new();
    for pattern in FIXTURE_DIRS {
        for dir in expand(pattern) {
            walk(&dir, &mut files);
        }
    }
    files.sort();
    assert!(
        files.len() > 600,
        "the walk found only {} fixture files under {FIXTURE_DIRS:?}: did the layout move?",
        files.len()
    );
    let mut offences = Vec::new();
    for file in &files {
        let Ok(bytes) = std::fs::read(file) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        for (line, lit, ip) in dialable(&text) {
            let shown = file.strip_prefix(&root).unwrap_or(file).display();
            offences.push(format!("{shown}:{line}: {lit} ({ip})"));
        }
    }
    assert!(
        offences.is_empty(),
        "fixtures hold {} addresses a test could dial (private or public). Fix: rewrite them into \
         192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 or 2001:db8::/32 (RFC 5737/3849), keeping \
         the data's shape:\n{}",
        offences.len(),
        offences.join("\n")
    );
}

#[test]
fn the_scan_finds_addresses_in_every_form_fixtures_write_them() {
    let text = "node cn-hangzhou.10.0.1.23 InternalIP 10.0.1.23\n\
                podCIDR 172.20.1.0/24; OOB eth0:10.0.1.24<0>\n\
                gid 0000:0000:0000:0000:0000:ffff:0a00:0117\n\
                GID[  1]: ::ffff:192.168.77.1, RoCE v2\n\
                ula fd00:77::1 and \"2400:3200::1\"\n";
    let found: Vec<(usize, String)> = dialable(text)
        .into_iter()
        .map(|(line, lit, _)| (line, lit))
        .collect();
    let want = [
        (1, "10.0.1.23"),
        (1, "10.0.1.23"),
        (2, "172.20.1.0"),
        (2, "10.0.1.24"),
        (3, "0000:0000:0000:0000:0000:ffff:0a00:0117"),
        (4, "192.168.77.1"),
        (5, "fd00:77::1"),
        (5, "2400:3200::1"),
    ];
    let want: Vec<(usize, String)> = want.iter().map(|(l, s)| (*l, s.to_string())).collect();
    assert_eq!(found, want);
}

#[test]
fn versions_times_macs_paths_and_documentation_addresses_are_not_flagged() {
    let text = "NCCL version 2.28.9+cuda12.9; kernel 5.10.134-18.al8.x86_64; v1.2.3.4; \
                OID 1.3.6.1.4.1.2011; at 12:34:56.789 mac 52:54:00:12:34:56 pci 0000:00:05.0 \
                std::net::IpAddr; mask 255.255.255.0; 0.0.0.0/0; [::]:443; ::1; 127.0.0.1:6443; \
                192.0.2.23 198.51.100.7 203.0.113.17/24 2001:db8::5 fe80::5054:ff:fe12:3456 \
                fe80:0000:0000:0000:5054:00ff:fe12:3456 ::ffff:192.0.2.1";
    assert_eq!(dialable(text), Vec::new());
}
