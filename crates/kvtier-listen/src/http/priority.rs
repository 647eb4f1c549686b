//! The CPU priority a lane's threads run at.
//!
//! Two ways to rank a thread below the request threads, which differ where it counts:
//!
//! - a `nice` value (1 to 19) shrinks the thread's share of a CPU it competes for, but the
//!   kernel still counts that CPU as busy when it places a woken thread. On two cores with
//!   a store's copy running on one, woken lookup threads queue on the other, behind each
//!   other, instead of taking the copy's CPU: a scheduler trace of the mixed bench row
//!   showed the request thread and the lookup clients' threads taking turns on one CPU
//!   while a nice-19 copy held the other (BENCHMARKS.md, issue 36).
//! - the idle policy (Linux `SCHED_IDLE`): the thread runs only on CPU time nothing else
//!   wants; a CPU running only such threads counts as free when the kernel places a woken
//!   thread, and the woken thread preempts them at once (the same row's median lookup:
//!   0.43 ms against 0.75 ms at nice 19). Where cores are free the thread runs at full
//!   speed, as at any priority. Where every core is busy with other work it gets a sliver
//!   (a fifth of nice 19's), so a host that keeps every core busy slows stores toward
//!   their body timeout, five times sooner than at nice 19.
//!
//! Any process may lower its own threads this way without privilege. A thread created by
//! a thread keeps its creator's priority, which is why blocking work from a lane goes
//! through [`super::spawn_blocking`].

/// How a lane's threads rank against the request threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanePriority {
    /// The kernel's idle policy (`SCHED_IDLE`); where the platform has none, nice 19.
    Idle,
    /// A `nice` value, 0 (the request threads' priority) to 19.
    Nice(i32),
}

impl LanePriority {
    /// Sets the calling thread to this priority. Failing leaves the thread where it was,
    /// which is only slower for the requests it competes with: logged, not an error.
    pub fn apply_to_this_thread(self) {
        let nice = match self {
            Self::Idle => {
                if set_idle_policy() {
                    return;
                }
                19
            }
            Self::Nice(n) => n,
        };
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
            tracing::debug!(error = %e, nice, "cannot lower a lane thread's priority");
        }
    }
}

/// Puts the calling thread under `SCHED_IDLE`; false where that fails or does not exist.
#[cfg(target_os = "linux")]
fn set_idle_policy() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // pid 0 is the calling thread (Linux schedules threads, not processes).
    #[expect(
        unsafe_code,
        reason = "a libc call with a valid pointer to a parameter that outlives it"
    )]
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &raw const param) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "cannot put a lane thread under SCHED_IDLE; nice 19 instead"
        );
    }
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn set_idle_policy() -> bool {
    false
}
