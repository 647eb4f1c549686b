//! `kvtier gateway` as a real process: S3 semantics clients rely on (conditional requests,
//! listings with control characters, retried completion, ignored Range headers, refusals),
//! deletes that stay deleted across a clean stop and a kill -9, and the listener's bounds
//! (idle, slow-header and slow-body clients, 1,100 idle sockets, memory of a big PUT, an
//! oversized head, a refusal given before the body was read).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use gateway::{ACCESS, Gateway, SECRET, assert_ok};

fn python(endpoint: &str, mode: &str) -> Output {
    gateway::python("s3_semantics.py", endpoint, SECRET, mode, &[])
}

#[test]
fn conditions_listings_retried_completion_ranges_and_refusals_behave_as_in_s3() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(dir.path(), &[]);
    assert_ok(&python(&g.endpoint, "semantics"), "the semantics checks");
}

#[test]
fn deleted_objects_and_buckets_stay_deleted_after_a_clean_stop_and_a_kill_9() {
    for signal in [rustix::process::Signal::TERM, rustix::process::Signal::KILL] {
        let dir = tempfile::tempdir().unwrap();
        let mut g = Gateway::start(dir.path(), &[]);
        assert_ok(&python(&g.endpoint, "deleted"), "delete before restart");
        g.signal(signal);
        let g = Gateway::start(dir.path(), &[]);
        assert_ok(
            &python(&g.endpoint, "deletedc"),
            &format!("after a restart ({signal:?})"),
        );
    }
}

/// The status of a plain unsigned GET / on a new connection (403: the gateway answered).
fn probe(endpoint: &str) -> Option<u16> {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Whether the server closes `s` within `within` (reads return 0 or fail).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false;
            }
            Err(_) => return true,
        }
        if started.elapsed() > within {
            return false;
        }
    }
}

#[test]
fn idle_slow_header_and_slow_body_clients_are_cut_off_and_idle_sockets_lock_nobody_out() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(
        dir.path(),
        &[
            "--header-timeout",
            "1s",
            "--body-timeout",
            "1s",
            "--idle-timeout",
            "2s",
            "--max-connections",
            "1000",
        ],
    );
    let addr = g.endpoint.trim_start_matches("http://").to_owned();
    // A client that connects and sends nothing.
    let mut silent = TcpStream::connect(&addr).unwrap();
    // A client that sends its head one byte at a time, too slowly.
    let mut slow_head = TcpStream::connect(&addr).unwrap();
    slow_head.write_all(b"GET / HT").unwrap();
    // A client that promises a body and stops sending.
    let mut slow_body = TcpStream::connect(&addr).unwrap();
    write!(
        slow_body,
        "PUT /b/k HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 100\r\n\r\nabc"
    )
    .unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "silent client kept"
    );
    assert!(
        closed_within(&mut slow_head, Duration::from_secs(5)),
        "slow header kept"
    );
    assert!(
        closed_within(&mut slow_body, Duration::from_secs(6)),
        "slow body kept"
    );
    // 1,100 idle sockets (over the cap) do not lock out a client with a request.
    let idle: Vec<TcpStream> = (0..1100)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert!(idle.len() >= 1050, "could open only {} sockets", idle.len());
    let started = Instant::now();
    for _ in 0..5 {
        assert_eq!(probe(&g.endpoint), Some(403), "the gateway did not answer");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
}

/// Sends `request` from a second thread (the gateway may answer before reading it all)
/// and reads until the gateway closes the connection: what was read, or the read error
/// (a reset that destroyed the answer).
fn answer_to(addr: &str, request: Vec<u8>) -> Result<String, std::io::Error> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut writer = s.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(&request);
    });
    let mut got = Vec::new();
    let read = s.read_to_end(&mut got);
    sending.join().unwrap();
    read.map(|_| String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn an_oversized_head_is_answered_431_and_answers_given_before_the_body_are_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start_unauthenticated_with(dir.path(), &["--create-bucket", "big"]);
    let addr = g.endpoint.trim_start_matches("http://").to_owned();
    // A 200 KiB head (kvtier_listen::MAX_HEAD is 64 KiB): 431, as kvtier serve answers.
    let mut head = b"GET /big/k HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 200 << 10));
    head.extend_from_slice(b"\r\n\r\n");
    let got = answer_to(&addr, head).expect("the 431 was lost to a reset");
    assert!(
        got.starts_with("HTTP/1.1 431"),
        "{}",
        &got[..got.len().min(300)]
    );
    // A PUT announcing 2 GiB (over the largest object) is refused at once, with 8 MiB of
    // its body on the way: the refusal (S3's 400 EntityTooLarge) still reaches the client.
    let mut put = format!(
        "PUT /big/k HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        2u64 << 30
    )
    .into_bytes();
    put.extend(std::iter::repeat_n(b'x', 8 << 20));
    let got = answer_to(&addr, put).expect("the refusal was lost to a reset");
    assert!(
        got.starts_with("HTTP/1.1 400"),
        "{}",
        &got[..got.len().min(300)]
    );
    assert!(got.contains("<Code>EntityTooLarge</Code>"), "{got}");
    // The gateway goes on serving.
    assert_eq!(probe(&g.endpoint), Some(200));
}

fn rss_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_256_mib_put_is_streamed_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(&dir.path().join("s"), &["--create-bucket", "big"]);
    let file: PathBuf = dir.path().join("big.bin");
    let data: Vec<u8> = (0..256u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    drop(data);
    let before = rss_hwm_kib(g.pid());
    let out = Command::new("aws")
        .args([
            "--endpoint-url",
            &g.endpoint,
            "s3api",
            "put-object",
            "--bucket",
            "big",
            "--key",
            "k",
        ])
        .arg("--body")
        .arg(&file)
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .expect("aws (scripts/setup.sh installs awscli)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grew_mib = (rss_hwm_kib(g.pid()) - before) / 1024;
    // Buffering the body would take at least 256 MiB; streaming takes a few batches.
    assert!(
        grew_mib < 64,
        "peak RSS grew by {grew_mib} MiB during a 256 MiB PUT"
    );
}

/// Signals are watched before the gateway says it listens: a SIGTERM sent the moment that
/// line appears is a clean stop (exit 0), not the default action's exit.
#[test]
fn a_sigterm_the_moment_the_gateway_listens_stops_it_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let mut g = Gateway::start(dir.path(), &[]);
        let status = g.terminate();
        assert!(status.success(), "round {round}: {status:?}");
    }
}
