//! Running the gateway: a listener whose accepted sockets get `TCP_NODELAY` (without it
//! Nagle's algorithm holds the tail of a small response for the client's delayed ACK,
//! ~40 ms), HTTP/1.1 keep-alive connections served by s3s, on a runtime of its own.
//!
//! Every listener resource is bounded by the HTTP edge `kvtier serve` uses too
//! (`kvtier_listen::http`): a request head must be complete within `header_timeout` of
//! its first byte, a body may pause at most `body_timeout`, a connection with no request
//! in flight is closed after `idle_timeout`, and at most `max_connections` are open (the
//! longest-idle one makes room for a new one), a cap clamped at start to what the
//! open-file limit leaves after raising it (`kvtier_listen::fds`). A request head over
//! `kvtier_listen::MAX_HEAD` is answered 431 by hyper. A connection that ends after an
//! error answer (431, or one given before the request body was read) is closed
//! lingering, so the answer is not lost to a reset. A failed `accept` (out of
//! descriptors) closes the longest-idle connection and backs off. Refusals are logged
//! rate-limited and counted by kind (`kvtier_listen::refusals`). Request shaping:
//! `wrap.rs`.

mod access;
mod compactor;
mod signed_range;
mod unsigned;
mod wrap;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvtier_core::clock::{Clock, SystemClock};
use kvtier_core::registry::Samples;
use kvtier_core::stats::Counter;
use kvtier_core::stats::CounterKind::Counter as C;
use kvtier_listen::http::{BodyDeadline, Handler, ListenSettings, TimedBody};
use kvtier_listen::refusals::Refusals;
use kvtier_ssd::{Durability, StoreConfig};
use s3s::auth::{S3Auth, SecretKey};
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;

use crate::s3::Gateway;
use crate::store::{GatewayStore, Opened, StoreError};

/// How requests are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// No authentication: every request is allowed, and a signed one is served as if it
    /// were unsigned (its signature is neither checked nor refused). Only on a loopback
    /// address.
    None,
    /// AWS Signature Version 4 (header or presigned URL) with one key pair; unsigned
    /// requests are refused with `AccessDenied`.
    SigV4 {
        /// The access key id.
        access_key: String,
        /// The secret key.
        secret_key: String,
    },
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where the segment store lives.
    pub dir: PathBuf,
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Authentication.
    pub auth: Auth,
    /// When a PUT is acknowledged: after `fdatasync` (default) or once written.
    pub durability: Durability,
    /// Bytes per segment file; the largest object is 1 MiB less (default 1 GiB).
    pub segment_bytes: u64,
    /// Worker threads of the runtime (default: one per core). Measured on 2 cores with the
    /// 8 SigV4 clients of the bench on the same machine: with one worker the gateway is
    /// the bottleneck (signature checks) and the p99 rose to 3.8 ms (median of three
    /// runs) against 2.7 ms with two; unsigned (`--auth none`), one worker had the lower
    /// tail (0.85–1.3 ms against 1.75–2.1 ms). Signed is what deployments run.
    pub workers: usize,
    /// Buckets to create at start when missing (default none).
    pub create_buckets: Vec<String>,
    /// The whole request head must arrive within this (default 10 s).
    pub header_timeout: Duration,
    /// A request body may send nothing for at most this long (default 30 s).
    pub body_timeout: Duration,
    /// A connection with no request in flight is closed after this (default 60 s).
    pub idle_timeout: Duration,
    /// Open connections at most (default 1,024); see `kvtier_listen::http` for what
    /// happens at the cap.
    /// Lowered at start when the open-file limit leaves room for fewer (logged).
    pub max_connections: usize,
    /// Refused requests are logged at most once per this interval (default 10 s).
    pub refusal_log_interval: Duration,
    /// How often compaction runs (default 10 s); each pass moves at most one segment's
    /// worth of live bytes.
    pub compact_interval: Duration,
    /// A sealed segment whose current records fill less than this fraction of it is
    /// compacted (default 0.5: the disk holds at most about twice the live bytes, plus
    /// the active segment); 0 turns compaction off.
    pub compact_below: f64,
    /// Time for record stamps and `Last-Modified` (default: the system's clock); a
    /// component, not a setting — tests pass a mock clock.
    pub clock: Arc<dyn Clock>,
}

impl GatewayConfig {
    /// Defaults for a store in `dir`: 127.0.0.1:9000, no authentication, fsync, one
    /// worker per core.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            auth: Auth::None,
            durability: Durability::Synced,
            segment_bytes: 1 << 30,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            create_buckets: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            refusal_log_interval: Duration::from_secs(10),
            compact_interval: Duration::from_secs(10),
            compact_below: 0.5,
            clock: Arc::new(SystemClock::new()),
        }
    }
}

