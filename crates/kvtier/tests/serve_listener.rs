//! `kvtier serve`'s listener bounds, against a real server process: an idle client, a
//! slow-header client and a slow-body client are each disconnected within their bound
//! (and not before the bound that applies to them); hundreds of idle sockets over the
//! connection cap do not lock a legitimate client out; when every connection is busy a
//! new one is closed at once instead of waiting; an oversized request head is answered
//! 431, and a body over `max_body` 413 however it is framed — each answer read by the
//! client, not lost to a connection reset. And (`listener/store_priority.rs`) the
//! threads that read store bodies run at the priority the settings name.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

#[path = "listener/store_priority.rs"]
mod store_priority;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use server::{Server, runtime};

fn addr(server: &Server) -> SocketAddr {
    server.url.strip_prefix("http://").unwrap().parse().unwrap()
}

/// What a read on a connection saw.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Open,
    Closed,
    Bytes(Vec<u8>),
}

fn poll(s: &mut TcpStream, wait: Duration) -> Seen {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(0) => Seen::Closed,
        Ok(n) => Seen::Bytes(buf[..n].to_vec()),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Seen::Open,
        Err(_) => Seen::Closed,
    }
}

/// Reads until the server closes the connection (at most `limit`); returns what was
/// read and when the close came, or None if it stayed open.
fn until_closed(s: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Instant)> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        match poll(s, Duration::from_millis(50)) {
            Seen::Open => {}
            Seen::Closed => return Some((got, Instant::now())),
            Seen::Bytes(b) => got.extend(b),
        }
    }
    None
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[test]
fn idle_and_slow_header_clients_are_closed_by_their_own_timer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--set", "idle_timeout=1s", "--set", "header_timeout=3s"],
    );
    let a = addr(&server);

    // Connects and sends nothing: the idle timer (1 s).
    let start = Instant::now();
    let mut idle = TcpStream::connect(a).unwrap();
    let (_, at) = until_closed(&mut idle, Duration::from_secs(10)).expect("idle client closed");
    let took = at - start;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "idle connection closed after {:.2} s, expected about 1 s",
        secs(took)
    );

    // Sends a head one byte every 200 ms: past the idle timeout, the header timer
    // (3 s from the first byte) closes it.
    let head =
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut slow = TcpStream::connect(a).unwrap();
    let first = Instant::now();
    let mut closed_at = None;
    for b in head {
        if slow.write_all(&[*b]).is_err() {
            closed_at = Some(Instant::now());
            break;
        }
        if poll(&mut slow, Duration::from_millis(200)) == Seen::Closed {
            closed_at = Some(Instant::now());
            break;
        }
    }
    let took = closed_at.expect("the slow head was still being accepted after 17 s") - first;
    assert!(
        took >= Duration::from_millis(2800) && took < Duration::from_secs(5),
        "slow-header connection closed after {:.2} s, expected about 3 s",
        secs(took)
    );

    // A kept-alive connection after its answer: idle again, closed after 1 s.
    let mut kept = TcpStream::connect(a).unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let answered = Instant::now();
    let (got, at) = until_closed(&mut kept, Duration::from_secs(10)).expect("kept-alive closed");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let took = at - answered;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "kept-alive connection closed {:.2} s after its answer, expected about 1 s",
        secs(took)
    );
    assert!(server.stop().success());
}

#[test]
fn a_slow_body_is_refused_with_408_at_the_body_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--set", "body_timeout=2s", "--set", "idle_timeout=1s"],
    );
    let mut s = TcpStream::connect(addr(&server)).unwrap();
    s.write_all(
        b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    )
    .unwrap();
    let start = Instant::now();
    // One byte every 200 ms for 1.6 s, then nothing: 991 bytes short. The idle timeout
    // (1 s) must not close it — a request is in progress — the body timeout (2 s) must.
    // (The trickle stops before the deadline so that the server's close finds no unread
    // bytes and sends FIN, not RST, which could discard the answer before it is read.)
    for _ in 0..8 {
        s.write_all(b" ").unwrap();
        assert_eq!(poll(&mut s, Duration::from_millis(200)), Seen::Open);
    }
    let (got, at) = until_closed(&mut s, Duration::from_secs(5)).expect("closed after a 408");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_timeout\""), "{text}");
    let took = at - start;
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(5),
        "slow body refused after {:.2} s, expected about 2 s",
        secs(took)
    );
    assert!(server.stop().success());
}

#[test]
fn hundreds_of_idle_sockets_over_the_cap_do_not_lock_a_legitimate_client_out() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 32;
    // Long timers: only the cap can close these sockets within the test.
    let server = Server::start(
        dir.path(),
        &[
            "--set",
            "max_connections=32",
            "--set",
            "idle_timeout=5m",
            "--set",
            "header_timeout=5m",
        ],
    );
    let a = addr(&server);
    let mut idle: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(a).unwrap()).collect();
    // Half of them start a head and stall, as slowloris does.
    for s in idle.iter_mut().step_by(2) {
        s.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    }

    let rt = runtime();
    let started = Instant::now();
    rt.block_on(async {
        let c = server.client();
        assert_eq!(c.health().await.unwrap().status, "ok");
        let layout = c
            .register_layout(&server::layout_spec("capped", 1))
            .await
            .unwrap();
        assert_eq!(layout.layout.len(), 32);
    });
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a legitimate client took {:.2} s",
        secs(started.elapsed())
    );

    // The server keeps at most `cap` connections: the rest of the idle ones were closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut closed = vec![false; idle.len()];
    while Instant::now() < deadline && closed.iter().filter(|c| !**c).count() > cap {
        for (s, c) in idle.iter_mut().zip(closed.iter_mut()) {
            if !*c && poll(s, Duration::from_millis(1)) == Seen::Closed {
                *c = true;
            }
        }
    }
    let open = closed.iter().filter(|c| !**c).count();
    assert!(
        open <= cap,
        "{open} of 300 idle sockets still open with a cap of {cap}"
    );
    drop(idle);
    assert!(server.stop().success());
}

