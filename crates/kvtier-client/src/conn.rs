//! A minimal HTTP/1.1 client for the two hot calls, lookup and load.
//!
//! A general HTTP client reads a response into its own buffers and hands out chunks, which
//! the caller then copies again; for a 128 MiB load that second copy (and the allocation
//! and page faults of fresh buffers) cost a third of the throughput here. This client
//! reads the load stream's block bytes straight from the socket into their destination,
//! so they are copied once (kernel to caller), like a plain TCP read. It speaks only what
//! kvtier's server sends: a status line, headers with `content-length`, and a body of
//! that length. Connections are kept in a small pool and reused.

use std::io;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most idle connections kept.
const IDLE: usize = 32;
/// Longest response head accepted.
const MAX_HEAD: usize = 16 << 10;

/// An open response: status, body length, and the connection positioned at the body.
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body bytes still to read.
    pub left: u64,
    conn: Conn,
}

/// One connection, with bytes read past the response head.
struct Conn {
    stream: TcpStream,
    /// Bytes already read from the socket that belong to the body.
    spare: Vec<u8>,
    keep_alive: bool,
}

/// A pool of connections to one server.
#[derive(Debug)]
pub struct Pool {
    addr: String,
    host: String,
    idle: Mutex<Vec<TcpStream>>,
}

impl Pool {
    /// Connections to `base` (`http://host:port`).
    pub fn new(base: &str) -> Option<Self> {
        let host = base
            .strip_prefix("http://")?
            .trim_end_matches('/')
            .to_string();
        if host.contains('/') {
            return None;
        }
        Some(Self {
            addr: host.clone(),
            host,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends one request and reads the response head.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<Response> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n",
            self.host,
            body.len()
        );
        if let Some(t) = token {
            head.push_str("authorization: Bearer ");
            head.push_str(t);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        // A pooled connection may have been closed by the server while idle: retry once on
        // a fresh one if the first attempt fails before any answer.
        let pooled = self.idle.lock().pop();
        if let Some(stream) = pooled {
            match Self::exchange(stream, &head, body).await {
                Ok(r) => return Ok(r),
                Err(e) if e.kind() != io::ErrorKind::InvalidData => {}
                Err(e) => return Err(e),
            }
        }
        let stream = TcpStream::connect(&self.addr).await?;
        stream.set_nodelay(true)?;
        Self::exchange(stream, &head, body).await
    }

    async fn exchange(mut stream: TcpStream, head: &str, body: &[u8]) -> io::Result<Response> {
        // One write for a small request; two for a large body (no copy of it).
        if body.len() <= 64 << 10 {
            let mut all = Vec::with_capacity(head.len() + body.len());
            all.extend_from_slice(head.as_bytes());
            all.extend_from_slice(body);
            stream.write_all(&all).await?;
        } else {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body).await?;
        }
        let mut buf = vec![0u8; 4096];
        let mut have = 0;
        let end = loop {
            if let Some(i) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if have == buf.len() {
                if buf.len() >= MAX_HEAD {
                    return Err(invalid("response head too long"));
                }
                buf.resize(buf.len() * 2, 0);
            }
            let n = stream.read(&mut buf[have..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            have += n;
        };
        let text =
            std::str::from_utf8(&buf[..end]).map_err(|_| invalid("response head is not text"))?;
        let mut lines = text.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("no status line"))?;
        let mut length = None;
        let mut keep_alive = true;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<u64>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(invalid("chunked responses are not expected from kvtier"));
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep_alive = false;
            }
        }
        let left = length.ok_or_else(|| invalid("response without content-length"))?;
        let spare = buf[end..have].to_vec();
        if spare.len() as u64 > left {
            return Err(invalid("more bytes than the response's length"));
        }
        Ok(Response {
            status,
            left: left - spare.len() as u64,
            conn: Conn {
                stream,
                spare,
                keep_alive,
            },
        })
    }

    /// Returns a connection whose response was read completely.
    fn put_back(&self, r: Response) {
        if r.left == 0 && r.conn.spare.is_empty() && r.conn.keep_alive {
            let mut idle = self.idle.lock();
            if idle.len() < IDLE {
                idle.push(r.conn.stream);
            }
        }
    }

    /// Reads the whole body and returns the connection to the pool.
    pub async fn body(&self, mut r: Response) -> io::Result<Vec<u8>> {
        let mut out = std::mem::take(&mut r.conn.spare);
        let start = out.len();
        out.resize(start + r.left as usize, 0);
        r.conn.stream.read_exact(&mut out[start..]).await?;
        r.left = 0;
        self.put_back(r);
        Ok(out)
    }

    /// Reads exactly `dst.len()` body bytes into `dst`.
    pub async fn read_exact(r: &mut Response, dst: &mut [u8]) -> io::Result<()> {
        if dst.len() as u64 > r.left + r.conn.spare.len() as u64 {
            return Err(invalid("read past the end of the response"));
        }
        let from_spare = dst.len().min(r.conn.spare.len());
        dst[..from_spare].copy_from_slice(&r.conn.spare[..from_spare]);
        r.conn.spare.drain(..from_spare);
        let rest = &mut dst[from_spare..];
        r.conn.stream.read_exact(rest).await?;
        r.left -= rest.len() as u64;
        Ok(())
    }

    /// Finishes a response whose body was read to its end with [`Pool::read_exact`].
    pub fn done(&self, r: Response) {
        self.put_back(r);
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl Response {
    /// Body bytes not yet read.
    pub fn remaining(&self) -> u64 {
        self.left + self.conn.spare.len() as u64
    }
}
