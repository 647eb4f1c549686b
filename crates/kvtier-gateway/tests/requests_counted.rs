//! The gateway's counters as one list of samples (`RunningGateway::samples`): requests,
//! GETs with data, ranged ones, bytes sent, and refusals by kind, each under the flat name
//! and family its table declares, counted as a real client's requests arrive.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kvtier_core::stats::CounterKind;
use kvtier_gateway::{Auth, Counters, GatewayConfig, RunningGateway};

/// Sends one HTTP/1.1 request on a new connection and returns the status and the body.
fn send(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "{head}\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer head");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, answer[split + 4..].to_vec())
}

#[test]
fn every_request_lands_in_the_gateways_one_list_of_counters() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::new(dir.path().to_path_buf());
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.auth = Auth::None;
    config.create_buckets = vec!["counted".into()];
    let gateway = RunningGateway::start(config).unwrap();
    let addr = gateway.addr;

    let object: Vec<u8> = (0..100u8).collect();
    assert_eq!(send(addr, "PUT /counted/k HTTP/1.1", &object).0, 200);
    let (status, whole) = send(addr, "GET /counted/k HTTP/1.1", &[]);
    assert_eq!((status, whole), (200, object.clone()));
    let (status, part) = send(addr, "GET /counted/k HTTP/1.1\r\nRange: bytes=10-19", &[]);
    assert_eq!((status, part.as_slice()), (206, &object[10..20]));
    // A body that does not match its digest: the client's mistake, counted as a refusal.
    let (status, _) = send(
        addr,
        "PUT /counted/other HTTP/1.1\r\nContent-MD5: AAAAAAAAAAAAAAAAAAAAAA==",
        &object,
    );
    assert_eq!(status, 400);

    let samples = gateway.samples();
    let flat = samples.flat();
    assert_eq!(flat["gateway_requests"], 4, "{flat:?}");
    assert_eq!(flat["gateway_gets"], 2, "{flat:?}");
    assert_eq!(flat["gateway_ranged_gets"], 1, "{flat:?}");
    assert_eq!(flat["gateway_sent_bytes"], 110, "{flat:?}");
    assert_eq!(flat["refused_s3_request"], 1, "{flat:?}");
    assert_eq!(flat.len(), Counters::COUNTERS.len() + 1, "{flat:?}");
    // The accessor tests use reads the same counters.
    assert_eq!(gateway.counters().snapshot(), (2, 1, 110, 4));
    // Every one counts up: typed as a counter, under the family its table names.
    for s in samples.iter() {
        assert_eq!(s.kind, CounterKind::Counter, "{}", s.name);
    }
    let families: Vec<&str> = samples.iter().map(|s| s.family).collect();
    assert_eq!(
        families,
        [
            "gateway_requests",
            "gateway_gets",
            "gateway_ranged_gets",
            "gateway_sent_bytes",
            "gateway_compaction_segments_removed",
            "gateway_compaction_bytes_reclaimed",
            "gateway_compaction_records_moved",
            "refused"
        ]
    );
    gateway.stop();
}
