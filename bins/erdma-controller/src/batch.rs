//! Describe calls batched across reconciles: ECS's describes take lists of IDs (100 a call), so
//! the reconciles that ask within one window share a call. The first caller of a window
//! leads: it waits the window (or until `max` keys are asked), then calls for everything asked so far (at most `max` keys a
//! call, until nothing is left) and hands each caller its answer. No task is spawned: when the
//! leader is dropped (shutdown), the callers it was serving get [`BatchError::Abandoned`].

use erdma_cloud::EcsError;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Why a batched answer did not come.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// The batch's call failed (shared by every caller of the batch).
    #[error(transparent)]
    Ecs(Arc<EcsError>),
    /// The caller leading the batch went away before answering (shutdown).
    #[error("the batched ECS call was abandoned")]
    Abandoned,
}

impl BatchError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Ecs(e) => e.is_retryable(),
            Self::Abandoned => true,
        }
    }
}

type Answer<V> = Result<Option<V>, BatchError>;

struct State<K, V> {
    pending: Vec<(K, oneshot::Sender<Answer<V>>)>,
    leading: bool,
}

/// One kind of batched describe: key `K` (an ID), answer `V`.
pub struct Batcher<K, V> {
    window: Duration,
    max: usize,
    state: Mutex<State<K, V>>,
    full: tokio::sync::Notify,
}

impl<K, V> std::fmt::Debug for Batcher<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("window", &self.window)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

struct Lead<'a, K, V>(&'a Mutex<State<K, V>>);

impl<K, V> Drop for Lead<'_, K, V> {
    fn drop(&mut self) {
        let mut st = self.0.lock().unwrap_or_else(|p| p.into_inner());
        st.leading = false;
        // Whoever is still waiting gets Abandoned (their senders drop here).
        st.pending.clear();
    }
}

impl<K: Clone + Eq + Hash, V: Clone> Batcher<K, V> {
    /// Batches of at most `max` keys, gathered for `window`.
    pub fn new(window: Duration, max: usize) -> Self {
        Self {
            window,
            max: max.max(1),
            state: Mutex::new(State {
                pending: Vec::new(),
                leading: false,
            }),
            full: tokio::sync::Notify::new(),
        }
    }

    /// The answer for `key` (`None`: ECS did not return it); `call` describes a batch of keys.
    pub async fn get<F, Fut>(&self, key: K, call: F) -> Answer<V>
    where
        F: Fn(Vec<K>) -> Fut,
        Fut: Future<Output = Result<HashMap<K, V>, EcsError>>,
    {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pending.push((key, tx));
            if st.pending.len() >= self.max {
                self.full.notify_one();
            }
            !std::mem::replace(&mut st.leading, true)
        };
        if lead {
            let guard = Lead(&self.state);
            let _ = tokio::time::timeout(self.window, self.full.notified()).await;
            loop {
                let batch: Vec<(K, oneshot::Sender<Answer<V>>)> = {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    let n = st.pending.len().min(self.max);
                    st.pending.drain(..n).collect()
                };
                if batch.is_empty() {
                    break;
                }
                let mut keys: Vec<K> = Vec::with_capacity(batch.len());
                for (k, _) in &batch {
                    if !keys.contains(k) {
                        keys.push(k.clone());
                    }
                }
                match call(keys).await {
                    Ok(found) => {
                        for (k, tx) in batch {
                            let _ = tx.send(Ok(found.get(&k).cloned()));
                        }
                    }
                    Err(e) => {
                        let e = Arc::new(e);
                        for (_, tx) in batch {
                            let _ = tx.send(Err(BatchError::Ecs(e.clone())));
                        }
                    }
                }
            }
            drop(guard);
        }
        rx.await.unwrap_or(Err(BatchError::Abandoned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn callers_within_a_window_share_calls_of_at_most_max_keys() {
        let b: Batcher<u32, u32> = Batcher::new(Duration::from_millis(20), 3);
        let calls = AtomicUsize::new(0);
        let call = |keys: Vec<u32>| {
            calls.fetch_add(1, Ordering::SeqCst);
            assert!(keys.len() <= 3);
            async move {
                Ok(keys
                    .into_iter()
                    .filter(|k| *k != 4)
                    .map(|k| (k, k * 10))
                    .collect())
            }
        };
        let answers = futures::future::join_all((0..7).map(|k| b.get(k % 6, call))).await;
        let got: Vec<Option<u32>> = answers.into_iter().map(|a| a.unwrap()).collect();
        assert_eq!(
            got,
            vec![
                Some(0),
                Some(10),
                Some(20),
                Some(30),
                None,
                Some(50),
                Some(0)
            ]
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "7 asks of 6 keys, 3 a call"
        );
    }
}
