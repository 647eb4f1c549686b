//! `store_idle` and `store_nice` keep their promise in a real `kvtier serve` process: the
//! thread that read a store's body runs under the kernel's idle policy by default, at
//! `nice` 19 with `store_idle = false`, and the request threads at the process's priority
//! either way — each read back from the kernel (`/proc/PID/task/*/stat`). A module of
//! `serve_listener.rs` (one test binary fewer to link).

use kvtier_testkit::{SCHED_IDLE, SCHED_OTHER, ThreadSched, threads_of};

use super::server::{Server, layout_spec, payloads, prompt, runtime};

/// A thread's (scheduling policy, nice value).
type Priority = (u32, i64);

/// Stores one prompt through `server`, then reads its threads.
fn threads_after_a_store(server: &Server) -> Vec<ThreadSched> {
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
    threads_of(server.pid())
}

/// The `nice` value this test runs at, which the server inherits.
fn base() -> i64 {
    i64::from(rustix::process::getpriority_process(None).unwrap())
}

/// The bulk threads that served (their priority is set when they first serve) and the
/// request threads.
fn lanes(threads: &[ThreadSched]) -> (Vec<Priority>, Vec<Priority>) {
    let pick = |name: &str| -> Vec<Priority> {
        threads
            .iter()
            .filter(|t| t.name == name)
            .map(|t| (t.policy, t.nice))
            .collect()
    };
    let bulk: Vec<_> = pick("kvtier-bulk")
        .into_iter()
        .filter(|&(p, nice)| p != SCHED_OTHER || nice != base())
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
        request
            .iter()
            .all(|&(p, nice)| p == SCHED_OTHER && nice == base()),
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
    assert!(
        bulk.iter().all(|&b| b == (SCHED_OTHER, 19)),
        "bulk threads: {bulk:?}"
    );
    assert!(
        request
            .iter()
            .all(|&(p, nice)| p == SCHED_OTHER && nice == base()),
        "request threads: {request:?}"
    );
    server.stop();
}
