//! What the agent is waiting on or running, by name: the shutdown report's `abandoned: ...`
//! lines name what [`Pending`] holds when the grace ran out.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the agent is waiting on or running, by name: what a shutdown cut short abandoned.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    next: Arc<AtomicU64>,
    names: Arc<Mutex<BTreeMap<u64, String>>>,
}

/// Removes its name from [`Pending`] when dropped.
#[derive(Debug)]
pub struct PendingGuard {
    id: u64,
    names: Arc<Mutex<BTreeMap<u64, String>>>,
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
    /// Records `what` until the guard is dropped.
    pub fn enter(&self, what: impl Into<String>) -> PendingGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, what.into());
        PendingGuard {
            id,
            names: self.names.clone(),
        }
    }

    /// `fut`, recorded as `what` until it ends or is dropped.
    pub fn track<F: Future>(&self, what: &str, fut: F) -> impl Future<Output = F::Output> + use<F> {
        let guard = self.enter(what);
        async move {
            let out = fut.await;
            drop(guard);
            out
        }
    }

    /// What is recorded now, oldest first.
    pub fn list(&self) -> Vec<String> {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}
