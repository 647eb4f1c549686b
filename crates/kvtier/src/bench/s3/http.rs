//! A minimal blocking HTTP/1.1 client for the load generator: one keep-alive connection
//! per client thread, `Content-Length` bodies read into a reused buffer. Lean on purpose:
//! on 2 cores the load generator shares the CPU with the server, and its cost is part of
//! every figure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};

/// One connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    host: String,
    /// The server said `Connection: close` (moto does, on every answer): the next
    /// request opens a new connection, and pays for it, as any client would.
    closed: bool,
}

fn connect(host: &str) -> anyhow::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect(host).with_context(|| format!("connecting to {host}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(BufReader::with_capacity(256 << 10, s))
}

/// A response: status and body (in the connection's buffer).
pub struct Response {
    /// HTTP status.
    pub status: u16,
}

impl Conn {
    /// Connects to `host` (`IP:PORT`) with TCP_NODELAY and a 30 s read timeout.
    pub fn open(host: &str) -> anyhow::Result<Self> {
        Ok(Self {
            reader: connect(host)?,
            host: host.to_owned(),
            closed: false,
        })
    }

    /// The `Host` header value.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Sends `head` (request line and headers, without the blank line) and `body`, reads
    /// the answer into `out` (cleared first).
    pub fn request(
        &mut self,
        head: &str,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> anyhow::Result<Response> {
        if self.closed {
            self.reader = connect(&self.host)?;
            self.closed = false;
        }
        let mut msg = Vec::with_capacity(head.len() + 64 + body.len());
        msg.extend_from_slice(head.as_bytes());
        msg.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        msg.extend_from_slice(body);
        self.reader.get_mut().write_all(&msg)?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut length: Option<usize> = None;
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                bail!("connection closed in the headers");
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().ok();
                } else if name.eq_ignore_ascii_case("connection")
                    && value.trim().eq_ignore_ascii_case("close")
                {
                    self.closed = true;
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    bail!("chunked answers are not supported by the bench client");
                }
            }
        }
        let n = length.unwrap_or(0);
        out.clear();
        out.resize(n, 0);
        self.reader.read_exact(out)?;
        Ok(Response { status })
    }
}
