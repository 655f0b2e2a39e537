//! Leader election over a `coordination.k8s.io/v1` Lease (the original's ID
//! `26dc1c71.alibabacloud.com`): acquire when free or expired, renew every `retry`, give up
//! leadership when a renewal has not succeeded within `lease_duration`.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The original's leader-election ID.
pub const LEASE_NAME: &str = "26dc1c71.alibabacloud.com";

/// Leader-election settings.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    /// Lease API (controller namespace).
    pub api: Api<Lease>,
    /// Lease name.
    pub name: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// Interval between attempts.
    pub retry: Duration,
}

impl LeaderElector {
    /// Defaults: 15 s lease, 2 s retry.
    pub fn new(client: Client, namespace: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: LEASE_NAME.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry: Duration::from_secs(2),
        }
    }

    /// One attempt: `Ok(true)` when this replica holds the lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let secs = self.lease_duration.as_secs() as i32;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(t), Some(d)) => t.0 + SignedDuration::from_secs(i64::from(d)) < now,
            _ => true,
        };
        if !mine && !expired {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(secs);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Runs until `cancel`, publishing leadership on `leader`. Leadership is dropped when no
    /// renewal succeeded for `lease_duration`. Returns as soon as `cancel` fires, an attempt in
    /// flight included (leadership then published as lost).
    pub async fn run(self, leader: watch::Sender<bool>, cancel: CancellationToken) {
        let mut last_ok: Option<tokio::time::Instant> = None;
        loop {
            // An API server that does not answer must not hold the shutdown up.
            let attempt = tokio::select! {
                _ = cancel.cancelled() => {
                    tracing::warn!(lease = %self.name, "abandoned: a lease request the API server has not answered");
                    leader.send_replace(false);
                    return;
                }
                r = self.try_acquire_or_renew() => r,
            };
            match attempt {
                Ok(true) => {
                    last_ok = Some(tokio::time::Instant::now());
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                    }
                    leader.send_replace(true);
                }
                Ok(false) => {
                    last_ok = None;
                    leader.send_replace(false);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    if last_ok.is_none_or(|t| t.elapsed() >= self.lease_duration) {
                        if *leader.borrow() {
                            tracing::warn!("lost leadership");
                        }
                        leader.send_replace(false);
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => { leader.send_replace(false); return; }
                _ = tokio::time::sleep(self.retry) => {}
            }
        }
    }
}
