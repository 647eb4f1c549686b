//! A minimal HTTP/1.1 client for the two hot calls, lookup and load.
//!
//! A general HTTP client reads a response into its own buffers and hands out chunks, which
//! the caller then copies again; for a 128 MiB load that second copy (and the allocation
//! and page faults of fresh buffers) cost a third of the throughput here. This client
//! reads the load stream's block bytes straight from the socket into their destination,
//! so they are copied once (kernel to caller), like a plain TCP read. It speaks only what
//! kvtier's server sends: a status line, headers, and a body of `content-length` bytes or
//! in chunked transfer encoding (a load stream is produced as it is read, so its length is
//! not known up front). Connections are kept in a small pool and reused.

use std::io;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most idle connections kept.
const IDLE: usize = 32;
/// Longest response head accepted.
const MAX_HEAD: usize = 16 << 10;

/// Bytes asked of the socket per read into a connection's buffer.
const READ_AHEAD: usize = 16 << 10;

/// How the body's end is known.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// This many body bytes are still to come.
    Length(u64),
    /// Chunked: this many bytes of the current chunk are still to come; `done` once the
    /// last (empty) chunk was read.
    Chunked { left: u64, done: bool },
}

/// An open response: status, and the connection positioned in its body.
pub struct Response {
    /// HTTP status.
    pub status: u16,
    framing: Framing,
    conn: Conn,
}

/// One connection, with bytes read past what was consumed.
struct Conn {
    stream: TcpStream,
    /// Bytes read from the socket and not consumed yet: `buf[at..]`.
    buf: Vec<u8>,
    at: usize,
    keep_alive: bool,
    /// The pool's lane it goes back to.
    lane: usize,
}

impl Conn {
    fn buffered(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Reads more from the socket into the buffer; EOF is an error.
    async fn fill(&mut self) -> io::Result<()> {
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        // Into spare capacity: no zeroing of memory the read overwrites.
        self.buf.reserve(READ_AHEAD);
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// Reads exactly `dst.len()` bytes: first what is buffered, then straight from the
    /// socket into `dst`.
    async fn read_exact(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let from_buf = dst.len().min(self.buffered());
        dst[..from_buf].copy_from_slice(&self.buf[self.at..self.at + from_buf]);
        self.at += from_buf;
        self.stream.read_exact(&mut dst[from_buf..]).await?;
        Ok(())
    }

    /// Reads one CRLF-terminated line (without the CRLF).
    async fn read_line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = self.buf[self.at..].windows(2).position(|w| w == b"\r\n") {
                let line = std::str::from_utf8(&self.buf[self.at..self.at + i])
                    .map_err(|_| invalid("a chunk line is not text"))?
                    .to_string();
                self.at += i + 2;
                return Ok(line);
            }
            if self.buffered() > 1024 {
                return Err(invalid("chunk line too long"));
            }
            self.fill().await?;
        }
    }
}

/// A pool of connections to one server.
#[derive(Debug)]
pub struct Pool {
    addr: String,
    host: String,
    /// Idle connections by lane: small requests (0) and bulk ones (1,
    /// [`crate::wire::is_bulk`]) never share a connection, since the server serves a
    /// connection on the lane its first request chose.
    idle: [Mutex<Vec<TcpStream>>; 2],
    /// The longest a new connection may take to open.
    connect: std::time::Duration,
}

