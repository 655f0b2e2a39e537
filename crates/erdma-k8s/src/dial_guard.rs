//! Where test tools may send packets: the fake API server's pod proxy and the lab's helpers dial
//! only loopback unless the lab names its own subnets ([`DialGuard::allow`]). A fixture's address
//! (a pod IP captured from a cluster, a node's InternalIP) is data to show, never a place to
//! connect to: without this guard a test that loaded such a fixture reached out of the machine.
//!
//! [`never_dialled`] is the other half: the addresses fixtures may hold (loopback, the
//! documentation ranges, link-local GIDs, masks) because no code path dials them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A network, `ADDRESS/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    base: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.89.0.0/24`, `fd00::/8` or a bare address (a /32 or /128).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = |why: &str| {
            format!("{text:?} is not a CIDR ({why}); write ADDRESS/PREFIX, e.g. 10.89.0.0/24")
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let base: IpAddr = addr.trim().parse().map_err(|_| bad("bad address"))?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad("bad prefix length"))?,
            None => max,
        };
        Ok(Cidr { base, prefix })
    }

    /// Whether `ip` is inside (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.base, ip) {
            (IpAddr::V4(b), IpAddr::V4(a)) => same_prefix(&b.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(b), IpAddr::V6(a)) => same_prefix(&b.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

fn same_prefix(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix % 8;
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[full] & mask == b[full] & mask
    }
}

/// `::ffff:a.b.c.d` as `a.b.c.d`; every other address as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// A destination a guard refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to dial {addr} (not loopback or a lab address): {context}; only 127.0.0.0/8 and ::1{allowed} are dialled. Fix: point the test at a local listener, or name the lab's subnet with --allow-dial"
)]
pub struct DialRefused {
    /// The destination.
    pub addr: SocketAddr,
    /// What was about to dial it.
    pub context: String,
    allowed: String,
}

/// The destinations a test tool may dial: loopback, and the CIDRs given to [`DialGuard::allow`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DialGuard {
    allowed: Vec<Cidr>,
}

impl DialGuard {
    /// Loopback only.
    pub fn loopback_only() -> DialGuard {
        DialGuard::default()
    }

    /// Also allows `cidr` (the lab's own subnets, named by the lab's scripts).
    pub fn allow(&mut self, cidr: Cidr) {
        if !self.allowed.contains(&cidr) {
            self.allowed.push(cidr);
        }
    }

    /// The CIDRs allowed besides loopback.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allowed
    }

    /// `Ok` when `addr` may be dialled; `context` names the caller in the error.
    pub fn check(&self, addr: SocketAddr, context: &str) -> Result<(), DialRefused> {
        let ip = canonical(addr.ip());
        if ip.is_loopback() || self.allowed.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        let allowed: String = self.allowed.iter().map(|c| format!(", {c}")).collect();
        Err(DialRefused {
            addr,
            context: context.to_string(),
            allowed,
        })
    }

    /// Resolves `host:port` and checks every address it names (a name that resolves to a
    /// refused address is refused); returns the addresses to dial.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        context: &str,
    ) -> Result<Vec<SocketAddr>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("{context}: resolve {host}: {e}"))?
                .collect(),
        };
        for a in &addrs {
            self.check(*a, context).map_err(|e| e.to_string())?;
        }
        Ok(addrs)
    }
}

const DOCUMENTATION_V4: [(Ipv4Addr, u8); 3] = [
    (Ipv4Addr::new(192, 0, 2, 0), 24),
    (Ipv4Addr::new(198, 51, 100, 0), 24),
    (Ipv4Addr::new(203, 0, 113, 0), 24),
];

