//! A child's stdout and stderr, each written to a file in the process's own temporary
//! directory: never a pipe left to fill up and block the child, never lost, and read back
//! when a test fails. The stream a readiness line is expected on is piped through a
//! thread that copies it to its file and reports the line.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;

use crate::{Error, Result};

/// Lines of each stream a failure message shows (the end is what explains a failure).
const TAIL_LINES: usize = 40;

/// Which stream of the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Where a child's output goes.
#[derive(Debug)]
pub(crate) struct Captured {
    dir: tempfile::TempDir,
}

impl Captured {
    pub(crate) fn new() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("kvtier-testkit-")
            .tempdir()
            .map_err(|e| Error::io("cannot create a directory for a child's output", e))?;
        Ok(Self { dir })
    }

    fn path(&self, stream: Stream) -> PathBuf {
        self.dir.path().join(stream.file_name())
    }

    /// The file `stream` is written to, created empty.
    pub(crate) fn file(&self, stream: Stream) -> Result<File> {
        let path = self.path(stream);
        File::create(&path).map_err(|e| Error::io(format!("cannot create {}", path.display()), e))
    }

    /// Everything `stream` printed so far (lossy UTF-8).
    pub(crate) fn text(&self, stream: Stream) -> String {
        std::fs::read(self.path(stream))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last lines of both streams, for a message: empty when the child printed
    /// nothing, else starting with a newline.
    pub(crate) fn tail(&self) -> String {
        let mut out = String::new();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let text = self.text(stream);
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                continue;
            }
            let skipped = lines.len().saturating_sub(TAIL_LINES);
            out.push_str(&format!("\n--- {} ", stream.file_name()));
            if skipped > 0 {
                out.push_str(&format!("(last {TAIL_LINES} of {} lines) ", lines.len()));
            }
            out.push_str("---");
            for line in &lines[skipped..] {
                out.push('\n');
                out.push_str(line);
            }
        }
        out
    }
}

/// Copies `pipe` into `file` line by line until it closes, and sends what follows
/// `marker` (trimmed) on the first line containing it. The channel closes without a
/// message if the stream ends first. The copy goes on after the line: the child keeps
/// writing, and a full pipe would block it.
pub(crate) fn watch(
    pipe: impl Read + Send + 'static,
    mut file: File,
    marker: String,
) -> Result<mpsc::Receiver<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("testkit-output".into())
        .spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            let mut seen = false;
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let _ = file.write_all(&line);
                if !seen {
                    let text = String::from_utf8_lossy(&line);
                    if let Some((_, after)) = text.split_once(marker.as_str()) {
                        seen = true;
                        let _ = tx.send(after.trim().to_owned());
                    }
                }
            }
        })
        .map_err(|e| Error::io("cannot start the thread reading a child's output", e))?;
    Ok(rx)
}
