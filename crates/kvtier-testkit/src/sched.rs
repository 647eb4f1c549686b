//! How the kernel schedules a thread, read from its `/proc/.../stat` line: what a test
//! checks when a setting promises a thread's priority (the store lane's idle policy or
//! `nice` value).

use std::path::Path;

/// `SCHED_OTHER`, the default policy, in `sched_setscheduler(2)`'s numbering.
pub const SCHED_OTHER: u32 = 0;
/// `SCHED_IDLE` in `sched_setscheduler(2)`'s numbering.
pub const SCHED_IDLE: u32 = 5;

/// One thread's name and scheduling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSched {
    /// The thread's name (`comm`).
    pub name: String,
    /// Its scheduling policy ([`SCHED_OTHER`], [`SCHED_IDLE`], …).
    pub policy: u32,
    /// Its `nice` value.
    pub nice: i64,
}

/// The scheduling of the thread whose stat line is at `stat` (`/proc/thread-self/stat`,
/// `/proc/PID/task/TID/stat`); `None` if it cannot be read (a thread that ended) or
/// parsed.
pub fn thread_sched(stat: &Path) -> Option<ThreadSched> {
    let line = std::fs::read_to_string(stat).ok()?;
    // The name is in parentheses and may hold spaces or parentheses: fields are counted
    // after the last closing one, from the third (state) on.
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let fields: Vec<&str> = line.get(close + 2..)?.split(' ').collect();
    Some(ThreadSched {
        name: line.get(open + 1..close)?.to_string(),
        nice: fields.get(19 - 3)?.parse().ok()?,
        policy: fields.get(41 - 3)?.parse().ok()?,
    })
}

/// Every thread of process `pid` that could be read.
pub fn threads_of(pid: u32) -> Vec<ThreadSched> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| thread_sched(&t.path().join("stat")))
        .collect()
}
