//! A real `kvtier gateway` process on an ephemeral loopback port with SigV4, for the tests
//! that drive it; killed when dropped.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test code: a failed expectation is a failed test; not every test uses every helper"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The key pair every test gateway accepts.
pub const ACCESS: &str = "gateway-test";
pub const SECRET: &str = "gateway-test-secret";

pub struct Gateway {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Gateway {
    /// Starts it on the store in `dir` with `extra` arguments and waits until it listens.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(["gateway", "--listen", "127.0.0.1:0"])
            .args(["--access-key", ACCESS, "--secret-key", SECRET])
            .arg("--dir")
            .arg(dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kvtier gateway");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line
            .split_once("listening on ")
            .map(|(_, a)| a.trim().to_owned())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Self { child, endpoint }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` and waits for the process to end.
    pub fn signal(&mut self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, sig);
        let _ = self.child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
