//! Ports, for programs that must be told where to listen instead of binding port 0 and
//! announcing the address (every kvtier command announces; etcd, for one, does not).

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
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
