//! The HTTP edge both front ends serve through: accepts connections and serves each with
//! hyper under bounds on time and count. `axum::serve` and s3s have neither timeouts nor
//! a connection cap, so an idle or slow client could hold a connection (and a descriptor)
//! for ever, and enough of them starve everyone else. What a request means is the front
//! end's ([`Handler`]: `kvtier serve`'s routes, the gateway's S3 service); everything
//! about connections is here, once:
//!
//! - `idle_timeout`: a connection with no request in progress is closed this long after
//!   it was accepted or its last response was sent;
//! - `header_timeout`: a request head must be complete this long after its first byte;
//! - `body_timeout`: a request body must arrive whole this long after its head
//!   ([`BodyDeadline::Whole`], `kvtier serve`: a store is a bounded transfer), or may
//!   pause at most this long ([`BodyDeadline::Pause`], the gateway: an object may be
//!   gigabytes); the handler sees [`BodyTimedOut`] as the body's error;
//! - `max_connections`: at the cap, a new connection closes the connection that has been
//!   idle longest (every idle one costs a descriptor and does nothing); when every
//!   connection has a request in progress, the new one is closed at once instead of
//!   waiting in the kernel's backlog. Idle sockets therefore cannot lock legitimate
//!   clients out. The front end clamps the cap at start to what the open-file limit
//!   leaves ([`crate::fds`]), so that the cap, not `EMFILE`, meets the idle sockets first;
//! - a request head over [`crate::MAX_HEAD`] is answered 431 by hyper.
//!
//! A connection that ends after an answer given before its request was read whole (431,
//! 413, 408, a refusal of a request with a body) is closed lingering ([`crate::linger`]),
//! so the answer is not lost to a reset. A failed `accept` (out of descriptors) closes
//! the longest-idle connection and backs off ([`crate::accept`]). Closures for limits are
//! logged at a rate-limited `warn` and counted by kind ([`crate::refusals`]).

mod body;
mod conn;
mod lane;
mod priority;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

pub use body::{BodyTimedOut, TimedBody, timed_out};
use conn::{ConnState, Lane};
pub use lane::{Lanes, spawn_blocking};
pub use priority::LanePriority;

use crate::refusals::{Level, Refusals};

/// What the body timeout bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyDeadline {
    /// The whole body must arrive within the timeout after the head.
    Whole,
    /// The body may pause at most the timeout between frames.
    Pause,
}

/// The bounds every connection is served under (settings of the same names in both
/// front ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenSettings {
    /// Connections open at once (clamp it with [`crate::fds::connection_budget`]).
    pub max_connections: usize,
    /// From the first byte of a request head to its end.
    pub header_timeout: Duration,
    /// See [`BodyDeadline`].
    pub body_timeout: Duration,
    /// What `body_timeout` bounds.
    pub body_deadline: BodyDeadline,
    /// How long a connection with no request in progress stays open.
    pub idle_timeout: Duration,
}

/// What a front end does with a request: its answer, whose body is streamed to the
/// client. Called once per request, on the connection's task.
pub trait Handler: Clone + Send + Sync + Unpin + 'static {
    /// The answer's body.
    type Body: http_body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Unpin
        + 'static;

    /// Answers `request` from `peer`.
    fn call(
        &self,
        request: http::Request<TimedBody>,
        peer: SocketAddr,
    ) -> impl Future<Output = http::Response<Self::Body>> + Send + use<Self>;

    /// Whether a connection whose first request begins with `head` (its first bytes as
    /// they arrived: the request line, or part of it) is served on the bulk lane
    /// ([`Lanes`]). By default none is.
    fn is_bulk(&self, head: &[u8]) -> bool {
        let _ = head;
        false
    }
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

/// Accepts on `listener` and serves `handler` through `lanes` until `stopping` turns
/// true; then stops accepting, lets each connection finish the request it is serving, and
/// returns once every connection has closed.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: H,
    limits: ListenSettings,
    lanes: &Lanes,
    refusals: Arc<Refusals>,
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
                // front end's own files may have grown into the reserve): free one by
                // closing the longest-idle connection, and back off instead of spinning.
                let freed = crate::accept::out_of_descriptors(&e) && table.lock().evict_idlest();
                refusals.note(
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
                tokio::time::sleep(crate::accept::BACKOFF).await;
                continue;
            }
        };
        let (id, state) = {
            let mut t = table.lock();
            if !t.make_room(cap) {
                drop(t);
                refusals.note(
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
        // Small answers (lookups, S3 heads) must not wait for Nagle's algorithm: it would
        // hold a response's tail for the client's delayed ACK, ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let table = table.clone();
        let handler = handler.clone();
        let refusals = refusals.clone();
        let stopping = stopping.clone();
        let alive = alive_tx.clone();
        let bulk = lanes.bulk();
        tokio::spawn(async move {
            let tcp = match bulk {
                None => tcp,
                Some(bulk) => {
                    match conn::choose_lane(&tcp, &state, &handler, &limits, stopping.clone()).await
                    {
                        Lane::Small => tcp,
                        Lane::Closed => {
                            table.lock().open.remove(&id);
                            return;
                        }
                        // Moved to the bulk lane: its socket is driven by that runtime from
                        // now on.
                        Lane::Bulk => {
                            match tcp.into_std() {
                                Ok(std) => bulk.spawn(async move {
                                    if let Ok(tcp) = TcpStream::from_std(std) {
                                        conn::serve(
                                            tcp, peer, state, handler, limits, refusals, stopping,
                                        )
                                        .await;
                                    }
                                    table.lock().open.remove(&id);
                                    drop(alive);
                                }),
                                Err(e) => {
                                    tracing::debug!(error = %e, "cannot move a connection to the bulk lane");
                                    table.lock().open.remove(&id);
                                }
                            }
                            return;
                        }
                    }
                }
            };
            conn::serve(tcp, peer, state, handler, limits, refusals, stopping).await;
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
