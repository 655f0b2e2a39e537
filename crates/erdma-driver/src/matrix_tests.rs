//! Every mode × initial state, with the exact host actions expected.

use crate::fake::{FakeHost, FakeState, FakeUsage};
use crate::{
    DriverConfig, DriverReconciler, DriverStatus, Holder, Pass, RunningMode, StatusCode, UsageError,
};
use erdma_model::DriverMode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Init {
    Missing,
    NotLoaded,
    LoadedIwarp,
    LoadedRoce,
}

fn node(init: Init, gpu: bool) -> FakeState {
    let mut s = FakeState {
        gpu,
        ..FakeState::default()
    };
    if gpu {
        s.available.insert("nvidia_peermem".into());
    }
    match init {
        Init::Missing => s.erdma_installed = false,
        Init::NotLoaded => {}
        Init::LoadedIwarp | Init::LoadedRoce => {
            s.loaded.insert("erdma".into());
            s.compat = matches!(init, Init::LoadedRoce);
        }
    }
    s
}

fn holder() -> Holder {
    Holder::of_ids("team-a", "trainer-0", "main", vec!["erdma_0/3".into()])
}

struct Run {
    pass: Pass,
    actions: Vec<String>,
    end: FakeState,
    usage_calls: usize,
}

async fn run_with(mode: DriverMode, start: FakeState, in_use: bool, force: bool) -> Run {
    let host = Arc::new(FakeHost::new(start));
    let usage = Arc::new(if in_use {
        FakeUsage::held_by(vec![holder()])
    } else {
        FakeUsage::idle()
    });
    let cfg = DriverConfig {
        mode,
        force_reload: force,
        ..DriverConfig::default()
    };
    let r = DriverReconciler::new(Arc::clone(&host), Arc::clone(&usage), cfg);
    let pass = r.reconcile_once().await;
    Run {
        pass,
        actions: host.actions(),
        end: host.state(),
        usage_calls: usage.calls(),
    }
}

async fn run(mode: DriverMode, start: FakeState, in_use: bool) -> Run {
    run_with(mode, start, in_use, false).await
}

fn assert_converged(r: &Run, mode: DriverMode) {
    let s: &DriverStatus = &r.pass.status;
    assert!(s.ready, "{s:?}");
    assert_eq!(s.code, StatusCode::Converged, "{s:?}");
    assert_eq!(s.running, RunningMode::Mode(mode));
    assert_eq!(s.pending, None);
    assert!(!r.pass.failed);
}

fn assert_refused(r: &Run, from: DriverMode, to: DriverMode) {
    let s = &r.pass.status;
    assert!(s.ready, "keeps serving the devices it has: {s:?}");
    assert_eq!(s.code, StatusCode::ModeChangePending);
    assert_eq!(s.running, RunningMode::Mode(from));
    let p = s.pending.as_ref().expect("pending change");
    assert_eq!(p.to, to);
    assert_eq!(p.holders, vec![holder()]);
    assert!(s.reason.contains("team-a/trainer-0"), "{}", s.reason);
    assert!(s.reason.contains("--force-driver-reload"), "{}", s.reason);
    assert!(
        !r.actions.iter().any(|a| a.contains("erdma")),
        "erdma untouched: {:?}",
        r.actions
    );
    assert_eq!(r.usage_calls, 1);
}

const STD_INSTALL: &str = "install erdma_installer-1.5.9";
const MAD_INSTALL: &str = "install erdma_installer-1.5.9 (ERDMA_FORCE_MAD_ENABLE=1)";

// ---- default -------------------------------------------------------------------------------

#[tokio::test]
async fn default_driver_missing_installs_then_loads_iwarp_and_smc() {
    for in_use in [false, true] {
        let r = run(DriverMode::Default, node(Init::Missing, false), in_use).await;
        assert_eq!(
            r.actions,
            [STD_INSTALL, "modprobe erdma compat_mode=N", "modprobe smc"]
        );
        assert_converged(&r, DriverMode::Default);
        assert_eq!(r.usage_calls, 0, "no reload, no usage query");
    }
}

