//! IPv4 addresses of network interfaces.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Looks up the IPv4 addresses of interfaces in the current network namespace.
pub trait InterfaceAddrs: Send + Sync {
    /// Addresses by interface name. An error is reported as text naming what failed.
    fn ipv4_by_interface(&self) -> Result<BTreeMap<String, Vec<Ipv4Addr>>, String>;
}

/// The live system, through `getifaddrs(3)` (netlink underneath).
#[derive(Debug, Clone, Default)]
pub struct LiveInterfaceAddrs;

impl InterfaceAddrs for LiveInterfaceAddrs {
    fn ipv4_by_interface(&self) -> Result<BTreeMap<String, Vec<Ipv4Addr>>, String> {
        let mut out: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
        let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs failed: {e}"))?;
        for ifa in addrs {
            let Some(v4) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) else {
                continue;
            };
            out.entry(ifa.interface_name.clone())
                .or_default()
                .push(v4.ip());
        }
        Ok(out)
    }
}

/// No interfaces: used when the sysfs root is a captured tree whose interfaces do not exist here.
#[derive(Debug, Clone, Default)]
pub struct NoInterfaceAddrs;

impl InterfaceAddrs for NoInterfaceAddrs {
    fn ipv4_by_interface(&self) -> Result<BTreeMap<String, Vec<Ipv4Addr>>, String> {
        Ok(BTreeMap::new())
    }
}
