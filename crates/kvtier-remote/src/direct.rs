//! Direct reads: the tier's GETs of blocks and states on [`crate::http1`], on the calling
//! thread, the body received straight into a reused buffer of the tier's [`RecvPool`].
//!
//! A hit's bytes are copied once, by the kernel, into the buffer they are served from;
//! no other thread is woken. Everything but these GETs stays on object_store.
//!
//! **When it applies.** An endpoint gets a [`DirectReader`] only when this client can
//! speak to it exactly as object_store would: a plain `http://host[:port]` URL (no TLS,
//! no path), and either unsigned requests or static credentials (the endpoint's own, or
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN` from the environment,
//! which object_store reads too). Names and buckets outside the characters SigV4 leaves
//! unencoded are read through object_store, so both clients always ask for the same
//! object. Anything else (https, instance or web-identity credentials) reads through
//! object_store as before.
//!
//! **Same promises as object_store's reads.** Each call ends by the tier's deadline: a
//! connect, every socket read and write is bounded by what is left of it. 5xx, 429,
//! resets, timeouts and cut bodies are retried with backoff (20 ms, doubling, at most a
//! quarter of the deadline) up to the tier's retry count; a 404 is [`Fetch::Gone`]; any
//! other status fails at once. A connection that fails before any byte of an answer came
//! back after sitting idle (the server closed it) is replaced by a new one without
//! counting a retry. A body longer than the caller allows is refused before it is read.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::{Endpoint, RemoteConfig};
use crate::http1::{Conn, DirectError, is_before_answer};
use crate::recv::RecvPool;
use crate::s3::{CallError, Fetch};
use crate::sigv4::{EMPTY_SHA256, Signer, request_head};

/// Idle connections kept per endpoint.
const KEEP_IDLE: usize = 16;

/// First pause before a retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

/// A received body and the CRC-32C of its bytes from the offset the caller named (of no
/// bytes if it named none).
pub(crate) struct Received {
    pub(crate) body: Vec<u8>,
    pub(crate) crc: u32,
}

/// GETs of one endpoint, on kept-alive connections; see the module docs.
#[derive(Debug)]
pub(crate) struct DirectReader {
    /// `host[:port]`, as sent in `Host` and signed.
    host: String,
    /// `host:port`, to connect to.
    addr: String,
    bucket: String,
    signer: Option<Signer>,
    idle: Mutex<Vec<Conn>>,
    deadline: Duration,
    retries: usize,
    /// Reads answered (for tests and stats).
    reads: AtomicU64,
}

/// Characters SigV4 and object_store leave as they are in a path.
fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/'))
}

impl DirectReader {
    /// A reader for `endpoint`, if direct reads can reach it as object_store does.
    pub(crate) fn for_endpoint(endpoint: &Endpoint, config: &RemoteConfig) -> Option<Self> {
        let host = endpoint.url.strip_prefix("http://")?.trim_end_matches('/');
        if host.is_empty() || host.contains(['/', '?', '#', '@']) || !plain(&endpoint.bucket) {
            return None;
        }
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let signer = if endpoint.unsigned {
            None
        } else {
            let access_key = endpoint
                .access_key
                .clone()
                .or_else(|| env("AWS_ACCESS_KEY_ID"))?;
            let secret_key = endpoint
                .secret_key
                .clone()
                .or_else(|| env("AWS_SECRET_ACCESS_KEY"))?;
            Some(Signer {
                access_key,
                secret_key,
                region: endpoint.region.clone(),
                session_token: env("AWS_SESSION_TOKEN"),
            })
        };
        // `host` without a port connects to 80; with one, as written.
        let addr = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        Some(Self {
            host: host.to_owned(),
            addr,
            bucket: endpoint.bucket.clone(),
            signer,
            idle: Mutex::new(Vec::new()),
            deadline: config.deadline,
            retries: config.retries,
            reads: AtomicU64::new(0),
        })
    }

    /// Whether `name` can be read directly (see the module docs).
    pub(crate) fn reads(&self, name: &str) -> bool {
        plain(name)
    }

    /// Reads answered so far.
    pub(crate) fn answered(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// GETs `range` of object `name` (all of it for `None`) into a buffer of `pool`,
    /// with the CRC-32C of its bytes from offset `crc_from` (if any) taken as they arrive. An
    /// answer longer than `limit` bytes, or a ranged answer that is not 206 Partial
    /// Content, fails.
    pub(crate) fn get(
        &self,
        name: &str,
        range: Option<Range<u64>>,
        limit: u64,
        crc_from: Option<usize>,
        pool: &RecvPool,
    ) -> Fetch<Received> {
        let deadline = Instant::now() + self.deadline;
        let mut backoff = FIRST_BACKOFF;
        let mut failures = 0;
        loop {
            let idle = self.idle.lock().pop();
            let (conn, pooled) = match idle {
                Some(c) => (Ok(c), true),
                None => (self.connect(deadline), false),
            };
            let err = match conn {
                Ok(mut conn) => {
                    match self.attempt(
                        &mut conn,
                        name,
                        range.clone(),
                        limit,
                        crc_from,
                        deadline,
                        pool,
                    ) {
                        Ok(answer) => {
                            self.keep(conn);
                            match answer {
                                Some(received) => {
                                    self.reads.fetch_add(1, Ordering::Relaxed);
                                    return Fetch::Got(received);
                                }
                                None => return Fetch::Gone,
                            }
                        }
                        Err(e) => {
                            self.keep(conn);
                            e
                        }
                    }
                }
                Err(e) => DirectError::Io(e),
            };
            let stale = pooled && matches!(&err, DirectError::Io(e) if is_before_answer(e));
            if stale && Instant::now() < deadline {
                continue; // the server closed an idle connection: not a failure
            }
            failures += 1;
            if !err.retryable() || failures > self.retries {
                return Fetch::Failed(CallError::Direct(err));
            }
            if Instant::now() + backoff >= deadline {
                return Fetch::Failed(CallError::Deadline(self.deadline));
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(self.deadline / 4);
        }
    }

    fn connect(&self, deadline: Instant) -> io::Result<Conn> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Conn::connect(&self.addr, left.min(Duration::from_secs(1)))
    }

    /// Keeps `conn` for the next read if it can take one.
    fn keep(&self, conn: Conn) {
        if conn.reusable() {
            let mut idle = self.idle.lock();
            if idle.len() < KEEP_IDLE {
                idle.push(conn);
            }
        }
    }

    /// One request on `conn`: the body (`None` for a 404), or why not.
    #[allow(clippy::too_many_arguments, reason = "one request's parts, private")]
    fn attempt(
        &self,
        conn: &mut Conn,
        name: &str,
        range: Option<Range<u64>>,
        limit: u64,
        crc_from: Option<usize>,
        deadline: Instant,
        pool: &RecvPool,
    ) -> Result<Option<Received>, DirectError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DirectError::Io(io::ErrorKind::TimedOut.into()));
        }
        conn.set_timeout(left)?;
        let range = range.map(|r| format!("bytes={}-{}", r.start, r.end.saturating_sub(1)));
        conn.send(&self.head(name, range.as_deref()), &[])?;
        let head = conn.read_head()?;
        let expected = if range.is_some() { 206 } else { 200 };
        if head.status != expected {
            conn.discard_body(head.content_length)?;
            return match head.status {
                404 => Ok(None),
                s => Err(DirectError::Status(s)),
            };
        }
        if head.content_length > limit {
            return Err(DirectError::TooLong {
                got: head.content_length,
                limit,
            });
        }
        let len = usize::try_from(head.content_length).map_err(|_| DirectError::TooLong {
            got: head.content_length,
            limit,
        })?;
        let mut body = pool.take_filled(len);
        let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        let mut at = 0usize;
        conn.read_body(&mut body, deadline, &mut |part| {
            if let Some(from) = crc_from {
                let skip = from.saturating_sub(at).min(part.len());
                digest.update(&part[skip..]);
            }
            at += part.len();
        })?;
        Ok(Some(Received {
            body,
            crc: digest.finalize() as u32,
        }))
    }

    /// The request line and headers of a GET of `name`, signed when credentials are set.
    fn head(&self, name: &str, range: Option<&str>) -> String {
        let path = format!("/{}/{name}", self.bucket);
        let range: Vec<(&str, &str)> = range.map(|r| ("range", r)).into_iter().collect();
        request_head(
            self.signer.as_ref(),
            "GET",
            &self.host,
            &path,
            &range,
            EMPTY_SHA256,
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// What the scripted server does with the next request.
    enum Step {
        /// Writes these bytes and keeps the connection.
        Answer(&'static [u8]),
        /// Writes these bytes and closes the connection.
        AnswerAndClose(&'static [u8]),
    }

    /// A server answering requests from a script; counts connections and requests.
    struct Scripted {
        url: String,
        connections: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
    }

    fn scripted(steps: Vec<Step>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let steps = Arc::new(parking_lot::Mutex::new(VecDeque::from(steps)));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (connections.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().take(8) {
                let Ok(mut s) = stream else { return };
                c.fetch_add(1, Ordering::Relaxed);
                let (steps, r) = (steps.clone(), r.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    loop {
                        // One request per read: the client sends each in one write.
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        r.fetch_add(1, Ordering::Relaxed);
                        let Some(step) = steps.lock().pop_front() else {
                            return;
                        };
                        match step {
                            Step::Answer(a) => {
                                let _ = s.write_all(a);
                            }
                            Step::AnswerAndClose(a) => {
                                let _ = s.write_all(a);
                                return;
                            }
                        }
                    }
                });
            }
        });
        Scripted {
            url,
            connections,
            requests,
        }
    }

    fn reader(url: &str) -> DirectReader {
        let mut e = Endpoint::new(url, "bucket").with_credentials("ak", "sk");
        e.region = "us-east-1".into();
        let mut config = RemoteConfig::new(vec![e.clone()]);
        config.deadline = Duration::from_millis(1500);
        DirectReader::for_endpoint(&e, &config).unwrap()
    }

    const PARTIAL: &[u8] = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 8\r\n\r\nheadbody";

    fn get(r: &DirectReader, limit: u64) -> Fetch<Received> {
        r.get("kv/o.kvo", Some(0..8), limit, Some(4), &RecvPool::default())
    }

    #[test]
    fn a_body_arrives_whole_with_the_checksum_of_its_tail() {
        let server = scripted(vec![Step::Answer(PARTIAL), Step::Answer(PARTIAL)]);
        let r = reader(&server.url);
        for _ in 0..2 {
            let Fetch::Got(got) = get(&r, 8) else {
                panic!("no body")
            };
            assert_eq!(got.body, b"headbody");
            assert_eq!(got.crc, crate::object::crc(b"body"));
        }
        assert_eq!(r.answered(), 2);
        assert_eq!(server.connections.load(Ordering::Relaxed), 1, "kept alive");
    }

    #[test]
    fn a_connection_the_server_closed_while_idle_is_replaced_without_a_retry() {
        let server = scripted(vec![Step::AnswerAndClose(PARTIAL), Step::Answer(PARTIAL)]);
        let mut r = reader(&server.url);
        r.retries = 0;
        // The first answer did not say `Connection: close`, so its connection is kept;
        // the server has closed it by the time of the second read.
        assert!(matches!(get(&r, 8), Fetch::Got(_)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(get(&r, 8), Fetch::Got(_)));
        assert_eq!(server.connections.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn server_errors_are_retried_and_client_errors_are_not() {
        const UNAVAILABLE: &[u8] = b"HTTP/1.1 503 Slow Down\r\nContent-Length: 4\r\n\r\nbusy";
        let server = scripted(vec![Step::Answer(UNAVAILABLE), Step::Answer(PARTIAL)]);
        assert!(matches!(get(&reader(&server.url), 8), Fetch::Got(_)));
        assert_eq!(server.requests.load(Ordering::Relaxed), 2);

        const FORBIDDEN: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno";
        let server = scripted(vec![Step::Answer(FORBIDDEN), Step::Answer(PARTIAL)]);
        let got = get(&reader(&server.url), 8);
        assert!(matches!(
            got,
            Fetch::Failed(CallError::Direct(DirectError::Status(403)))
        ));
        assert_eq!(server.requests.load(Ordering::Relaxed), 1);

        const MISSING: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        let server = scripted(vec![Step::Answer(MISSING)]);
        assert!(matches!(get(&reader(&server.url), 8), Fetch::Gone));
    }

    #[test]
    fn answers_past_the_limit_or_of_the_wrong_kind_are_refused() {
        let server = scripted(vec![Step::Answer(PARTIAL)]);
        let got = get(&reader(&server.url), 7);
        assert!(matches!(
            got,
            Fetch::Failed(CallError::Direct(DirectError::TooLong { got: 8, limit: 7 }))
        ));
        // A whole object where a range was asked for is not the range.
        const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nheadbody";
        let server = scripted(vec![Step::Answer(WHOLE)]);
        let got = get(&reader(&server.url), 8);
        assert!(matches!(
            got,
            Fetch::Failed(CallError::Direct(DirectError::Status(200)))
        ));
    }

    #[test]
    fn a_silent_server_fails_the_read_within_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = reader(&format!("http://{}", listener.local_addr().unwrap()));
        let start = Instant::now();
        assert!(matches!(get(&r, 8), Fetch::Failed(_)));
        let took = start.elapsed();
        assert!(took < Duration::from_secs(4), "took {took:?}");
        drop(listener);
    }

    #[test]
    fn a_body_that_trickles_past_the_deadline_fails_the_read_at_the_deadline() {
        // Every byte arrives well within a socket timeout; the whole body never does.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = reader(&format!("http://{}", listener.local_addr().unwrap()));
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\r\n");
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"x").is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let got = r.get("kv/o.kvo", Some(0..100), 100, None, &RecvPool::default());
        let took = start.elapsed();
        assert!(
            matches!(got, Fetch::Failed(_)),
            "a trickled body was served"
        );
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
            "took {took:?} for a 1.5 s deadline"
        );
    }

    #[test]
    fn only_endpoints_reachable_as_object_store_reaches_them_get_a_reader() {
        let config = RemoteConfig::new(Vec::new());
        let with = |url: &str, bucket: &str| {
            let e = Endpoint::new(url, bucket).with_credentials("ak", "sk");
            DirectReader::for_endpoint(&e, &config)
        };
        assert!(with("http://127.0.0.1:9000", "b").is_some());
        assert!(with("http://127.0.0.1:9000/", "b").is_some());
        let r = with("http://s3.local", "b").unwrap();
        assert_eq!(
            (r.host.as_str(), r.addr.as_str()),
            ("s3.local", "s3.local:80")
        );
        assert!(with("https://s3.amazonaws.com", "b").is_none(), "TLS");
        assert!(with("http://127.0.0.1:9000/base", "b").is_none(), "a path");
        assert!(with("http://user@127.0.0.1:9000", "b").is_none());
        assert!(
            with("http://127.0.0.1:9000", "b b").is_none(),
            "an encoded bucket"
        );
        let mut unsigned = Endpoint::new("http://127.0.0.1:9000", "b");
        unsigned.unsigned = true;
        assert!(
            DirectReader::for_endpoint(&unsigned, &config)
                .unwrap()
                .signer
                .is_none()
        );
        assert!(r.reads("kv/state/ab/cd.kvs"));
        assert!(!r.reads("kv/a b"), "a name SigV4 would encode");
        assert!(!r.reads("kv/é"));
    }
}
