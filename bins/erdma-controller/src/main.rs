//! `erdma-controller`: wires the configuration, the Kubernetes and ECS clients, leader election,
//! the reconcilers and the webhook together. All logic lives in the library.
//!
//! Shutdown contract: after SIGTERM or SIGINT the process exits within 5 s, with status 0,
//! whatever it was waiting on (an API server that does not answer, the webhook certificate, the
//! metadata service); what it cut short is logged as `abandoned: ...`. Every wait gives way to
//! the shutdown; the tasks' graceful tail gets [`SHUTDOWN_GRACE`], the runtime then
//! [`RUNTIME_SHUTDOWN`], and a last resort ends the process at [`HARD_LIMIT`] should the runtime
//! itself be stuck.

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
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long the graceful shutdown may take once SIGTERM/SIGINT arrived: what has not finished by
/// then is abandoned (and logged).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);
/// How long the runtime's shutdown waits for its blocking threads (a DNS lookup, for one).
const RUNTIME_SHUTDOWN: Duration = Duration::from_millis(500);
/// After SIGTERM/SIGINT the process ends by this time in any case.
const HARD_LIMIT: Duration = Duration::from_secs(5);
/// How often the webhook certificate is asked for again while the API server does not give it.
const CERT_RETRY: Duration = Duration::from_secs(5);

