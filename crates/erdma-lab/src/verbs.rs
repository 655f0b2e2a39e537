//! The few libibverbs calls the lab's resource probes make, through `dlopen`: device contexts
//! (each one is an `hca_handle` of the rdma cgroup) and a memory registration (pinned pages,
//! bounded by `RLIMIT_MEMLOCK`). Loading the library at run time keeps the build free of
//! rdma-core; the lab image has `libibverbs.so.1` and the rxe provider.
//!
//! Every failure carries the errno the kernel returned, which is what the lab asserts on.

use nix::libc;
use std::ffi::{CStr, CString, c_char, c_int, c_void};

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// `libibverbs.so.1` or one of its symbols could not be loaded.
    #[error("cannot load {what} from libibverbs.so.1: {why} (is rdma-core installed?)")]
    Load {
        /// Library or symbol.
        what: String,
        /// `dlerror()`.
        why: String,
    },
    /// No RDMA device of that name is visible.
    #[error("no RDMA device {name:?} (visible: {visible:?})")]
    NoDevice {
        /// Asked for.
        name: String,
        /// What `ibv_get_device_list` returned.
        visible: Vec<String>,
    },
    /// A verbs call returned NULL or non-zero.
    #[error("{call} failed: {errno}")]
    Call {
        /// The function.
        call: &'static str,
        /// The errno it left.
        errno: std::io::Error,
    },
    /// A size that cannot be mapped.
    #[error("cannot map {size} bytes: {errno}")]
    Map {
        /// Bytes.
        size: usize,
        /// The errno.
        errno: std::io::Error,
    },
}

impl VerbsError {
    /// The errno of a failed call, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Call { errno, .. } | VerbsError::Map { errno, .. } => errno.raw_os_error(),
            _ => None,
        }
    }
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type DeregMr = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `IBV_ACCESS_LOCAL_WRITE`.
const ACCESS_LOCAL_WRITE: c_int = 1;

/// libibverbs, loaded; the library stays loaded for the life of the process.
pub struct Verbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn last_errno(call: &'static str) -> VerbsError {
    VerbsError::Call {
        call,
        errno: std::io::Error::last_os_error(),
    }
}

/// An open device context; closed on drop.
pub struct Context<'v> {
    verbs: &'v Verbs,
    ctx: *mut c_void,
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device and is closed once.
        unsafe { (self.verbs.close_device)(self.ctx) };
    }
}

