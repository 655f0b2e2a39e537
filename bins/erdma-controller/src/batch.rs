//! Describe calls batched across reconciles: ECS's describes take lists of IDs (100 a call), so
//! the reconciles that ask within one window share a call. The first caller of a window
//! leads: it waits the window (or until `max` asks are waiting), then calls for everything asked
//! so far (at most `max` distinct keys a call, until nothing is left) and hands each caller its
//! answer. No task is spawned: when the leader is dropped (shutdown), the callers it was serving
//! get [`BatchError::Abandoned`].

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
    /// While the leader gathers: wakes it when a call's worth of asks is waiting.
    full: Option<oneshot::Sender<()>>,
}

/// One kind of batched describe: key `K` (an ID), answer `V`.
pub struct Batcher<K, V> {
    window: Duration,
    max: usize,
    state: Mutex<State<K, V>>,
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
        st.full = None;
        // Whoever is still waiting gets Abandoned (their senders drop here).
        st.pending.clear();
    }
}

/// Takes from `pending` the asks of its first `max` distinct keys (every ask of those keys,
/// wherever it stands): the keys to call for and the asks they answer. An ask repeated while
/// waiting (two reconciles of one object, or a lookup without a key) costs no room in a call.
#[allow(clippy::type_complexity)]
fn take_batch<K: Clone + Eq + Hash, T>(
    pending: &mut Vec<(K, T)>,
    max: usize,
) -> (Vec<K>, Vec<(K, T)>) {
    let mut keys: Vec<K> = Vec::new();
    let mut chosen: std::collections::HashSet<K> = std::collections::HashSet::new();
    let mut batch = Vec::new();
    let mut rest = Vec::with_capacity(pending.len());
    for (k, t) in pending.drain(..) {
        if chosen.contains(&k) {
            batch.push((k, t));
        } else if keys.len() < max {
            chosen.insert(k.clone());
            keys.push(k.clone());
            batch.push((k, t));
        } else {
            rest.push((k, t));
        }
    }
    *pending = rest;
    (keys, batch)
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
                full: None,
            }),
        }
    }

    /// The answer for `key` (`None`: ECS did not return it); `call` describes a batch of keys.
    pub async fn get<F, Fut>(&self, key: K, call: F) -> Answer<V>
    where
        F: Fn(Vec<K>) -> Fut,
        Fut: Future<Output = Result<HashMap<K, V>, EcsError>>,
    {
        let (tx, rx) = oneshot::channel();
        // Leading: `Some(gathering)`, where `gathering` wakes the leader when a call's worth
        // is waiting (`None`: it already is).
        let lead = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pending.push((key, tx));
            let full = st.pending.len() >= self.max;
            if full && let Some(wake) = st.full.take() {
                let _ = wake.send(());
            }
            if std::mem::replace(&mut st.leading, true) {
                None
            } else if full {
                Some(None)
            } else {
                let (wake, gathering) = oneshot::channel();
                st.full = Some(wake);
                Some(Some(gathering))
            }
        };
        if let Some(gathering) = lead {
            let guard = Lead(&self.state);
            if let Some(gathering) = gathering {
                let _ = tokio::time::timeout(self.window, gathering).await;
                self.state.lock().unwrap_or_else(|p| p.into_inner()).full = None;
            }
            loop {
                let (keys, batch) = {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    take_batch(&mut st.pending, self.max)
                };
                if batch.is_empty() {
                    break;
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
            2,
            "7 asks of 6 distinct keys, 3 keys a call (the repeated key rides along)"
        );
    }

    #[tokio::test]
    async fn a_lookup_without_key_is_shared_by_every_ask_waiting_for_it() {
        // max 1 on a single key: the first ask goes at once, and the asks that come while
        // its call is out share the next call, however many they are.
        let b: Batcher<(), u32> = Batcher::new(Duration::from_secs(3600), 1);
        let calls = AtomicUsize::new(0);
        let gate = tokio::sync::Semaphore::new(0);
        let call = |_keys: Vec<()>| {
            let n = calls.fetch_add(1, Ordering::SeqCst) as u32;
            let gate = &gate;
            async move {
                if n == 0 {
                    // The first call is answered only once the other asks are waiting.
                    let _ = gate.acquire().await;
                }
                Ok(HashMap::from([((), n)]))
            }
        };
        let first = b.get((), call);
        let rest = async {
            tokio::task::yield_now().await;
            let asks = futures::future::join_all((0..50).map(|_| b.get((), call)));
            let release = async {
                tokio::task::yield_now().await;
                gate.add_permits(1);
            };
            futures::join!(asks, release).0
        };
        let (first, rest) = futures::join!(first, rest);
        assert_eq!(first.unwrap(), Some(0));
        assert!(rest.iter().all(|a| matches!(a, Ok(Some(1)))), "{rest:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "51 asks, 2 calls");
    }

    #[test]
    fn a_batch_takes_every_ask_of_its_keys_and_leaves_the_rest_in_order() {
        let mut pending: Vec<(u32, char)> =
            vec![(1, 'a'), (2, 'b'), (1, 'c'), (3, 'd'), (2, 'e'), (4, 'f')];
        let (keys, batch) = take_batch(&mut pending, 2);
        assert_eq!(keys, vec![1, 2]);
        assert_eq!(batch, vec![(1, 'a'), (2, 'b'), (1, 'c'), (2, 'e')]);
        assert_eq!(pending, vec![(3, 'd'), (4, 'f')]);
    }
}
