//! A real `kvtier gateway` process on an ephemeral loopback port with SigV4, for the tests
//! that drive it (a `kvtier_testkit::Process`: killed when dropped).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test code: a failed expectation is a failed test; not every test uses every helper"
)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use kvtier_testkit::{Process, Ready};

/// The key pair every test gateway accepts.
pub const ACCESS: &str = "gateway-test";
pub const SECRET: &str = "gateway-test-secret";

/// How long a gateway may take to listen, and to exit after a signal.
const WITHIN: Duration = Duration::from_secs(60);

pub struct Gateway {
    process: Process,
    /// `http://ADDRESS:PORT` (127.0.0.1 unless started elsewhere).
    pub endpoint: String,
}

impl Gateway {
    /// Starts it on the store in `dir` with `extra` arguments and waits until it listens.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        Self::start_at("127.0.0.1:0", dir, extra)
    }

    /// [`Gateway::start`] listening on `listen` (`ADDRESS:0`).
    pub fn start_at(listen: &str, dir: &Path, extra: &[&str]) -> Self {
        let keys = ["--access-key", ACCESS, "--secret-key", SECRET];
        Self::launch(listen, dir, &[&keys[..], extra].concat())
    }

    /// Starts it on the store in `dir` without authentication (`--auth none`).
    pub fn start_unauthenticated(dir: &Path) -> Self {
        Self::start_unauthenticated_with(dir, &[])
    }

    /// [`Gateway::start_unauthenticated`] with `extra` arguments.
    pub fn start_unauthenticated_with(dir: &Path, extra: &[&str]) -> Self {
        Self::launch(
            "127.0.0.1:0",
            dir,
            &[&["--auth", "none"][..], extra].concat(),
        )
    }

    /// Starts it without authentication under the open-file limits `soft` and `hard` (see
    /// `kvtier_testkit::with_nofile_limit`).
    pub fn start_unauthenticated_with_nofile(
        dir: &Path,
        soft: u64,
        hard: u64,
        extra: &[&str],
    ) -> Self {
        let cmd = kvtier_testkit::with_nofile_limit(env!("CARGO_BIN_EXE_kvtier"), soft, hard);
        let args = [&["--auth", "none"][..], extra].concat();
        Self::launch_with(cmd, "127.0.0.1:0", dir, &args)
    }

    fn launch(listen: &str, dir: &Path, args: &[&str]) -> Self {
        Self::launch_with(
            Command::new(env!("CARGO_BIN_EXE_kvtier")),
            listen,
            dir,
            args,
        )
    }

    /// Runs `gateway` through `cmd` (the program, or a command that runs it).
    fn launch_with(mut cmd: Command, listen: &str, dir: &Path, args: &[&str]) -> Self {
        cmd.args(["gateway", "--listen", listen])
            .arg("--dir")
            .arg(dir)
            .args(args);
        let process = Process::start(
            "kvtier gateway",
            cmd,
            Ready::StdoutLine("listening on ".into()),
            WITHIN,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let endpoint = process.announced().to_owned();
        Self { process, endpoint }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Everything it logged (stderr) so far.
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// SIGTERM, and how the process ended.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.process
            .signal_and_wait(kvtier_testkit::Signal::TERM, WITHIN)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends `sig` and waits for the process to end.
    pub fn signal(&mut self, sig: kvtier_testkit::Signal) {
        self.process
            .signal_and_wait(sig, WITHIN)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Runs `tests/gateway/{script}` (a boto3 client) against `endpoint` with the test access
/// key, `secret`, `mode` and `extra` arguments.
pub fn python(script: &str, endpoint: &str, secret: &str, mode: &str, extra: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/gateway")
        .join(script);
    Command::new("python3")
        .arg(script)
        .args([endpoint, ACCESS, secret, mode])
        .args(extra)
        .output()
        .expect("python3 (scripts/setup.sh installs boto3)")
}

/// Fails the test unless the script exited 0 and its output ends with `OK`.
pub fn assert_ok(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "{what} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
