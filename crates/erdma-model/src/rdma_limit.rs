//! Per-container RDMA limits (the kernel's rdma cgroup, `rdma.max`) and the locked-memory limit
//! RDMA registration needs, as users write them.
//!
//! `rdma.max` takes one device per write: `<ibdev> hca_handle=<N|max> hca_object=<N|max>`
//! (`hca_handle` counts verbs contexts, i.e. opened devices; `hca_object` counts QPs, CQs, MRs,
//! PDs, ...). Users give the limits without the device (`hca_handle=2 hca_object=1000`); the
//! device is the one the container was allocated.

use std::fmt;

/// The pod annotation that sets `rdma.max` for the pod's containers holding `aliyun/erdma`.
pub const RDMA_MAX_ANNOTATION: &str = "network.alibabacloud.com/erdma-rdma-max";

/// One limit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max`: no limit.
    Max,
    /// At most this many.
    Count(u32),
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Max => f.write_str("max"),
            Limit::Count(n) => write!(f, "{n}"),
        }
    }
}

/// The limits of one `rdma.max` line, without the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdmaLimit {
    /// Verbs contexts (`hca_handle`).
    pub hca_handle: Option<Limit>,
    /// Verbs objects (`hca_object`).
    pub hca_object: Option<Limit>,
}

/// Why a limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rdma limit {value:?} is not valid: {why}; write `hca_handle=<N|max>` and/or `hca_object=<N|max>` separated by a space, e.g. \"hca_handle=2 hca_object=2000\""
)]
pub struct RdmaLimitError {
    /// The value (cut to 120 characters).
    pub value: String,
    /// What is wrong.
    pub why: String,
}

impl RdmaLimit {
    /// Parses `hca_handle=N hca_object=M` strictly: known keys once each, decimal counts that fit
    /// the kernel's `int` (0..=2147483647) or `max`, at least one key.
    pub fn parse(s: &str) -> Result<Self, RdmaLimitError> {
        let err = |why: String| RdmaLimitError {
            value: s.chars().take(120).collect(),
            why,
        };
        let mut out = RdmaLimit::default();
        for part in s.split_ascii_whitespace() {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            let limit = match value {
                "max" => Limit::Max,
                v if !v.is_empty()
                    && v.bytes().all(|b| b.is_ascii_digit())
                    && (v.len() == 1 || !v.starts_with('0')) =>
                {
                    let n: u32 = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= i32::MAX as u32)
                        .ok_or_else(|| err(format!("{v} is larger than 2147483647")))?;
                    Limit::Count(n)
                }
                v => return Err(err(format!("{v:?} is neither a count nor max"))),
            };
            let slot = match key {
                "hca_handle" => &mut out.hca_handle,
                "hca_object" => &mut out.hca_object,
                k => return Err(err(format!("unknown key {k:?}"))),
            };
            if slot.replace(limit).is_some() {
                return Err(err(format!("{key} is given twice")));
            }
        }
        if out.hca_handle.is_none() && out.hca_object.is_none() {
            return Err(err("no limit given".into()));
        }
        Ok(out)
    }

    /// The `rdma.max` line for `device`.
    pub fn line(&self, device: &str) -> String {
        let mut s = device.to_string();
        if let Some(h) = self.hca_handle {
            s.push_str(&format!(" hca_handle={h}"));
        }
        if let Some(o) = self.hca_object {
            s.push_str(&format!(" hca_object={o}"));
        }
        s
    }

    /// Whether a cgroup whose limits for the device are `current` already has every limit this
    /// one sets (a key this one leaves out, a write leaves as it is too).
    pub fn held_by(&self, current: &RdmaLimit) -> bool {
        (self.hca_handle.is_none() || self.hca_handle == current.hca_handle)
            && (self.hca_object.is_none() || self.hca_object == current.hca_object)
    }
}

/// The limits of `device` in the text of a cgroup's `rdma.max` file (the kernel lists one
/// `<ibdev> hca_handle=<N|max> hca_object=<N|max>` line per RDMA device); `None` without a valid
/// line for it.
pub fn limits_of_device(rdma_max: &str, device: &str) -> Option<RdmaLimit> {
    rdma_max.lines().find_map(|l| {
        let (dev, limits) = l.trim().split_once(' ')?;
        if dev != device {
            return None;
        }
        RdmaLimit::parse(limits).ok()
    })
}

/// The `RLIMIT_MEMLOCK` given to containers holding `aliyun/erdma`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memlock {
    /// Leave the runtime's default.
    Off,
    /// `unlimited` (RLIM_INFINITY).
    Unlimited,
    /// At most this many bytes.
    Bytes(u64),
}

