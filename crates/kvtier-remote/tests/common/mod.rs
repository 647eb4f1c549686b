//! Real S3 servers for the remote tier's tests: `kvtier gateway` in this process (its
//! request counters tell how many GETs a load made) and moto's server in a child process
//! (a `kvtier_testkit::Process`), each on an ephemeral loopback port and stopped by its
//! handle's drop.

#![allow(dead_code, reason = "each test file uses part of this")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvtier_gateway::{Auth, GatewayConfig, RunningGateway};
use kvtier_remote::{Endpoint, RemoteConfig};
use kvtier_testkit::{Process, Ready};

pub const ACCESS: &str = "kvtier-test";
pub const SECRET: &str = "kvtier-test-secret";
pub const BUCKET: &str = "kvcache";

/// A gateway with SigV4 and bucket [`BUCKET`], on a fresh directory.
pub struct Gateway {
    pub running: Option<RunningGateway>,
    pub dir: kvtier_testkit::TestDir,
}

impl Gateway {
    pub fn start() -> Self {
        let dir = kvtier_testkit::test_dir("remote-gateway").expect("tempdir");
        let mut g = Self { running: None, dir };
        g.restart();
        g
    }

    /// Starts it again on the same directory (a new port).
    pub fn restart(&mut self) {
        self.running = None;
        let mut config = GatewayConfig::new(self.dir.path().to_path_buf());
        config.listen = "127.0.0.1:0".parse().expect("addr");
        config.auth = Auth::SigV4 {
            access_key: ACCESS.into(),
            secret_key: SECRET.into(),
        };
        config.durability = kvtier_ssd::Durability::Written { retries: 0 };
        // Created by the gateway itself: opening the store here first and reopening it in
        // the gateway races with child processes other tests fork (they inherit the
        // directory lock's descriptor until they exec).
        config.create_buckets = vec![BUCKET.into()];
        self.running = Some(RunningGateway::start(config).expect("start gateway"));
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").addr
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(format!("http://{}", self.addr()), BUCKET).with_credentials(ACCESS, SECRET)
    }

    /// Ranged GETs answered so far.
    pub fn ranged_gets(&self) -> u64 {
        self.running
            .as_ref()
            .expect("running")
            .counters()
            .snapshot()
            .1
    }

    /// GETs answered so far (ranged or not).
    pub fn gets(&self) -> u64 {
        self.running
            .as_ref()
            .expect("running")
            .counters()
            .snapshot()
            .0
    }

    pub fn stop(&mut self) {
        self.running = None;
    }
}

/// moto's S3 server in a child process (killed when dropped), with bucket [`BUCKET`].
pub struct Moto {
    pub addr: String,
    _process: Process,
}

impl Moto {
    pub fn start() -> Self {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"]);
        // moto says where it listens on stderr.
        let process = Process::start(
            "moto (python3 -m moto.server; scripts/setup.sh installs moto[server])",
            cmd,
            Ready::StderrLine("Running on http://".into()),
            Duration::from_secs(60),
        )
        .expect("moto did not say where it listens within 60 s");
        let addr = process.announced().to_owned();
        let moto = Self {
            addr,
            _process: process,
        };
        let status = raw_request(
            &moto.addr,
            &format!(
                "PUT /{BUCKET} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
                moto.addr
            ),
        );
        assert_eq!(status, 200, "creating the bucket on moto");
        moto
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(format!("http://{}", self.addr), BUCKET).with_credentials(ACCESS, SECRET)
    }
}

/// Sends one raw request and returns the status code.
pub fn raw_request(addr: &str, request: &str) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(request.as_bytes()).expect("write");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read");
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A misbehaving endpoint: answers every request with 500, or accepts and never answers.
pub struct BadServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    pub requests: Arc<AtomicUsize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    Error500,
    Hang,
}

impl BadServer {
    pub fn start(how: Misbehaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let (flag, count) = (flag.clone(), count.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
                    let mut buf = [0u8; 65536];
                    while !flag.load(Ordering::Relaxed) {
                        match conn.read(&mut buf) {
                            Ok(0) => return,
                            Ok(_) => {
                                count.fetch_add(1, Ordering::Relaxed);
                                if how == Misbehaviour::Error500 {
                                    let body = "<Error><Code>InternalError</Code><Message>injected</Message></Error>";
                                    let _ = write!(
                                        conn,
                                        "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{body}",
                                        body.len()
                                    );
                                }
                            }
                            Err(_) => {}
                        }
                    }
                });
            }
        });
        Self {
            addr,
            stop,
            requests,
        }
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(format!("http://{}", self.addr), BUCKET).with_credentials(ACCESS, SECRET)
    }
}

