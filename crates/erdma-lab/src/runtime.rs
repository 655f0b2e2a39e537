//! Runs a [`PodPlan`]: the Linux system calls that make a pod.
//!
//! Order matters and is the reason this module exists:
//! 1. everything on the node is looked at first: the type and major:minor of each device node,
//!    and each mount source must exist (`/dev` is covered by a tmpfs later, so the pod's init
//!    takes `O_PATH` handles on the sources before it mounts anything);
//! 2. the network namespace is joined (`setns`) or created (`unshare`, then `lo` up);
//! 3. new mount, UTS, IPC and PID namespaces; `/` becomes private so nothing leaks back;
//! 4. a child (PID 1 of the pod) mounts its own `/proc`, a `/sys` of its network namespace, a
//!    tmpfs `/dev` with only the planned nodes, devpts, `/dev/shm`, a private `/tmp`, the bind
//!    mounts, and makes the node's root read-only in its mount namespace; it then
//!    forks the command (PID 2), forwards SIGINT/SIGTERM/SIGHUP to it and reaps orphans, as a
//!    container's init does;
//! 5. the caller waits and exits with the command's status (128 + signal if it was killed).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use nix::sys::stat::{Mode, SFlag, mknod, stat, umask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, execvpe, fork, sethostname};

use crate::plan::{BindMount, DeviceNode, Network, PodPlan};

/// Why a pod could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Not running as root.
    #[error(
        "erdma-labpod must run as root (it creates namespaces and device nodes); run it with sudo or inside the lab VM"
    )]
    NotRoot,
    /// A planned device node is missing on the node or not a device.
    #[error(
        "device {host} for the pod's {container}: {reason}; is the RDMA driver loaded and the device plugin's answer current?"
    )]
    Device {
        /// Host path.
        host: String,
        /// Container path.
        container: String,
        /// What is wrong.
        reason: String,
    },
    /// `lo` could not be brought up in a new network namespace.
    #[error("new network namespace: {0}")]
    Loopback(#[from] crate::link::LinkError),
    /// A system call failed.
    #[error("{what}: {cause}")]
    Sys {
        /// What was being done, naming the object.
        what: String,
        /// The errno.
        cause: nix::Error,
    },
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::Error) -> RuntimeError {
    let what = what.into();
    move |cause| RuntimeError::Sys { what, cause }
}

/// A device node as found on the node.
struct HostNode {
    plan: DeviceNode,
    kind: SFlag,
    rdev: u64,
}

/// A mount source held open across the `/dev` overmount.
struct HostMount {
    plan: BindMount,
    fd: OwnedFd,
    is_dir: bool,
}

/// Starts the pod and waits for it; returns the exit status to exit with.
pub fn run(plan: &PodPlan) -> Result<i32, RuntimeError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(RuntimeError::NotRoot);
    }
    let nodes = plan
        .devices
        .iter()
        .map(inspect_device)
        .collect::<Result<Vec<_>, _>>()?;
    // fail before creating anything when a mount source is missing; the handles used for the
    // bind mounts are taken again inside the pod's mount namespace (a bind mount cannot take
    // its source from another mount namespace)
    drop(
        plan.mounts
            .iter()
            .map(open_mount)
            .collect::<Result<Vec<_>, _>>()?,
    );

    match &plan.network {
        Network::Named(name) => {
            let path = Path::new("/run/netns").join(name);
            let fd = open(&path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).map_err(
                sys(format!(
                    "open network namespace {} (create it with `ip netns add {name}`)",
                    path.display()
                )),
            )?;
            setns(fd, CloneFlags::CLONE_NEWNET)
                .map_err(sys(format!("join network namespace {name}")))?;
        }
        Network::New => {
            unshare(CloneFlags::CLONE_NEWNET).map_err(sys("create a network namespace"))?;
            loopback_up()?;
        }
    }
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWPID,
    )
    .map_err(sys("create mount, UTS, IPC and PID namespaces"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make / private in the pod's mount namespace"))?;
    sethostname(&plan.name).map_err(sys(format!("set hostname {}", plan.name)))?;

    // SAFETY: the process is single-threaded here (the binary starts no threads), so the child
    // may run arbitrary code after fork.
    match unsafe { fork() }.map_err(sys("fork the pod's init"))? {
        ForkResult::Child => {
            let code = match pod_init(plan, &nodes) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("erdma-labpod: pod {}: {e}", plan.name);
                    125
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            forward_signals_to(child)?;
            wait_for(child)
        }
    }
}

fn inspect_device(d: &DeviceNode) -> Result<HostNode, RuntimeError> {
    let err = |reason: String| RuntimeError::Device {
        host: d.host_path.display().to_string(),
        container: d.container_path.display().to_string(),
        reason,
    };
    let st = stat(&d.host_path).map_err(|e| err(format!("cannot stat it ({e})")))?;
    let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if kind != SFlag::S_IFCHR && kind != SFlag::S_IFBLK {
        return Err(err("it is not a character or block device".to_owned()));
    }
    Ok(HostNode {
        plan: d.clone(),
        kind,
        rdev: st.st_rdev,
    })
}

fn open_mount(m: &BindMount) -> Result<HostMount, RuntimeError> {
    let fd = open(
        &m.host_path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys(format!(
        "open mount source {} for {}",
        m.host_path.display(),
        m.container_path.display()
    )))?;
    let is_dir = std::fs::metadata(&m.host_path)
        .map(|md| md.is_dir())
        .unwrap_or(false);
    Ok(HostMount {
        plan: m.clone(),
        fd,
        is_dir,
    })
}

fn loopback_up() -> Result<(), RuntimeError> {
    Ok(crate::link::set_link("lo", true)?)
}

/// PID 1 of the pod: builds the filesystem view, runs the command, reaps.
fn pod_init(plan: &PodPlan, nodes: &[HostNode]) -> Result<i32, RuntimeError> {
    umask(Mode::empty());
    let mounts = plan
        .mounts
        .iter()
        .map(open_mount)
        .collect::<Result<Vec<_>, _>>()?;
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    remount("proc", "/proc", "proc", nosuid, None)?;
    remount("sysfs", "/sys", "sysfs", nosuid | MsFlags::MS_RDONLY, None)?;
    remount(
        "tmpfs",
        "/dev",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=755,size=1m"),
    )?;
    for n in nodes {
        make_node(n)?;
    }
    mkdir_all(Path::new("/dev/pts"))?;
    mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(sys("mount devpts on /dev/pts"))?;
    mkdir_all(Path::new("/dev/shm"))?;
    mount(
        Some("shm"),
        "/dev/shm",
        Some("tmpfs"),
        nosuid,
        Some("mode=1777,size=64m"),
    )
    .map_err(sys("mount tmpfs on /dev/shm"))?;
    for (link, target) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, link)
            .map_err(|e| io_err(format!("symlink {link}"), e))?;
    }
    // a private /tmp, then the bind mounts (their mount points may live in it), then the node's
    // root becomes read-only in this mount namespace only (a per-mount flag, not the superblock)
    remount(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=64m"),
    )?;
    for m in &mounts {
        bind(m)?;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(sys("make the node's root file system read-only in the pod"))?;
    std::env::set_current_dir("/").map_err(|e| io_err("chdir /", e))?;

    let argv: Vec<CString> = plan
        .command
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = plan
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    // SAFETY: still single-threaded.
    match unsafe { fork() }.map_err(sys("fork the pod's command"))? {
        ForkResult::Child => {
            let err = execvpe(&argv[0], &argv, &envp).unwrap_err();
            eprintln!(
                "erdma-labpod: cannot run {:?} in pod {}: {err}",
                plan.command[0], plan.name
            );
            std::process::exit(127);
        }
        ForkResult::Parent { child } => {
            forward_signals_to(child)?;
            wait_for(child)
        }
    }
}

