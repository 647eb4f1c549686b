//! Both front ends under a low open-file limit, as real processes: `kvtier gateway` and
//! `kvtier serve` started with soft = hard = 256 descriptors (the limit cannot be raised)
//! clamp their connection cap below it, say so once, and with 300 idle sockets open —
//! more than the limit allows — still answer requests within seconds; started with a soft
//! limit of 256 under a higher hard one, they raise the soft limit to the hard one.
//!
//! 300 idle sockets: more than the limit, fewer than the limit plus the listener's
//! backlog (128), so every one of them is established and waits to be accepted, as a
//! burst of real clients would. Before the clamp, the gateway with its default cap (1,024)
//! accepted until `EMFILE`, then the request waited behind the unaccepted sockets until
//! header timeouts freed descriptors (a GET timed out after 5 s, the next took 3.5 s).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod gateway;
mod server;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use gateway::Gateway;
use server::Server;

/// The limit the processes are started under.
const LIMIT: u64 = 256;
/// Idle sockets opened against them.
const IDLE: usize = 300;
/// How long a request past the idle sockets may take.
const PROMPT: Duration = Duration::from_secs(3);

/// Sends `request` on a new connection and reads the answer to the end (the request says
/// `Connection: close`); the answer and how long it took.
fn exchange(addr: SocketAddr, request: &[u8]) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, PROMPT).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(
        read.is_ok(),
        "{read:?} after {:?}; read: {text}",
        started.elapsed()
    );
    (text, started.elapsed())
}

/// With [`IDLE`] idle sockets open against `addr`, sends `request` three times, each on a
/// new connection that must be answered 200 within [`PROMPT`]; the answers.
fn answered_past_idle_sockets(addr: SocketAddr, request: &[u8]) -> Vec<String> {
    let idle = idle_sockets(addr, IDLE);
    let answers = (0..3)
        .map(|_| {
            let (got, took) = exchange(addr, request);
            assert!(got.starts_with("HTTP/1.1 200"), "{got}");
            assert!(
                took < PROMPT,
                "an answer past {IDLE} idle sockets took {took:?}"
            );
            got
        })
        .collect();
    drop(idle);
    answers
}

/// Opens `n` idle connections to `addr` (they send nothing).
fn idle_sockets(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

/// The soft and hard "Max open files" of process `pid`.
fn nofile_of(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// A hard limit above [`LIMIT`] that this process may give its children.
fn higher_hard_limit() -> u64 {
    let own = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = own.maximum.unwrap_or(u64::MAX).min(4096);
    assert!(
        hard >= 2 * LIMIT,
        "the test's own hard open-file limit ({hard}) is too low to test raising"
    );
    hard
}

fn clamp_lines(log: &str) -> usize {
    log.matches("max_connections lowered").count()
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// PUTs a small object, opens the idle sockets, then GETs it three times.
fn gateway_serves_gets_past_idle_sockets(g: &Gateway) {
    let addr = addr_of(&g.endpoint);
    let (put, _) = exchange(
        addr,
        b"PUT /fdb/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let get = b"GET /fdb/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for got in answered_past_idle_sockets(addr, get) {
        assert!(got.ends_with("hello"), "{got}");
    }
}

#[test]
fn a_gateway_that_cannot_raise_its_limit_clamps_its_cap_and_serves_gets_past_idle_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::start_unauthenticated_with_nofile(
        dir.path(),
        LIMIT,
        LIMIT,
        &["--create-bucket", "fdb"],
    );
    assert_eq!(nofile_of(g.pid()), (LIMIT, LIMIT));
    gateway_serves_gets_past_idle_sockets(&g);
    let log = g.stderr();
    assert_eq!(clamp_lines(&log), 1, "one warning for the clamp:\n{log}");
    // Accept failures, if any, are rate-limited: never one line per failure.
    let failures = log.matches("accept failed").count();
    assert!(failures <= 2, "{failures} accept-failure lines:\n{log}");
    g.signal(kvtier_testkit::Signal::TERM);
}

#[test]
fn a_gateway_raises_its_soft_limit_to_the_hard_one_and_keeps_its_cap() {
    let hard = higher_hard_limit();
    let dir = tempfile::tempdir().unwrap();
    let cap = (hard / 2).to_string();
    let mut g = Gateway::start_unauthenticated_with_nofile(
        dir.path(),
        LIMIT,
        hard,
        &["--create-bucket", "fdb", "--max-connections", &cap],
    );
    assert_eq!(
        nofile_of(g.pid()),
        (hard, hard),
        "the soft limit was not raised"
    );
    gateway_serves_gets_past_idle_sockets(&g);
    let log = g.stderr();
    assert_eq!(clamp_lines(&log), 0, "nothing to clamp:\n{log}");
    g.signal(kvtier_testkit::Signal::TERM);
}

#[test]
fn kvtier_serve_under_a_low_limit_clamps_its_cap_and_answers_past_idle_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_nofile(dir.path(), LIMIT, LIMIT, &[]);
    assert_eq!(nofile_of(server.pid()), (LIMIT, LIMIT));
    let addr = addr_of(&server.url);
    let health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for got in answered_past_idle_sockets(addr, health) {
        assert!(got.contains("\"status\":\"ok\""), "{got}");
    }
    let log = server.stderr();
    assert_eq!(clamp_lines(&log), 1, "one warning for the clamp:\n{log}");
    assert!(server.stop().success());
}

#[test]
fn kvtier_serve_raises_its_soft_limit_to_the_hard_one() {
    let hard = higher_hard_limit();
    let dir = tempfile::tempdir().unwrap();
    let cap = format!("max_connections={}", hard / 2);
    let server = Server::start_with_nofile(dir.path(), LIMIT, hard, &["--set", &cap]);
    assert_eq!(
        nofile_of(server.pid()),
        (hard, hard),
        "the soft limit was not raised"
    );
    let (got, _) = exchange(
        addr_of(&server.url),
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let log = server.stderr();
    assert_eq!(clamp_lines(&log), 0, "nothing to clamp:\n{log}");
    assert!(server.stop().success());
}
