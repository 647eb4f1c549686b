//! The listener: accepts connections and serves them with bounds on time and count.
//!
//! `axum::serve` has neither timeouts nor a connection cap, so an idle or slow client
//! could hold a connection (and a file descriptor) for ever, and enough of them starve
//! everyone else. Here each connection is served by hyper directly ([`conn`]), with:
//!
//! - `idle_timeout`: a connection with no request in progress is closed this long after
//!   it was accepted or its last response was sent;
//! - `header_timeout`: a request head must be complete this long after its first byte;
//! - `body_timeout`: a request body must have arrived whole this long after its head
//!   (the handler answers 408 `body_timeout` and the connection is closed);
//! - `max_connections`: at the cap, a new connection closes the connection that has been
//!   idle longest (every idle one costs a descriptor and does nothing); when every
//!   connection has a request in progress, the new one is closed at once instead of
//!   waiting in the kernel's backlog. Idle sockets therefore cannot lock legitimate
//!   clients out: a client that connects and sends its request is served. The cap is
//!   clamped at start to what the open-file limit leaves (`kvtier_listen::fds`, shared
//!   with the gateway), so that the cap, not `EMFILE`, meets the idle sockets first;
//! - a request head over `kvtier_listen::MAX_HEAD` is answered 431 by hyper.
//!
//! A connection that ends after an answer given before its request was read whole (431,
//! 413, 408) is closed lingering (`kvtier_listen::linger`), so the answer is not lost to
//! a reset. A failed `accept` (out of descriptors) closes the longest-idle connection and
//! backs off instead of spinning. Closures for limits are logged at a rate-limited `warn`
//! ([`refusals`]).

mod body;
mod conn;
pub mod refusals;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

pub use body::{BodyTimedOut, timed_out};
use conn::ConnState;
use refusals::{Level, REFUSALS};

/// The bounds every connection is served under (settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// From the first byte of a request head to its end.
    pub header_timeout: Duration,
    /// From the end of a request head to the end of its body.
    pub body_timeout: Duration,
    /// How long a connection with no request in progress stays open.
    pub idle_timeout: Duration,
}

/// Open connections, by id, for the cap.
#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Arc<ConnState>>,
}

impl Table {
    /// Makes room for one more connection under `cap`: nothing to do below it; at it, the
    /// longest-idle connection is told to close (and forgotten). False when every
    /// connection is busy.
    fn make_room(&mut self, cap: usize) -> bool {
        self.open.len() < cap || self.evict_idlest()
    }

    /// Tells the longest-idle connection to close (and forgets it); false when every
    /// connection is busy.
    fn evict_idlest(&mut self) -> bool {
        let victim = self
            .open
            .iter()
            .filter_map(|(id, c)| c.idle_since().map(|t| (t, *id)))
            .min();
        match victim.and_then(|(_, id)| self.open.remove(&id)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Accepts on `listener` and serves `router` until `stopping` turns true; then stops
/// accepting, lets each connection finish the request it is serving, and returns once
/// every connection has closed.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
) {
    let cap = limits.max_connections.max(1);
    let table = Arc::new(Mutex::new(Table::default()));
    let epoch = Instant::now();
    // Every connection task holds a sender; when all are gone, the receiver says so.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, most likely (the cap is clamped to the limit, but the
                // store's own files may have grown into the reserve): free one by closing
                // the longest-idle connection, and back off instead of spinning.
                let freed =
                    kvtier_listen::accept::out_of_descriptors(&e) && table.lock().evict_idlest();
                REFUSALS.note(
                    Level::Warn,
                    "accept_failed",
                    &format_args!(
                        "cannot accept a connection: {e}{}",
                        if freed {
                            " (closed the longest-idle connection)"
                        } else {
                            ""
                        }
                    ),
                );
                tokio::time::sleep(kvtier_listen::accept::BACKOFF).await;
                continue;
            }
        };
        let (id, state) = {
            let mut t = table.lock();
            if !t.make_room(cap) {
                drop(t);
                REFUSALS.note(
                    Level::Warn,
                    "connection_cap",
                    &format_args!(
                        "connection from {peer} closed: all {cap} connections (max_connections) have a request in progress"
                    ),
                );
                drop(tcp);
                continue;
            }
            let id = t.next;
            t.next += 1;
            let state = Arc::new(ConnState::new(epoch));
            t.open.insert(id, state.clone());
            (id, state)
        };
        // Small answers (lookups) must not wait for Nagle's algorithm.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let table = table.clone();
        let router = router.clone();
        let stopping = stopping.clone();
        let alive = alive_tx.clone();
        tokio::spawn(async move {
            conn::serve(tcp, state, router, limits, stopping).await;
            table.lock().open.remove(&id);
            drop(alive);
        });
    }
    drop(listener);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_never_do() {
        let epoch = Instant::now();
        let mut t = Table::default();
        for id in 0..3 {
            t.open.insert(id, Arc::new(ConnState::new(epoch)));
        }
        assert!(t.make_room(4), "below the cap");
        assert_eq!(t.open.len(), 3);
        // 0 and 2 busy; 1 idle.
        t.open[&0].request_started();
        t.open[&2].request_started();
        assert!(t.make_room(3));
        assert_eq!(t.open.len(), 2);
        assert!(!t.open.contains_key(&1), "the idle one went");
        assert!(!t.make_room(2), "every connection busy: no room");
        assert_eq!(t.open.len(), 2);
    }
}