/// Whether `ip` is one fixtures may hold because nothing dials it: loopback, unspecified, the
/// documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32),
/// IPv6 link-local (a GID made from a MAC: it needs an interface to be dialled), the reserved
/// `::/8` that is not an IPv4-mapped address (an iWARP GID holding a MAC), `0.0.0.0/8`,
/// the broadcast address and IPv4 netmasks (`255.255.255.0`).
pub fn never_dialled(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            v4.is_loopback()
                || v4.octets()[0] == 0
                || v4.is_broadcast()
                || bits.leading_ones() + bits.trailing_zeros() == 32
                || DOCUMENTATION_V4
                    .iter()
                    .any(|(net, p)| same_prefix(&net.octets(), &v4.octets(), *p))
        }
        IpAddr::V6(v6) => {
            let doc = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0);
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.segments()[0] < 0x0100
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || same_prefix(&doc.octets(), &v6.octets(), 32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn loopback_passes_and_anything_else_is_refused_by_name() {
        let g = DialGuard::loopback_only();
        assert!(g.check(sa("127.0.0.1:80"), "t").is_ok());
        assert!(g.check(sa("127.8.9.1:80"), "t").is_ok());
        assert!(g.check(sa("[::1]:80"), "t").is_ok());
        assert!(g.check(sa("[::ffff:127.0.0.1]:80"), "t").is_ok());
        let e = g
            .check(sa("10.1.2.3:443"), "the pod proxy for kube-system/agent")
            .expect_err("private");
        assert_eq!(e.addr, sa("10.1.2.3:443"));
        let text = e.to_string();
        assert!(
            text.starts_with(
                "refusing to dial 10.1.2.3:443 (not loopback or a lab address): the pod proxy for kube-system/agent;"
            ),
            "{text}"
        );
        for refused in [
            "8.8.8.8:53",
            "[fd00::1]:80",
            "[::ffff:10.0.0.1]:80",
            "192.0.2.1:80",
        ] {
            assert!(g.check(sa(refused), "t").is_err(), "{refused}");
        }
    }

    #[test]
    fn a_lab_subnet_is_dialled_only_once_allowed() {
        let mut g = DialGuard::loopback_only();
        g.allow(Cidr::parse("10.89.0.0/24").expect("cidr"));
        assert!(g.check(sa("10.89.0.7:9101"), "t").is_ok());
        assert!(g.check(sa("[::ffff:10.89.0.7]:9101"), "t").is_ok());
        let e = g.check(sa("10.89.1.7:9101"), "t").expect_err("outside /24");
        assert!(
            e.to_string()
                .contains("127.0.0.0/8 and ::1, 10.89.0.0/24 are dialled"),
            "{e}"
        );
        g.allow(Cidr::parse("fd00:77::/32").expect("cidr"));
        assert!(g.check(sa("[fd00:77:1::2]:1"), "t").is_ok());
        assert!(g.check(sa("[fd00:78::2]:1"), "t").is_err());
    }

    #[test]
    fn cidrs_parse_with_errors_that_show_the_form() {
        assert_eq!(
            Cidr::parse("10.0.0.0/8").expect("ok").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            Cidr::parse("10.77.0.1").expect("ok").to_string(),
            "10.77.0.1/32"
        );
        assert!(
            Cidr::parse("10.77.0.1/7")
                .expect("ok")
                .contains("11.1.1.1".parse().expect("ip"))
        );
        for bad in ["10.0.0.0/33", "10.0.0/8", "fd00::/129", "lab", "10.0.0.0/x"] {
            let e = Cidr::parse(bad).expect_err(bad);
            assert!(e.contains("ADDRESS/PREFIX, e.g. 10.89.0.0/24"), "{e}");
        }
    }

    #[tokio::test]
    async fn a_name_is_resolved_and_each_address_checked() {
        let g = DialGuard::loopback_only();
        let ok = g.resolve("localhost", 80, "t").await.expect("localhost");
        assert!(ok.iter().all(|a| a.ip().is_loopback()), "{ok:?}");
        let e = g
            .resolve("203.0.113.9", 80, "t")
            .await
            .expect_err("doc range");
        assert!(e.starts_with("refusing to dial 203.0.113.9:80"), "{e}");
    }

    #[test]
    fn fixtures_may_hold_only_addresses_nothing_dials() {
        for ok in [
            "127.0.0.1",
            "0.0.0.0",
            "::",
            "::1",
            "192.0.2.23",
            "198.51.100.7",
            "203.0.113.250",
            "2001:db8::1",
            "fe80::5054:ff:fe12:3456",
            "255.255.255.0",
            "255.255.255.255",
            "255.255.240.0",
            "::ffff:192.0.2.1",
        ] {
            assert!(never_dialled(ok.parse().expect(ok)), "{ok}");
        }
        for dialable in [
            "10.0.1.23",
            "172.20.1.17",
            "192.168.77.1",
            "100.100.100.200",
            "8.8.8.8",
            "fd00:77::1",
            "2400:3200::1",
            "::ffff:10.0.1.23",
            "255.0.255.0",
            "169.254.169.254",
            "224.0.0.251",
        ] {
            assert!(
                !never_dialled(dialable.parse().expect(dialable)),
                "{dialable}"
            );
        }
    }
}
