//! The servers the `s3.*` rows run against: plain TCP (the baseline), `kvtier gateway` as
//! a child process (this same binary), and moto's server as a child process. Every child
//! is stopped when its handle drops.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::sigv4::Signer;
use crate::bench::measure::pattern;

/// `kvtier gateway` in this process on a loopback port, storing into `dir`, with SigV4
/// under `access_key` and the bucket `bucket` (`written` durability: the rows measure
/// reads). Stopped when dropped.
pub fn in_process_gateway(
    dir: &Path,
    access_key: &str,
    secret_key: &str,
    bucket: &str,
) -> anyhow::Result<kvtier_gateway::RunningGateway> {
    let mut config = kvtier_gateway::GatewayConfig::new(dir.to_path_buf());
    config.listen = "127.0.0.1:0".parse()?;
    config.auth = kvtier_gateway::Auth::SigV4 {
        access_key: access_key.into(),
        secret_key: secret_key.into(),
    };
    config.durability = kvtier_ssd::Durability::Written { retries: 0 };
    config.create_buckets = vec![bucket.into()];
    kvtier_gateway::RunningGateway::start(config).map_err(anyhow::Error::msg)
}

/// Plain TCP over loopback answering the load generator's requests with the same bytes
/// the S3 servers send: no parsing beyond the request line, no storage, no signature.
pub struct RawServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl RawServer {
    /// Serves `objects` objects' first `range_bytes` bytes (of `object_bytes`-byte
    /// patterns, as the load generator expects).
    pub fn start(objects: usize, object_bytes: usize, range_bytes: usize) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
            (0..objects)
                .map(|i| pattern(object_bytes, i as u8)[..range_bytes].to_vec())
                .collect(),
        );
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("bench-raw-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let bodies = bodies.clone();
                    let _ = std::thread::Builder::new()
                        .name("bench-raw-conn".into())
                        .spawn(move || {
                            let _ = serve_raw(conn, &bodies);
                        });
                }
            })?;
        Ok(Self { addr, stop })
    }
}

fn serve_raw(conn: TcpStream, bodies: &[Vec<u8>]) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':')
                && n.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        let object = path
            .rsplit_once("object-")
            .and_then(|(_, i)| i.parse::<usize>().ok())
            .and_then(|i| bodies.get(i));
        match (method.as_str(), object) {
            ("GET", Some(b)) => {
                let mut msg = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .into_bytes();
                msg.extend_from_slice(b);
                writer.write_all(&msg)?;
            }
            _ => writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?,
        }
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// A server in a child process, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Child {
    /// `IP:PORT` it listens on.
    pub host: String,
    child: std::process::Child,
}

impl Child {
    /// `kvtier gateway` on a free loopback port with SigV4 and a store in `dir`.
    pub fn gateway(dir: &Path, signer: &Signer) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args([
                "gateway",
                "--listen",
                "127.0.0.1:0",
                "--durability",
                "written",
            ])
            .arg("--dir")
            .arg(dir)
            .args([
                "--access-key",
                &signer.access_key,
                "--secret-key",
                &signer.secret_key,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kvtier gateway")?;
        let out = child.stdout.take().context("gateway stdout")?;
        let host = wait_for(out, "listening on http://", &mut child)?;
        Ok(Self { host, child })
    }

    /// moto's S3 server (`python3 -m moto.server`) on a free loopback port.
    pub fn moto() -> anyhow::Result<Self> {
        let mut child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting python3 -m moto.server (scripts/setup.sh installs moto)")?;
        let err = child.stderr.take().context("moto stderr")?;
        let host = wait_for(err, "Running on http://", &mut child)?;
        Ok(Self { host, child })
    }
}

/// Reads `stream` until a line contains `marker` followed by `IP:PORT`; keeps draining it
/// afterwards so the child never blocks on a full pipe.
fn wait_for(
    stream: impl Read + Send + 'static,
    marker: &'static str,
    child: &mut std::process::Child,
) -> anyhow::Result<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stream).lines();
        let mut sent = false;
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if !sent && let Some((_, rest)) = line.split_once(marker) {
                let host: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                let _ = tx.send(host);
                sent = true;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(host) = rx.recv_timeout(Duration::from_millis(100)) {
            return Ok(host);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the server exited before listening ({status})");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the server did not say where it listens within 60 s");
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
