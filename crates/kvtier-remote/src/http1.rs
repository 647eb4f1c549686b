//! A minimal blocking HTTP/1.1 client connection: requests with `Content-Length` bodies,
//! answers with `Content-Length` bodies read **straight into the caller's buffer**.
//!
//! It exists for one reason: a read of a hit should cost one copy, kernel to the buffer
//! the block or state is served from. object_store's client (hyper) receives a body into
//! buffers of its own, which the tier then had to copy again, and runs on another thread
//! the caller waits for; on a 1 MiB state that was a fifth of the read's time. The tier's
//! direct reads ([`crate::direct`]) and kvtier bench's load generator and baselines use
//! this connection; everything else the tier sends (PUTs, listings, deletes, manifests)
//! stays on object_store.
//!
//! What it refuses instead of guessing: chunked or length-less answers, status lines or
//! header sections past [`MAX_HEAD_BYTES`], and bodies that end early. A refused answer
//! leaves the connection unusable ([`Conn::reusable`] is false).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest status line plus headers accepted.
pub const MAX_HEAD_BYTES: u64 = 16 << 10;

/// Bytes of an error answer's body read (and discarded) to keep the connection usable;
/// a longer one closes it instead.
const MAX_DRAINED: u64 = 64 << 10;

/// One connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<TcpStream>,
    host: String,
    /// The server said `Connection: close`, or an answer was refused or cut: the next
    /// request needs a new connection.
    closed: bool,
}

/// The status line and the headers that matter of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// HTTP status.
    pub status: u16,
    /// Body bytes that follow.
    pub content_length: u64,
}

/// A complete answer of [`Conn::request`] (its body is in the caller's buffer).
#[derive(Debug, Clone, Copy)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
}

/// Why a request failed before any byte of an answer arrived: the connection may have
/// been closed by the server while idle, and a fresh one may succeed.
pub fn is_before_answer(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<BeforeAnswer>())
}

