//! The client against a server that misbehaves: load streams cut off, garbage frames, a
//! stream longer than the caller's buffer. Each is an error, never silently short data.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use kvtier_client::wire::LoadRequest;
use kvtier_client::wire::frame::{self, EndStatus};
use kvtier_client::{Client, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `body` once, as a 200 answer with `content-length: declared`.
async fn serve_once(body: Vec<u8>, declared: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let _ = s.read(&mut buf).await;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {declared}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(&body).await;
        let _ = s.shutdown().await;
    });
    format!("http://{addr}")
}

/// Serves `body` once in chunked encoding, `piece` bytes per chunk; `finish` sends the
/// last (empty) chunk.
async fn serve_chunked(body: Vec<u8>, piece: usize, finish: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let _ = s.read(&mut buf).await;
        let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for c in body.chunks(piece) {
            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        if finish {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        let _ = s.write_all(&out).await;
        let _ = s.shutdown().await;
    });
    format!("http://{addr}")
}

fn stream(blocks: &[&[u8]], status: EndStatus) -> Vec<u8> {
    let mut out = frame::stream_header(blocks.len() as u32).to_vec();
    for (i, b) in blocks.iter().enumerate() {
        out.extend_from_slice(&frame::block_header(i as u32, b.len() as u64, &[7; 16]));
        out.extend_from_slice(b);
    }
    out.extend_from_slice(&frame::end_frame(blocks.len() as u32, status));
    out
}

fn request() -> LoadRequest {
    LoadRequest {
        layout: "00".repeat(16),
        handles: String::new(),
        layers: None,
        chains: None,
    }
}

#[tokio::test]
async fn a_whole_stream_decodes() {
    let a = vec![1u8; 1000];
    let b = vec![2u8; 77];
    let body = stream(&[&a, &b], EndStatus::Lost);
    let url = serve_once(body.clone(), body.len()).await;
    let got = Client::new(&url).unwrap().load(&request()).await.unwrap();
    assert_eq!(got.status, EndStatus::Lost);
    assert_eq!(got.blocks, vec![a.clone(), b.clone()]);
    let url = serve_once(body.clone(), body.len()).await;
    let mut dst = vec![0u8; 1077];
    let (n, status) = Client::new(&url)
        .unwrap()
        .load_into(&request(), &mut dst)
        .await
        .unwrap();
    assert_eq!((n, status), (2, EndStatus::Lost));
    assert_eq!(&dst[..1000], &a[..]);
    assert_eq!(&dst[1000..], &b[..]);
}

#[tokio::test]
async fn a_stream_cut_off_is_an_error() {
    let a = vec![1u8; 1000];
    let body = stream(&[&a], EndStatus::Complete);
    for cut in [10, 40, 500, body.len() - frame::HEADER_LEN] {
        let url = serve_once(body[..cut].to_vec(), body.len()).await;
        let err = Client::new(&url)
            .unwrap()
            .load(&request())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Protocol(_)),
            "cut at {cut}: {err:?}"
        );
        // The same cut with an honest length: the end frame is missing.
        let url = serve_once(body[..cut].to_vec(), cut).await;
        let err = Client::new(&url)
            .unwrap()
            .load(&request())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Protocol(_)),
            "cut at {cut}: {err:?}"
        );
    }
}

#[tokio::test]
async fn garbage_and_overruns_are_refused() {
    let url = serve_once(vec![0u8; 64], 64).await;
    let err = Client::new(&url)
        .unwrap()
        .load(&request())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
    let a = vec![1u8; 100];
    let body = stream(&[&a, &a], EndStatus::Complete);
    let url = serve_once(body.clone(), body.len()).await;
    let mut dst = vec![0u8; 150];
    let err = Client::new(&url)
        .unwrap()
        .load_into(&request(), &mut dst)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
    assert_eq!(
        &dst[100..],
        &[0u8; 50][..],
        "nothing written past the first block"
    );
}

#[tokio::test]
async fn chunked_streams_decode_and_cut_chunked_streams_fail() {
    let a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let b = vec![9u8; 33];
    let body = stream(&[&a, &b], EndStatus::Complete);
    for piece in [1, 7, 32, 100, 4096, body.len()] {
        let url = serve_chunked(body.clone(), piece, true).await;
        let got = Client::new(&url).unwrap().load(&request()).await.unwrap();
        assert_eq!(got.status, EndStatus::Complete, "piece {piece}");
        assert_eq!(got.blocks, vec![a.clone(), b.clone()], "piece {piece}");
    }
    // Cut inside a block, and cut before the end frame.
    for cut in [100, body.len() - frame::HEADER_LEN] {
        let url = serve_chunked(body[..cut].to_vec(), 64, true).await;
        let err = Client::new(&url)
            .unwrap()
            .load(&request())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Protocol(_)),
            "cut at {cut}: {err:?}"
        );
    }
    // The whole stream, but the connection dies before the last (empty) chunk.
    let url = serve_chunked(body.clone(), 64, false).await;
    let got = Client::new(&url).unwrap().load(&request()).await;
    assert!(
        got.is_err(),
        "an HTTP body without its last chunk is a broken transfer"
    );
}
