//! The observer registry: one bounded queue and one thread per observer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use parking_lot::RwLock;

use super::{ObserverStats, ResidencyEvent, ResidencyObserver};
use crate::error::{Error, Result};

/// Events handed to an observer in one call, at most.
const MAX_BATCH: usize = 256;

struct Subscription {
    id: u64,
    name: String,
    tx: Sender<ResidencyEvent>,
    delivered: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

/// The engine's observers. Publishing costs one relaxed load when nobody observes.
#[derive(Default)]
pub struct Observers {
    subs: RwLock<Arc<[Arc<Subscription>]>>,
    any: AtomicBool,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.subs.read().iter().map(|s| s.name.clone()).collect();
        f.debug_struct("Observers").field("names", &names).finish()
    }
}

impl Observers {
    /// Whether anyone observes (so building an event is worth it).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Hands the event `make` builds to every observer's queue, never waiting: a full
    /// queue drops it (counted). Does not build the event when nobody observes.
    pub fn publish(&self, make: impl FnOnce() -> ResidencyEvent) {
        if !self.any() {
            return;
        }
        let subs = self.subs.read().clone();
        let Some((last, rest)) = subs.split_last() else {
            return;
        };
        let event = make();
        for sub in rest {
            sub.offer(event.clone());
        }
        last.offer(event);
    }

    /// Registers `observer` under `name` (letters, digits and `_`, unique) with a queue of
    /// `queue_len` events, and starts its thread. Dropping the handle unregisters it.
    pub fn register(
        self: &Arc<Self>,
        name: &str,
        observer: Arc<dyn ResidencyObserver>,
        queue_len: usize,
    ) -> Result<ObserverHandle> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(Error::invalid(format!(
                "observer name `{name}` must be non-empty lowercase letters, digits and `_` (it names counters)"
            )));
        }
        if queue_len == 0 {
            return Err(Error::invalid(
                "an observer's queue must hold at least one event",
            ));
        }
        let (tx, rx) = bounded(queue_len);
        let delivered = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let sub = Arc::new(Subscription {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            tx,
            delivered: delivered.clone(),
            dropped: dropped.clone(),
        });
        {
            let mut subs = self.subs.write();
            if subs.iter().any(|s| s.name == name) {
                return Err(Error::invalid(format!(
                    "an observer named `{name}` is registered already"
                )));
            }
            std::thread::Builder::new()
                .name(format!("kvtier-observer-{name}"))
                .spawn(move || deliver(&rx, observer.as_ref(), &delivered, &dropped))
                .map_err(|e| {
                    Error::new(
                        crate::ErrorKind::Unavailable,
                        format!("cannot start the thread of observer `{name}`"),
                    )
                    .with_source(e)
                })?;
            let mut list: Vec<Arc<Subscription>> = subs.iter().cloned().collect();
            list.push(sub.clone());
            *subs = list.into();
            self.any.store(true, Ordering::Relaxed);
        }
        Ok(ObserverHandle {
            registry: Arc::downgrade(self),
            id: sub.id,
        })
    }

    fn unregister(&self, id: u64) {
        let mut subs = self.subs.write();
        let list: Vec<Arc<Subscription>> = subs.iter().filter(|s| s.id != id).cloned().collect();
        self.any.store(!list.is_empty(), Ordering::Relaxed);
        *subs = list.into();
    }

    /// Every observer's counters, in registration order.
    pub fn stats(&self) -> Vec<ObserverStats> {
        self.subs
            .read()
            .iter()
            .map(|s| ObserverStats {
                name: s.name.clone(),
                delivered: s.delivered.load(Ordering::Relaxed),
                dropped: s.dropped.load(Ordering::Relaxed),
                queued: s.tx.len() as u64,
            })
            .collect()
    }
}

impl Subscription {
    fn offer(&self, event: ResidencyEvent) {
        match self.tx.try_send(event) {
            Ok(()) => {}
            // Full, or the observer's thread is gone (it panicked): either way it missed
            // this one.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The observer's thread: takes what is queued, up to [`MAX_BATCH`] at a time, and hands
/// it over — after telling it how many were dropped since the last batch, if any. Ends
/// when the observer is unregistered and its queue is empty.
fn deliver(
    rx: &Receiver<ResidencyEvent>,
    observer: &dyn ResidencyObserver,
    delivered: &AtomicU64,
    dropped: &AtomicU64,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut missed_told = 0;
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let missed = dropped.load(Ordering::Relaxed);
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if missed > missed_told {
                observer.missed(missed - missed_told);
            }
            observer.observe(&batch);
        }));
        missed_told = missed;
        batch.clear();
        if ok.is_err() {
            tracing::error!("a residency observer panicked; it receives no more events");
            return;
        }
        delivered.fetch_add(n, Ordering::Relaxed);
    }
}

/// Keeps an observer registered; dropping it unregisters the observer (its thread hands
/// over what is still queued, then ends).
#[derive(Debug)]
pub struct ObserverHandle {
    registry: Weak<Observers>,
    id: u64,
}

impl Drop for ObserverHandle {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.unregister(self.id);
        }
    }
}
