//! Progress on stderr while a group of rows is measured.
//!
//! A group prints its rows when it has measured them all, and some groups take tens of
//! seconds (the SSD rows write and recover real files), so without this a run looks
//! stuck. Each group announces itself, and every few seconds a line says how long it has
//! been running and which row it started last. The lines go to stderr: stdout keeps only
//! the table, for scripts.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a running group says it is still running.
const EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Shared {
    /// The row last asked for (and wanted).
    current: Mutex<String>,
    done: Mutex<bool>,
    wake: Condvar,
}

/// A poisoned lock only means a panic elsewhere; the progress text is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One group's progress: announced on creation, a heartbeat thread until dropped.
pub struct GroupProgress {
    shared: Arc<Shared>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl GroupProgress {
    /// Announces group `name` (run started at `run_start`) and starts its heartbeat.
    pub fn start(name: &'static str, run_start: Instant) -> Self {
        let _ = writeln!(
            std::io::stderr(),
            "[{:>4.0} s] measuring the {name} rows",
            run_start.elapsed().as_secs_f64()
        );
        let shared = Arc::new(Shared::default());
        let ticker = {
            let shared = shared.clone();
            let group_start = Instant::now();
            std::thread::Builder::new()
                .name("bench-progress".into())
                .spawn(move || {
                    let mut done = lock(&shared.done);
                    while !*done {
                        let (guard, waited) = shared
                            .wake
                            .wait_timeout(done, EVERY)
                            .unwrap_or_else(|e| e.into_inner());
                        done = guard;
                        if waited.timed_out() && !*done {
                            let current = lock(&shared.current).clone();
                            let _ = writeln!(
                                std::io::stderr(),
                                "[{:>4.0} s]   {name}: {:.0} s in, last row started: {current}",
                                run_start.elapsed().as_secs_f64(),
                                group_start.elapsed().as_secs_f64()
                            );
                        }
                    }
                })
                .ok()
        };
        Self { shared, ticker }
    }

    /// Records that row `name` is being measured.
    pub fn row(&self, name: &str) {
        let mut current = lock(&self.shared.current);
        if *current != name {
            current.clear();
            current.push_str(name);
        }
    }
}

impl Drop for GroupProgress {
    fn drop(&mut self) {
        *lock(&self.shared.done) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}