#[tokio::test]
async fn default_on_container_os_installs_kernel_modules_package() {
    let mut s = node(Init::Missing, false);
    s.container_os = true;
    let r = run(DriverMode::Default, s, false).await;
    assert_eq!(
        r.actions,
        [
            "yum install -y kernel-modules-$(uname -r)",
            "modprobe erdma compat_mode=N",
            "modprobe smc"
        ]
    );
    assert_converged(&r, DriverMode::Default);
}

#[tokio::test]
async fn default_installed_not_loaded_loads_without_installer() {
    let r = run(DriverMode::Default, node(Init::NotLoaded, false), false).await;
    assert_eq!(r.actions, ["modprobe erdma compat_mode=N", "modprobe smc"]);
    assert_converged(&r, DriverMode::Default);
}

#[tokio::test]
async fn default_loaded_in_compat_not_in_use_reloads() {
    let r = run(DriverMode::Default, node(Init::LoadedRoce, false), false).await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=N",
            "modprobe smc"
        ]
    );
    assert_converged(&r, DriverMode::Default);
    assert!(!r.end.compat);
    assert_eq!(r.usage_calls, 1);
}

#[tokio::test]
async fn default_loaded_in_compat_in_use_refuses() {
    let r = run(DriverMode::Default, node(Init::LoadedRoce, false), true).await;
    assert_eq!(r.actions, ["modprobe smc"]);
    assert_refused(&r, DriverMode::Compat, DriverMode::Default);
    assert!(r.end.compat && r.end.loaded.contains("erdma"));
}

#[tokio::test]
async fn default_loaded_in_compat_in_use_forced_reloads() {
    let r = run_with(
        DriverMode::Default,
        node(Init::LoadedRoce, false),
        true,
        true,
    )
    .await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=N",
            "modprobe smc"
        ]
    );
    assert_converged(&r, DriverMode::Default);
}

#[tokio::test]
async fn default_loaded_right_does_nothing_in_use_or_not() {
    for in_use in [false, true] {
        let mut s = node(Init::LoadedIwarp, false);
        s.loaded.insert("smc".into());
        let r = run(DriverMode::Default, s, in_use).await;
        assert!(r.actions.is_empty(), "{:?}", r.actions);
        assert_converged(&r, DriverMode::Default);
        assert_eq!(r.usage_calls, 0);
    }
}

// ---- compat --------------------------------------------------------------------------------

#[tokio::test]
async fn compat_driver_missing_installs_with_mad_then_peermem_and_smc() {
    let mut s = node(Init::Missing, false);
    s.available.insert("nvidia_peermem".into());
    let r = run(DriverMode::Compat, s, true).await;
    assert_eq!(
        r.actions,
        [
            MAD_INSTALL,
            "modprobe erdma compat_mode=Y",
            "modprobe nvidia_peermem",
            "modprobe smc"
        ]
    );
    assert_converged(&r, DriverMode::Compat);
    assert_eq!(r.usage_calls, 0);
}

#[tokio::test]
async fn compat_without_peermem_skips_it() {
    let r = run(DriverMode::Compat, node(Init::NotLoaded, false), false).await;
    assert_eq!(r.actions, ["modprobe erdma compat_mode=Y", "modprobe smc"]);
    assert_converged(&r, DriverMode::Compat);
}

#[tokio::test]
async fn compat_loaded_in_default_not_in_use_reloads() {
    let r = run(DriverMode::Compat, node(Init::LoadedIwarp, false), false).await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=Y",
            "modprobe smc"
        ]
    );
    assert_converged(&r, DriverMode::Compat);
    assert!(r.end.compat);
}

#[tokio::test]
async fn compat_loaded_in_default_in_use_refuses() {
    let r = run(DriverMode::Compat, node(Init::LoadedIwarp, false), true).await;
    assert_eq!(r.actions, ["modprobe smc"]);
    assert_refused(&r, DriverMode::Default, DriverMode::Compat);
    assert!(!r.end.compat);
}

#[tokio::test]
async fn compat_loaded_right_does_nothing() {
    for in_use in [false, true] {
        let mut s = node(Init::LoadedRoce, false);
        s.loaded.insert("smc".into());
        let r = run(DriverMode::Compat, s, in_use).await;
        assert!(r.actions.is_empty(), "{:?}", r.actions);
        assert_converged(&r, DriverMode::Compat);
    }
}