/// Request counters of a running gateway.
#[derive(Debug, Default)]
pub struct Counters {
    /// GetObject requests answered with data.
    pub gets: AtomicU64,
    /// Of those, requests with a Range header.
    pub ranged_gets: AtomicU64,
    /// Bytes sent in GetObject bodies.
    pub bytes_out: AtomicU64,
    /// Every request, whatever its outcome.
    pub requests: AtomicU64,
    /// Segments compaction removed.
    pub segments_removed: AtomicU64,
    /// Bytes of the segment files it removed.
    pub bytes_reclaimed: AtomicU64,
    /// Records it moved out of mostly-dead segments.
    pub records_moved: AtomicU64,
}

/// One key pair; an unknown access key is `InvalidAccessKeyId`, as S3 answers it.
#[derive(Debug)]
struct OneKey {
    access_key: String,
    secret_key: SecretKey,
}

#[async_trait::async_trait]
impl S3Auth for OneKey {
    async fn get_secret_key(&self, access_key: &str) -> s3s::S3Result<SecretKey> {
        if access_key == self.access_key {
            Ok(self.secret_key.clone())
        } else {
            Err(s3s::s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            ))
        }
    }
}

impl Counters {
    /// Every request counter of the gateway, declared once (`kvtier_core::registry`):
    /// flat name `gateway_{name}`, counter family `gateway_{name}`.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<Counters>] = &[
        Counter { name: "requests", family: "gateway_requests", label: None, help: "Requests the gateway received, whatever their outcome", kind: C, read: |c| get(&c.requests) },
        Counter { name: "gets", family: "gateway_gets", label: None, help: "GetObject requests answered with data", kind: C, read: |c| get(&c.gets) },
        Counter { name: "ranged_gets", family: "gateway_ranged_gets", label: None, help: "GetObject requests with a Range header answered with data", kind: C, read: |c| get(&c.ranged_gets) },
        Counter { name: "sent_bytes", family: "gateway_sent_bytes", label: None, help: "Bytes sent in GetObject bodies", kind: C, read: |c| get(&c.bytes_out) },
        Counter { name: "compaction_segments_removed", family: "gateway_compaction_segments_removed", label: None, help: "Segments compaction removed", kind: C, read: |c| get(&c.segments_removed) },
        Counter { name: "compaction_bytes_reclaimed", family: "gateway_compaction_bytes_reclaimed", label: None, help: "Bytes of the segment files compaction removed", kind: C, read: |c| get(&c.bytes_reclaimed) },
        Counter { name: "compaction_records_moved", family: "gateway_compaction_records_moved", label: None, help: "Records compaction moved out of mostly-dead segments", kind: C, read: |c| get(&c.records_moved) },
    ];

    /// The counters as registry samples, from [`Self::COUNTERS`].
    pub fn samples(&self) -> Samples {
        let mut out = Samples::default();
        out.table(Self::COUNTERS, "gateway", self, &[]);
        out
    }

    /// `(gets, ranged_gets, bytes_out, requests)` now.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            get(&self.gets),
            get(&self.ranged_gets),
            get(&self.bytes_out),
            get(&self.requests),
        )
    }
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// A gateway serving on its own threads; stopped by [`RunningGateway::stop`] or drop.
#[derive(Debug)]
pub struct RunningGateway {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// What recovery found at open.
    pub opened: Opened,
    counters: Arc<Counters>,
    refusals: Arc<Refusals>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Dropping it stops the compaction thread.
    compaction_stop: Option<std::sync::mpsc::Sender<()>>,
    compaction: Option<std::thread::JoinHandle<()>>,
}