/// erdma cluster controller.
#[derive(Debug, Parser)]
#[command(
    name = "erdma-controller",
    version,
    about,
    after_help = "Exit status: 0 stopped on SIGTERM or SIGINT (within 5 s; anything cut short is logged as abandoned), or --check-install passed; 1 a fatal runtime error (logged), or --check-install found a gap; 2 usage or configuration error (flags, addresses, --log-format, --log-level, RUST_LOG, a missing or broken config file)."
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

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => {
            let code = rt.block_on(async_main());
            // Dropping the runtime would wait for every blocking thread, however long.
            rt.shutdown_timeout(RUNTIME_SHUTDOWN);
            code
        }
        Err(e) => {
            eprintln!("erdma-controller: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main() -> ExitCode {
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
    let cancel = CancellationToken::new();
    if let Err(e) = on_signal(cancel.clone()) {
        tracing::error!("{e:#}");
        return ExitCode::FAILURE;
    }
    let pending = Pending::default();
    let deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let result = tokio::select! {
        r = run(args, cfg, cancel.clone(), pending.clone()) => r,
        () = deadline => {
            tracing::warn!(
                grace = ?SHUTDOWN_GRACE,
                "the graceful shutdown did not finish in time; exiting without it"
            );
            for what in pending.list() {
                tracing::warn!("abandoned: {what}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM or SIGINT cancels `cancel` (and arms [`last_resort`]).
fn on_signal(cancel: CancellationToken) -> anyhow::Result<()> {
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
/// (bounded by [`SHUTDOWN_GRACE`] and [`RUNTIME_SHUTDOWN`], well within it) be stuck where no
/// timer runs. A thread of its own, not a task: it must run when the runtime does not; it ends
/// with the process.
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

/// The tasks running, by name: what a shutdown cut short abandoned.
#[derive(Debug, Clone, Default)]
struct Pending {
    next: Arc<AtomicU64>,
    names: Arc<Mutex<BTreeMap<u64, &'static str>>>,
}

/// Removes its name from [`Pending`] when dropped (the task ended or was dropped).
struct PendingGuard {
    id: u64,
    names: Arc<Mutex<BTreeMap<u64, &'static str>>>,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Pending {
    /// `fut`, recorded as `what` until it ends or is dropped.
    fn track<F: Future>(
        &self,
        what: &'static str,
        fut: F,
    ) -> impl Future<Output = F::Output> + use<F> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, what);
        let guard = PendingGuard {
            id,
            names: self.names.clone(),
        };
        async move {
            let out = fut.await;
            drop(guard);
            out
        }
    }

    /// What is recorded now, oldest first.
    fn list(&self) -> Vec<&'static str> {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect()
    }
}

/// `fut`'s output, or `None` once `cancel` fired: then `what` is logged as abandoned.
async fn or_abandon<F: Future>(
    cancel: &CancellationToken,
    what: &str,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        r = fut => Some(r),
        _ = cancel.cancelled() => {
            tracing::warn!("abandoned: {what}");
            None
        }
    }
}

/// Waits for the tasks started so far to stop (they follow the cancellation; the caller's
/// deadline bounds the wait).
async fn stop(mut tasks: JoinSet<()>) -> anyhow::Result<()> {
    while tasks.join_next().await.is_some() {}
    Ok(())
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

/// The controller until `cancel` (SIGTERM/SIGINT), or its fatal error. Every wait before the
/// tasks run gives way to `cancel` (logged as abandoned); `pending` names the tasks running, for
/// the caller's shutdown deadline.
async fn run(
    args: Args,
    cfg: Config,
    cancel: CancellationToken,
    pending: Pending,
) -> anyhow::Result<()> {
    let Some(client) = or_abandon(
        &cancel,
        "building the Kubernetes client",
        erdma_k8s::client::infer(&cfg.kube_client_options()),
    )
    .await
    else {
        return Ok(());
    };
    let client = client.context("Kubernetes client")?;
    let mut tasks = JoinSet::new();
    let metrics = Arc::new(Metrics::default());
    // Not ready until the webhook port serves (it first waits for its certificate).
    metrics
        .webhook_required
        .store(cfg.enable_webhook, std::sync::atomic::Ordering::Relaxed);
    let health = tokio::net::TcpListener::bind(&args.health_listen)
        .await
        .with_context(|| format!("bind {}", args.health_listen))?;
    tasks.spawn(pending.track(
        "serving /metrics",
        erdma_controller::metrics::serve(health, metrics.clone(), cancel.clone()),
    ));

    if cfg.enable_webhook {
        let mgr = CertManager::new(
            client.clone(),
            &cfg.controller_namespace,
            &format!("{}-webhook-tls", cfg.controller_name),
            &cfg.controller_name,
            dns_names(
                &cfg.controller_name,
                &cfg.controller_namespace,
                &cfg.cluster_domain,
            ),
            &args.identity,
        );
        // The API server may not answer, or refuse, for ever: retried until the shutdown.
        let secret = format!(
            "{}/{}-webhook-tls",
            cfg.controller_namespace, cfg.controller_name
        );
        let mut last_error: Option<String> = None;
        let bundle = loop {
            let what = match &last_error {
                None => format!("waiting for the webhook certificate (Secret {secret})"),
                Some(e) => {
                    format!(
                        "waiting for the webhook certificate (Secret {secret}; last error: {e})"
                    )
                }
            };
            let Some(got) = or_abandon(&cancel, &what, mgr.current()).await else {
                return stop(tasks).await;
            };
            match got {
                Ok(b) => break b,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?CERT_RETRY, "webhook certificate not available yet");
                    let what = format!(
                        "waiting for the webhook certificate (Secret {secret}; last error: {e})"
                    );
                    last_error = Some(e.to_string());
                    let retry = tokio::time::sleep(CERT_RETRY);
                    if or_abandon(&cancel, &what, retry).await.is_none() {
                        return stop(tasks).await;
                    }
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
            events: Some(erdma_k8s::events::Events::new(
                client.clone(),
                erdma_k8s::labels::MANAGER,
                &args.identity,
            )),
        };
        // Acknowledge what this replica serves before serving it (a rotation waits for it).
        let ack = "acknowledging the webhook certificate served";
        match or_abandon(&cancel, ack, mgr.tick(&slot)).await {
            None => return stop(tasks).await,
            Some(Err(e)) => tracing::warn!(error = %e, "webhook certificate check failed"),
            Some(Ok(_)) => {}
        }
        tasks.spawn(pending.track(
            "serving the webhook",
            serve(listener, slot.clone(), opts, cancel.clone()),
        ));
        tasks.spawn(pending.track(
            "the webhook certificate's upkeep",
            cert_loop(mgr, slot, cancel.clone()),
        ));
    }

    if cfg.local_eri_discovery {
        tracing::info!("localERIDiscovery: agents discover ERIs themselves; no provisioning");
    } else {
        let region = if cfg.region.is_empty() {
            let imds = erdma_cloud::imds::ImdsClient::new(&args.metadata_endpoint)?;
            let asked = "asking the metadata service for the region";
            let Some(answer) =
                or_abandon(&cancel, asked, imds.get("/latest/meta-data/region-id")).await
            else {
                return stop(tasks).await;
            };
            answer
                .context("config.region is empty and the metadata service did not answer; set config.region")?
                .trim()
                .to_string()
        } else {
            cfg.region.clone()
        };
        // The cluster's VPC: only instances in it are changed (erdma_controller::verify).
        let mut cfg = cfg;
        if cfg.vpc_id.is_empty() {
            let imds = erdma_cloud::imds::ImdsClient::new(&args.metadata_endpoint)?;
            let asked = "asking the metadata service for the VPC";
            let Some(answer) =
                or_abandon(&cancel, asked, imds.get("/latest/meta-data/vpc-id")).await
            else {
                return stop(tasks).await;
            };
            cfg.vpc_id = answer
                .context("config.vpcId is empty and the metadata service did not answer; set config.vpcId to the cluster's VPC (vpc-…)")?
                .trim()
                .to_string();
        }
        tracing::info!(vpc = %cfg.vpc_id, "provisioning only instances of this VPC");
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
        .with_timeouts(cfg.ecs_timeouts())
        .with_rate_limit(cfg.ecs_rate_limit())
        .with_observer(metrics.clone());
        let mut ctx = Ctx::new(client.clone(), ecs, cfg.clone());
        ctx.metrics = metrics.clone();
        let ctx = Arc::new(ctx);
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        tasks.spawn(
            pending.track(
                "leader election",
                LeaderElector::new(client.clone(), &cfg.controller_namespace, &args.identity)
                    .run(tx, cancel.clone()),
            ),
        );
        let cancel2 = cancel.clone();
        tasks.spawn(pending.track("the reconcilers", async move {
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
        }));
    }
    stop(tasks).await
}

/// Every replica ticks its [`CertManager`]: hot reload, acknowledgement, `caBundle` upkeep and the
/// rotation's next step (see `erdma_controller::cert`).
async fn cert_loop(mgr: CertManager, slot: Arc<CertSlot>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        let tick = "a webhook certificate check the API server has not answered";
        let Some(ticked) = or_abandon(&cancel, tick, mgr.tick(&slot)).await else {
            return;
        };
        if let Err(e) = ticked {
            tracing::warn!(error = %e, "webhook certificate check failed");
        }
    }
}