// ---- ofed ----------------------------------------------------------------------------------

#[tokio::test]
async fn ofed_driver_missing_runs_gpu_installer_no_smc() {
    let r = run(DriverMode::Ofed, node(Init::Missing, true), false).await;
    assert_eq!(
        r.actions,
        [
            "env_setup.sh --egs",
            "modprobe erdma compat_mode=Y",
            "modprobe nvidia_peermem"
        ]
    );
    assert_converged(&r, DriverMode::Ofed);
    assert!(!r.end.loaded.contains("smc"));
}

#[tokio::test]
async fn ofed_loaded_in_default_not_in_use_reloads() {
    let r = run(DriverMode::Ofed, node(Init::LoadedIwarp, true), false).await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=Y",
            "modprobe nvidia_peermem"
        ]
    );
    assert_converged(&r, DriverMode::Ofed);
}

#[tokio::test]
async fn ofed_loaded_in_default_in_use_refuses() {
    let r = run(DriverMode::Ofed, node(Init::LoadedIwarp, true), true).await;
    assert_eq!(r.actions, ["modprobe nvidia_peermem"]);
    assert_refused(&r, DriverMode::Default, DriverMode::Ofed);
}

#[tokio::test]
async fn ofed_loaded_right_only_adds_peermem_once() {
    let r = run(DriverMode::Ofed, node(Init::LoadedRoce, true), true).await;
    assert_eq!(r.actions, ["modprobe nvidia_peermem"]);
    assert_converged(&r, DriverMode::Ofed);
    let mut s = node(Init::LoadedRoce, true);
    s.loaded.insert("nvidia_peermem".into());
    let r = run(DriverMode::Ofed, s, true).await;
    assert!(r.actions.is_empty());
    assert_converged(&r, DriverMode::Ofed);
}

// ---- auto ----------------------------------------------------------------------------------

#[tokio::test]
async fn auto_on_gpu_node_is_ofed() {
    let r = run(DriverMode::Auto, node(Init::Missing, true), false).await;
    assert_eq!(
        r.actions,
        [
            "env_setup.sh --egs",
            "modprobe erdma compat_mode=Y",
            "modprobe nvidia_peermem"
        ]
    );
    assert_converged(&r, DriverMode::Ofed);
    assert_eq!(r.pass.status.target, Some(DriverMode::Ofed));
    assert_eq!(r.pass.status.desired, DriverMode::Auto);
    let r = run(DriverMode::Auto, node(Init::LoadedIwarp, true), true).await;
    assert_refused(&r, DriverMode::Default, DriverMode::Ofed);
    let r = run(DriverMode::Auto, node(Init::LoadedIwarp, true), false).await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=Y",
            "modprobe nvidia_peermem"
        ]
    );
}

#[tokio::test]
async fn auto_on_cpu_node_is_default() {
    let r = run(DriverMode::Auto, node(Init::Missing, false), false).await;
    assert_eq!(
        r.actions,
        [STD_INSTALL, "modprobe erdma compat_mode=N", "modprobe smc"]
    );
    assert_converged(&r, DriverMode::Default);
    let r = run(DriverMode::Auto, node(Init::LoadedRoce, false), true).await;
    assert_refused(&r, DriverMode::Compat, DriverMode::Default);
    let r = run(DriverMode::Auto, node(Init::LoadedRoce, false), false).await;
    assert_eq!(
        r.actions,
        [
            "rmmod erdma",
            "modprobe erdma compat_mode=N",
            "modprobe smc"
        ]
    );
    let mut s = node(Init::LoadedIwarp, false);
    s.loaded.insert("smc".into());
    let r = run(DriverMode::Auto, s, true).await;
    assert!(r.actions.is_empty());
}

// ---- none ----------------------------------------------------------------------------------