impl RunningGateway {
    /// Opens the store, binds, and starts serving. Refuses `Auth::None` on an address
    /// other than loopback.
    pub fn start(config: GatewayConfig) -> Result<Self, kvtier_core::Error> {
        use kvtier_core::{Error, ErrorKind};
        let unavailable = |what: String| {
            move |e: std::io::Error| Error::new(ErrorKind::Unavailable, what).with_source(e)
        };
        if config.auth == Auth::None && !config.listen.ip().is_loopback() {
            return Err(Error::invalid(format!(
                "refusing to serve without authentication on {}: set SigV4 credentials, or listen on 127.0.0.1",
                config.listen
            )));
        }
        let store_config = StoreConfig {
            segment_bytes: config.segment_bytes,
            durability: config.durability,
            ..StoreConfig::default()
        };
        let (store, opened) =
            GatewayStore::open_with_clock(&config.dir, store_config, config.clock.clone())
                .map_err(|e| {
                    // A store whose recovery refuses it as damaged is `Corrupt`; any other
                    // failure to open it (lock held, I/O) `Unavailable`.
                    let kind = match e {
                        StoreError::Corrupt(_) => ErrorKind::Corrupt,
                        _ => ErrorKind::Unavailable,
                    };
                    Error::new(
                        kind,
                        format!(
                            "cannot open the gateway store in `{}`",
                            config.dir.display()
                        ),
                    )
                    .with_source(e)
                })?;
        for bucket in &config.create_buckets {
            if !store.has_bucket(bucket) {
                store.create_bucket(bucket).map_err(|e| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("cannot create bucket `{bucket}`"),
                    )
                    .with_source(e)
                })?;
            }
        }
        let counters = Arc::new(Counters::default());
        let store = Arc::new(store);
        let (compaction_stop, compaction_stopping) = std::sync::mpsc::channel();
        let compactor = if config.compact_below > 0.0 {
            let schedule = compactor::Schedule {
                interval: config.compact_interval,
                below: config.compact_below,
                budget: config.segment_bytes,
            };
            let (store, counters) = (store.clone(), counters.clone());
            Some(
                std::thread::Builder::new()
                    .name("kvtier-gateway-compact".into())
                    .spawn(move || compactor::run(store, schedule, counters, compaction_stopping))
                    .map_err(unavailable("cannot start the compaction thread".into()))?,
            )
        } else {
            None
        };
        let gateway = Gateway::with_counters(store.clone(), counters.clone());
        let builder = match &config.auth {
            Auth::None => S3ServiceBuilder::new(gateway),
            Auth::SigV4 {
                access_key,
                secret_key,
            } => {
                let verified = S3ServiceBuilder::new(gateway.clone()).build();
                let mut builder = S3ServiceBuilder::new(gateway.authenticated());
                builder.set_auth(OneKey {
                    access_key: access_key.clone(),
                    secret_key: SecretKey::from(secret_key.as_str()),
                });
                builder.set_access(access::PublicReadOnly { store });
                builder.set_route(signed_range::WholeObject { verified });
                builder
            }
        };
        let refusals = Arc::new(Refusals::new(config.refusal_log_interval));
        let shaper = Arc::new(wrap::Shaper {
            service: builder.build(),
            refusals: refusals.clone(),
            request_ids: wrap::RequestIds::new(),
            unsigned: config.auth == Auth::None,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.workers.max(1))
            .thread_name("kvtier-gateway")
            .enable_all()
            .build()
            .map_err(unavailable("cannot start the gateway's runtime".into()))?;
        let std_listener = std::net::TcpListener::bind(config.listen)
            .map_err(unavailable(format!("cannot listen on {}", config.listen)))?;
        std_listener
            .set_nonblocking(true)
            .map_err(unavailable("cannot set up the listener".into()))?;
        let addr = std_listener
            .local_addr()
            .map_err(unavailable("cannot read the listener's address".into()))?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        // After the store opened its files, so that they are counted.
        let budget = kvtier_listen::fds::connection_budget(config.max_connections);
        let limits = ListenSettings {
            max_connections: budget.connections,
            header_timeout: config.header_timeout,
            body_timeout: config.body_timeout,
            // An object may be gigabytes: the body may pause at most the timeout.
            body_deadline: BodyDeadline::Pause,
            idle_timeout: config.idle_timeout,
        };
        let handler = Requests {
            shaper,
            counters: counters.clone(),
        };
        // The listener counts into `refusals`; the gateway keeps a handle to read them.
        let refused = refusals.clone();
        let thread = std::thread::Builder::new()
            .name("kvtier-gateway-accept".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(std_listener) {
                        Ok(listener) => {
                            // Every gateway request carries an object: one lane.
                            let lanes = kvtier_listen::http::Lanes::one();
                            kvtier_listen::http::serve(
                                listener, handler, limits, &lanes, refusals, stopping,
                            )
                            .await;
                        }
                        Err(e) => tracing::error!(error = %e, "gateway listener failed"),
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(unavailable("cannot start the gateway thread".into()))?;
        tracing::info!(%addr, buckets = opened.buckets, objects = opened.objects, max_connections = budget.connections, "kvtier gateway serving");
        Ok(Self {
            addr,
            opened,
            counters,
            refusals: refused,
            stop: Some(stop),
            thread: Some(thread),
            compaction_stop: Some(compaction_stop),
            compaction: compactor,
        })
    }

    /// The request counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Every counter of the gateway as registry samples (`kvtier_core::registry`): its
    /// request counters (`gateway_*`) and its listener's refusals by kind (`refused_*`).
    /// What the gateway reports is rendered from this one list.
    pub fn samples(&self) -> Samples {
        let mut out = self.counters.samples();
        out.extend(self.refusals.samples());
        out
    }

    /// Stops accepting, closes connections, and waits for the threads (the store's
    /// directory lock is released when this returns).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        drop(self.compaction_stop.take());
        if let Some(thread) = self.compaction.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The gateway's requests at the shared HTTP edge: counted, then shaped and served by
/// s3s (`wrap.rs`).
#[derive(Clone)]
struct Requests {
    shaper: Arc<wrap::Shaper>,
    counters: Arc<Counters>,
}

impl Handler for Requests {
    type Body = s3s::Body;

    fn call(
        &self,
        request: http::Request<TimedBody>,
        peer: SocketAddr,
    ) -> impl Future<Output = http::Response<s3s::Body>> + Send + use<> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.shaper.clone().handle(request, peer)
    }
}
