//! When a panic was reported, for tests that time what happens after one.
//!
//! The standard panic hook prints the message, and with `RUST_BACKTRACE` set symbolizes a
//! backtrace, before the unwinding reaches whatever catches it. For a large debug binary
//! on a loaded machine that takes seconds, which is the hook's time, not the code under
//! test's. A test that promises "closed within a second of the panic" counts that second
//! from [`last_panic_reported`].

use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

static REPORTED: Mutex<Option<Instant>> = Mutex::new(None);
static INSTALL: Once = Once::new();

/// Wraps the current panic hook (once per process) so that the instant it finishes
/// reporting a panic is recorded; the report itself is unchanged.
pub fn time_panic_reports() {
    INSTALL.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            *REPORTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }));
    });
}

/// When the last panic finished being reported, if one was since
/// [`time_panic_reports`].
pub fn last_panic_reported() -> Option<Instant> {
    *REPORTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls `call` every 5 ms until it fails and returns that error, for a test that has
/// just caused a panic on another thread. Panics if `call` still succeeds `limit` after
/// the panic's report finished, or if no panic is reported within 60 s.
/// [`time_panic_reports`] must have been called before the panic.
pub fn first_error_after_panic<T, E>(limit: Duration, mut call: impl FnMut() -> Result<T, E>) -> E {
    let started = Instant::now();
    loop {
        if let Err(e) = call() {
            return e;
        }
        if let Some(reported) = last_panic_reported() {
            assert!(
                reported.elapsed() < limit,
                "still succeeding {limit:?} after the panic was reported"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no panic was reported within 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_timed_after_its_report() {
        time_panic_reports();
        let before = Instant::now();
        assert!(std::panic::catch_unwind(|| panic!("reported")).is_err());
        let reported = last_panic_reported().expect("the panic was not timed");
        assert!(reported >= before);
    }

    #[test]
    fn the_first_error_is_returned_and_a_call_that_never_fails_is_caught() {
        time_panic_reports();
        let mut calls = 0;
        let e = first_error_after_panic(Duration::from_secs(1), || {
            calls += 1;
            if calls < 3 { Ok(()) } else { Err(calls) }
        });
        assert_eq!(e, 3);

        assert!(std::panic::catch_unwind(|| panic!("reported")).is_err());
        let never = std::panic::catch_unwind(|| {
            first_error_after_panic::<(), ()>(Duration::from_millis(50), || Ok(()))
        });
        assert!(never.is_err(), "a call that never fails was not caught");
    }
}
