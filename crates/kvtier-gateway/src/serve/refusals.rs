//! Logging refused requests without letting clients flood the log.
//!
//! A refused request (bad signature, unknown key, a malformed request: any 4xx but the
//! ordinary outcomes 404 and 304/412) is the client's problem, not the server's: it is
//! logged at WARN, at most once per interval, with the number suppressed since the last
//! line. s3s's own per-error ERROR lines are filtered out by the gateway's log filter
//! (`kvtier gateway` sets `s3s=off` unless `RUST_LOG` says otherwise); server errors
//! (5xx) are logged at ERROR where they arise.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// See the module docs.
#[derive(Debug)]
pub struct Refusals {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl Refusals {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// Whether a response with `status` counts as a refusal.
    pub fn is_refusal(status: u16) -> bool {
        (400..500).contains(&status) && !matches!(status, 404 | 409 | 412 | 416)
    }

    /// Notes a refusal; returns the number of refusals the logged line stands for, when
    /// this one is logged (`None`: suppressed).
    pub fn note(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        match s.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                s.suppressed += 1;
                None
            }
            _ => {
                s.last = Some(now);
                let n = s.suppressed + 1;
                s.suppressed = 0;
                Some(n)
            }
        }
    }

    /// Notes and, when due, logs a refusal.
    pub fn log(&self, status: u16, method: &str, path: &str, peer: &str) {
        if let Some(n) = self.note(Instant::now()) {
            tracing::warn!(
                status,
                method,
                path,
                peer,
                refusals_since_last_line = n,
                "refused request (one line per interval at most)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_carries_the_suppressed_count() {
        let r = Refusals::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.note(t0), Some(1));
        for i in 1..=99 {
            assert_eq!(r.note(t0 + Duration::from_millis(i * 50)), None);
        }
        assert_eq!(r.note(t0 + Duration::from_secs(11)), Some(100));
        assert!(Refusals::is_refusal(403));
        assert!(!Refusals::is_refusal(404));
        assert!(!Refusals::is_refusal(200));
        assert!(!Refusals::is_refusal(500));
    }
}
