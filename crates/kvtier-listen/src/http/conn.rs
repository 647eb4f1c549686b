//! One connection: its state as the cap and the timers see it, the socket wrapper that
//! notices a request head beginning, and the task that serves it until it ends, times
//! out, is evicted, or the server stops.
//!
//! A connection is *busy* while a request is in progress (from its head to the end of
//! its response) and *idle* otherwise. An idle connection is closed `idle_timeout` after
//! it became idle (accepted, or its last response sent) — unless bytes of a next request
//! head have arrived, in which case that head must be complete `header_timeout` after its
//! first byte. A busy connection's body has its own deadline ([`super::body`]).
//!
//! When hyper ends a connection after an error answer — its own 431 for a head over
//! [`crate::MAX_HEAD`] (or 400 for a malformed one), or a handler's 4xx or 5xx given
//! before the request body was read whole (413, 408, a 401 on a request with a body) — the
//! socket is closed lingering ([`crate::linger`]): closed outright, with the rest of
//! the request unread, the kernel would reset the connection and the client would lose the
//! answer. (After a successful answer hyper ends a connection only when the client closed
//! it or asked to: nothing is left to read.)

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::body::{InFlight, TimedBody, TrackedBody};
use super::{Handler, ListenSettings};
use crate::refusals::{Level, Refusals};

/// No time recorded.
const NEVER: u64 = u64::MAX;

