//! Running the gateway: a listener whose accepted sockets get `TCP_NODELAY` (without it
//! Nagle's algorithm holds the tail of a small response for the client's delayed ACK,
//! ~40 ms), HTTP/1.1 keep-alive connections served by s3s, on a runtime of its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kvtier_ssd::{Durability, StoreConfig};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;

use crate::s3::Gateway;
use crate::store::{GatewayStore, Opened};

/// How requests are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// No authentication: every request is allowed. Only on a loopback address.
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
}

impl GatewayConfig {
    /// Defaults for a store in `dir`: 127.0.0.1:9000, no authentication, fsync, one
    /// worker per core.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            auth: Auth::None,
            durability: Durability::Fsync,
            segment_bytes: 1 << 30,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            create_buckets: Vec::new(),
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
}

impl Counters {
    /// `(gets, ranged_gets, bytes_out, requests)` now.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (
            g(&self.gets),
            g(&self.ranged_gets),
            g(&self.bytes_out),
            g(&self.requests),
        )
    }
}

/// A gateway serving on its own threads; stopped by [`RunningGateway::stop`] or drop.
#[derive(Debug)]
pub struct RunningGateway {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// What recovery found at open.
    pub opened: Opened,
    counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningGateway {
    /// Opens the store, binds, and starts serving. Refuses `Auth::None` on an address
    /// other than loopback.
    pub fn start(config: GatewayConfig) -> Result<Self, String> {
        if config.auth == Auth::None && !config.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve without authentication on {}: set SigV4 credentials, or listen on 127.0.0.1",
                config.listen
            ));
        }
        let store_config = StoreConfig {
            segment_bytes: config.segment_bytes,
            durability: config.durability,
            ..StoreConfig::default()
        };
        let (store, opened) = GatewayStore::open(&config.dir, store_config).map_err(|e| {
            format!(
                "cannot open the gateway store in `{}`: {e}",
                config.dir.display()
            )
        })?;
        for bucket in &config.create_buckets {
            if !store.has_bucket(bucket) {
                store
                    .create_bucket(bucket)
                    .map_err(|e| format!("cannot create bucket `{bucket}`: {e}"))?;
            }
        }
        let counters = Arc::new(Counters::default());
        let mut builder =
            S3ServiceBuilder::new(Gateway::with_counters(Arc::new(store), counters.clone()));
        if let Auth::SigV4 {
            access_key,
            secret_key,
        } = &config.auth
        {
            builder.set_auth(SimpleAuth::from_single(
                access_key.clone(),
                secret_key.as_str(),
            ));
        }
        let service = builder.build();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.workers.max(1))
            .thread_name("kvtier-gateway")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the gateway's runtime: {e}"))?;
        let std_listener = std::net::TcpListener::bind(config.listen)
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot set up the listener: {e}"))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| format!("cannot read the listener's address: {e}"))?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let count = counters.clone();
        let thread = std::thread::Builder::new()
            .name("kvtier-gateway-accept".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "gateway listener failed");
                            return;
                        }
                    };
                    loop {
                        let accepted = tokio::select! {
                            a = listener.accept() => a,
                            _ = &mut stopped => break,
                        };
                        let socket = match accepted {
                            Ok((socket, _)) => socket,
                            Err(e) => {
                                // Out of file descriptors and the like: back off, go on.
                                tracing::warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        };
                        if let Err(e) = socket.set_nodelay(true) {
                            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
                        }
                        let service = service.clone();
                        let count = count.clone();
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                count.requests.fetch_add(1, Ordering::Relaxed);
                                let service = service.clone();
                                async move { hyper::service::Service::call(&service, req).await }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .keep_alive(true)
                                .serve_connection(TokioIo::new(socket), service)
                                .await;
                        });
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| format!("cannot start the gateway thread: {e}"))?;
        tracing::info!(%addr, buckets = opened.buckets, objects = opened.objects, "kvtier gateway serving");
        Ok(Self {
            addr,
            opened,
            counters,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The request counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Stops accepting, closes connections, and waits for the threads (the store's
    /// directory lock is released when this returns).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.shutdown();
    }
}
