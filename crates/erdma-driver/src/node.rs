//! The real host: sysfs/procfs reads, and host commands run in the host's mount and cgroup
//! namespaces (joined with `setns` in the child before `exec`; no `nsenter` binary needed).

use crate::host::{Host, HostError, ModuleInfo};
use crate::plan::{Installer, ModuleParam};
use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `PATH` for host commands (the container's own `PATH` says nothing about the host).
pub const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The finished host command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CommandOutput {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    fn tail(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let t = text.trim();
        let start = t.char_indices().rev().nth(400).map(|(i, _)| i).unwrap_or(0);
        t[start..].to_string()
    }
}

/// Runs commands inside the mount and cgroup namespaces of a target process (PID 1 for the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNamespaces {
    pid: u32,
}

impl HostNamespaces {
    /// The host: PID 1's namespaces (the agent runs with `hostPID`).
    pub fn host() -> Self {
        HostNamespaces { pid: 1 }
    }

    /// The namespaces of process `pid`.
    pub fn of_pid(pid: u32) -> Self {
        HostNamespaces { pid }
    }

    /// Runs `program args…` with `env` (plus [`HOST_PATH`]) in the target namespaces, waiting at most
    /// `timeout` (then it is killed). `step` names the action in errors.
    pub fn run(
        &self,
        step: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<CommandOutput, HostError> {
        let open = |kind: &str| {
            File::open(format!("/proc/{}/ns/{kind}", self.pid)).map_err(|e| HostError::Command {
                step: step.to_string(),
                detail: format!("cannot open /proc/{}/ns/{kind}: {e}", self.pid),
                fix:
                    "run the agent with hostPID: true and the SYS_ADMIN and SYS_PTRACE capabilities"
                        .to_string(),
            })
        };
        let mnt = open("mnt")?;
        // Kernels without cgroup namespaces have no such file; the mount namespace alone then works.
        let cgroup = open("cgroup").ok();
        let mnt_fd = mnt.as_raw_fd();
        let cgroup_fd = cgroup.as_ref().map(|f| f.as_raw_fd());

        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", HOST_PATH)
            .env("LANG", "C")
            .envs(env.iter().copied())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only makes `setns` system
        // calls on descriptors that stay open in the parent until `spawn` returns; it allocates
        // nothing and takes no locks.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = cgroup_fd {
                    setns(BorrowedFd::borrow_raw(fd), CloneFlags::CLONE_NEWCGROUP)?;
                }
                setns(BorrowedFd::borrow_raw(mnt_fd), CloneFlags::CLONE_NEWNS)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| HostError::Command {
            step: step.to_string(),
            detail: format!(
                "cannot start {program} in the namespaces of PID {}: {e}",
                self.pid
            ),
            fix: format!("make sure {program} exists on the host and the agent has SYS_ADMIN"),
        })?;
        drop((mnt, cgroup));
        let pid = child.id();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = String::new();
            let mut err = String::new();
            let err_reader = std::thread::spawn(move || {
                if let Some(e) = stderr.as_mut() {
                    let _ = e.read_to_string(&mut err);
                }
                err
            });
            if let Some(o) = stdout.as_mut() {
                let _ = o.read_to_string(&mut out);
            }
            let err = err_reader.join().unwrap_or_default();
            let status = child.wait();
            let _ = tx.send((status, out, err));
        });
        match rx.recv_timeout(timeout) {
            Ok((Ok(status), stdout, stderr)) => Ok(CommandOutput {
                code: status.code(),
                stdout,
                stderr,
            }),
            Ok((Err(e), _, _)) => Err(HostError::Command {
                step: step.to_string(),
                detail: format!("waiting for {program}: {e}"),
                fix: "see agent logs".to_string(),
            }),
            Err(_) => {
                if let Ok(p) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::SIGKILL,
                    );
                }
                Err(HostError::Command {
                    step: step.to_string(),
                    detail: format!("{program} did not finish within {timeout:?} and was killed"),
                    fix: "check the node's network and package mirrors, then let the agent retry"
                        .to_string(),
                })
            }
        }
    }

    /// Like [`HostNamespaces::run`], but a non-zero exit is an error carrying the output's tail.
    pub fn run_ok(
        &self,
        step: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
        fix: &str,
    ) -> Result<CommandOutput, HostError> {
        let out = self.run(step, program, args, env, timeout)?;
        if out.success() {
            return Ok(out);
        }
        Err(HostError::Command {
            step: step.to_string(),
            detail: format!(
                "exit {}: {}",
                out.code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "by signal".to_string()),
                out.tail()
            ),
            fix: fix.to_string(),
        })
    }
}

