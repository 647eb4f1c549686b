//! Logging refusals without flooding the log.
//!
//! A refused request — a malformed body, a wrong token or signature, a connection closed
//! for a timeout or for the connection cap — is the client's problem, not the server's,
//! and a misbehaving or hostile client can cause thousands a second. Each kind is
//! therefore logged at most once per interval (default [`INTERVAL`]), at `info`
//! (requests) or `warn` (connection limits an operator may want to raise), with the
//! number of the same kind left unlogged since the previous line, and every one is
//! counted by kind ([`Refusals::samples`]: what the front ends export). Nothing here logs
//! at `error`.
//! Both front ends use this: `kvtier serve` one per process, the gateway one per gateway
//! (its interval is a setting).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvtier_core::registry::{Sample, Samples};
use kvtier_core::stats::CounterKind;
use parking_lot::Mutex;

/// At most one line per kind in this period, unless told otherwise.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// How loud a kind of refusal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Ordinary client mistakes (4xx answers).
    Info,
    /// Connections closed by a limit: worth an operator's look.
    Warn,
}

#[derive(Debug)]
struct Slot {
    logged_at: Instant,
    unlogged: u64,
}

/// Per-kind rate limiting, and a count of every refusal by kind (for metrics).
#[derive(Debug)]
pub struct Refusals {
    every: Duration,
    slots: Mutex<HashMap<&'static str, Slot>>,
    totals: Mutex<HashMap<&'static str, u64>>,
}

impl Default for Refusals {
    fn default() -> Self {
        Self::new(INTERVAL)
    }
}

impl Refusals {
    /// At most one line per kind per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            slots: Mutex::new(HashMap::new()),
            totals: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one refusal of `kind` and logs it unless one of that kind was logged less
    /// than the interval ago. Returns whether a line was written.
    pub fn note(&self, level: Level, kind: &'static str, detail: &dyn std::fmt::Display) -> bool {
        self.note_at(Instant::now(), level, kind, detail)
    }

    fn note_at(
        &self,
        now: Instant,
        level: Level,
        kind: &'static str,
        detail: &dyn std::fmt::Display,
    ) -> bool {
        *self.totals.lock().entry(kind).or_insert(0) += 1;
        let unlogged = {
            let mut slots = self.slots.lock();
            match slots.get_mut(kind) {
                Some(slot) if now.saturating_duration_since(slot.logged_at) < self.every => {
                    slot.unlogged += 1;
                    return false;
                }
                Some(slot) => {
                    let n = slot.unlogged;
                    *slot = Slot {
                        logged_at: now,
                        unlogged: 0,
                    };
                    n
                }
                None => {
                    slots.insert(
                        kind,
                        Slot {
                            logged_at: now,
                            unlogged: 0,
                        },
                    );
                    0
                }
            }
        };
        match level {
            Level::Info => {
                tracing::info!(kind, unlogged_since_last = unlogged, "refused: {detail}")
            }
            Level::Warn => {
                tracing::warn!(kind, unlogged_since_last = unlogged, "refused: {detail}")
            }
        }
        true
    }

    /// Refusals of `kind` so far.
    pub fn total(&self, kind: &str) -> u64 {
        self.totals.lock().get(kind).copied().unwrap_or(0)
    }

    /// Every refusal so far, by kind.
    pub fn totals(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self.totals.lock().iter().map(|(k, n)| (*k, *n)).collect();
        v.sort_unstable();
        v
    }

    /// Every refusal so far as registry samples (`kvtier_core::registry`), what each front
    /// end exports: flat name `refused_{kind}`, counter family `refused` labelled by
    /// `kind`. A kind appears once it has happened (kinds are the front ends' own names:
    /// error codes, the limit that closed a connection).
    pub fn samples(&self) -> Samples {
        let mut out = Samples::default();
        for (kind, n) in self.totals() {
            out.push(Sample {
                name: format!("refused_{kind}"),
                family: "refused",
                help: "Requests refused (by error code) and connections closed by a limit (by kind)",
                kind: CounterKind::Counter,
                labels: vec![("kind", kind.to_string())],
                value: n,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn one_line_per_kind_per_interval_and_every_refusal_counted() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let mut lines = 0;
        for i in 0..1000u64 {
            // 1000 refusals over 25 s: lines at 0 s, 10 s and 20 s.
            let at = t0 + Duration::from_millis(i * 25);
            lines += u32::from(r.note_at(at, Level::Info, "bad_json", &"x"));
        }
        assert_eq!(lines, 3);
        assert!(
            r.note_at(t0, Level::Warn, "idle_timeout", &"y"),
            "kinds are apart"
        );
        assert_eq!(r.totals(), vec![("bad_json", 1000), ("idle_timeout", 1)]);
        let flat = r.samples().flat();
        assert_eq!(flat.len(), 2, "{flat:?}");
        assert_eq!(flat["refused_bad_json"], 1000);
        assert_eq!(flat["refused_idle_timeout"], 1);
        assert!(
            r.samples()
                .iter()
                .all(|s| s.family == "refused" && s.kind == CounterKind::Counter),
            "one counter family"
        );
    }
}