impl Verbs {
    /// Loads `libibverbs.so.1` and the symbols the probes use.
    pub fn load() -> Result<Self, VerbsError> {
        let name = c"libibverbs.so.1";
        // SAFETY: a NUL-terminated name; the handle is never closed, so symbols stay valid.
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err(VerbsError::Load {
                what: "the library".into(),
                why: dl_error(),
            });
        }
        let sym = |s: &str| -> Result<*mut c_void, VerbsError> {
            let c = CString::new(s).map_err(|e| VerbsError::Load {
                what: s.into(),
                why: e.to_string(),
            })?;
            // SAFETY: lib is a live handle, c a NUL-terminated name.
            let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
            if p.is_null() {
                Err(VerbsError::Load {
                    what: s.into(),
                    why: dl_error(),
                })
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol has the C signature of its type alias (libibverbs' verbs.h); the
        // default symbol versions are the current ABI.
        unsafe {
            Ok(Self {
                get_device_list: std::mem::transmute::<*mut c_void, GetDeviceList>(sym(
                    "ibv_get_device_list",
                )?),
                free_device_list: std::mem::transmute::<*mut c_void, FreeDeviceList>(sym(
                    "ibv_free_device_list",
                )?),
                get_device_name: std::mem::transmute::<*mut c_void, GetDeviceName>(sym(
                    "ibv_get_device_name",
                )?),
                open_device: std::mem::transmute::<*mut c_void, OpenDevice>(sym(
                    "ibv_open_device",
                )?),
                close_device: std::mem::transmute::<*mut c_void, CloseDevice>(sym(
                    "ibv_close_device",
                )?),
                alloc_pd: std::mem::transmute::<*mut c_void, AllocPd>(sym("ibv_alloc_pd")?),
                dealloc_pd: std::mem::transmute::<*mut c_void, DeallocPd>(sym("ibv_dealloc_pd")?),
                reg_mr: std::mem::transmute::<*mut c_void, RegMr>(sym("ibv_reg_mr")?),
                dereg_mr: std::mem::transmute::<*mut c_void, DeregMr>(sym("ibv_dereg_mr")?),
            })
        }
    }

    /// Opens a new context on device `name` (one `hca_handle` of the caller's rdma cgroup).
    pub fn open(&self, name: &str) -> Result<Context<'_>, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer; the list is freed below on every path.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(last_errno("ibv_get_device_list"));
        }
        let count = usize::try_from(n).unwrap_or(0);
        let mut visible = Vec::with_capacity(count);
        let mut found = None;
        for i in 0..count {
            // SAFETY: the list holds n device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a device of the list; the name is NUL-terminated.
            let dn = unsafe { CStr::from_ptr((self.get_device_name)(dev)) }
                .to_string_lossy()
                .into_owned();
            if dn == name {
                found = Some(dev);
            }
            visible.push(dn);
        }
        let result = match found {
            None => Err(VerbsError::NoDevice {
                name: name.into(),
                visible,
            }),
            Some(dev) => {
                // SAFETY: dev is valid until the list is freed; a context outlives the list.
                let ctx = unsafe { (self.open_device)(dev) };
                if ctx.is_null() {
                    Err(last_errno("ibv_open_device"))
                } else {
                    Ok(Context { verbs: self, ctx })
                }
            }
        };
        // SAFETY: list came from ibv_get_device_list and is freed once.
        unsafe { (self.free_device_list)(list) };
        result
    }
}

impl Context<'_> {
    /// Registers `size` bytes of fresh anonymous memory (protection domain, memory region), then
    /// releases them again. The kernel pins the pages, which `RLIMIT_MEMLOCK` bounds for a
    /// process without `CAP_IPC_LOCK`.
    pub fn register(&self, size: usize) -> Result<(), VerbsError> {
        let v = self.verbs;
        // SAFETY: ctx is an open context.
        let pd = unsafe { (v.alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(last_errno("ibv_alloc_pd"));
        }
        // SAFETY: an anonymous private mapping, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let result = if addr == libc::MAP_FAILED {
            Err(VerbsError::Map {
                size,
                errno: std::io::Error::last_os_error(),
            })
        } else {
            // SAFETY: pd is live; [addr, addr+size) is mapped read-write.
            let mr = unsafe { (v.reg_mr)(pd, addr, size, ACCESS_LOCAL_WRITE) };
            let r = if mr.is_null() {
                Err(last_errno("ibv_reg_mr"))
            } else {
                // SAFETY: mr came from ibv_reg_mr.
                unsafe { (v.dereg_mr)(mr) };
                Ok(())
            };
            // SAFETY: the mapping made above, no longer registered.
            unsafe { libc::munmap(addr, size) };
            r
        };
        // SAFETY: pd came from ibv_alloc_pd, its only MR is gone.
        unsafe { (v.dealloc_pd)(pd) };
        result
    }
}

/// `RLIMIT_MEMLOCK` of this process as (soft, hard); `None` is unlimited.
pub fn memlock_limit() -> (Option<u64>, Option<u64>) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    let f = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    (f(r.rlim_cur), f(r.rlim_max))
}

/// Parses a size: bytes with an optional `K`, `M` or `G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a size (bytes with an optional K, M or G)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn memlock_limit_is_what_proc_shows() {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max locked memory"))
            .unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        let value = |s: &str| (s != "unlimited").then(|| s.parse::<u64>().unwrap());
        assert_eq!(memlock_limit(), (value(cols[3]), value(cols[4])), "{line}");
    }
}