impl Memlock {
    /// Parses `off`, `unlimited`, or a byte count with an optional `K`/`M`/`G`/`T` (powers of 1024).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        match t {
            "off" => return Ok(Memlock::Off),
            "unlimited" => return Ok(Memlock::Unlimited),
            _ => {}
        }
        let (digits, shift) = match t.as_bytes().last() {
            Some(b'K' | b'k') => (&t[..t.len() - 1], 10),
            Some(b'M' | b'm') => (&t[..t.len() - 1], 20),
            Some(b'G' | b'g') => (&t[..t.len() - 1], 30),
            Some(b'T' | b't') => (&t[..t.len() - 1], 40),
            _ => (t, 0),
        };
        let bad = || {
            format!(
                "memlock {s:?} is not valid: write off, unlimited, or bytes with an optional K/M/G/T (e.g. 64G)"
            )
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        n.checked_mul(1u64 << shift)
            .map(Memlock::Bytes)
            .ok_or_else(bad)
    }

    /// The OCI rlimit value (`u64::MAX` is RLIM_INFINITY); `None` for [`Memlock::Off`].
    pub fn value(&self) -> Option<u64> {
        match self {
            Memlock::Off => None,
            Memlock::Unlimited => Some(u64::MAX),
            Memlock::Bytes(n) => Some(*n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_cgroups_rdma_max_file_is_read_per_device() {
        // As a v1 rdma cgroup's rdma.max reads with two devices, one limited.
        let file = "mlx5_0 hca_handle=max hca_object=max\nerdma_0 hca_handle=2 hca_object=max\n";
        let erdma = limits_of_device(file, "erdma_0").unwrap();
        assert_eq!(erdma.hca_handle, Some(Limit::Count(2)));
        assert_eq!(erdma.hca_object, Some(Limit::Max));
        assert_eq!(limits_of_device(file, "erdma_1"), None);
        assert_eq!(limits_of_device("erdma_0 hca_handle=x\n", "erdma_0"), None);
        assert_eq!(limits_of_device("", "erdma_0"), None);
        // A limit of hca_handle only is held whatever hca_object is; a different count is not.
        assert!(RdmaLimit::parse("hca_handle=2").unwrap().held_by(&erdma));
        assert!(
            RdmaLimit::parse("hca_handle=2 hca_object=max")
                .unwrap()
                .held_by(&erdma)
        );
        assert!(!RdmaLimit::parse("hca_handle=3").unwrap().held_by(&erdma));
        assert!(!RdmaLimit::parse("hca_object=10").unwrap().held_by(&erdma));
    }

    #[test]
    fn limits_parse_and_render() {
        let l = RdmaLimit::parse("hca_handle=2 hca_object=max").unwrap();
        assert_eq!(l.hca_handle, Some(Limit::Count(2)));
        assert_eq!(l.hca_object, Some(Limit::Max));
        assert_eq!(l.line("erdma_0"), "erdma_0 hca_handle=2 hca_object=max");
        assert_eq!(
            RdmaLimit::parse("  hca_object=1000 ").unwrap().line("rxe0"),
            "rxe0 hca_object=1000"
        );
        for bad in [
            "",
            "hca_handle",
            "hca_handle=-1",
            "hca_handle=01",
            "hca_handle=2 hca_handle=3",
            "hca_handles=2",
            "hca_handle=2147483648",
            "hca_handle=2,hca_object=3",
            "rxe0 hca_handle=2",
        ] {
            let e = RdmaLimit::parse(bad).unwrap_err();
            assert!(e.to_string().contains("hca_handle=<N|max>"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn memlock_values() {
        assert_eq!(Memlock::parse("unlimited").unwrap().value(), Some(u64::MAX));
        assert_eq!(Memlock::parse("off").unwrap().value(), None);
        assert_eq!(Memlock::parse("64G").unwrap(), Memlock::Bytes(64 << 30));
        assert_eq!(Memlock::parse("8192").unwrap(), Memlock::Bytes(8192));
        for bad in [
            "",
            "-1",
            "1.5G",
            "64GB",
            "99999999999999999999",
            "16777216T",
        ] {
            assert!(Memlock::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(s in ".{0,60}", h in proptest::option::of(0u32..=i32::MAX as u32), o in proptest::option::of(0u32..=i32::MAX as u32)) {
            let _ = RdmaLimit::parse(&s);
            let _ = Memlock::parse(&s);
            if h.is_some() || o.is_some() {
                let l = RdmaLimit { hca_handle: h.map(Limit::Count), hca_object: o.map(Limit::Count) };
                let line = l.line("dev");
                let back = RdmaLimit::parse(line.strip_prefix("dev").unwrap()).unwrap();
                prop_assert_eq!(back, l);
            }
        }
    }
}