fn cstring(s: &str) -> Result<CString, RuntimeError> {
    CString::new(s).map_err(|_| RuntimeError::Sys {
        what: format!("argument or environment {s:?} contains NUL"),
        cause: nix::Error::EINVAL,
    })
}

fn io_err(what: impl Into<String>, e: std::io::Error) -> RuntimeError {
    RuntimeError::Sys {
        what: what.into(),
        cause: nix::Error::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
    }
}

fn mkdir_all(p: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(p)
        .map_err(|e| io_err(format!("create directory {}", p.display()), e))
}

/// Replaces whatever is mounted on `target` (lazily detached) by a fresh mount.
fn remount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), RuntimeError> {
    match umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) => {}
        Err(e) => {
            return Err(RuntimeError::Sys {
                what: format!("detach the node's {target}"),
                cause: e,
            });
        }
    }
    mkdir_all(Path::new(target))?;
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(sys(format!("mount {fstype} on {target}")))
}

fn make_node(n: &HostNode) -> Result<(), RuntimeError> {
    let path = &n.plan.container_path;
    if let Some(parent) = path.parent() {
        mkdir_all(parent)?;
    }
    let mode = Mode::from_bits_truncate(n.plan.mode);
    mknod(path, n.kind, mode, n.rdev).map_err(sys(format!(
        "create device node {} ({}:{})",
        path.display(),
        nix::sys::stat::major(n.rdev),
        nix::sys::stat::minor(n.rdev)
    )))
}

fn bind(m: &HostMount) -> Result<(), RuntimeError> {
    let target: &PathBuf = &m.plan.container_path;
    if m.is_dir {
        mkdir_all(target)?;
    } else {
        if let Some(parent) = target.parent() {
            mkdir_all(parent)?;
        }
        if !target.exists() {
            std::fs::File::create(target)
                .map_err(|e| io_err(format!("create mount point {}", target.display()), e))?;
        }
    }
    let src = format!("/proc/self/fd/{}", m.fd.as_raw_fd());
    let what = format!(
        "bind-mount {} on {}",
        m.plan.host_path.display(),
        target.display()
    );
    mount(
        Some(src.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(sys(what.clone()))?;
    if m.plan.read_only {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(sys(format!("{what} read-only")))?;
    }
    Ok(())
}

static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: nix::libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { nix::libc::kill(pid, sig) };
    }
}

fn forward_signals_to(child: Pid) -> Result<(), RuntimeError> {
    FORWARD_TO.store(child.as_raw(), Ordering::SeqCst);
    let action = SigAction::new(
        SigHandler::Handler(forward),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only reads an atomic and calls kill(2).
        unsafe { sigaction(sig, &action) }.map_err(sys(format!("install a {sig} handler")))?;
    }
    Ok(())
}

/// Waits for `child`, reaping any other child (orphans re-parented to a pod's PID 1) meanwhile.
fn wait_for(child: Pid) -> Result<i32, RuntimeError> {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => return Ok(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => return Ok(128 + sig as i32),
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => {
                return Err(RuntimeError::Sys {
                    what: format!("wait for process {child}"),
                    cause: e,
                });
            }
        }
    }
}
