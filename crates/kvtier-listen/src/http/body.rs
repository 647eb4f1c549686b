//! Bodies at the connection's edge: a request body with a deadline, and a response body
//! that tells the connection when its request is over.
//!
//! The body deadline is what bounds a slow body: a client that sends its head and then
//! one byte a second would otherwise hold a handler (and the bytes it has sent) for as
//! long as it likes. The handler reading the body sees [`BodyTimedOut`] as an error
//! (`kvtier serve` answers 408; the gateway fails the upload and releases its space).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use super::BodyDeadline;
use super::conn::ConnState;

/// The request body did not arrive within the body timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimedOut {
    /// The limit.
    pub limit: Duration,
    /// What it bounded.
    pub deadline: BodyDeadline,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.deadline {
            BodyDeadline::Whole => write!(
                f,
                "the request body did not arrive within {:?} (body_timeout)",
                self.limit
            ),
            BodyDeadline::Pause => write!(
                f,
                "no request body bytes for {:?} (body_timeout)",
                self.limit
            ),
        }
    }
}

impl std::error::Error for BodyTimedOut {}

/// Whether `err` (or an error it wraps) is a [`BodyTimedOut`].
pub fn timed_out(err: &(dyn std::error::Error + 'static)) -> Option<BodyTimedOut> {
    let mut at = Some(err);
    while let Some(e) = at {
        if let Some(t) = e.downcast_ref::<BodyTimedOut>() {
            return Some(*t);
        }
        at = e.source();
    }
    None
}

/// A request body that fails with [`BodyTimedOut`] once its deadline has passed: the
/// whole body's, or (for [`BodyDeadline::Pause`]) the one that each frame moves on.
pub struct TimedBody {
    inner: Incoming,
    deadline: BodyDeadline,
    limit: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl TimedBody {
    /// `inner`, bounded by `limit` under `deadline` from now.
    pub fn new(inner: Incoming, limit: Duration, deadline: BodyDeadline) -> Self {
        Self {
            inner,
            deadline,
            limit,
            sleep: Box::pin(tokio::time::sleep_until(Instant::now() + limit)),
        }
    }

    fn timed_out(&self) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(BodyTimedOut {
            limit: self.limit,
            deadline: self.deadline,
        })
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.deadline == BodyDeadline::Whole && Instant::now() >= this.sleep.deadline() {
            return Poll::Ready(Some(Err(this.timed_out())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if this.deadline == BodyDeadline::Pause {
                    let next = Instant::now() + this.limit;
                    this.sleep.as_mut().reset(next);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(this.timed_out()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Marks a request in progress on its connection from the moment its head is read until
/// its response has been sent (or abandoned): dropped, the connection counts as idle
/// again and its idle clock restarts.
pub(super) struct InFlight(Arc<ConnState>);

impl InFlight {
    /// A request starts on `conn`.
    pub(super) fn start(conn: Arc<ConnState>) -> Self {
        conn.request_started();
        Self(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that holds its request's [`InFlight`] until hyper drops it (after
/// the last frame is written, or when the connection goes away).
pub(super) struct TrackedBody<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> TrackedBody<B> {
    /// `inner`, holding `in_flight` until it is dropped.
    pub(super) fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: HttpBody + Unpin> HttpBody for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
