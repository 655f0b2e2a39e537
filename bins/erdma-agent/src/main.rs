//! `erdma-agent`: the erdma node agent. Wiring only: flags and config file → settings, logs,
//! SIGTERM/SIGINT → cancellation, then [`erdma_agent::agent::run`].
//!
//! Shutdown contract: after SIGTERM or SIGINT the process exits within 5 s, with status 0,
//! whatever it was waiting on; what it cut short is logged as `abandoned: ...`. The agent's own
//! bound is [`erdma_agent::agent::SHUTDOWN_GRACE`]; the runtime then gets [`RUNTIME_SHUTDOWN`]
//! (blocking threads stuck in a read are not waited for), and a last resort ends the process at
//! [`HARD_LIMIT`] should the runtime itself be stuck.

use anyhow::Context;
use clap::Parser;
use erdma_agent::cli::{Flags, Settings};
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Async worker threads. A node agent waits on sockets and timers; tokio's default (one worker
/// per CPU) would start 128 threads, each with its own stack and malloc arena, on a 128-CPU node.
const WORKER_THREADS: usize = 2;
/// Threads for blocking work (sysfs reads, namespace entry).
const MAX_BLOCKING_THREADS: usize = 16;
/// An idle blocking thread exits after this long: longer than the inventory's 10 s safety poll,
/// so an idle agent reuses one thread instead of creating one every poll.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the runtime's shutdown waits for its blocking threads (a sysfs read that never
/// answers keeps one for ever).
const RUNTIME_SHUTDOWN: Duration = Duration::from_millis(500);
/// After SIGTERM/SIGINT the process ends by this time in any case.
const HARD_LIMIT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    // Before the runtime's threads exist: one malloc arena instead of one per allocating thread.
    erdma_host::resident::single_malloc_arena();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => {
            let code = rt.block_on(run());
            // Dropping the runtime would wait for every blocking thread, one stuck in a sysfs
            // read included: for ever.
            rt.shutdown_timeout(RUNTIME_SHUTDOWN);
            code
        }
        Err(e) => {
            eprintln!("erdma-agent: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let flags = Flags::parse();
    let settings = match Settings::resolve(flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("erdma-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = erdma_host::logs::init(
        settings.log_format,
        settings.log_level.as_deref(),
        erdma_host::logs::DEFAULT_FILTER,
    ) {
        eprintln!("erdma-agent: {e}");
        return ExitCode::from(2);
    }
    let cancel = CancellationToken::new();
    let result = match spawn_signal_handler(cancel.clone()) {
        Ok(()) => erdma_agent::agent::run(settings, cancel).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn spawn_signal_handler(cancel: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = cancel.cancelled() => return,
        }
        cancel.cancel();
        last_resort();
    });
    Ok(())
}

/// Ends the process [`HARD_LIMIT`] after a shutdown was asked for, should the graceful path
/// (bounded by [`erdma_agent::agent::SHUTDOWN_GRACE`] and [`RUNTIME_SHUTDOWN`], well within it)
/// be stuck where no timer runs. A thread of its own, not a task: it must run when the runtime
/// does not; it ends with the process.
fn last_resort() {
    let started = std::thread::Builder::new()
        .name("shutdown-limit".into())
        .spawn(|| {
            std::thread::sleep(HARD_LIMIT);
            tracing::error!(
                limit = ?HARD_LIMIT,
                "abandoned: the whole shutdown (still running after the limit); exiting"
            );
            std::process::exit(0);
        });
    if let Err(e) = started {
        tracing::warn!("cannot start the shutdown time limit's thread: {e}");
    }
}
