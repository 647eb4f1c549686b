//! Closing a connection after an answer without losing the answer.
//!
//! A server that answers before it has read the whole request — 431 for a head over
//! [`MAX_HEAD`](crate::MAX_HEAD), 413 for a body over the limit, 408 for a body that
//! stalled — and then closes its socket with the rest of the request unread makes the
//! kernel send a reset instead of a FIN. The reset reaches the client's kernel, which
//! throws away whatever the client has not read yet — the answer — and the client sees
//! "connection reset" instead of a status. [`close`] closes the way web servers call
//! "lingering close": send a FIN after the answer (the client reads it whole, then the end
//! of the stream), then read and discard what the client still sends until it closes its
//! side, for at most a bounded time, and only then close the socket.

use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

/// The longest a closing connection's remaining input is read and discarded: enough for a
/// client on a loopback or LAN link to read its answer and close; short enough that
/// lingering connections cannot pile up (the connection cap still counts them, and
/// eviction cuts a linger short).
pub const LINGER: Duration = Duration::from_secs(2);

/// Closes `tcp` after its last answer has been written: shuts down the sending side, then
/// discards input until the client closes its side, `within` passes, or `cancel`
/// completes (the connection cap wants the descriptor), whichever comes first.
pub async fn close(mut tcp: TcpStream, within: Duration, cancel: impl Future<Output = ()>) {
    if std::future::poll_fn(|cx| Pin::new(&mut tcp).poll_shutdown(cx))
        .await
        .is_err()
    {
        return;
    }
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if tcp.readable().await.is_err() {
                return;
            }
            match tcp.try_read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(within, drain) => {}
        () = cancel => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::io::{Read, Write};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn pair() -> (std::net::TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn an_answer_given_before_the_request_was_read_reaches_the_client() {
        let (mut client, mut server) = pair().await;
        // The client sends 4 MiB the server never reads, then reads its answer.
        let reader = std::thread::spawn(move || {
            let sent = client.write_all(&vec![b'x'; 4 << 20]);
            let mut got = Vec::new();
            let read = client.read_to_end(&mut got);
            (sent.is_ok(), read.map(|_| got))
        });
        let mut head = [0u8; 16];
        server.read_exact(&mut head).await.unwrap();
        server.write_all(b"HTTP/1.1 431 \r\n\r\n").await.unwrap();
        let started = Instant::now();
        close(server, LINGER, std::future::pending()).await;
        let (sent, got) = tokio::task::spawn_blocking(move || reader.join().unwrap())
            .await
            .unwrap();
        assert!(sent, "the client's request was cut off");
        assert_eq!(got.unwrap(), b"HTTP/1.1 431 \r\n\r\n");
        assert!(started.elapsed() < LINGER, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_client_that_never_closes_is_let_go_after_the_bound_or_at_once_when_evicted() {
        let (client, server) = pair().await;
        let started = Instant::now();
        close(server, Duration::from_millis(200), std::future::pending()).await;
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(2));
        drop(client);

        let (client, server) = pair().await;
        let started = Instant::now();
        close(server, LINGER, std::future::ready(())).await;
        assert!(started.elapsed() < Duration::from_millis(500));
        drop(client);
    }
}