#[derive(Debug, thiserror::Error)]
#[error("the connection failed before an answer: {0}")]
struct BeforeAnswer(io::Error);

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl Conn {
    /// Connects to `host` (`NAME:PORT` or `IP:PORT`) with TCP_NODELAY, 30 s timeouts.
    pub fn open(host: &str) -> io::Result<Self> {
        Self::connect(host, Duration::from_secs(30))
    }

    /// Connects to `host` within `timeout` (also the first read and write timeout).
    pub fn connect(host: &str, timeout: Duration) -> io::Result<Self> {
        let timeout = timeout.max(Duration::from_millis(1));
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
        for addr in host.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    return Ok(Self {
                        reader: BufReader::with_capacity(64 << 10, s),
                        host: host.to_owned(),
                        closed: false,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The `Host` header value.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether another request may be sent on this connection.
    pub fn reusable(&self) -> bool {
        !self.closed
    }

    /// Read and write timeout of each socket call from now on.
    pub fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        let t = Some(timeout.max(Duration::from_millis(1)));
        let s = self.reader.get_ref();
        s.set_read_timeout(t)?;
        s.set_write_timeout(t)
    }

    /// Sends `head` (request line and headers, each ending in CRLF, without the blank
    /// line) with a `Content-Length` of `body`, then `body`.
    pub fn send(&mut self, head: &str, body: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(head.len() + 32 + body.len());
        msg.extend_from_slice(head.as_bytes());
        msg.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        msg.extend_from_slice(body);
        self.reader
            .get_mut()
            .write_all(&msg)
            .map_err(|e| self.cut(io::Error::other(BeforeAnswer(e))))
    }

    /// Reads an answer's status line and headers. An error before its first byte is
    /// [`is_before_answer`].
    pub fn read_head(&mut self) -> io::Result<Head> {
        match read_head(&mut self.reader) {
            Ok((head, close)) => {
                self.closed |= close;
                Ok(head)
            }
            Err(e) => Err(self.cut(e)),
        }
    }

    /// Reads exactly `out.len()` body bytes into `out`, calling `on_data` with each part
    /// as it arrives, every socket read bounded by what is left until `deadline`.
    pub fn read_body(
        &mut self,
        out: &mut [u8],
        deadline: Instant,
        on_data: &mut dyn FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut filled = 0;
        while filled < out.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.cut(io::Error::from(io::ErrorKind::TimedOut)));
            }
            if let Err(e) = self.set_timeout(left) {
                return Err(self.cut(e));
            }
            // An empty BufReader hands a read this large straight to the socket.
            match self.reader.read(&mut out[filled..]) {
                Ok(0) => return Err(self.cut(invalid("the answer's body was cut"))),
                Ok(n) => {
                    on_data(&out[filled..filled + n]);
                    filled += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.cut(e)),
            }
        }
        Ok(())
    }

    /// Reads and drops a body of `len` bytes (an error answer's), or closes the
    /// connection if it is long.
    pub fn discard_body(&mut self, len: u64) -> io::Result<()> {
        if len > MAX_DRAINED {
            self.closed = true;
            return Ok(());
        }
        let copied = io::copy(&mut (&mut self.reader).take(len), &mut io::sink());
        match copied {
            Ok(n) if n == len => Ok(()),
            Ok(_) => Err(self.cut(invalid("the answer's body was cut"))),
            Err(e) => Err(self.cut(e)),
        }
    }

    /// Sends a request and reads its whole answer into `out` (resized to the body, its
    /// bytes overwritten, not zeroed first). Opens a new connection first if the last
    /// answer closed this one, as any client would.
    pub fn request(&mut self, head: &str, body: &[u8], out: &mut Vec<u8>) -> io::Result<Response> {
        if self.closed {
            *self = Self::connect(&self.host, Duration::from_secs(30))?;
        }
        self.send(head, body)?;
        let h = self.read_head()?;
        let len = usize::try_from(h.content_length)
            .map_err(|_| self.cut(invalid("a body larger than memory")))?;
        if out.len() < len {
            out.resize(len, 0);
        }
        out.truncate(len);
        let deadline = Instant::now() + Duration::from_secs(30);
        self.read_body(out, deadline, &mut |_| {})?;
        Ok(Response { status: h.status })
    }

    /// Marks the connection unusable and passes `e` on.
    fn cut(&mut self, e: io::Error) -> io::Error {
        self.closed = true;
        e
    }
}

