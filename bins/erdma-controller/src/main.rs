//! `erdma-controller`: wires the configuration, the Kubernetes and ECS clients, leader election,
//! the reconcilers and the webhook together. All logic lives in the library.

use anyhow::Context;
use clap::Parser;
use erdma_cloud::{CredentialProvider, EcsClient, EcsConfig, RetryPolicy, SignatureVersion};
use erdma_controller::cert::{CertManager, dns_names};
use erdma_controller::config::{
    CONFIG_PATH, CREDENTIAL_PATH, Config, CredentialConfig, KubeSecretSource,
};
use erdma_controller::leader::LeaderElector;
use erdma_controller::metrics::Metrics;
use erdma_controller::reconcile::{Ctx, run_controllers};
use erdma_controller::webhook::{CertSlot, InjectOptions, serve};
use erdma_host::logs::{self, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// erdma cluster controller.
#[derive(Debug, Parser)]
#[command(
    name = "erdma-controller",
    version,
    about,
    after_help = "Exit status: 0 stopped cleanly (SIGTERM), or --check-install passed; 1 a fatal runtime error (logged), or --check-install found a gap; 2 usage or configuration error (flags, addresses, --log-format, --log-level, RUST_LOG, a missing or broken config file)."
)]
struct Args {
    /// Controller configuration (config.json). The original's flag name; `--config` is accepted too.
    #[arg(long = "config-path", alias = "config", default_value = CONFIG_PATH, value_name = "FILE")]
    config: PathBuf,
    /// Cloud credentials (credential.json). The original's flag name; `--credentials` is accepted too.
    #[arg(long = "credential-path", alias = "credentials", default_value = CREDENTIAL_PATH, value_name = "FILE")]
    credentials: PathBuf,
    /// Webhook HTTPS address.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_listen: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (the agent's flag of the same name;
    /// `--health-listen` is accepted too).
    #[arg(
        long = "metrics-addr",
        alias = "health-listen",
        default_value = "0.0.0.0:8080",
        value_name = "HOST:PORT"
    )]
    health_listen: String,
    /// Use the public ECS/STS endpoints instead of the VPC ones.
    #[arg(long, env = "PUBLIC_NETWORK", default_value_t = false)]
    public_network: bool,
    /// ECS endpoint override (e.g. an emulator).
    #[arg(long, env = "ERDMA_ECS_ENDPOINT")]
    ecs_endpoint: Option<String>,
    /// Metadata service.
    #[arg(long, default_value = "http://100.100.100.200")]
    metadata_endpoint: String,
    /// Request signature: v3 (ACS3-HMAC-SHA256) or v2 (HMAC-SHA1).
    #[arg(long, default_value = "v3", value_parser = ["v2", "v3"])]
    signature: String,
    /// This replica's identity for leader election.
    #[arg(long, env = "POD_NAME", default_value = "erdma-controller")]
    identity: String,
    /// Log format on stderr: `text` (ANSI colours only when stderr is a terminal and NO_COLOR is
    /// unset or empty) or `json` (one JSON object per line) [default: text].
    #[arg(long, value_name = "text|json")]
    log_format: Option<String>,
    /// Log filter in tracing's EnvFilter syntax (`info`, `debug`, `info,erdma_k8s=debug`)
    /// [default: $RUST_LOG, else info].
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Check the installation in NAMESPACE instead of running (what `helm test` runs): the agent
    /// DaemonSet ready, the controller available, every webhook entry with its caBundle. Prints
    /// one JSON object; exit status 0 when all pass, 1 otherwise.
    #[arg(long, value_name = "NAMESPACE")]
    check_install: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let set_up = LogFormat::parse(args.log_format.as_deref().unwrap_or_default())
        .map_err(|e| format!("--log-format: {e}"))
        .and_then(|format| {
            logs::init(format, args.log_level.as_deref(), logs::DEFAULT_FILTER)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = set_up {
        eprintln!("erdma-controller: {e}");
        return ExitCode::from(2);
    }
    if let Some(ns) = args.check_install.clone() {
        return check_install(&ns).await;
    }
    // Usage and configuration errors (exit 2) before anything runs.
    let cfg = match check_usage(&args) {
        Ok(cfg) => cfg,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::from(2);
        }
    };
    match run(args, cfg).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-install`: the verdict on stdout, its exit status.
async fn check_install(namespace: &str) -> ExitCode {
    let client = match erdma_k8s::client::infer(&Default::default()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("Kubernetes client: {e}");
            return ExitCode::FAILURE;
        }
    };
    match erdma_controller::selfcheck::check_install(client, namespace).await {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
            if report.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            tracing::error!("checking the installation in {namespace}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration file and the listen addresses, checked before anything starts: a missing
/// or broken config file and an address that is not `HOST:PORT` are usage errors (exit 2), as
/// the README's exit-status contract says.
fn check_usage(args: &Args) -> anyhow::Result<Config> {
    for (flag, addr) in [
        ("--metrics-addr", &args.health_listen),
        ("--webhook-listen", &args.webhook_listen),
    ] {
        addr.parse::<std::net::SocketAddr>().map_err(|e| {
            anyhow::anyhow!("{flag} {addr:?} is not an IP:PORT address ({e}); e.g. 0.0.0.0:8080")
        })?;
    }
    Config::load(&args.config)
}

/// The controller until SIGTERM/SIGINT, or its fatal error.
async fn run(args: Args, cfg: Config) -> anyhow::Result<()> {
    let client = erdma_k8s::client::infer(&cfg.kube_client_options())
        .await
        .context("Kubernetes client")?;
    let cancel = CancellationToken::new();
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { if let Some(t) = term.as_mut() { t.recv().await; } else { std::future::pending::<()>().await } } => {}
            }
            tracing::info!("shutting down");
            cancel.cancel();
        });
    }
    let mut tasks = tokio::task::JoinSet::new();
    let metrics = Arc::new(Metrics::default());
    let health = tokio::net::TcpListener::bind(&args.health_listen)
        .await
        .with_context(|| format!("bind {}", args.health_listen))?;
    tasks.spawn(erdma_controller::metrics::serve(
        health,
        metrics.clone(),
        cancel.clone(),
    ));

    if cfg.enable_webhook {
        let mgr = CertManager::new(
            client.clone(),
            &cfg.controller_namespace,
            &format!("{}-webhook-cert", cfg.controller_name),
            &cfg.controller_name,
            dns_names(
                &cfg.controller_name,
                &cfg.controller_namespace,
                &cfg.cluster_domain,
            ),
            &args.identity,
        );
        let bundle = loop {
            match mgr.current().await {
                Ok(b) => break b,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook certificate not available yet");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        let slot = CertSlot::new(&bundle.cert_pem, &bundle.key_pem)?;
        let listener = tokio::net::TcpListener::bind(&args.webhook_listen)
            .await
            .with_context(|| format!("bind {}", args.webhook_listen))?;
        let opts = InjectOptions {
            device_plugin: cfg.enable_device_plugin,
            inject: cfg.enable_init_container_inject,
            image: cfg.smc_init_image().to_string(),
            metrics: metrics.clone(),
        };
        // Acknowledge what this replica serves before serving it (a rotation waits for it).
        if let Err(e) = mgr.tick(&slot).await {
            tracing::warn!(error = %e, "webhook certificate check failed");
        }
        tasks.spawn(serve(listener, slot.clone(), opts, cancel.clone()));
        tasks.spawn(cert_loop(mgr, slot, cancel.clone()));
    }

    if cfg.local_eri_discovery {
        tracing::info!("localERIDiscovery: agents discover ERIs themselves; no provisioning");
    } else {
        let region = if cfg.region.is_empty() {
            erdma_cloud::imds::ImdsClient::new(&args.metadata_endpoint)?
                .get("/latest/meta-data/region-id")
                .await
                .context("config.region is empty and the metadata service did not answer; set config.region")?
                .trim()
                .to_string()
        } else {
            cfg.region.clone()
        };
        let creds = CredentialConfig::load(&args.credentials)?;
        tracing::info!(kind = %if creds.kind.is_empty() { "access_key" } else { &creds.kind }, region = %region, "cloud credentials");
        let (sns, sname) = creds.sts_secret();
        let source = creds.source(
            Arc::new(KubeSecretSource::new(client.clone(), &sns, &sname)),
            &args.metadata_endpoint,
            erdma_cloud::ecs::sts_endpoint(&region, args.public_network),
        )?;
        let ecs = EcsClient::new(
            EcsConfig {
                endpoint: args.ecs_endpoint.clone().unwrap_or_else(|| {
                    erdma_cloud::ecs::ecs_endpoint(&region, args.public_network)
                }),
                region,
                signature: if args.signature == "v2" {
                    SignatureVersion::V2
                } else {
                    SignatureVersion::V3
                },
                retry: RetryPolicy::default(),
            },
            Arc::new(CredentialProvider::new(source)),
        )?
        .with_timeouts(cfg.ecs_timeouts());
        let mut ctx = Ctx::new(client.clone(), ecs, cfg.clone());
        ctx.metrics = metrics.clone();
        let ctx = Arc::new(ctx);
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        tasks.spawn(
            LeaderElector::new(client.clone(), &cfg.controller_namespace, &args.identity)
                .run(tx, cancel.clone()),
        );
        let cancel2 = cancel.clone();
        tasks.spawn(async move {
            loop {
                if rx.wait_for(|l| *l).await.is_err() || cancel2.is_cancelled() {
                    return;
                }
                ctx.metrics.leader.set(1);
                let term = cancel2.child_token();
                let run = tokio::spawn(run_controllers(ctx.clone(), term.clone()));
                let _ = rx.wait_for(|l| !*l).await;
                term.cancel();
                let _ = run.await;
                ctx.metrics.leader.set(0);
                if cancel2.is_cancelled() {
                    return;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Every replica ticks its [`CertManager`]: hot reload, acknowledgement, `caBundle` upkeep and the
/// rotation's next step (see `erdma_controller::cert`).
async fn cert_loop(mgr: CertManager, slot: Arc<CertSlot>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        if let Err(e) = mgr.tick(&slot).await {
            tracing::warn!(error = %e, "webhook certificate check failed");
        }
    }
}
