//! A token bucket per ECS action, shared by every caller of one [`crate::EcsClient`] (and its
//! clones): ECS throttles per account and per API, so each action gets its own rate. Waiting is
//! by reservation (as Go's `golang.org/x/time/rate`, which client-go's and controller-runtime's
//! limiters use): a caller takes the next free slot and sleeps until it, so callers go in arrival
//! order and a burst never exceeds the bucket. A `Throttling` answer pauses the whole action for
//! the caller's jittered back-off, so the other callers of that action back off with it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Rate and burst of each action's bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Calls per second per action (sustained); `0` or less: unlimited.
    pub per_second: f64,
    /// Calls that may go at once after a quiet period (at least 1).
    pub burst: u32,
}

impl Default for RateLimit {
    /// 10 calls per second, burst 10: controller-runtime's client-side default for its
    /// queue (10 qps), per action here.
    fn default() -> Self {
        Self {
            per_second: 10.0,
            burst: 10,
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    paused_until: Option<Instant>,
}

/// The buckets of one client.
#[derive(Debug)]
pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    /// Buckets with `limit` each.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The limit of each action.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// How long the caller must wait before calling `action` (its slot is reserved).
    pub fn reserve(&self, action: &str) -> Duration {
        if self.limit.per_second <= 0.0 {
            return Duration::ZERO;
        }
        let burst = f64::from(self.limit.burst.max(1));
        let now = Instant::now();
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = b.entry(action.to_string()).or_insert(Bucket {
            tokens: burst,
            last: now,
            paused_until: None,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.limit.per_second).min(burst);
        bucket.last = now;
        bucket.tokens -= 1.0;
        let mut wait = if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / self.limit.per_second)
        };
        if let Some(until) = bucket.paused_until {
            wait = wait.max(until.saturating_duration_since(now));
        }
        wait
    }

    /// Waits for a slot of `action`.
    pub async fn acquire(&self, action: &str) {
        let wait = self.reserve(action);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// `action` was throttled: nobody calls it again for `for_` (the longest pause asked wins).
    pub fn pause(&self, action: &str, for_: Duration) {
        let until = Instant::now() + for_;
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = b.get_mut(action) {
            bucket.paused_until = Some(bucket.paused_until.map_or(until, |u| u.max(until)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_one_slot_per_interval() {
        let l = Limiter::new(RateLimit {
            per_second: 10.0,
            burst: 3,
        });
        for _ in 0..3 {
            assert_eq!(l.reserve("A"), Duration::ZERO);
        }
        let w = l.reserve("A");
        assert!(
            w > Duration::from_millis(90) && w <= Duration::from_millis(100),
            "{w:?}"
        );
        let w2 = l.reserve("A");
        assert!(
            w2 > Duration::from_millis(190) && w2 <= Duration::from_millis(200),
            "{w2:?}"
        );
        // Other actions have their own bucket.
        assert_eq!(l.reserve("B"), Duration::ZERO);
    }

    #[test]
    fn a_pause_holds_every_caller_of_the_action() {
        let l = Limiter::new(RateLimit {
            per_second: 100.0,
            burst: 100,
        });
        assert_eq!(l.reserve("A"), Duration::ZERO);
        l.pause("A", Duration::from_secs(2));
        assert!(l.reserve("A") > Duration::from_millis(1900));
        assert_eq!(l.reserve("B"), Duration::ZERO);
    }

    #[test]
    fn unlimited_never_waits() {
        let l = Limiter::new(RateLimit {
            per_second: 0.0,
            burst: 1,
        });
        for _ in 0..1000 {
            assert_eq!(l.reserve("A"), Duration::ZERO);
        }
    }
}
