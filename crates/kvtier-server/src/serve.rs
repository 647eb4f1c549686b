//! Running the server: open the engine, listen, serve until SIGTERM or SIGINT, then stop
//! accepting, finish requests in flight (within `shutdown_timeout`), drain the SSD writer,
//! flush, and record the shutdown so the next start reports `shutdown_clean`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Settings;
use kvtier_core::{Error, ErrorKind};
use kvtier_listen::http::{BodyDeadline, LanePriority, Lanes, ListenSettings};

use crate::listen;
use crate::routes;
use crate::state::AppState;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Requests in flight all finished before the deadline.
    pub requests_finished: bool,
    /// The SSD writer drained completely (true without an SSD tier).
    pub writer_clean: bool,
}

/// A server that is listening.
pub struct Running {
    /// The bound address (port 0 resolved).
    pub addr: SocketAddr,
    app: Arc<AppState>,
    listener: TcpListener,
    /// The connection cap: `max_connections`, clamped to the open-file limit.
    max_connections: usize,
    /// The shared arena's socket, when `shm.enabled`.
    shm: Option<crate::shm::ShmService>,
}

impl Running {
    /// Opens the engine (recovering the SSD store) and binds the listen address. Errors
    /// keep their kind ([`kvtier_node::Node::open_with`]); an address that cannot be bound
    /// is `Unavailable`.
    pub async fn start(settings: Settings) -> Result<Self, Error> {
        settings.validate()?;
        let listen = settings.listen;
        let app = tokio::task::spawn_blocking(move || AppState::open(settings))
            .await
            .map_err(|e| Error::new(ErrorKind::Internal, "engine start failed").with_source(e))??;
        let listener = TcpListener::bind(listen).await.map_err(|e| {
            Error::new(ErrorKind::Unavailable, format!("cannot listen on {listen}")).with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            Error::new(ErrorKind::Unavailable, "cannot read the bound address").with_source(e)
        })?;
        // After the engine opened its files, so that they are counted.
        let configured = app.node.settings.read().max_connections;
        let max_connections = kvtier_listen::fds::connection_budget(configured).connections;
        let shm = crate::shm::ShmService::start(app.clone())?;
        Ok(Self {
            addr,
            app,
            listener,
            max_connections,
            shm,
        })
    }

    /// The shared state (for in-process use such as the bench).
    pub fn state(&self) -> Arc<AppState> {
        self.app.clone()
    }

    /// The shared arena's socket, when `shm.enabled`.
    pub fn shm_socket(&self) -> Option<&std::path::Path> {
        self.shm.as_ref().map(|s| s.path())
    }

    /// A note for the operator about the shared arena's page size (see `shm/pages.rs`).
    pub fn shm_page_note(&self) -> Option<&str> {
        self.shm.as_ref().and_then(|s| s.page_note())
    }

    /// Serves until `stop` resolves, then shuts down in order.
    pub async fn serve(self, stop: impl Future<Output = ()> + Send + 'static) -> Stopped {
        let app = self.app;
        let (deadline, limits, threads, priority) = {
            let s = app.node.settings.read();
            let limits = ListenSettings {
                max_connections: self.max_connections,
                header_timeout: s.header_timeout.0,
                body_timeout: s.body_timeout.0,
                // A store is a bounded transfer: its whole body within the timeout.
                body_deadline: BodyDeadline::Whole,
                idle_timeout: s.idle_timeout.0,
            };
            (
                s.shutdown_timeout.0,
                limits,
                s.worker_threads(),
                store_priority(&s),
            )
        };
        // Store bodies on threads of their own at a lower priority, so that lookups never
        // wait for the CPU behind a copy (kvtier_listen::http::Lanes).
        let lanes = Lanes::with_bulk(threads, priority).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no bulk lane: every request on the request threads");
            Lanes::one()
        });
        let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
        let server = listen::serve(
            self.listener,
            routes::router(app.clone()),
            limits,
            lanes,
            stopping_rx,
        );
        let server = tokio::spawn(server);
        stop.await;
        tracing::info!("stopping: no new connections; finishing requests in flight");
        let _ = stopping_tx.send(true);
        let requests_finished = matches!(tokio::time::timeout(deadline, server).await, Ok(Ok(())));
        // Local clients go before the engine stops: their leases and reservations end.
        if let Some(shm) = self.shm {
            let _ = tokio::task::spawn_blocking(move || shm.stop()).await;
        }
        if !requests_finished {
            tracing::warn!(
                ?deadline,
                "requests still in flight at the shutdown deadline"
            );
        }
        let engine = app.engine.clone();
        let drain = app.node.settings.read().ssd.drain_timeout.0;
        let report = tokio::task::spawn_blocking(move || engine.shutdown(drain))
            .await
            .ok()
            .flatten();
        let writer_clean = report.is_none_or(|r| r.clean);
        tracing::info!(?report, "stopped");
        Stopped {
            requests_finished,
            writer_clean,
        }
    }
}

/// The CPU priority of the threads that read store bodies: the kernel's idle policy, or
/// `store_nice` (the `store_idle` and `store_nice` settings).
pub fn store_priority(settings: &Settings) -> LanePriority {
    if settings.store_idle {
        LanePriority::Idle
    } else {
        LanePriority::Nice(settings.store_nice)
    }
}

/// `kvtier serve`: runs until a signal. Prints `listening on http://ADDR` on stdout once
/// requests are accepted (tests and scripts wait for that line).
pub async fn run(settings: Settings) -> Result<Stopped, Error> {
    // Before anything else: from here on a SIGTERM is a clean stop.
    let stop = kvtier_listen::signals::stop_signals();
    let running = Running::start(settings).await?;
    if let Some(k) = &running.app.node.kv_events {
        match k.replay_endpoint() {
            Some(replay) => println!(
                "kvtier serve: KV events on {} (replay on {replay})",
                k.endpoint()
            ),
            None => println!("kvtier serve: KV events on {}", k.endpoint()),
        }
    }
    if let Some(path) = running.shm_socket() {
        println!("kvtier serve: shared arena on {}", path.display());
    }
    if let Some(note) = running.shm_page_note() {
        println!("kvtier serve: note: {note}");
    }
    println!("kvtier serve: listening on http://{}", running.addr);
    let _ = std::io::stdout().flush();
    let stopped = running.serve(stop).await;
    println!(
        "kvtier serve: stopped (requests finished: {}, SSD writer drained: {})",
        stopped.requests_finished, stopped.writer_clean
    );
    Ok(stopped)
}
