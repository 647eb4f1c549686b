//! A child process a test runs: started, waited for until ready, signalled by PID, and
//! killed when the guard drops — so a failing test never leaves a server behind holding a
//! port or a directory lock.

use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::error::describe;
use crate::output::{Captured, Stream, watch};
use crate::{Error, Result};

/// How long [`Process`] waits for a SIGKILLed child to be reaped; only a process stuck in
/// the kernel takes longer.
const KILL_WAIT: Duration = Duration::from_secs(60);
/// How often a bounded wait looks at the child.
const POLL: Duration = Duration::from_millis(10);

/// When a started process counts as ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// At once: the test does not talk to it (a writer it will kill at a moment of its
    /// choosing).
    Spawned,
    /// When it prints a line containing this text on stdout; the rest of the line,
    /// trimmed, is [`Process::announced`] (`"listening on "` → the address).
    StdoutLine(String),
    /// The same on stderr.
    StderrLine(String),
    /// When this address accepts a TCP connection.
    Port(SocketAddr),
}

impl Ready {
    fn describe(&self) -> String {
        match self {
            Ready::Spawned => "started".into(),
            Ready::StdoutLine(m) => format!("a line with {m:?} on stdout"),
            Ready::StderrLine(m) => format!("a line with {m:?} on stderr"),
            Ready::Port(a) => format!("{a} accepting connections"),
        }
    }
}

/// A command that runs `program` with its open-file limit (`RLIMIT_NOFILE`) set to `soft`
/// and `hard` from its first instruction on, as a service manager would start it (systemd's
/// `LimitNOFILE=`): `sh` sets the limits with `ulimit`, then `exec`s the program, which
/// keeps the process id. `hard` may not exceed the caller's own hard limit; add the
/// program's arguments to the command returned.
pub fn with_nofile_limit(program: impl AsRef<std::ffi::OsStr>, soft: u64, hard: u64) -> Command {
    let mut cmd = Command::new("sh");
    // Soft first: lowering the hard limit below the current soft one would fail.
    cmd.arg("-c")
        .arg(format!(
            "ulimit -S -n {soft} && ulimit -H -n {hard} && exec \"$0\" \"$@\""
        ))
        .arg(program);
    cmd
}

/// A running child process; SIGKILLed and reaped when dropped. When dropped while the
/// test panics, it prints the end of its output first.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    /// Set once the child is reaped: from then on its PID may belong to another process
    /// and is never signalled again.
    status: Option<ExitStatus>,
    announced: String,
    output: Captured,
}

impl Process {
    /// Starts `command` (its stdin closed, stdout and stderr captured; whatever the
    /// command had set for them is replaced) and waits at most `within` for `ready`.
    /// `name` identifies it in messages. A process that exits or stays unready within the
    /// bound is killed, and the error carries the end of its output.
    pub fn start(
        name: impl Into<String>,
        mut command: Command,
        ready: Ready,
        within: Duration,
    ) -> Result<Self> {
        let name = name.into();
        let output = Captured::new()?;
        let watched = match &ready {
            Ready::StdoutLine(_) => Some(Stream::Stdout),
            Ready::StderrLine(_) => Some(Stream::Stderr),
            Ready::Spawned | Ready::Port(_) => None,
        };
        let stdout = match watched {
            Some(Stream::Stdout) => Stdio::piped(),
            _ => output.file(Stream::Stdout)?.into(),
        };
        let stderr = match watched {
            Some(Stream::Stderr) => Stdio::piped(),
            _ => output.file(Stream::Stderr)?.into(),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|source| Error::Spawn {
                name: name.clone(),
                source,
            })?;
        let mut process = Self {
            name,
            child,
            status: None,
            announced: String::new(),
            output,
        };
        let waited_for = ready.describe();
        let became_ready = match ready {
            Ready::Spawned => Ok(true),
            Ready::StdoutLine(marker) | Ready::StderrLine(marker) => {
                process.await_line(watched.unwrap_or(Stream::Stdout), marker, within)
            }
            Ready::Port(addr) => Ok(process.await_port(addr, within)),
        };
        match became_ready {
            Ok(true) => Ok(process),
            Ok(false) => Err(process.not_ready(waited_for, within)),
            Err(e) => Err(e),
        }
    }