/// The standard installer (seed §8): leave the agent's cgroup, unpack the tarball the agent
/// downloaded and verified (`ERDMA_INSTALLER_TARBALL`, see [`crate::fetch`]), install build
/// dependencies, `install.sh --batch`. Inputs come from the environment, never spliced into the text.
const STANDARD_INSTALLER: &str = r#"set -eu
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p /sys/fs/cgroup/erdma-installer
  echo $$ > /sys/fs/cgroup/erdma-installer/cgroup.procs
else
  for c in cpu memory; do [ -f /sys/fs/cgroup/$c/tasks ] && echo $$ > /sys/fs/cgroup/$c/tasks || true; done
fi
cd "$(dirname "$ERDMA_INSTALLER_TARBALL")"
tar -xzf "$ERDMA_INSTALLER_TARBALL"
if command -v yum >/dev/null 2>&1; then
  yum install -y "kernel-devel-$(uname -r)" gcc-c++ dkms cmake
elif command -v apt-get >/dev/null 2>&1; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y debhelper autotools-dev dkms libnl-3-dev libnl-route-3-dev cmake
fi
cd "$(find . -mindepth 1 -maxdepth 1 -type d | head -n 1)"
ERDMA_CM_NO_BOUND_IF=1 ./install.sh --batch
"#;

const GPU_INSTALLER: &str = r#"set -eu
cd "$(dirname "$ERDMA_ENV_SETUP")"
bash "$ERDMA_ENV_SETUP" --egs
"#;

const CONTAINER_OS_INSTALLER: &str = r#"set -eu
yum install -y "kernel-modules-$(uname -r)"
"#;

/// Directories searched for `nvidia-smi` under the host root.
const GPU_TOOL_DIRS: [&str; 5] = ["usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin"];

/// The real node: reads `/sys` and `/proc`, and runs kmod and installers in the host namespaces.
#[derive(Debug, Clone)]
pub struct NodeHost {
    sys: PathBuf,
    proc_root: PathBuf,
    host_root: PathBuf,
    exec: HostNamespaces,
    module_timeout: Duration,
    installer_timeout: Duration,
    trust: crate::fetch::InstallerTrust,
}

impl Default for NodeHost {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeHost {
    /// The node the agent runs on (`/sys`, `/proc`, host root `/proc/1/root`, PID 1's namespaces).
    pub fn new() -> Self {
        NodeHost {
            sys: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
            host_root: PathBuf::from("/proc/1/root"),
            exec: HostNamespaces::host(),
            module_timeout: Duration::from_secs(120),
            installer_timeout: Duration::from_secs(30 * 60),
            trust: crate::fetch::InstallerTrust::default(),
        }
    }

    /// Same, with other roots and namespaces (tests, lab).
    pub fn with_roots(
        sys: &Path,
        proc_root: &Path,
        host_root: &Path,
        exec: HostNamespaces,
    ) -> Self {
        NodeHost {
            sys: sys.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            host_root: host_root.to_path_buf(),
            exec,
            ..Self::new()
        }
    }

    /// Where installers come from and the pins they must match.
    pub fn with_installer_trust(mut self, trust: crate::fetch::InstallerTrust) -> Self {
        self.trust = trust;
        self
    }