#[tokio::test]
async fn none_never_touches_the_driver() {
    for init in [
        Init::Missing,
        Init::NotLoaded,
        Init::LoadedIwarp,
        Init::LoadedRoce,
    ] {
        for in_use in [false, true] {
            let r = run(DriverMode::None, node(init, true), in_use).await;
            assert!(r.actions.is_empty(), "{init:?}: {:?}", r.actions);
            assert_eq!(r.usage_calls, 0);
            let s = &r.pass.status;
            assert_eq!(s.code, StatusCode::Unmanaged);
            assert_eq!(s.target, None);
            let loaded = matches!(init, Init::LoadedIwarp | Init::LoadedRoce);
            assert_eq!(s.ready, loaded, "{init:?}");
            if !loaded {
                assert!(s.reason.contains("--prefer-driver=none"), "{}", s.reason);
            }
        }
    }
}

// ---- upstream kernels (no compat_mode) -------------------------------------------------------

#[tokio::test]
async fn upstream_kernel_is_never_switched() {
    for mode in [DriverMode::Default, DriverMode::Compat, DriverMode::Ofed] {
        for in_use in [false, true] {
            let mut s = node(Init::LoadedIwarp, true);
            s.erdma_has_compat_param = false;
            s.loaded.insert("smc".into());
            s.loaded.insert("nvidia_peermem".into());
            let r = run(mode, s, in_use).await;
            assert!(r.actions.is_empty(), "{mode}: {:?}", r.actions);
            assert_eq!(r.usage_calls, 0);
            let st = &r.pass.status;
            assert_eq!(st.code, StatusCode::HardwareDecided);
            assert_eq!(st.running, RunningMode::HardwareDecided);
            assert!(st.ready);
            assert!(st.reason.contains("no compat_mode"), "{}", st.reason);
        }
    }
    let mut s = node(Init::NotLoaded, false);
    s.erdma_has_compat_param = false;
    let r = run(DriverMode::Default, s, false).await;
    assert_eq!(r.actions, ["modprobe erdma", "modprobe smc"]);
    assert_eq!(r.pass.status.code, StatusCode::HardwareDecided);
}

// ---- faults ----------------------------------------------------------------------------------

#[tokio::test]
async fn installer_failure_is_not_ready_and_stops() {
    let mut s = node(Init::Missing, false);
    s.failing.insert(STD_INSTALL.into());
    let r = run(DriverMode::Default, s, false).await;
    assert_eq!(r.actions, [STD_INSTALL]);
    let st = &r.pass.status;
    assert!(!st.ready && r.pass.failed);
    assert_eq!(st.code, StatusCode::Failed);
    assert!(
        st.reason.contains(STD_INSTALL) && st.reason.contains("Fix:"),
        "{}",
        st.reason
    );
}

#[tokio::test]
async fn load_failure_after_unload_is_repaired_by_the_next_pass() {
    let mut s = node(Init::LoadedRoce, false);
    s.failing.insert("modprobe erdma compat_mode=N".into());
    let host = Arc::new(FakeHost::new(s));
    let r = DriverReconciler::new(
        Arc::clone(&host),
        FakeUsage::idle(),
        DriverConfig {
            mode: DriverMode::Default,
            ..DriverConfig::default()
        },
    );
    let p = r.reconcile_once().await;
    assert!(p.failed && !p.status.ready);
    assert_eq!(p.status.running, RunningMode::NotLoaded);
    assert!(
        p.status.reason.contains("modprobe erdma compat_mode=N"),
        "{}",
        p.status.reason
    );
    host.with_state(|s| s.failing.clear());
    host.clear_actions();
    let p = r.reconcile_once().await;
    assert_eq!(
        host.actions(),
        ["modprobe erdma compat_mode=N", "modprobe smc"]
    );
    assert!(p.status.ready && !p.failed);
}

#[tokio::test]
async fn smc_failure_is_a_warning_not_a_failure() {
    let mut s = node(Init::NotLoaded, false);
    s.failing.insert("modprobe smc".into());
    let r = run(DriverMode::Default, s, false).await;
    assert_converged(&r, DriverMode::Default);
    assert_eq!(r.pass.status.warnings.len(), 1);
    assert!(r.pass.status.warnings[0].contains("modprobe smc"));
}