impl Drop for BadServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A plain S3 client of `endpoint`'s bucket, bypassing the tier (as any other writer
/// would see the bucket), and a runtime to drive it.
pub fn raw_s3(endpoint: &Endpoint) -> (object_store::aws::AmazonS3, tokio::runtime::Runtime) {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&endpoint.url)
        .with_bucket_name(&endpoint.bucket)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS)
        .with_secret_access_key(SECRET)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .expect("S3 client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (store, rt)
}

/// A remote config over `endpoint` with its own prefix (so tiers never see each other's
/// objects) and a short deadline.
pub fn config(endpoint: Endpoint, prefix: &str) -> RemoteConfig {
    let mut c = RemoteConfig::new(vec![endpoint]);
    c.prefix = prefix.into();
    c.deadline = Duration::from_millis(1500);
    c
}

/// Waits until `f` holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// How [`Proxy`] treats requests.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Mode {
    /// Forward to the server.
    Pass = 0,
    /// Read requests, never answer.
    Hang = 1,
    /// Answer every request with 500.
    Error500 = 2,
    /// Close the connection at once (a dead server behind a live address).
    Dead = 3,
}

/// A TCP proxy in front of a server whose behaviour a test switches while clients hold
/// pooled connections: the mode is checked on every chunk a client sends.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<std::sync::atomic::AtomicU8>,
    stop: Arc<AtomicBool>,
    /// Requests (client chunks) seen while not passing.
    pub intercepted: Arc<AtomicUsize>,
    /// Bytes of answers still to pass before the server "dies" (`u64::MAX`: no limit).
    answer_budget: Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(Mode::Pass as u8));
        let stop = Arc::new(AtomicBool::new(false));
        let intercepted = Arc::new(AtomicUsize::new(0));
        let answer_budget = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let (m, s, n, b) = (
            mode.clone(),
            stop.clone(),
            intercepted.clone(),
            answer_budget.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let (m, s, n, b) = (m.clone(), s.clone(), n.clone(), b.clone());
                std::thread::spawn(move || pump(client, upstream, &m, &s, &n, &b));
            }
        });
        Self {
            addr,
            mode,
            stop,
            intercepted,
            answer_budget,
        }
    }

    /// The server dies after `bytes` more bytes of answers: the answer in flight is cut
    /// there, its connection closed, and every later request finds a dead server.
    pub fn die_after_answer_bytes(&self, bytes: u64) {
        self.answer_budget.store(bytes, Ordering::SeqCst);
    }

    /// Whether the server "died" (its answer budget ran out).
    pub fn died(&self) -> bool {
        self.answer_budget.load(Ordering::SeqCst) == 0
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(format!("http://{}", self.addr), BUCKET).with_credentials(ACCESS, SECRET)
    }
}

fn pump(
    mut client: TcpStream,
    upstream: SocketAddr,
    mode: &std::sync::atomic::AtomicU8,
    stop: &AtomicBool,
    intercepted: &AtomicUsize,
    budget: &Arc<std::sync::atomic::AtomicU64>,
) {
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut server_r), Ok(mut client_w)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    // Server to client: a copy until either side closes, or the answer budget runs out
    // (then this connection is cut where the budget ended, and the server is dead).
    let answers = budget.clone();
    let dead = Arc::new(AtomicBool::new(false));
    let dead_w = dead.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match server_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let left = answers.load(Ordering::SeqCst);
            let pass = (n as u64).min(left) as usize;
            if left != u64::MAX {
                answers.fetch_sub(pass as u64, Ordering::SeqCst);
            }
            if client_w.write_all(&buf[..pass]).is_err() {
                break;
            }
            if pass < n || answers.load(Ordering::SeqCst) == 0 {
                dead_w.store(true, Ordering::SeqCst);
                break;
            }
        }
        let _ = client_w.shutdown(std::net::Shutdown::Both);
    });
    let _ = client.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) && !dead.load(Ordering::SeqCst) {
        // A dead server takes no new requests either.
        if budget.load(Ordering::SeqCst) == 0 {
            break;
        }
        let n = match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) => continue,
        };
        match mode.load(Ordering::SeqCst) {
            0 => {
                if server.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            1 => {
                intercepted.fetch_add(1, Ordering::Relaxed);
            }
            2 => {
                intercepted.fetch_add(1, Ordering::Relaxed);
                let body = "<Error><Code>InternalError</Code><Message>injected</Message></Error>";
                let _ = write!(
                    client,
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
            _ => {
                intercepted.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = server.shutdown(std::net::Shutdown::Both);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}
