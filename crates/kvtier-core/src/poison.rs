//! Poisoning: a background thread that panics closes the engine instead of leaving its
//! callers hanging (fjall's `poison.rs`).
//!
//! The engine's work is split between the caller's thread and background threads (a
//! tier's write-behind worker, the prefetch thread, the SSD tier's maintenance). If one of
//! those dies by a panic, the engine no longer does what it promises: queued blocks are
//! never written, a flush would wait for a worker that is gone. So the thread's panic is
//! caught where it started ([`spawn`]), the engine's [`Poison`] records the reason, and
//! every later engine call that returns a `Result` fails with [`ErrorKind::Closed`] and
//! that reason. Whoever was waiting on the thread is woken by the thread's own wrapper
//! (the writer marks its worker done), so no call waits past its deadline for it.
//!
//! The check on the hot path is one acquire load of a flag that is never set in a healthy
//! engine.

use std::any::Any;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// Whether the engine is closed, and why. Shared by the engine and the components
/// assembled beside it (see [`crate::EngineBuilder::poison`]); the first reason wins.
#[derive(Debug, Default)]
pub struct Poison {
    closed: AtomicBool,
    reason: OnceLock<String>,
}

impl Poison {
    /// A healthy flag.
    pub fn new() -> Self {
        Self::default()
    }

    /// `Ok` while healthy; [`ErrorKind::Closed`] with the reason once poisoned.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(self.error());
        }
        Ok(())
    }

    #[cold]
    fn error(&self) -> Error {
        let reason = self.reason.get().map_or("closed", String::as_str);
        Error::new(ErrorKind::Closed, format!("the engine is closed: {reason}"))
    }

    /// Closes the engine for `reason` (kept only if it is the first).
    pub fn poison(&self, reason: impl Into<String>) {
        let reason = reason.into();
        if self.reason.set(reason.clone()).is_ok() {
            tracing::error!(reason = %reason, "the engine is closed; every later call fails");
        }
        self.closed.store(true, Ordering::Release);
    }

    /// Why the engine is closed, if it is.
    pub fn reason(&self) -> Option<&str> {
        if self.closed.load(Ordering::Acquire) {
            self.reason.get().map(String::as_str)
        } else {
            None
        }
    }
}

/// The reason recorded when the thread `name` panicked with `payload`:
/// ``"background thread `name` panicked: <payload>"``.
pub fn panic_reason(name: &str, payload: &(dyn Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned());
    format!("background thread `{name}` panicked: {what}")
}

/// Starts a thread named `name` running `f`; if `f` panics, `on_panic` gets the reason
/// (see [`panic_reason`]) on that thread before it ends.
pub fn spawn<F, P>(name: String, f: F, on_panic: P) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
    P: FnOnce(String) + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                on_panic(panic_reason(&name, payload.as_ref()));
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_wins_and_calls_fail_closed() {
        let p = Poison::new();
        assert!(p.check().is_ok());
        assert_eq!(p.reason(), None);
        p.poison("one");
        p.poison("two");
        let e = p.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed);
        assert!(e.message().contains("one"), "{e}");
        assert_eq!(p.reason(), Some("one"));
    }

    #[test]
    fn a_panicking_thread_reports_its_name_and_payload() {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = spawn(
            "kvtier-test".into(),
            || panic!("boom {}", 7),
            move |reason| tx.send(reason).unwrap(),
        )
        .unwrap();
        h.join().unwrap();
        assert_eq!(
            rx.recv().unwrap(),
            "background thread `kvtier-test` panicked: boom 7"
        );
    }
}
