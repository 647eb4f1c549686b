//! A `kvtier serve` inside this process, on a thread of its own: the same server code,
//! reached over loopback TCP like any other. The model demo, the model bench rows and the
//! server-mode model tests use it to run turns "through the server" without a second
//! binary; it lives here, not in `kvtier-candle`, so the model crate never depends on the
//! HTTP server (the `kvtier` binary hands the demo a launcher built on it).

use std::net::SocketAddr;
use std::thread::JoinHandle;

use crate::config::Settings;
use crate::serve::{Running, Stopped};

/// A server running until [`LocalServer::stop`] (or drop).
#[derive(Debug)]
pub struct LocalServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Option<Stopped>>>,
}

impl LocalServer {
    /// Starts a server with `settings` (use `127.0.0.1:0` to get a free port) and waits
    /// until it listens. The error says why it did not start (bad settings, the engine
    /// failed to open, the address was taken).
    pub fn start(settings: Settings) -> Result<Self, String> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let workers = settings.worker_threads();
        let thread = std::thread::Builder::new()
            .name("kvtier-serve".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(workers)
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return None;
                    }
                };
                runtime.block_on(async move {
                    let running = match Running::start(settings).await {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return None;
                        }
                    };
                    let _ = ready_tx.send(Ok(running.addr));
                    Some(
                        running
                            .serve(async move {
                                let _ = stop_rx.await;
                            })
                            .await,
                    )
                })
            })
            .map_err(|e| format!("cannot start the server thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(addr)) => Ok(Self {
                addr,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(format!("the server did not start: {e}"))
            }
            Err(_) => {
                let _ = thread.join();
                Err("the server thread ended before listening".into())
            }
        }
    }

    /// The bound address (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the server down in order (requests finish, the SSD writer drains) and
    /// reports how it went; `None` if the server thread panicked.
    pub fn stop(mut self) -> Option<Stopped> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Option<Stopped> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.thread.take().and_then(|t| t.join().ok().flatten())
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
