//! How long a call may take before it is an error.
//!
//! A cache is an optimisation: an engine that waits on a stalled server (stopped,
//! swapping, behind a partition) does worse than one that computes cold. So every call
//! has a deadline, and past it the call fails with [`crate::ClientError::Deadline`] (an
//! `Unavailable` error: the caller treats it as a miss). The connection it was using is
//! closed, never reused with an answer half read.

use std::time::Duration;

/// The deadlines of a [`crate::Client`]'s calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Opening a connection (a host that drops packets answers nothing at all).
    pub connect: Duration,
    /// A small call, answered from the server's memory: a lookup, registering a layout,
    /// stats, health, metrics.
    pub request: Duration,
    /// A call that moves blocks or waits on the disk: a load, a store, a restore, a
    /// snapshot or checkpoint, deleting a layout, the admin calls (a flush waits until
    /// the SSD has written everything queued).
    pub transfer: Duration,
}

impl Deadlines {
    /// Connect 2 s, request 5 s, transfer 60 s: a healthy server answers a lookup in well
    /// under a millisecond and moves a GiB in about a second, so these fire only on a
    /// server that is not answering, not on a busy one.
    pub const DEFAULT: Self = Self {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(5),
        transfer: Duration::from_secs(60),
    };
}

impl Default for Deadlines {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use std::time::Instant;

    use super::*;
    use crate::wire::{LayoutSpec, PromptSpec};
    use crate::{Client, ClientError};

    /// A server that accepts connections and never answers (a stopped process's socket
    /// behaves the same: the kernel accepts, nobody reads).
    async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        (url, task)
    }

    #[tokio::test]
    async fn every_kind_of_call_fails_at_its_deadline_on_a_silent_server() {
        let (url, task) = silent_server().await;
        let d = Deadlines {
            connect: Duration::from_secs(2),
            request: Duration::from_millis(200),
            transfer: Duration::from_millis(400),
        };
        let c = Client::with_deadlines(&url, d).unwrap();
        assert_eq!(c.deadlines(), d);
        let prompt = PromptSpec::new("0".repeat(64), vec![1, 2, 3]);

        let t = Instant::now();
        let e = c.lookup(&prompt).await.unwrap_err();
        let took = t.elapsed();
        assert!(
            matches!(&e, ClientError::Deadline { what, after } if what == "/v1/lookup" && *after == d.request),
            "{e}"
        );
        assert!(e.is_retryable());
        assert!(took >= d.request && took < d.request * 10, "{took:?}");

        let t = Instant::now();
        let e = c
            .store(&prompt, vec![bytes::Bytes::from_static(b"x")])
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Deadline { .. }), "{e}");
        assert!(t.elapsed() >= d.transfer, "{:?}", t.elapsed());

        // The calls over reqwest (a layout, stats) are bounded by the request deadline too.
        let t = Instant::now();
        let spec = LayoutSpec::of_key(
            &kvtier_core::LayoutKey::new("m", kvtier_core::KvDtype::F16, 16, 1, 1, 8),
            None,
        );
        let e = c.register_layout(&spec).await.unwrap_err();
        assert!(
            matches!(&e, ClientError::Transport(t) if t.is_timeout()),
            "{e}"
        );
        assert_eq!(e.kind(), kvtier_core::ErrorKind::Unavailable);
        assert!(t.elapsed() < d.request * 10, "{:?}", t.elapsed());
        task.abort();
    }
}