#[tokio::test]
async fn unknown_usage_refuses_the_reload() {
    let host = Arc::new(FakeHost::new(node(Init::LoadedRoce, false)));
    let usage = FakeUsage::idle();
    usage.set(Err(UsageError {
        resource: "aliyun/erdma".into(),
        detail: "connecting to /var/lib/kubelet/pod-resources/kubelet.sock: No such file".into(),
        fix: "mount the pod-resources directory".into(),
    }));
    let r = DriverReconciler::new(
        Arc::clone(&host),
        usage,
        DriverConfig {
            mode: DriverMode::Default,
            ..DriverConfig::default()
        },
    );
    let p = r.reconcile_once().await;
    assert_eq!(p.status.code, StatusCode::ModeChangePending);
    assert!(
        p.status.reason.contains("kubelet.sock"),
        "{}",
        p.status.reason
    );
    assert_eq!(host.actions(), ["modprobe smc"]);
}

#[tokio::test]
async fn second_pass_is_idempotent_and_refusal_clears_once_pods_leave() {
    let host = Arc::new(FakeHost::new(node(Init::LoadedRoce, false)));
    let usage = Arc::new(FakeUsage::held_by(vec![holder()]));
    let r = DriverReconciler::new(
        Arc::clone(&host),
        Arc::clone(&usage),
        DriverConfig {
            mode: DriverMode::Default,
            ..DriverConfig::default()
        },
    );
    assert_eq!(
        r.reconcile_once().await.status.code,
        StatusCode::ModeChangePending
    );
    usage.set(Ok(vec![]));
    host.clear_actions();
    let p = r.reconcile_once().await;
    assert_eq!(
        host.actions(),
        ["rmmod erdma", "modprobe erdma compat_mode=N"]
    );
    assert_eq!(p.status.code, StatusCode::Converged);
    host.clear_actions();
    let p = r.reconcile_once().await;
    assert!(host.actions().is_empty());
    assert_eq!(p.executed, Vec::<String>::new());
}

#[tokio::test]
async fn loop_publishes_status_and_repairs_drift() {
    let host = Arc::new(FakeHost::new(node(Init::NotLoaded, false)));
    let cfg = DriverConfig {
        mode: DriverMode::Default,
        resync: Duration::from_millis(20),
        ..DriverConfig::default()
    };
    let (tx, mut rx) = tokio::sync::watch::channel(DriverStatus::starting(DriverMode::Default));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(
        DriverReconciler::new(Arc::clone(&host), FakeUsage::idle(), cfg).run(cancel.clone(), tx),
    );
    let wait_ready = |rx: &mut tokio::sync::watch::Receiver<DriverStatus>, want: bool| {
        let mut rx = rx.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.ready == want))
                .await
                .is_ok()
        }
    };
    assert!(wait_ready(&mut rx, true).await);
    // Someone unloads the module by hand: the loop notices and loads it again.
    host.with_state(|s| {
        s.loaded.remove("erdma");
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while host
        .actions()
        .iter()
        .filter(|a| *a == "modprobe erdma compat_mode=N")
        .count()
        < 2
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "drift not repaired: {:?}",
            host.actions()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(host.state().loaded.contains("erdma"));
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("loop stops on cancel")
        .expect("no panic");
}

// Virtual time: the attempts are counted against tokio's paused clock, so a loaded CI machine
// cannot change the count.
#[tokio::test(start_paused = true)]
async fn loop_backs_off_on_failure() {
    let mut s = node(Init::Missing, false);
    s.failing.insert(STD_INSTALL.into());
    let host = Arc::new(FakeHost::new(s));
    let cfg = DriverConfig {
        mode: DriverMode::Default,
        backoff_initial: Duration::from_millis(40),
        backoff_max: Duration::from_millis(160),
        ..DriverConfig::default()
    };
    let (tx, rx) = tokio::sync::watch::channel(DriverStatus::starting(DriverMode::Default));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(
        DriverReconciler::new(Arc::clone(&host), FakeUsage::idle(), cfg).run(cancel.clone(), tx),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    cancel.cancel();
    task.await.expect("no panic");
    // Attempts at ~0, 40, 120, 280, 440 ms (delays 40, 80, 160, 160): about 5, never one per tick.
    let n = host.actions().len();
    assert_eq!(
        n,
        5,
        "{n} installer attempts in 500 ms: {:?}",
        host.actions()
    );
    assert_eq!(rx.borrow().code, StatusCode::Failed);
    assert!(!rx.borrow().ready);
}
