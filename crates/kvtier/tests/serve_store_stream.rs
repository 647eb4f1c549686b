//! Stores are read as they arrive, straight into the blocks' buffers: whatever way the
//! bytes are cut on the wire, the stored blocks are exactly the bytes sent, and an answer
//! given before the body ended still reaches the client.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kvtier_client::ClientError;
use kvtier_client::wire::frame;

use server::{Server, layout_spec, load_all, payloads, prompt, runtime};

/// An upload body: the frame, the JSON head, the payloads.
fn upload(head: &kvtier_client::wire::PromptSpec, payloads: &[bytes::Bytes]) -> Vec<u8> {
    let json = serde_json::to_vec(head).unwrap();
    let mut body = frame::upload_head(json.len() as u32).to_vec();
    body.extend_from_slice(&json);
    for p in payloads {
        body.extend_from_slice(p);
    }
    body
}

/// Sends `body` to `path` in pieces of the given sizes (cycled), pausing after each of
/// the first pieces so they reach the server as separate reads; returns the answer.
fn post_in_pieces(addr: &str, path: &str, body: &[u8], pieces: &[usize]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut at = 0;
    for (n, size) in pieces.iter().cycle().enumerate() {
        if at == body.len() {
            break;
        }
        let end = (at + size).min(body.len());
        s.write_all(&body[at..end]).unwrap();
        at = end;
        if n < 40 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn an_upload_cut_anywhere_on_the_wire_stores_exactly_the_bytes_sent() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let addr = server.url.trim_start_matches("http://").to_string();
    rt.block_on(async {
        let layout = c.register_layout(&layout_spec("stream", 2)).await.unwrap();
        // Pieces that split the 12-byte frame, the JSON head and the blocks at odd places,
        // and pieces larger than a block.
        for (seed, pieces) in [
            (1u32, vec![1usize, 5, 3, 7]),
            (2, vec![13, 1021, 4099]),
            (3, vec![70_001]),
        ] {
            let p = prompt(&layout, seed, 5);
            let sent = payloads(&layout, seed, 5);
            let body = upload(&p.compact(), &sent);
            let answer = post_in_pieces(&addr, "/v1/store", &body, &pieces);
            assert!(
                answer.starts_with("HTTP/1.1 200"),
                "pieces {pieces:?}: {answer}"
            );
            assert!(answer.contains("\"stored\":5"), "{answer}");
            let hit = c.lookup(&p).await.unwrap();
            assert_eq!(hit.blocks(), 5);
            let got = load_all(&c, &layout, &hit).await;
            assert_eq!(got.blocks, sent, "pieces {pieces:?}");
        }
        // The raw form reads its body the same way.
        let p = prompt(&layout, 4, 3);
        let sent = payloads(&layout, 4, 3);
        let raw: Vec<u8> = sent.iter().flat_map(|b| b.iter().copied()).collect();
        let tokens: Vec<String> = p.tokens.iter().map(u32::to_string).collect();
        let path = format!(
            "/v1/store/raw?layout={}&tokens={}",
            layout.layout,
            tokens.join(",")
        );
        let answer = post_in_pieces(&addr, &path, &raw, &[3, 999, 50_000]);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let got = load_all(&c, &layout, &c.lookup(&p).await.unwrap()).await;
        assert_eq!(got.blocks, sent);
    });
    assert!(server.stop().success());
}

#[test]
fn a_store_refused_after_its_head_is_answered_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let server = Server::start(dir.path(), &["--set", "max_body=8MiB"]);
    let c = server.client();
    rt.block_on(async {
        let layout = c.register_layout(&layout_spec("early", 32)).await.unwrap();
        // 4 MiB (16 blocks of 256 KiB) for a layout nobody registered: refused as soon
        // as the head is read, while most of the body is still on its way.
        let mut p = prompt(&layout, 1, 16);
        p.layout = "00".repeat(16);
        let sent = payloads(&layout, 1, 16);
        for round in 0..5 {
            match c.store(&p, sent.clone()).await {
                Err(ClientError::Api { status, code, .. }) => {
                    assert_eq!(
                        (status, code.as_str()),
                        (404, "unknown_layout"),
                        "round {round}"
                    );
                }
                other => panic!("round {round}: expected 404 unknown_layout, got {other:?}"),
            }
        }
        // A body over the limit, announced by its length: 413, as an answer.
        let p = prompt(&layout, 2, 48);
        let big = payloads(&layout, 2, 48);
        match c.store(&p, big).await {
            Err(ClientError::Api { status, code, .. }) => {
                assert_eq!((status, code.as_str()), (413, "body_too_large"));
            }
            other => panic!("expected 413, got {other:?}"),
        }
        // A payload cut short by the client: nothing of it is kept.
        let p = prompt(&layout, 3, 2);
        let body = upload(&p.compact(), &payloads(&layout, 3, 2));
        let addr = server.url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(
            format!(
                "POST /v1/store HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        s.write_all(&body[..body.len() - 1000]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
        assert_eq!(c.lookup(&p).await.unwrap().matched_tokens, 0);
    });
    assert!(server.stop().success());
}
