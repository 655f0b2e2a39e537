//! The kubelet's DRA resource-health stream (`DRAResourceHealth.NodeWatchResources`, KEP-4680):
//! the health of every device of this driver's pool, sent when the kubelet opens the stream, on
//! every change, and again every [`REFRESH`] so the kubelet's per-device timeout never turns a
//! healthy device into `Unknown`. The kubelet puts it into `allocatedResourcesStatus` of the pods
//! that use the devices; the ResourceSlice's taints ([`crate::slice`]) keep new pods away.
//! Served in both API versions the kubelet may call: `v1alpha1` (1.34 to 1.36) and `v1`.

use erdma_kubelet::dra_health::{v1, v1alpha1};
use erdma_model::NodeDevices;
use futures::Stream;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// How often the current health is sent again without a change.
pub const REFRESH: Duration = Duration::from_secs(10);
/// How long the kubelet may trust a status without an update (several [`REFRESH`] periods).
pub const TIMEOUT_SECONDS: i64 = 60;
/// The longest message the kubelet keeps.
const MESSAGE_MAX: usize = 1024;

/// One device's health as the stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// The ResourceSlice device name.
    pub device: String,
    /// Healthy or not.
    pub healthy: bool,
    /// Why not (the inventory's reasons), empty when healthy.
    pub message: String,
}

/// The health of every served device that has a ResourceSlice name, in device-name order.
pub fn states(served: &NodeDevices) -> Vec<DeviceState> {
    let mut out: Vec<DeviceState> = served
        .devices
        .iter()
        .filter_map(|d| {
            let device = crate::slice::device_name(&d.name)?;
            let mut message = d.health.reasons().join("; ");
            if message.len() > MESSAGE_MAX {
                let mut cut = MESSAGE_MAX - 3;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
                message.push_str("...");
            }
            Some(DeviceState {
                device,
                healthy: d.health.is_healthy(),
                message,
            })
        })
        .collect();
    out.sort_by(|a, b| a.device.cmp(&b.device));
    out
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The stream of `make(states, now)` messages: at once, on every change of `served`, every
/// [`REFRESH`]; it ends when `stop` fires or the served set's sender goes.
fn updates<T, M>(
    served: watch::Receiver<NodeDevices>,
    stop: CancellationToken,
    make: M,
) -> BoxStream<T>
where
    T: Send + 'static,
    M: Fn(&[DeviceState], i64) -> T + Send + Sync + 'static,
{
    let mut ticker = tokio::time::interval(REFRESH);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let make = std::sync::Arc::new(make);
    let stream = futures::stream::unfold(
        (served, stop, ticker, make, true),
        |(mut rx, stop, mut ticker, make, first)| async move {
            if first {
                // The interval's first tick is immediate: it goes with the first message.
                ticker.tick().await;
            } else {
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    r = rx.changed() => if r.is_err() { return None },
                    _ = ticker.tick() => {}
                }
            }
            let now = states(&rx.borrow_and_update());
            let msg = make(&now, unix_now());
            Some((Ok(msg), (rx, stop, ticker, make, false)))
        },
    );
    Box::pin(stream)
}

/// The health service of one driver, in both API versions.
#[derive(Debug, Clone)]
pub struct HealthService {
    /// The pool every device belongs to (the node's).
    pub pool: String,
    /// The served devices.
    pub served: watch::Receiver<NodeDevices>,
    /// Ends every open stream.
    pub stop: CancellationToken,
}

impl HealthService {
    fn open(&self, version: &str) {
        tracing::info!(version, "kubelet opened the DRA resource-health stream");
    }
}

/// `DRAResourceHealth` for one API version: the versions differ only in their package, so one
/// definition serves both.
macro_rules! health_api {
    ($v:ident) => {
        #[tonic::async_trait]
        impl $v::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = BoxStream<$v::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _: Request<$v::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                self.open(stringify!($v));
                let pool = self.pool.clone();
                let make = move |states: &[DeviceState], now: i64| $v::NodeWatchResourcesResponse {
                    devices: states
                        .iter()
                        .map(|s| $v::DeviceHealth {
                            device: Some($v::DeviceIdentifier {
                                pool_name: pool.clone(),
                                device_name: s.device.clone(),
                            }),
                            health: if s.healthy {
                                $v::HealthStatus::Healthy
                            } else {
                                $v::HealthStatus::Unhealthy
                            } as i32,
                            last_updated_time: now,
                            health_check_timeout_seconds: TIMEOUT_SECONDS,
                            message: s.message.clone(),
                        })
                        .collect(),
                };
                Ok(Response::new(updates(
                    self.served.clone(),
                    self.stop.clone(),
                    make,
                )))
            }
        }
    };
}

health_api!(v1alpha1);
health_api!(v1);

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::{DeviceKind, Health, RdmaDevice};

    #[test]
    fn states_name_each_device_with_its_reasons_cut_to_the_kubelets_limit() {
        let mut a = RdmaDevice::named("erdma_1", DeviceKind::Erdma);
        a.health = Health::from_reasons(vec!["port 1 is DOWN".into(), "x".repeat(2000)]);
        let b = RdmaDevice::named("erdma_0", DeviceKind::Erdma);
        let mut served = NodeDevices::empty();
        served.devices = vec![a, b];
        let s = states(&served);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].device.as_str(), s[0].healthy), ("erdma-0", true));
        assert!(s[0].message.is_empty());
        assert_eq!((s[1].device.as_str(), s[1].healthy), ("erdma-1", false));
        assert!(
            s[1].message.starts_with("port 1 is DOWN; xxx"),
            "{}",
            s[1].message
        );
        assert_eq!(s[1].message.len(), MESSAGE_MAX);
        assert!(s[1].message.ends_with("..."));
    }
}
