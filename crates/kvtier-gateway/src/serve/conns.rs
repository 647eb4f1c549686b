//! The connection cap, and the watch on each connection's idleness.
//!
//! At most `max` connections are open. When one more arrives at the cap, the connection
//! idle longest (no request in flight) is closed to make room; only when every open
//! connection is busy is the new one refused (closed at once). So sockets that connect
//! and send nothing — or keep-alive connections nobody uses — can never lock out a client
//! with work to do. An idle connection told to close closes at once (its descriptor is what
//! the new one needs); one whose request began meanwhile finishes it first. `max` is
//! clamped at start to what the open-file limit leaves (`kvtier_listen::fds`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// One open connection, as its task and the tracker see it.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    in_flight: AtomicUsize,
    /// Requests started on it.
    pub requests: AtomicU64,
    /// Milliseconds (since the tracker started) of the last request's end, or the accept.
    idle_since_ms: AtomicU64,
    /// Notified when the tracker wants it closed.
    pub evict: Notify,
    /// The last answer was an error (4xx, 5xx), possibly given before its request body was
    /// read: if the connection ends, it is closed lingering (see `serve_connection`).
    pub error_answered: AtomicBool,
    epoch: Instant,
}

impl Conn {
    /// A request started.
    pub fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended (its response was handed over).
    pub fn end(&self) {
        self.idle_since_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether no request is in flight.
    pub fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// How long it has been idle (zero while busy).
    pub fn idle_for(&self) -> Duration {
        if !self.idle() {
            return Duration::ZERO;
        }
        let since = self.idle_since_ms.load(Ordering::Relaxed);
        self.epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(since))
    }
}

/// The open connections.
#[derive(Debug)]
pub struct Tracker {
    max: usize,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    epoch: Instant,
    /// Idle connections closed to admit a new one.
    pub evicted: AtomicU64,
    /// Connections refused because every open one was busy.
    pub refused: AtomicU64,
}

impl Tracker {
    /// At most `max` open connections (at least 1).
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Admits a new connection, closing the longest-idle one if at the cap; `None` when
    /// every open connection is busy (the new one is refused).
    pub fn admit(&self) -> Option<Arc<Conn>> {
        let mut open = self.open.lock();
        if open.len() >= self.max && !Self::evict_idlest_of(&mut open, &self.evicted) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            evict: Notify::new(),
            error_answered: AtomicBool::new(false),
            epoch: self.epoch,
        });
        open.insert(id, conn.clone());
        Some(conn)
    }

    /// Closes the longest-idle connection (to free its descriptor when `accept` ran out);
    /// false when every open connection is busy.
    pub fn evict_idlest(&self) -> bool {
        Self::evict_idlest_of(&mut self.open.lock(), &self.evicted)
    }

    fn evict_idlest_of(open: &mut HashMap<u64, Arc<Conn>>, evicted: &AtomicU64) -> bool {
        let victim = open
            .values()
            .filter(|c| c.idle())
            .max_by_key(|c| c.idle_for())
            .cloned();
        match victim {
            Some(v) => {
                open.remove(&v.id);
                v.evict.notify_one();
                evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// A connection ended.
    pub fn release(&self, conn: &Conn) {
        self.open.lock().remove(&conn.id);
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.open.lock().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_never_do() {
        let t = Tracker::new(2);
        let a = t.admit().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let b = t.admit().unwrap();
        // Both idle: the older one (a) goes.
        let c = t.admit().unwrap();
        assert_eq!(t.open(), 2);
        assert_eq!(t.evicted.load(Ordering::Relaxed), 1);
        assert!(!t.open.lock().contains_key(&a.id));
        // Both busy: the next is refused.
        b.begin();
        c.begin();
        assert!(t.admit().is_none());
        assert_eq!(t.refused.load(Ordering::Relaxed), 1);
        // One done: it makes room.
        c.end();
        assert!(t.admit().is_some());
        assert!(!t.open.lock().contains_key(&c.id));
        t.release(&b);
        assert_eq!(t.open(), 1);
    }
}
