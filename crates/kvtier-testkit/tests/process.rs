//! The kit against real processes (`sh`, `sleep`, python's HTTP server): readiness by a
//! line and by a port, the errors of a child that exits or never gets ready, SIGTERM,
//! SIGKILL, a SIGTERM that is ignored, and the kill on drop.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kvtier_testkit::{Error, Process, Ready, free_port};

const WITHIN: Duration = Duration::from_secs(30);

fn sh(script: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", script]);
    c
}

#[test]
fn a_line_on_stdout_makes_it_ready_and_announces_the_rest() {
    let mut p = Process::start(
        "announcer",
        sh("echo starting; echo 'note: listening on 127.0.0.1:1234 '; exec sleep 30"),
        Ready::StdoutLine("listening on ".into()),
        WITHIN,
    )
    .unwrap();
    assert_eq!(p.announced(), "127.0.0.1:1234");
    assert!(p.stdout().contains("starting\n"), "{:?}", p.stdout());
    assert_eq!(p.try_wait().unwrap(), None);
    let status = p.terminate(WITHIN).unwrap();
    assert_eq!(status.signal(), Some(15), "SIGTERM");
}

#[test]
fn a_line_on_stderr_works_the_same() {
    let mut p = Process::start(
        "stderr announcer",
        // `out` comes first: readiness must not race with what is checked after it.
        sh("echo out; echo 'Running on http://127.0.0.1:9' >&2; exec sleep 30"),
        Ready::StderrLine("Running on http://".into()),
        WITHIN,
    )
    .unwrap();
    assert_eq!(p.announced(), "127.0.0.1:9");
    let status = p.kill_hard().unwrap();
    assert_eq!(status.signal(), Some(9), "SIGKILL");
    assert_eq!(p.stdout(), "out\n");
}

#[test]
fn a_child_that_exits_before_it_is_ready_is_reported_with_its_output() {
    let err = Process::start(
        "quitter",
        sh("echo 'bad flag' >&2; exit 3"),
        Ready::StdoutLine("listening on ".into()),
        WITHIN,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::NotReady { .. }), "{text}");
    assert!(text.contains("quitter"), "{text}");
    assert!(text.contains("exited with code 3"), "{text}");
    assert!(text.contains("bad flag"), "{text}");
}

#[test]
fn a_child_that_never_gets_ready_is_killed_at_the_bound() {
    let err = Process::start(
        "sleeper",
        sh("echo waiting; exec sleep 30"),
        Ready::StdoutLine("listening on ".into()),
        Duration::from_millis(300),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("still running, killed"), "{text}");
    assert!(text.contains("waiting"), "{text}");
}

#[test]
fn a_missing_program_is_a_spawn_error() {
    let err = Process::start(
        "nothing",
        Command::new("/nonexistent/kvtier-testkit-program"),
        Ready::Spawned,
        WITHIN,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Spawn { .. }), "{err}");
}

#[test]
fn a_port_accepting_connections_makes_it_ready() {
    let port = free_port().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut server = Command::new("python3");
    server.args([
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
    ]);
    let mut p = Process::start("http.server", server, Ready::Port(addr), WITHIN).unwrap();
    assert!(kvtier_testkit::wait_for_port(addr, Duration::ZERO));
    assert!(!p.terminate(WITHIN).unwrap().success());
}

#[test]
fn an_ignored_sigterm_ends_in_sigkill_and_an_error() {
    let mut p = Process::start(
        "stubborn",
        sh("trap '' TERM; echo ready; while :; do sleep 0.05; done"),
        Ready::StdoutLine("ready".into()),
        WITHIN,
    )
    .unwrap();
    let err = p.terminate(Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::NotStopped { .. }), "{err}");
    assert_eq!(p.try_wait().unwrap().and_then(|s| s.signal()), Some(9));
}

#[test]
fn dropping_the_guard_kills_the_child() {
    let p = Process::start("orphan", sh("exec sleep 30"), Ready::Spawned, WITHIN).unwrap();
    let proc_dir = format!("/proc/{}", p.pid());
    assert!(Path::new(&proc_dir).exists());
    drop(p);
    assert!(!Path::new(&proc_dir).exists(), "{proc_dir} still exists");
}

#[test]
fn a_test_dir_is_removed_unless_the_test_fails() {
    let dir = kvtier_testkit::test_dir("kit-passes").unwrap();
    let path = dir.path().to_owned();
    assert!(path.is_dir());
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("kvtier-kit-passes-")
    );
    drop(dir);
    assert!(!path.exists());

    let (tx, rx) = std::sync::mpsc::channel();
    let failed = std::thread::spawn(move || {
        let dir = kvtier_testkit::test_dir("kit-fails").unwrap();
        tx.send(dir.path().to_owned()).unwrap();
        panic!("a failing test");
    })
    .join();
    assert!(failed.is_err());
    let kept = rx.recv().unwrap();
    assert!(kept.is_dir(), "{} was removed", kept.display());
    std::fs::remove_dir_all(kept).unwrap();
}