impl Pool {
    /// Connections to `base` (`http://host:port`), each opened within `connect`.
    pub fn new(base: &str, connect: std::time::Duration) -> Option<Self> {
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
            idle: Default::default(),
            connect,
        })
    }

    /// Sends one request and reads the response head.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: &[&[u8]],
    ) -> io::Result<Response> {
        let length: usize = body.iter().map(|p| p.len()).sum();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n",
            self.host,
        );
        if let Some(t) = token {
            head.push_str("authorization: Bearer ");
            head.push_str(t);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        // A pooled connection may have been closed by the server while idle: retry once on
        // a fresh one if the first attempt fails before any answer.
        let lane = usize::from(crate::wire::is_bulk(head.as_bytes()));
        let pooled = self.idle[lane].lock().pop();
        if let Some(stream) = pooled {
            match Self::exchange(stream, &head, body, lane).await {
                Ok(r) => return Ok(r),
                Err(e) if e.kind() != io::ErrorKind::InvalidData => {}
                Err(e) => return Err(e),
            }
        }
        let stream = tokio::time::timeout(self.connect, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection to {} within {:?}", self.addr, self.connect),
                )
            })??;
        stream.set_nodelay(true)?;
        Self::exchange(stream, &head, body, lane).await
    }

    /// Writes the request — `head`, then the body's parts in order — and reads the
    /// answer's head.
    async fn exchange(
        mut stream: TcpStream,
        head: &str,
        body: &[&[u8]],
        lane: usize,
    ) -> io::Result<Response> {
        // One write for a small request; for a large body, the head and then each part
        // as it is (no copy of it: the kernel's copy into the socket is the only one).
        let sent = Self::write_request(&mut stream, head, body).await;
        // A server may answer before it has read the whole body (one over its limit, a
        // store for an unknown layout) and close: its answer says more than the failed
        // write, so it is read if it is there.
        match Self::read_head(stream, lane).await {
            Ok(mut r) => {
                if sent.is_err() {
                    r.conn.keep_alive = false;
                }
                Ok(r)
            }
            Err(e) => Err(sent.err().unwrap_or(e)),
        }
    }

    async fn write_request(stream: &mut TcpStream, head: &str, body: &[&[u8]]) -> io::Result<()> {
        let length: usize = body.iter().map(|p| p.len()).sum();
        if length <= 64 << 10 {
            let mut all = Vec::with_capacity(head.len() + length);
            all.extend_from_slice(head.as_bytes());
            for part in body {
                all.extend_from_slice(part);
            }
            stream.write_all(&all).await
        } else {
            stream.write_all(head.as_bytes()).await?;
            for part in body {
                stream.write_all(part).await?;
            }
            Ok(())
        }
    }

    /// Reads an answer's head; the body is read from the returned [`Response`].
    ///
    /// The first read asks for [`READ_AHEAD`] bytes, so that a small answer (a lookup's:
    /// head and a 4 KiB body) arrives in one read whose shortness tells the runtime the
    /// socket is drained; reading the head alone first cost a lookup two more reads, one
    /// of them answered "would block".
    async fn read_head(mut stream: TcpStream, lane: usize) -> io::Result<Response> {
        let mut buf: Vec<u8> = Vec::with_capacity(READ_AHEAD);
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() >= MAX_HEAD {
                return Err(invalid("response head too long"));
            }
            buf.reserve(READ_AHEAD);
            let n = stream.read_buf(&mut buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
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
        let mut chunked = false;
        let mut keep_alive = true;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<u64>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                if !value.eq_ignore_ascii_case("chunked") {
                    return Err(invalid("unknown transfer encoding"));
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep_alive = false;
            }
        }
        let framing = match (chunked, length) {
            (true, _) => Framing::Chunked {
                left: 0,
                done: false,
            },
            (false, Some(n)) => Framing::Length(n),
            (false, None) => return Err(invalid("response without length or chunking")),
        };
        let conn = Conn {
            stream,
            buf,
            at: end,
            keep_alive,
            lane,
        };
        if let Framing::Length(n) = framing
            && conn.buffered() as u64 > n
        {
            return Err(invalid("more bytes than the response's length"));
        }
        Ok(Response {
            status,
            framing,
            conn,
        })
    }

    /// Returns a connection whose response was read completely.
    fn put_back(&self, r: Response) {
        let finished = match r.framing {
            Framing::Length(left) => left == 0,
            Framing::Chunked { done, .. } => done,
        };
        // Nothing of this response may be left, and nothing past it.
        if finished && r.conn.buffered() == 0 && r.conn.keep_alive {
            let mut idle = self.idle[r.conn.lane].lock();
            if idle.len() < IDLE {
                idle.push(r.conn.stream);
            }
        }
    }

    /// Reads the whole body and returns the connection to the pool.
    pub async fn body(&self, mut r: Response) -> io::Result<Vec<u8>> {
        if let Framing::Length(n) = r.framing {
            return self.body_of_length(r, n).await;
        }
        let mut out = Vec::new();
        let mut piece = vec![0u8; 16 << 10];
        loop {
            let n = Self::read_some(&mut r, &mut piece).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&piece[..n]);
            if out.len() > 1 << 30 {
                return Err(invalid("response body over 1 GiB"));
            }
        }
        self.put_back(r);
        Ok(out)
    }

    /// [`Pool::body`] of a body whose length the head gave: one buffer of that size, the
    /// bytes read ahead copied in and the rest read straight into it (a lookup's answer,
    /// read whole with its head, costs one copy and no zeroing).
    async fn body_of_length(&self, mut r: Response, n: u64) -> io::Result<Vec<u8>> {
        if n > 1 << 30 {
            return Err(invalid("response body over 1 GiB"));
        }
        let n = n as usize;
        let mut out = Vec::with_capacity(n);
        let conn = &mut r.conn;
        let ahead = n.min(conn.buffered());
        out.extend_from_slice(&conn.buf[conn.at..conn.at + ahead]);
        conn.at += ahead;
        while out.len() < n {
            let rest = (n - out.len()) as u64;
            if (&mut conn.stream).take(rest).read_buf(&mut out).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        r.framing = Framing::Length(0);
        self.put_back(r);
        Ok(out)
    }

    /// Reads up to `dst.len()` body bytes (0 at the end of the body).
    async fn read_some(r: &mut Response, dst: &mut [u8]) -> io::Result<usize> {
        match r.framing {
            Framing::Length(left) => {
                let n = (left.min(dst.len() as u64)) as usize;
                r.conn.read_exact(&mut dst[..n]).await?;
                r.framing = Framing::Length(left - n as u64);
                Ok(n)
            }
            Framing::Chunked { done: true, .. } => Ok(0),
            Framing::Chunked { left: 0, .. } => {
                let line = r.conn.read_line().await?;
                let size = line.split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(size, 16).map_err(|_| invalid("bad chunk size"))?;
                if size == 0 {
                    // Trailers (none expected) end with an empty line.
                    while !r.conn.read_line().await?.is_empty() {}
                    r.framing = Framing::Chunked {
                        left: 0,
                        done: true,
                    };
                    return Ok(0);
                }
                r.framing = Framing::Chunked {
                    left: size,
                    done: false,
                };
                Box::pin(Self::read_some(r, dst)).await
            }
            Framing::Chunked { left, .. } => {
                let n = (left.min(dst.len() as u64)) as usize;
                r.conn.read_exact(&mut dst[..n]).await?;
                let left = left - n as u64;
                if left == 0 && !r.conn.read_line().await?.is_empty() {
                    return Err(invalid("chunk not followed by CRLF"));
                }
                r.framing = Framing::Chunked { left, done: false };
                Ok(n)
            }
        }
    }

    /// Reads exactly `dst.len()` body bytes into `dst` (straight from the socket once the
    /// buffered bytes are used); the body ending first is an error.
    pub async fn read_exact(r: &mut Response, dst: &mut [u8]) -> io::Result<()> {
        let mut at = 0;
        while at < dst.len() {
            let n = Self::read_some(r, &mut dst[at..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            at += n;
        }
        Ok(())
    }

    /// Finishes a response: the body must have no bytes left; the connection goes back to
    /// the pool.
    pub async fn done(&self, mut r: Response) -> io::Result<()> {
        let mut probe = [0u8; 1];
        if Self::read_some(&mut r, &mut probe).await? != 0 {
            return Err(invalid("bytes after the end of the stream"));
        }
        self.put_back(r);
        Ok(())
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// A server that answers every request `200` with an empty body and counts the
    /// connections it accepted.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut s = BufReader::new(s);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        // The requests here have no body: a head ends at its empty line.
                        if line == "\r\n" {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                            if s.get_mut().write_all(ok).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (base, accepted)
    }

    #[tokio::test]
    async fn stores_and_lookups_never_share_a_pooled_connection() {
        let (base, accepted) = counting_server().await;
        let pool = Pool::new(&base, std::time::Duration::from_secs(5)).unwrap();
        let call = |path: &'static str| {
            let pool = &pool;
            async move {
                let r = pool.send("POST", path, None, "x", &[]).await.unwrap();
                assert_eq!(r.status, 200);
                pool.body(r).await.unwrap();
            }
        };
        call("/v1/store").await;
        call("/v1/lookup").await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "the lookup took a connection of its own"
        );
        call("/v1/lookup").await;
        call("/v1/store?durability=written").await;
        call("/v1/load").await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "each kind reused its own pooled connection (a load is not bulk)"
        );
    }

    /// A server that answers one request with `answer` (head and body as given) and then
    /// closes the connection.
    async fn one_answer(answer: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut line = String::new();
            while s.read_line(&mut line).await.unwrap_or(0) > 0 && !line.ends_with("\r\n\r\n") {}
            // The body in pieces, so that the client reads past its read-ahead.
            for piece in answer.chunks(7000) {
                s.get_mut().write_all(piece).await.unwrap();
                s.get_mut().flush().await.unwrap();
            }
        });
        base
    }

    #[tokio::test]
    async fn a_body_of_known_length_is_read_whole_and_exactly() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut answer =
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        answer.extend_from_slice(&body);
        let pool = Pool::new(&one_answer(answer).await, std::time::Duration::from_secs(5)).unwrap();
        let r = pool
            .send("POST", "/v1/lookup", None, "x", &[])
            .await
            .unwrap();
        assert_eq!(pool.body(r).await.unwrap(), body);
    }

    #[tokio::test]
    async fn a_body_shorter_than_its_length_is_an_error() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 50000\r\n\r\nonly this".to_vec();
        let pool = Pool::new(&one_answer(answer).await, std::time::Duration::from_secs(5)).unwrap();
        let r = pool
            .send("POST", "/v1/lookup", None, "x", &[])
            .await
            .unwrap();
        let err = pool.body(r).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
