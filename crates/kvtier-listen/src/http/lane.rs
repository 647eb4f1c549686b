//! Two lanes of request threads, so that small requests never wait behind bulk bodies.
//!
//! A store's body is copied twice on the server (socket to hyper's buffer, buffer to the
//! block), at memory speed a core's worth of work for as long as the transfer lasts. On
//! the request threads that also answer lookups, a lookup waits for the CPU behind that
//! copy: with one store streaming on two cores, `server.mixed.lookup.p99.ms` was 10 to
//! 36 ms against 0.3 to 0.5 ms for the same round trips without the store
//! (BENCHMARKS.md, issue 36).
//!
//! So a front end may name some requests *bulk* ([`super::Handler::is_bulk`], from the
//! first bytes of a connection's first request). Such a connection is served on the bulk
//! lane: a runtime of its own whose threads run at a lower CPU priority
//! ([`LanePriority`]: the kernel's idle policy by default, or a `nice` value). The kernel
//! then runs a woken small-request thread ahead of a bulk copy, and the copy takes the
//! cycles left over. Where cores are free, the priority changes nothing: it only orders
//! threads that compete.
//!
//! A connection stays on the lane its first request chose (hyper serves it whole): a
//! kept-alive connection that mixes kinds has its later requests served on that lane —
//! correct, only without the ordering. kvtier's client keeps bulk and small requests on
//! separate connections, so it never mixes them.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::{Handle, Runtime};

use super::priority::LanePriority;

/// The lanes a front end serves through.
#[derive(Default)]
pub struct Lanes {
    bulk: Option<Bulk>,
}

/// The bulk lane: its runtime, and the priority its request threads run at.
struct Bulk {
    runtime: Runtime,
    priority: LanePriority,
}

impl Lanes {
    /// One lane: every request on the caller's runtime (the gateway: all its requests
    /// carry objects).
    pub fn one() -> Self {
        Self::default()
    }

    /// A bulk lane of `threads` request threads at `priority` beside the caller's runtime.
    ///
    /// Only the threads that serve bulk connections run at `priority`. Blocking work a bulk
    /// request hands off through [`spawn_blocking`] (the engine's, which takes the
    /// engine's locks) runs at the process's priority, so that a lookup never waits for a
    /// lock held by a thread the kernel ranks below it.
    pub fn with_bulk(threads: usize, priority: LanePriority) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("kvtier-bulk")
            .enable_all()
            .build()?;
        Ok(Self {
            bulk: Some(Bulk { runtime, priority }),
        })
    }

    /// Where bulk connections go, if there is a bulk lane. Called on the front end's
    /// runtime, which becomes the lane's way back to threads at the process's priority
    /// ([`spawn_blocking`]).
    pub(super) fn bulk(&self) -> Option<BulkLane> {
        self.bulk.as_ref().map(|b| BulkLane {
            handle: b.runtime.handle().clone(),
            priority: b.priority,
            home: Handle::current(),
        })
    }
}

/// A way onto the bulk lane, held by the tasks that may move a connection there.
#[derive(Clone)]
pub(super) struct BulkLane {
    handle: Handle,
    priority: LanePriority,
    home: Handle,
}

impl BulkLane {
    /// Runs `serve` (a connection's task) on the lane's request threads, at their
    /// priority. Its socket must be registered inside it, with the lane's runtime.
    pub(super) fn spawn(&self, serve: impl Future<Output = ()> + Send + 'static) {
        self.handle.spawn(AtPriority {
            inner: Box::pin(serve),
            priority: self.priority,
            home: self.home.clone(),
        });
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        // Dropped from async code when the front end stops: a runtime may not block there.
        if let Some(bulk) = self.bulk.take() {
            bulk.runtime.shutdown_background();
        }
    }
}

thread_local! {
    /// On a bulk lane's thread: the priority it was set to and the front end's runtime
    /// (at the process's priority).
    static BULK_THREAD: RefCell<Option<(LanePriority, Handle)>> = const { RefCell::new(None) };
}

/// A future polled only on threads at `priority`: the first poll on a thread sets it.
struct AtPriority {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
    priority: LanePriority,
    home: Handle,
}

impl Future for AtPriority {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let priority = self.priority;
        BULK_THREAD.with(|t| {
            let mut t = t.borrow_mut();
            if t.as_ref().map(|(p, _)| *p) != Some(priority) {
                priority.apply_to_this_thread();
                *t = Some((priority, self.home.clone()));
            }
        });
        self.inner.as_mut().poll(cx)
    }
}

/// Runs `f` on a blocking-pool thread at the process's priority, wherever it is called
/// from: what a request handler uses instead of `tokio::task::spawn_blocking`.
///
/// A thread starts at its creator's priority, so a thread created from a bulk lane's
/// thread would run at the lane's lower priority — and blocking work (the engine's)
/// takes locks that lookups wait for. From a bulk lane's thread, the work is therefore
/// handed to the front end's runtime first, whose threads create the blocking thread.
pub async fn spawn_blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    let home = BULK_THREAD.with(|t| t.borrow().as_ref().map(|(_, h)| h.clone()));
    match home {
        None => tokio::task::spawn_blocking(f).await,
        Some(home) => home
            .spawn(async move { tokio::task::spawn_blocking(f).await })
            .await
            .and_then(|r| r),
    }
}