#[test]
fn when_every_connection_is_busy_a_new_one_is_closed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--set", "max_connections=3", "--set", "body_timeout=30s"],
    );
    let a = addr(&server);
    // Three requests in progress: heads sent, bodies pending.
    let mut busy: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(a).unwrap();
            s.write_all(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
                .unwrap();
            s
        })
        .collect();
    // Let the server read the three heads.
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let mut extra = TcpStream::connect(a).unwrap();
    let _ = extra.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let (got, at) = until_closed(&mut extra, Duration::from_secs(5)).expect("refused at once");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        at - start < Duration::from_secs(1),
        "took {:.2} s",
        secs(at - start)
    );

    // The busy ones are served as normal once their bodies arrive: no request lost.
    for s in &mut busy {
        // The other 9 bytes of the announced 10.
        s.write_all(b"\"x\":1}   ").unwrap();
    }
    for s in &mut busy {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && Instant::now() < deadline {
            if let Seen::Bytes(b) = poll(s, Duration::from_millis(50)) {
                got.extend(b);
            }
        }
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 400"),
            "an answer to the busy request: {text}"
        );
    }
    // With the slots free again, a new connection is served.
    let rt = runtime();
    rt.block_on(async {
        let c = server.client();
        assert_eq!(c.health().await.unwrap().status, "ok");
        let metrics = c.metrics().await.unwrap();
        let series = "kvtier_refused_total{kind=\"connection_cap\"} 1";
        assert!(
            metrics.contains(series),
            "missing `{series}` in:\n{metrics}"
        );
    });
    drop(busy);
    assert!(server.stop().success());
}

/// Sends `request` from a second thread (the server may answer before reading it all) and
/// reads on this one until the server closes the connection; what was read.
fn answer_to(addr: SocketAddr, request: Vec<u8>) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut writer = s.try_clone().unwrap();
    let sending = std::thread::spawn(move || writer.write_all(&request).is_ok());
    let (got, _) = until_closed(&mut s, Duration::from_secs(10)).expect("the server closed");
    let _ = sending.join();
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn an_oversized_request_head_is_answered_431() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let a = addr(&server);
    // One 200 KiB header.
    let mut big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 200 << 10));
    big.extend_from_slice(b"\r\n\r\n");
    // 200 headers of 1 KiB.
    let mut many = b"GET /health HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..200 {
        many.extend(format!("X-H{i}: {}\r\n", "a".repeat(1000)).into_bytes());
    }
    many.extend_from_slice(b"\r\n");
    for (what, request) in [("one 200 KiB header", big), ("200 headers of 1 KiB", many)] {
        let got = answer_to(a, request);
        assert!(
            got.starts_with("HTTP/1.1 431"),
            "{what}: {}",
            &got[..got.len().min(300)]
        );
    }
    // A head just under the limit (64 KiB) is served.
    let mut fits = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ".to_vec();
    fits.extend(std::iter::repeat_n(b'a', 60 << 10));
    fits.extend_from_slice(b"\r\n\r\n");
    let got = answer_to(a, fits);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(server.stop().success());
}

/// `body` as one chunk of HTTP/1.1 chunked encoding per 64 KiB, and the last chunk.
fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in body.chunks(64 << 10) {
        out.extend(format!("{:x}\r\n", piece.len()).into_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[test]
fn a_body_over_max_body_is_answered_413_however_it_is_framed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--set", "max_body=1MiB"]);
    let a = addr(&server);
    // 2 MiB that are not an upload: a store refuses them at their first bytes (no `KVTU`
    // head) — yet the answer must be the one a Content-Length of 2 MiB gets at once. The
    // raw store's query names no layout: refused before the body is read, the same way.
    let body = vec![b'x'; 2 << 20];
    for path in [
        "/v1/store",
        "/v1/store/raw?layout=00000000000000000000000000000000&tokens=1,2",
        "/v1/store/raw?tokens=1",
        "/v1/lookup",
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        );
        let mut with_length = format!("{head}Content-Length: {}\r\n\r\n", body.len()).into_bytes();
        with_length.extend_from_slice(&body);
        let mut with_chunks = format!("{head}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
        with_chunks.extend(chunked(&body));
        for (framing, request) in [("Content-Length", with_length), ("chunked", with_chunks)] {
            let got = answer_to(a, request);
            assert!(
                got.starts_with("HTTP/1.1 413"),
                "{path}, {framing}: {}",
                &got[..got.len().min(300)]
            );
            assert!(
                got.contains("\"code\":\"body_too_large\""),
                "{path}, {framing}: {got}"
            );
        }
    }
    // Under the limit, the same refusal stays what it is.
    let small = b"POST /v1/store HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nxxxx\r\n0\r\n\r\n";
    let got = answer_to(a, small.to_vec());
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    assert!(got.contains("bad_upload"), "{got}");
    assert!(server.stop().success());
}

/// The SIGTERM handler is in place before the server says it listens: a SIGTERM sent the
/// moment that line appears is a clean stop (exit 0, the shutdown recorded), not a kill.
#[test]
fn a_sigterm_the_moment_the_server_listens_stops_it_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let server = Server::start(dir.path(), &[]);
        let status = server.stop();
        assert!(status.success(), "round {round}: {status:?}");
    }
    let server = Server::start(dir.path(), &[]);
    let health = runtime().block_on(server.client().health()).unwrap();
    assert_eq!(health.previous_shutdown_clean, Some(true));
    assert!(server.stop().success());
}
