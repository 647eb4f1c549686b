//! Ports, for programs that must be told where to listen instead of binding port 0 and
//! announcing the address (every kvtier command announces; etcd, for one, does not), and
//! a TCP link that can be cut ([`Cuttable`]).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// A TCP port on 127.0.0.1 that was free a moment ago (bound as port 0, read, released).
/// Another process may take it before the program binds it: prefer port 0 and an
/// announced address ([`crate::Ready::StdoutLine`]) wherever the program allows.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("cannot bind a free port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("cannot read the bound port", e))
}

/// Whether `addr` accepts a TCP connection within `within` (tried every 20 ms).
pub fn wait_for_port(addr: SocketAddr, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP proxy to `target` that can be cut (every connection closed, new ones refused)
/// and healed: a network partition between one replica and etcd.
pub struct Cuttable {
    /// `http://127.0.0.1:PORT`: point the client here instead of at `target`.
    pub url: String,
    up: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Cuttable {
    /// A link to `target` (`host:port`, or `http://host:port`), up.
    pub fn start(target: &str) -> Result<Self> {
        use std::sync::atomic::Ordering;
        let target = target.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::io("cannot bind the link's port on 127.0.0.1", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("cannot read the link's port", e))?;
        let url = format!("http://{addr}");
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let open: Arc<std::sync::Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, open2) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let (Ok(c1), Ok(c2), Ok(u1), Ok(u2)) = (
                    client.try_clone(),
                    client.try_clone(),
                    upstream.try_clone(),
                    upstream.try_clone(),
                ) else {
                    continue;
                };
                open2
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend([c1, u1]);
                for (mut from, mut to) in [(c2, u2), (upstream, client)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self { url, up, open })
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
