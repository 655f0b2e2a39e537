//! A port's counters as sysfs shows them: `/sys/class/infiniband/<dev>/ports/<port>/hw_counters/*`
//! (the driver's counters, the same as `RDMA_NLDEV_CMD_STAT_GET` answers) and
//! `.../counters/*` (the InfiniBand port counters of the PMA, for drivers that have one; absent on
//! rxe). Each file holds one decimal number; files that are not (or unreadable ones) are skipped,
//! and so is `hw_counters/lifespan`, which the RDMA core adds to every `hw_counters/` directory:
//! it is how long (ms) the driver's values are cached, not a counter (seen on rxe in the lab: the
//! netlink answer has every other name and not this one).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Most files read per directory, and bytes per file.
const MAX_FILES: usize = 512;
const MAX_FILE_BYTES: u64 = 64;

/// The two counter directories of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SysfsCounters {
    /// `hw_counters/`: name → value.
    pub hw: BTreeMap<String, u64>,
    /// `counters/`: name → value (`port_xmit_data` and `port_rcv_data` count 4-byte words).
    pub pma: BTreeMap<String, u64>,
}

impl SysfsCounters {
    /// Bytes sent: `port_xmit_data` × 4 (the PMA counts octets divided by 4), when present.
    pub fn pma_bytes_sent(&self) -> Option<u64> {
        self.pma.get("port_xmit_data").map(|w| w.saturating_mul(4))
    }

    /// Bytes received: `port_rcv_data` × 4, when present.
    pub fn pma_bytes_received(&self) -> Option<u64> {
        self.pma.get("port_rcv_data").map(|w| w.saturating_mul(4))
    }
}

fn read_dir_numbers(dir: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten().take(MAX_FILES) {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Ok(f) = std::fs::File::open(e.path()) else {
            continue;
        };
        let mut s = String::new();
        if f.take(MAX_FILE_BYTES).read_to_string(&mut s).is_err() {
            continue;
        }
        if let Ok(v) = s.trim().parse::<u64>() {
            out.insert(name, v);
        }
    }
    out
}

/// Reads `<class_root>/<dev>/ports/<port>/{hw_counters,counters}`; `class_root` is
/// `/sys/class/infiniband` on a host. Missing directories read as empty.
pub fn port_counters(class_root: &Path, dev: &str, port: u32) -> SysfsCounters {
    let p = class_root.join(dev).join("ports").join(port.to_string());
    let mut hw = read_dir_numbers(&p.join("hw_counters"));
    hw.remove("lifespan");
    SysfsCounters {
        hw,
        pma: read_dir_numbers(&p.join("counters")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_directories_and_skips_what_is_not_a_number() {
        let root = std::env::temp_dir().join(format!("erdma-usage-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let port = root.join("erdma_0/ports/1");
        std::fs::create_dir_all(port.join("hw_counters")).unwrap();
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::write(port.join("hw_counters/tx_packets_cnt"), "12345\n").unwrap();
        std::fs::write(port.join("hw_counters/lifespan"), "10\n").unwrap();
        std::fs::write(port.join("hw_counters/garbage"), "n/a\n").unwrap();
        std::fs::write(port.join("counters/port_xmit_data"), "250\n").unwrap();
        std::fs::write(port.join("counters/port_rcv_data"), "25\n").unwrap();
        let c = port_counters(&root, "erdma_0", 1);
        let none = port_counters(&root, "erdma_0", 2);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(c.hw.get("tx_packets_cnt"), Some(&12345));
        assert!(!c.hw.contains_key("lifespan"));
        assert!(!c.hw.contains_key("garbage"));
        assert_eq!(
            (c.pma_bytes_sent(), c.pma_bytes_received()),
            (Some(1000), Some(100))
        );
        assert_eq!(none, SysfsCounters::default());
    }
}
