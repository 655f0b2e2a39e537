//! `erdma-agent`: the erdma node agent. Wiring only: flags and config file → settings, logs,
//! SIGTERM/SIGINT → cancellation, then [`erdma_agent::agent::run`].

use anyhow::Context;
use clap::Parser;
use erdma_agent::cli::{Flags, Settings};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

fn init_logs(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let settings = match Settings::resolve(flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("erdma-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    init_logs(settings.json_logs);
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
    });
    Ok(())
}