    /// Runs `script` with `env` plus `file_env` = the host path of the verified download of
    /// `url`, in a fresh 0700 directory under the host's `/tmp` (removed afterwards).
    #[allow(clippy::too_many_arguments)]
    fn run_downloaded(
        &self,
        step: &str,
        script: &str,
        env: &[(&str, &str)],
        url: &str,
        pin: Option<&crate::fetch::Sha256Pin>,
        flag: &'static str,
        file_name: &str,
        file_env: &'static str,
    ) -> Result<(), HostError> {
        use std::os::unix::fs::DirBuilderExt;
        let refused = |e: crate::fetch::FetchError| {
            HostError::Command {
            step: step.to_string(),
            detail: e.to_string(),
            fix: match e {
                crate::fetch::FetchError::MissingPin { .. } => format!("set {flag} to the installer's verified SHA-256 (docs/operations.md, driver installer trust)"),
                crate::fetch::FetchError::Mismatch { .. } => format!("verify the new installer and update {flag}, or find out who changed it"),
                crate::fetch::FetchError::InsecureUrl { .. } => "use an https:// --driver-installer-base-url".to_string(),
                crate::fetch::FetchError::Transport { .. } => "check that the node reaches the installer URL over HTTPS (--driver-installer-base-url, --driver-installer-ca-file)".to_string(),
            },
        }
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("erdma-installer.{}.{nanos}", std::process::id());
        let local = self.host_root.join("tmp").join(&name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&local)
            .map_err(|e| Self::read_error(&local, e))?;
        let host_path = format!("/tmp/{name}/{file_name}");
        let result = crate::fetch::fetch_then_run(
            url,
            pin,
            flag,
            &self.trust,
            &local,
            file_name,
            |_| {
                let mut env = env.to_vec();
                env.push((file_env, host_path.as_str()));
                self.exec
                    .run_ok(
                        step,
                        "bash",
                        &["-c", script],
                        &env,
                        self.installer_timeout,
                        "the installer's log is in the error above; check the node's package repositories",
                    )
                    .map(|_| ())
            },
        );
        let _ = std::fs::remove_dir_all(&local);
        result.map_err(refused)?
    }

    /// Overrides how long module commands and installers may run.
    pub fn with_timeouts(mut self, module: Duration, installer: Duration) -> Self {
        self.module_timeout = module;
        self.installer_timeout = installer;
        self
    }

    fn read_error(what: &Path, e: std::io::Error) -> HostError {
        HostError::Read {
            what: what.display().to_string(),
            detail: e.to_string(),
            fix: "mount the host's /sys and /proc into the agent (hostPID, hostPath)".to_string(),
        }
    }
}

impl Host for NodeHost {
    fn compat_mode(&self) -> Result<Option<bool>, HostError> {
        let path = self.sys.join("module/erdma/parameters/compat_mode");
        match std::fs::read_to_string(&path) {
            Ok(text) => match text.trim() {
                "Y" | "y" | "1" => Ok(Some(true)),
                "N" | "n" | "0" => Ok(Some(false)),
                other => Err(HostError::Read {
                    what: path.display().to_string(),
                    detail: format!("unexpected value {other:?} (expected Y or N)"),
                    fix: "check the erdma driver version (`modinfo erdma`)".to_string(),
                }),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::read_error(&path, e)),
        }
    }

    fn module_loaded(&self, module: &str) -> Result<bool, HostError> {
        let path = self.proc_root.join("modules");
        let text = std::fs::read_to_string(&path).map_err(|e| Self::read_error(&path, e))?;
        let want = module.replace('-', "_");
        Ok(text
            .lines()
            .any(|l| l.split_whitespace().next() == Some(want.as_str())))
    }

    fn module_info(&self, module: &str) -> Result<Option<ModuleInfo>, HostError> {
        let step = format!("modinfo {module}");
        let out = self.exec.run(
            &step,
            "modinfo",
            &["-F", "parm", module],
            &[],
            self.module_timeout,
        )?;
        if !out.success() {
            return Ok(None);
        }
        let params = out
            .stdout
            .lines()
            .filter_map(|l| l.split(':').next())
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        Ok(Some(ModuleInfo { params }))
    }

    fn has_gpu(&self) -> Result<bool, HostError> {
        if self.proc_root.join("driver/nvidia").exists() {
            return Ok(true);
        }
        Ok(GPU_TOOL_DIRS
            .iter()
            .any(|d| self.host_root.join(d).join("nvidia-smi").exists()))
    }

    fn container_os(&self) -> Result<bool, HostError> {
        let path = self.proc_root.join("sys/kernel/osrelease");
        let release = std::fs::read_to_string(&path).map_err(|e| Self::read_error(&path, e))?;
        Ok(release.contains("lifsea"))
    }