/// The head of the answer `reader` is at, and whether the server will close after it.
fn read_head(reader: &mut BufReader<TcpStream>) -> io::Result<(Head, bool)> {
    let mut limited = reader.take(MAX_HEAD_BYTES);
    let mut line = Vec::with_capacity(128);
    match limited.read_until(b'\n', &mut line) {
        Ok(0) => {
            let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
            return Err(io::Error::other(BeforeAnswer(eof)));
        }
        Err(e) if line.is_empty() => return Err(io::Error::other(BeforeAnswer(e))),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let status = std::str::from_utf8(&line)
        .ok()
        .filter(|l| l.starts_with("HTTP/1."))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| invalid("not an HTTP/1.x status line"))?;
    let (mut length, mut close) = (None, false);
    loop {
        line.clear();
        if limited.read_until(b'\n', &mut line)? == 0 {
            return Err(invalid("the answer's headers were cut"));
        }
        if !line.ends_with(b"\n") {
            return Err(invalid("the answer's headers are too long"));
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            continue; // a header value in another encoding: none of ours
        };
        let text = text.trim_end();
        if text.is_empty() {
            break;
        }
        let (name, value) = text
            .split_once(':')
            .ok_or_else(|| invalid("a header line without a colon"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<u64>() {
                Ok(n) if length.is_none_or(|l| l == n) => length = Some(n),
                _ => return Err(invalid("a bad or repeated Content-Length")),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("a chunked answer (only Content-Length bodies)"));
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    // 1xx, 204 and 304 answers carry no body whatever they say; every other one must say
    // how long it is.
    let content_length = match (status < 200 || status == 204 || status == 304, length) {
        (true, _) => 0,
        (false, Some(n)) => n,
        (false, None) => return Err(invalid("an answer without Content-Length")),
    };
    Ok((
        Head {
            status,
            content_length,
        },
        close,
    ))
}

/// Why a direct read failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DirectError {
    /// The connection or the answer's framing failed.
    #[error("direct read: {0}")]
    Io(#[from] io::Error),
    /// The endpoint answered with an error status.
    #[error("direct read: HTTP {0}")]
    Status(u16),
    /// The answer is longer than the caller allows.
    #[error("direct read: an answer of {got} bytes where at most {limit} are expected")]
    TooLong {
        /// Bytes the answer announced.
        got: u64,
        /// Bytes allowed.
        limit: u64,
    },
}

impl DirectError {
    /// Whether trying again may succeed (a dropped connection, a 5xx or 429).
    pub(crate) fn retryable(&self) -> bool {
        match self {
            Self::Io(e) => e.kind() != io::ErrorKind::InvalidData || is_before_answer(e),
            Self::Status(s) => *s >= 500 || *s == 429,
            Self::TooLong { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::net::TcpListener;

    use super::*;

    /// A server that answers each connection's first request with `answer`, then closes.
    fn answering(answer: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(4) {
                let Ok(mut s) = stream else { return };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(answer);
            }
        });
        addr
    }

    fn ask(answer: &'static [u8]) -> (Conn, io::Result<Head>) {
        let mut c = Conn::connect(&answering(answer), Duration::from_secs(5)).unwrap();
        c.send("GET /b/k HTTP/1.1\r\nHost: x\r\n", &[]).unwrap();
        let head = c.read_head();
        (c, head)
    }

    #[test]
    fn a_body_lands_in_the_callers_buffer_and_each_part_is_seen() {
        let (mut c, head) = ask(b"HTTP/1.1 206 Partial\r\ncontent-length: 5\r\nX: y\r\n\r\nhello");
        assert_eq!(
            head.unwrap(),
            Head {
                status: 206,
                content_length: 5
            }
        );
        let mut out = [0u8; 5];
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        c.read_body(&mut out, deadline, &mut |d| seen.extend_from_slice(d))
            .unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(seen, b"hello");
        assert!(c.reusable());
    }

    #[test]
    fn answers_it_cannot_frame_are_refused_and_close_the_connection() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
        ] {
            let (c, head) = ask(answer);
            let e = head.unwrap_err();
            assert!(!is_before_answer(&e), "{e}");
            assert!(!c.reusable(), "{}", String::from_utf8_lossy(answer));
        }
    }

    #[test]
    fn an_endless_header_section_is_cut_at_the_bound() {
        static LONG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let answer = LONG.get_or_init(|| {
            let mut a = b"HTTP/1.1 200 OK\r\n".to_vec();
            a.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES as usize + 10));
            a
        });
        let (c, head) = ask(answer);
        assert_eq!(head.unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(!c.reusable());
    }

    #[test]
    fn a_cut_body_and_a_silent_close_are_told_apart() {
        let (mut c, head) = ask(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello");
        let mut out = [0u8; 10];
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(head.unwrap().content_length, 10);
        let e = c.read_body(&mut out, deadline, &mut |_| {}).unwrap_err();
        assert!(!is_before_answer(&e));
        assert!(!c.reusable());
        // A server that closes without answering: the request may be retried.
        let (_, head) = ask(b"");
        assert!(is_before_answer(&head.unwrap_err()));
    }

    #[test]
    fn connection_close_is_honoured_and_request_reconnects() {
        let addr =
            answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok");
        let mut c = Conn::connect(&addr, Duration::from_secs(5)).unwrap();
        let mut out = vec![9u8; 100];
        for _ in 0..2 {
            let r = c
                .request("GET / HTTP/1.1\r\nHost: x\r\n", &[], &mut out)
                .unwrap();
            assert_eq!((r.status, &out[..]), (200, &b"ok"[..]));
            assert!(!c.reusable());
        }
    }

    #[test]
    fn a_silent_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut c = Conn::connect(&addr, Duration::from_millis(100)).unwrap();
        c.send("GET / HTTP/1.1\r\nHost: x\r\n", &[]).unwrap();
        let start = Instant::now();
        assert!(c.read_head().is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(listener);
    }
}
