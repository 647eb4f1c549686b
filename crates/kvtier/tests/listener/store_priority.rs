//! `store_idle` and `store_nice` keep their promise in a real `kvtier serve` process: the
//! thread that read a store's body runs under the kernel's idle policy by default, at
//! `nice` 19 with `store_idle = false`, and the request threads at the process's priority
//! either way — each read back from the kernel (`/proc/PID/task/*/stat`). A module of
//! `serve_listener.rs` (one test binary fewer to link).

use super::server::{Server, layout_spec, payloads, prompt, runtime};

/// `SCHED_IDLE` in `sched_setscheduler(2)`'s numbering.
const SCHED_IDLE: u32 = 5;

/// A thread as the kernel reports it: (name, scheduling policy, nice value).
type Thread = (String, u32, i64);

/// A thread's (scheduling policy, nice value).
type Priority = (u32, i64);

/// Every thread of `pid`.
fn threads(pid: u32) -> Vec<Thread> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(entry.unwrap().path().join("stat")) else {
            continue; // a thread that ended meanwhile
        };
        let name = stat[stat.find('(').unwrap() + 1..stat.rfind(')').unwrap()].to_string();
        // Fields from the third (state) on, after the name's closing parenthesis.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let nice: i64 = fields[19 - 3].parse().unwrap();
        let policy: u32 = fields[41 - 3].parse().unwrap();
        out.push((name, policy, nice));
    }
    out
}

/// Stores one prompt through `server`, then reads its threads.
fn threads_after_a_store(server: &Server) -> Vec<Thread> {
    let rt = runtime();
    let c = server.client();
    rt.block_on(async {
        let layout = c
            .register_layout(&layout_spec("priority", 2))
            .await
            .unwrap();
        let answer = c
            .store(&prompt(&layout, 1, 4), payloads(&layout, 1, 4))
            .await
            .unwrap();
        assert_eq!(answer.stored, 4);
        // A lookup, so that a request thread has certainly served a request too.
        let hit = c.lookup(&prompt(&layout, 1, 4)).await.unwrap();
        assert_eq!(hit.blocks(), 4);
    });
    threads(server.pid())
}

/// The `nice` value this test runs at, which the server inherits.
fn base() -> i64 {
    i64::from(rustix::process::getpriority_process(None).unwrap())
}

/// The bulk threads that served (their priority is set when they first serve) and the
/// request threads.
fn lanes(threads: &[Thread]) -> (Vec<Priority>, Vec<Priority>) {
    let pick = |name: &str| -> Vec<Priority> {
        threads
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, p, nice)| (*p, *nice))
            .collect()
    };
    let bulk: Vec<_> = pick("kvtier-bulk")
        .into_iter()
        .filter(|&(p, nice)| p != 0 || nice != base())
        .collect();
    (bulk, pick("kvtier-serve"))
}

#[test]
fn store_bodies_are_read_under_the_idle_policy_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let (bulk, request) = lanes(&threads_after_a_store(&server));
    assert!(!bulk.is_empty(), "no bulk thread was lowered by the store");
    assert!(
        bulk.iter().all(|&(p, _)| p == SCHED_IDLE),
        "bulk threads: {bulk:?}"
    );
    assert!(!request.is_empty());
    assert!(
        request.iter().all(|&(p, nice)| p == 0 && nice == base()),
        "request threads: {request:?}"
    );
    server.stop();
}

#[test]
fn without_the_idle_policy_store_bodies_are_read_at_store_nice() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--set", "store_idle=false"]);
    let (bulk, request) = lanes(&threads_after_a_store(&server));
    assert!(!bulk.is_empty(), "no bulk thread was lowered by the store");
    assert!(bulk.iter().all(|&b| b == (0, 19)), "bulk threads: {bulk:?}");
    assert!(
        request.iter().all(|&(p, nice)| p == 0 && nice == base()),
        "request threads: {request:?}"
    );
    server.stop();
}