    fn run_installer(&self, installer: &Installer) -> Result<(), HostError> {
        let step = crate::plan::Step::Install(installer.clone()).to_string();
        let fix =
            "check that the node has package repositories; the installer log is in the error above";
        let base = self.trust.base_url.trim_end_matches('/');
        let (script, env): (&str, Vec<(&str, &str)>) = match installer {
            Installer::Standard { version, force_mad } => {
                let mut env = vec![("ERDMA_INSTALLER_VERSION", version.as_str())];
                if *force_mad {
                    env.push(("ERDMA_FORCE_MAD_ENABLE", "1"));
                }
                let url = format!("{base}/erdma_installer-{}.tar.gz", version.as_str());
                return self.run_downloaded(
                    &step,
                    STANDARD_INSTALLER,
                    &env,
                    &url,
                    self.trust.standard_sha256.as_ref(),
                    "--driver-installer-sha256",
                    "installer.tar.gz",
                    "ERDMA_INSTALLER_TARBALL",
                );
            }
            Installer::Gpu => {
                let url = format!("{base}/env_setup.sh");
                return self.run_downloaded(
                    &step,
                    GPU_INSTALLER,
                    &[],
                    &url,
                    self.trust.gpu_sha256.as_ref(),
                    "--gpu-installer-sha256",
                    "env_setup.sh",
                    "ERDMA_ENV_SETUP",
                );
            }
            Installer::ContainerOs => (CONTAINER_OS_INSTALLER, Vec::new()),
        };
        self.exec
            .run_ok(
                &step,
                "bash",
                &["-c", script],
                &env,
                self.installer_timeout,
                fix,
            )
            .map(|_| ())
    }

    fn load_module(&self, module: &str, params: &[ModuleParam]) -> Result<(), HostError> {
        let kv: Vec<String> = params
            .iter()
            .map(|p| format!("{}={}", p.name, p.value))
            .collect();
        let mut args = vec![module];
        args.extend(kv.iter().map(String::as_str));
        let step = format!("modprobe {}", args.join(" "));
        let fix = format!(
            "check `dmesg` on the node and that {module} is built for the running kernel (`modinfo {module}`)"
        );
        self.exec
            .run_ok(&step, "modprobe", &args, &[], self.module_timeout, &fix)
            .map(|_| ())
    }