    /// Waits for the readiness line on `stream`; false if it did not come in time or the
    /// stream closed first.
    fn await_line(&mut self, stream: Stream, marker: String, within: Duration) -> Result<bool> {
        let file = self.output.file(stream)?;
        let rx = match stream {
            Stream::Stdout => self.child.stdout.take().map(|p| watch(p, file, marker)),
            Stream::Stderr => self.child.stderr.take().map(|p| watch(p, file, marker)),
        };
        let Some(rx) = rx.transpose()? else {
            return Ok(false);
        };
        match rx.recv_timeout(within) {
            Ok(announced) => {
                self.announced = announced;
                Ok(true)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Ok(false),
        }
    }

    /// Waits until `addr` accepts a connection; false if the child exits or time runs out.
    fn await_port(&mut self, addr: SocketAddr, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if crate::wait_for_port(addr, Duration::ZERO) {
                return true;
            }
            if Instant::now() >= deadline || !matches!(self.try_wait(), Ok(None)) {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    /// The error for a child that did not become ready; kills it if it still runs.
    fn not_ready(mut self, waited_for: String, within: Duration) -> Error {
        // A closed stream often means the child is on its way out: give it a moment to
        // exit so the message says how, rather than killing it.
        let ended = match self.wait_bounded(Duration::from_secs(1)) {
            Ok(Some(status)) => describe(status),
            _ => match self.kill_hard() {
                Ok(_) => "still running, killed".to_owned(),
                Err(e) => format!("still running, and killing it failed: {e}"),
            },
        };
        Error::NotReady {
            name: self.name.clone(),
            waited_for,
            within,
            ended,
            output: self.output.tail(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at [`Process::start`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What followed the readiness text on its line (empty for other readiness).
    pub fn announced(&self) -> &str {
        &self.announced
    }

    /// Everything it printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.output.text(Stream::Stdout)
    }

    /// Everything it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.output.text(Stream::Stderr)
    }

    /// Its exit status if it has ended (reaping it), `None` while it runs.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .map_err(|e| Error::io(format!("cannot wait for {}", self.name), e))?;
        }
        Ok(self.status)
    }

    /// Sends `signal` by PID (nothing once it has been reaped: the PID may be reused).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| {
                Error::io(
                    format!("{} has no usable pid", self.name),
                    std::io::ErrorKind::InvalidInput.into(),
                )
            })?;
        match rustix::process::kill_process(pid, signal) {
            // Already gone (and not yet reaped): nothing to signal.
            Err(rustix::io::Errno::SRCH) | Ok(()) => Ok(()),
            Err(e) => Err(Error::io(
                format!("cannot send {signal:?} to {}", self.name),
                e.into(),
            )),
        }
    }

    /// Sends `signal` and waits at most `within` for the process to exit; one that does
    /// not is SIGKILLed and reported as [`Error::NotStopped`].
    pub fn signal_and_wait(&mut self, signal: Signal, within: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        self.signal(signal)?;
        if let Some(status) = self.wait_bounded(within)? {
            return Ok(status);
        }
        if signal != Signal::KILL {
            self.signal(Signal::KILL)?;
            self.wait_bounded(KILL_WAIT)?;
        }
        Err(Error::NotStopped {
            name: self.name.clone(),
            signal: format!("{signal:?}"),
            within,
            output: self.output.tail(),
        })
    }

    /// SIGTERM, then waits at most `within` for it to exit (a clean shutdown);
    /// [`Error::NotStopped`] (and SIGKILL) if it does not.
    pub fn terminate(&mut self, within: Duration) -> Result<ExitStatus> {
        self.signal_and_wait(Signal::TERM, within)
    }

    /// SIGKILL, now — a crash as the process sees it — and waits for it to be reaped.
    pub fn kill_hard(&mut self) -> Result<ExitStatus> {
        self.signal_and_wait(Signal::KILL, KILL_WAIT)
    }

    /// Polls for the exit at most `within`; `None` if it still runs.
    fn wait_bounded(&mut self, within: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() && self.signal(Signal::KILL).is_ok() {
            self.status = self.child.wait().ok();
        }
        if std::thread::panicking() {
            let tail = self.output.tail();
            if !tail.is_empty() {
                eprintln!("{} (pid {}) printed:{tail}", self.name, self.child.id());
            }
        }
    }
}
