//! The bulk lane: a connection whose first request the front end calls bulk is served on
//! the lane's threads, at the priority asked for (the kernel's idle policy or a `nice`
//! value, read back from the kernel); every other connection on the accepting runtime's
//! threads, at theirs.

#![allow(clippy::unwrap_used, reason = "test code")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use kvtier_listen::http::{BodyDeadline, Handler, LanePriority, Lanes, ListenSettings, TimedBody};
use kvtier_listen::refusals::{INTERVAL, Refusals};

/// Answers every request with the name and priority of the thread that served it, and the
/// priority of the blocking pool's thread it handed work to.
#[derive(Clone)]
struct WhoServes;

impl Handler for WhoServes {
    type Body = Full<Bytes>;

    fn call(
        &self,
        _request: http::Request<TimedBody>,
        _peer: SocketAddr,
    ) -> impl Future<Output = http::Response<Full<Bytes>>> + Send + use<> {
        async move {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            let blocking = kvtier_listen::http::spawn_blocking(this_thread_priority)
                .await
                .unwrap();
            let answer = format!("{thread} {} {blocking}", this_thread_priority());
            http::Response::new(Full::new(Bytes::from(answer)))
        }
    }

    fn is_bulk(&self, head: &[u8]) -> bool {
        head.starts_with(b"POST /bulk")
    }
}

/// The calling thread's priority as the kernel reports it: `idle` under `SCHED_IDLE`,
/// else `nice=N`.
fn this_thread_priority() -> String {
    let t = kvtier_testkit::thread_sched(std::path::Path::new("/proc/thread-self/stat")).unwrap();
    if t.policy == kvtier_testkit::SCHED_IDLE {
        "idle".to_string()
    } else {
        assert_eq!(
            t.policy,
            kvtier_testkit::SCHED_OTHER,
            "a request thread under an unexpected policy"
        );
        format!("nice={}", t.nice)
    }
}

fn limits() -> ListenSettings {
    ListenSettings {
        max_connections: 16,
        header_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        body_deadline: BodyDeadline::Whole,
        idle_timeout: Duration::from_secs(5),
    }
}

/// Sends `paths` in order on one connection; the body of each answer.
fn ask(addr: SocketAddr, paths: &[&str]) -> Vec<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    paths
        .iter()
        .map(|path| {
            write!(
                s,
                "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"
            )
            .unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the server closed the connection");
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    if body.len() >= len {
                        return body[..len].to_string();
                    }
                }
            }
        })
        .collect()
}

/// Serves `WhoServes` through `lanes` on a runtime of two request threads named `small`,
/// runs `check` against it, then stops.
fn with_server(lanes: Lanes, check: impl FnOnce(SocketAddr)) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("small")
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let refusals = std::sync::Arc::new(Refusals::new(INTERVAL));
    let served = rt.spawn(async move {
        kvtier_listen::http::serve(listener, WhoServes, limits(), &lanes, refusals, stopping).await;
    });
    check(addr);
    stop.send(true).unwrap();
    rt.block_on(served).unwrap();
}

/// The `nice` value this test runs at, which the request threads inherit.
fn base() -> i32 {
    rustix::process::getpriority_process(None).unwrap()
}

/// A request served on the request threads: they and the blocking pool at the base.
fn small() -> String {
    format!("small nice={} nice={}", base(), base())
}

/// A request served on the bulk lane at `lane` (as [`this_thread_priority`] writes it);
/// the work it hands to the blocking pool (the engine's, which takes its locks) at the
/// base priority.
fn bulk(lane: &str) -> String {
    format!("kvtier-bulk {lane} nice={}", base())
}

#[test]
fn bulk_connections_are_served_on_the_lower_priority_lane_and_the_rest_are_not() {
    lanes_serve_in_their_places(LanePriority::Nice(19), &bulk("nice=19"));
}

#[test]
fn an_idle_lane_runs_under_the_kernels_idle_policy() {
    lanes_serve_in_their_places(LanePriority::Idle, &bulk("idle"));
}

/// A lane at `priority` serves bulk connections, answering `bulk`; the rest are served on
/// the request threads at the base priority.
fn lanes_serve_in_their_places(priority: LanePriority, bulk: &str) {
    let small = small();
    let bulk = bulk.to_string();
    with_server(Lanes::with_bulk(1, priority).unwrap(), |addr| {
        assert_eq!(
            ask(addr, &["/bulk", "/small"]),
            [bulk.clone(), bulk.clone()],
            "a bulk connection is served on the bulk lane, its later requests too"
        );
        assert_eq!(
            ask(addr, &["/small", "/bulk"]),
            [small.clone(), small.clone()],
            "a connection that began small stays on the request threads"
        );
        // Several at once: each on its own lane.
        let many: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    let path = if i % 2 == 0 { "/bulk" } else { "/small" };
                    (path, ask(addr, &[path]))
                })
            })
            .collect();
        for h in many {
            let (path, got) = h.join().unwrap();
            let want = if path == "/bulk" {
                bulk.as_str()
            } else {
                small.as_str()
            };
            assert_eq!(got, [want], "{path}");
        }
    });
}

#[test]
fn with_one_lane_every_connection_is_served_on_the_request_threads() {
    with_server(Lanes::one(), |addr| {
        assert_eq!(ask(addr, &["/bulk"]), [small()]);
    });
}