/// What the cap and the timers know about one connection.
#[derive(Debug)]
pub(super) struct ConnState {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` when the connection last became idle.
    idle_since: AtomicU64,
    /// Milliseconds since `epoch` of the first byte of a head not yet complete, or NEVER.
    head_started: AtomicU64,
    /// Set when the cap or the timers want the connection gone.
    pub(super) close: Notify,
    /// Woken when a deadline may have moved (a head began, a request ended).
    changed: Notify,
    /// The last answer was an error (4xx, 5xx): close lingering if hyper ends the connection.
    error_answered: AtomicBool,
}

impl ConnState {
    /// A connection accepted now, idle.
    pub(super) fn new(epoch: Instant) -> Self {
        let s = Self {
            epoch,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(NEVER),
            close: Notify::new(),
            changed: Notify::new(),
            error_answered: AtomicBool::new(false),
        };
        s.idle_since.store(s.now_ms(), Ordering::Relaxed);
        s
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// When it last became idle, if it is idle now (for choosing whom to evict).
    pub(super) fn idle_since(&self) -> Option<u64> {
        (self.in_flight.load(Ordering::Acquire) == 0)
            .then(|| self.idle_since.load(Ordering::Relaxed))
    }

    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(NEVER, Ordering::Relaxed);
    }

    pub(super) fn request_ended(&self) {
        self.idle_since.store(self.now_ms(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    fn bytes_arrived(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Relaxed) == NEVER
        {
            self.head_started.store(self.now_ms(), Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// When the connection must be closed if nothing changes, and why; None while busy.
    fn deadline(&self, limits: &ListenSettings) -> Option<(Instant, &'static str)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, d: Duration| self.epoch + Duration::from_millis(ms) + d;
        match self.head_started.load(Ordering::Relaxed) {
            NEVER => Some((
                at(self.idle_since.load(Ordering::Relaxed), limits.idle_timeout),
                "idle_timeout",
            )),
            ms => Some((at(ms, limits.header_timeout), "header_timeout")),
        }
    }
}

/// The socket, telling its connection's state when bytes arrive.
struct WatchedIo {
    tcp: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // Loads send block bytes as vectored writes, without copying them.
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Where a connection is served ([`super::Lanes`]).
pub(super) enum Lane {
    /// On the accepting runtime.
    Small,
    /// On the bulk lane.
    Bulk,
    /// Nowhere: the cap closed it while it waited for its first request.
    Closed,
}

/// Bytes of a first request looked at to choose its lane: enough for a request line's
/// method and path.
const LANE_PEEK: usize = 64;

/// Chooses a new connection's lane from the first bytes of its first request, looked at
/// without reading them (hyper reads them next). A connection that sends nothing before
/// its idle deadline, or that the front end stops waiting for, is left to [`serve`] on
/// the accepting runtime, which closes it the usual way.
pub(super) async fn choose_lane<H: Handler>(
    tcp: &TcpStream,
    state: &ConnState,
    handler: &H,
    limits: &ListenSettings,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Lane {
    let mut head = [0u8; LANE_PEEK];
    let deadline = state
        .deadline(limits)
        .map_or_else(|| Instant::now() + limits.idle_timeout, |(at, _)| at);
    tokio::select! {
        peeked = tcp.peek(&mut head) => match peeked {
            Ok(n) if n > 0 && handler.is_bulk(&head[..n]) => Lane::Bulk,
            _ => Lane::Small,
        },
        _ = state.close.notified() => Lane::Closed,
        _ = tokio::time::sleep_until(deadline) => Lane::Small,
        _ = stopping.wait_for(|s| *s) => Lane::Small,
    }
}

/// Serves one connection until the client closes it, a timer or the cap closes it, or
/// the front end stops (then the request in progress, if any, is finished first).
pub(super) async fn serve<H: Handler>(
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    state: Arc<ConnState>,
    handler: H,
    limits: ListenSettings,
    refusals: Arc<Refusals>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let svc_state = state.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let in_flight = InFlight::start(svc_state.clone());
        let req = req.map(|b| TimedBody::new(b, limits.body_timeout, limits.body_deadline));
        let call = handler.call(req, peer);
        let state = svc_state.clone();
        // Boxed: taking the socket back from hyper (below) needs an `Unpin` future.
        Box::pin(async move {
            let resp = call.await;
            let status = resp.status();
            state.error_answered.store(
                status.is_client_error() || status.is_server_error(),
                Ordering::Relaxed,
            );
            Ok::<_, std::convert::Infallible>(resp.map(|b| TrackedBody::new(b, in_flight)))
        })
    });
    let io = TokioIo::new(WatchedIo {
        tcp,
        state: state.clone(),
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The timers below replace hyper's own header timeout (which needs a hyper timer and
    // cannot tell an idle connection from a slow head).
    builder
        .keep_alive(true)
        .header_read_timeout(None)
        .max_header_size(crate::MAX_HEAD);
    let mut conn = builder.serve_connection(io, service);
    let mut closing = false;
    let mut stopping_seen = *stopping.borrow();
    if stopping_seen {
        Pin::new(&mut conn).graceful_shutdown();
    }
    loop {
        let deadline = state.deadline(&limits);
        let sleep = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Without hyper's shutdown: the socket is taken back to be closed here.
            res = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                let answered_early = match &res {
                    Ok(()) => state.error_answered.load(Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!(error = %e, "connection ended with an error");
                        // hyper answered a malformed or oversized head itself.
                        e.is_parse()
                    }
                };
                if answered_early {
                    let tcp = conn.into_parts().io.into_inner().tcp;
                    crate::linger::close(tcp, crate::linger::LINGER, state.close.notified())
                        .await;
                }
                return;
            }
            _ = state.close.notified(), if !closing => {
                // Evicted by the cap, which picks an idle connection; should a request
                // have begun since, it is finished first and the connection closed after.
                if state.idle_since().is_some() {
                    return;
                }
                closing = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
            _ = state.changed.notified() => {}
            changed = stopping.changed(), if !stopping_seen => {
                if changed.is_err() || *stopping.borrow() {
                    stopping_seen = true;
                    Pin::new(&mut conn).graceful_shutdown();
                }
            }
            _ = sleep => {
                if let Some((at, why)) = state.deadline(&limits)
                    && Instant::now() >= at
                {
                    let limit = match why {
                        "header_timeout" => limits.header_timeout,
                        _ => limits.idle_timeout,
                    };
                    if why == "header_timeout" {
                        refusals.note(
                            Level::Warn,
                            why,
                            &format_args!("a request head from {peer} was not complete within {limit:?}; connection closed"),
                        );
                    } else {
                        tracing::debug!(?limit, %peer, "idle connection closed");
                    }
                    return;
                }
            }
        }
    }
}