    fn unload_module(&self, module: &str) -> Result<(), HostError> {
        let step = format!("rmmod {module}");
        let fix = format!("stop what uses {module} (`lsmod`, rdma users) or keep the current mode");
        self.exec
            .run_ok(&step, "rmmod", &[module], &[], self.module_timeout, &fix)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_of(pid: &str, kind: &str) -> String {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// A process in fresh mount and cgroup namespaces, standing in for the host's PID 1.
    struct OtherNamespaces(std::process::Child);

    impl OtherNamespaces {
        fn start() -> Self {
            let mut cmd = Command::new("sleep");
            cmd.arg("60");
            // SAFETY: only the unshare system call runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sched::unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWCGROUP)?;
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .expect("start a process in new namespaces (needs root)");
            // Wait until the child has exec'd (its namespaces are set before that).
            let pid = child.id();
            for _ in 0..200 {
                if std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            OtherNamespaces(child)
        }
        fn exec(&self) -> HostNamespaces {
            HostNamespaces::of_pid(self.0.id())
        }
    }

    impl Drop for OtherNamespaces {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn commands_run_in_the_target_mount_and_cgroup_namespaces() {
        let other = OtherNamespaces::start();
        let pid = other.0.id().to_string();
        assert_ne!(
            ns_of(&pid, "mnt"),
            ns_of("self", "mnt"),
            "test setup: distinct namespaces"
        );
        for (exec, pid) in [
            (HostNamespaces::of_pid(std::process::id()), "self"),
            (other.exec(), pid.as_str()),
        ] {
            let out = exec
                .run(
                    "probe",
                    "sh",
                    &[
                        "-c",
                        "readlink /proc/self/ns/mnt; readlink /proc/self/ns/cgroup",
                    ],
                    &[],
                    Duration::from_secs(10),
                )
                .expect("runs");
            assert!(out.success(), "{out:?}");
            let lines: Vec<&str> = out.stdout.lines().collect();
            assert_eq!(
                lines,
                [ns_of(pid, "mnt"), ns_of(pid, "cgroup")],
                "pid {pid}"
            );
        }
    }

    #[test]
    fn unreachable_namespaces_are_a_clear_error() {
        let e = HostNamespaces::of_pid(u32::MAX - 1)
            .run("modinfo erdma", "true", &[], &[], Duration::from_secs(5))
            .unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("modinfo erdma") && t.contains("/ns/mnt") && t.contains("hostPID"),
            "{t}"
        );
    }

    #[test]
    fn env_is_clean_and_explicit() {
        let other = OtherNamespaces::start();
        let out = other
            .exec()
            .run(
                "env",
                "sh",
                &["-c", "echo $PATH; echo $ERDMA_X; echo ${HOME:-unset}"],
                &[("ERDMA_X", "1")],
                Duration::from_secs(10),
            )
            .expect("runs");
        assert_eq!(
            out.stdout.lines().collect::<Vec<_>>(),
            [HOST_PATH, "1", "unset"]
        );
    }

    #[test]
    fn failures_name_the_step_and_fix() {
        let other = OtherNamespaces::start();
        let e = other
            .exec()
            .run_ok(
                "modprobe nope",
                "sh",
                &["-c", "echo 'FATAL: Module nope not found' >&2; exit 1"],
                &[],
                Duration::from_secs(10),
                "install it",
            )
            .unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("modprobe nope")
                && t.contains("exit 1")
                && t.contains("Module nope not found")
                && t.contains("Fix: install it"),
            "{t}"
        );
        let e = other
            .exec()
            .run("x", "/nonexistent/prog", &[], &[], Duration::from_secs(10))
            .unwrap_err();
        assert!(
            e.to_string().contains("cannot start /nonexistent/prog"),
            "{e}"
        );
    }

    #[test]
    fn hung_commands_are_killed_at_the_timeout() {
        let other = OtherNamespaces::start();
        let t0 = std::time::Instant::now();
        let e = other
            .exec()
            .run("sleep", "sleep", &["30"], &[], Duration::from_millis(300))
            .unwrap_err();
        assert!(e.to_string().contains("did not finish"), "{e}");
        // Generous: it proves the 30 s command was killed, not how fast.
        assert!(t0.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn modinfo_of_a_missing_module_is_none() {
        let other = OtherNamespaces::start();
        let (d, _) = fake_node();
        let h = NodeHost::with_roots(
            &d.path().join("sys"),
            &d.path().join("proc"),
            &d.path().join("root"),
            other.exec(),
        );
        // This sandbox has no /lib/modules; on any host a module of this name does not exist.
        match h.module_info("erdma_no_such_module_xyz") {
            Ok(info) => assert_eq!(info, None),
            Err(e) => assert!(
                e.to_string().contains("cannot start modinfo"),
                "only acceptable error is a host without kmod: {e}"
            ),
        }
    }

    fn fake_node() -> (tempfile::TempDir, NodeHost) {
        let d = tempfile::tempdir().expect("tempdir");
        let (sys, proc_root, root) = (
            d.path().join("sys"),
            d.path().join("proc"),
            d.path().join("root"),
        );
        std::fs::create_dir_all(sys.join("module/erdma/parameters")).expect("mkdir");
        std::fs::create_dir_all(proc_root.join("sys/kernel")).expect("mkdir");
        std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir");
        std::fs::write(proc_root.join("modules"), "erdma 217088 0 - Live 0x0000000000000000\nib_core 462848 1 erdma, Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n").expect("write");
        std::fs::write(
            proc_root.join("sys/kernel/osrelease"),
            "5.10.134-16.3.al8.x86_64\n",
        )
        .expect("write");
        let h = NodeHost::with_roots(&sys, &proc_root, &root, HostNamespaces::host());
        (d, h)
    }

    #[test]
    fn reads_module_state_from_sysfs_and_procfs() {
        let (d, h) = fake_node();
        assert_eq!(
            h.compat_mode().unwrap(),
            None,
            "no parameter file: upstream kernel"
        );
        let param = d.path().join("sys/module/erdma/parameters/compat_mode");
        std::fs::write(&param, "Y\n").unwrap();
        assert_eq!(h.compat_mode().unwrap(), Some(true));
        std::fs::write(&param, "N\n").unwrap();
        assert_eq!(h.compat_mode().unwrap(), Some(false));
        std::fs::write(&param, "maybe\n").unwrap();
        let e = h.compat_mode().unwrap_err().to_string();
        assert!(e.contains("compat_mode") && e.contains("\"maybe\""), "{e}");
        assert!(h.module_loaded("erdma").unwrap());
        assert!(
            h.module_loaded("nvidia-peermem").unwrap(),
            "dashes and underscores are the same module"
        );
        assert!(!h.module_loaded("smc").unwrap());
        assert!(!h.module_loaded("ib").unwrap());
        assert!(!h.container_os().unwrap());
        std::fs::write(
            d.path().join("proc/sys/kernel/osrelease"),
            "5.10.134-17.lifsea8.x86_64\n",
        )
        .unwrap();
        assert!(h.container_os().unwrap());
    }

    #[test]
    fn detects_gpus_by_proc_driver_or_host_nvidia_smi() {
        let (d, h) = fake_node();
        assert!(!h.has_gpu().unwrap());
        std::fs::write(d.path().join("root/usr/bin/nvidia-smi"), "").unwrap();
        assert!(h.has_gpu().unwrap());
        std::fs::remove_file(d.path().join("root/usr/bin/nvidia-smi")).unwrap();
        std::fs::create_dir_all(d.path().join("proc/driver/nvidia")).unwrap();
        assert!(h.has_gpu().unwrap());
    }

    /// Tests that change the host's kernel modules: `#[ignore]`d, run with `--ignored` in the lab
    /// VM (`crates/erdma-driver/lab/run-driver.sh`), where `ERDMA_LAB_KMOD` is set.
    mod lab {
        use super::*;

        /// The module the lab VM offers for load/unload tests; fails the test outside the lab.
        fn lab_kmod() -> String {
            std::env::var("ERDMA_LAB_KMOD").expect(
                "needs ERDMA_LAB_KMOD naming an unloaded module on a disposable host \
                 (the lab VM sets it)",
            )
        }

        /// Real kmod through PID 1's namespaces, in the lab VM (`ERDMA_LAB_KMOD` names a module
        /// that is built for the VM's kernel and not loaded, e.g. `siw`). It loads and unloads
        /// kernel modules.
        #[test]
        #[ignore = "needs root on a disposable host (it loads and unloads the kernel module named by ERDMA_LAB_KMOD); run with --ignored by crates/erdma-driver/lab/run-driver.sh in the 7.3 VM"]
        fn real_kmod_in_the_lab() {
            let module = lab_kmod();
            let h = NodeHost::new();
            assert!(
                !h.module_loaded(&module).unwrap(),
                "{module} must start unloaded"
            );
            assert!(
                h.module_info(&module).unwrap().is_some(),
                "modinfo {module}"
            );
            assert_eq!(h.module_info("erdma_no_such_module").unwrap(), None);
            h.load_module(&module, &[]).expect("modprobe");
            assert!(h.module_loaded(&module).unwrap());
            h.unload_module(&module).expect("rmmod");
            assert!(!h.module_loaded(&module).unwrap());
            let e = h
                .load_module("erdma_no_such_module", &[ModuleParam::compat_mode(true)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("modprobe erdma_no_such_module compat_mode=Y") && e.contains("Fix:"),
                "{e}"
            );
            let e = h.unload_module(&module).unwrap_err().to_string();
            assert!(e.contains(&format!("rmmod {module}")), "{e}");
        }

        /// The whole reconciler against the lab VM's real kernel, which has no erdma module: the
        /// plan installs, the installer fails (no network in the VM), and the status says so
        /// without a panic.
        #[tokio::test]
        #[ignore = "needs root on a disposable host without erdma and without network (the installer runs for real); run with --ignored by crates/erdma-driver/lab/run-driver.sh in the 7.3 VM"]
        async fn real_reconcile_in_the_lab_reports_installer_failure() {
            lab_kmod();
            let host =
                NodeHost::new().with_timeouts(Duration::from_secs(30), Duration::from_secs(60));
            let observed = crate::observe(&host).expect("observe the VM");
            assert_eq!(observed.erdma, crate::ErdmaState::Missing, "{observed:?}");
            let cfg = crate::DriverConfig {
                mode: erdma_model::DriverMode::Default,
                ..crate::DriverConfig::default()
            };
            let r = crate::DriverReconciler::new(host, crate::fake::FakeUsage::idle(), cfg);
            let pass = r.reconcile_once().await;
            assert!(pass.failed && !pass.status.ready);
            assert!(
                pass.status.reason.contains("install erdma_installer-1.5.9")
                    && pass.status.reason.contains("Fix:"),
                "{}",
                pass.status.reason
            );
            eprintln!(
                "status: {}",
                serde_json::to_string(&pass.status).unwrap_or_default()
            );
        }
    }
}
