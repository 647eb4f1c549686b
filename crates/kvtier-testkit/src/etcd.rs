//! A real etcd cluster for tests: members of Debian's `etcd` binary on free loopback
//! ports, each with its own data directory, started and stopped by the test (never the
//! system's etcd, which the package may have started on 2379).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{Error, Process, Ready, Result, free_port};

/// How long a member may take to accept client connections.
const WITHIN: Duration = Duration::from_secs(30);

/// One member's ports and name.
#[derive(Debug, Clone)]
struct Spec {
    name: String,
    client: u16,
    peer: u16,
}

/// A running etcd cluster; every member is SIGKILLed when dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    specs: Vec<Spec>,
    members: Vec<Option<Process>>,
    initial: String,
    dir: std::path::PathBuf,
    /// Addresses clients may also use besides 127.0.0.1 (a [`crate::Link`]'s outside).
    also: Vec<Ipv4Addr>,
}

impl EtcdCluster {
    /// Starts `n` members with data under `dir` and waits until each accepts clients.
    pub fn start(dir: &Path, n: usize) -> Result<Self> {
        Self::start_also_on(dir, n, &[])
    }

    /// [`EtcdCluster::start`] with every member also taking clients at `also` (the same
    /// port as on 127.0.0.1): for a [`crate::Host`] that reaches them over a link.
    ///
    /// Ports are picked free and then given to etcd, so another process may take one in
    /// between; a member that reports its port taken is not a failure of the test: the
    /// cluster is started again on fresh ports, in a fresh directory (three tries).
    pub fn start_also_on(dir: &Path, n: usize, also: &[Ipv4Addr]) -> Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The first try keeps `dir` itself; a retry may not reuse a half-made member.
            let at = if attempt == 1 {
                dir.to_path_buf()
            } else {
                dir.join(format!("retry{attempt}"))
            };
            match Self::try_start(&at, n, also) {
                Err(Error::NotReady { output, .. }) if attempt < 3 && port_taken(&output) => {}
                other => return other,
            }
        }
    }

    fn try_start(dir: &Path, n: usize, also: &[Ipv4Addr]) -> Result<Self> {
        let mut specs = Vec::new();
        for i in 0..n {
            specs.push(Spec {
                name: format!("m{i}"),
                client: free_port()?,
                peer: free_port()?,
            });
        }
        let initial = specs
            .iter()
            .map(|s| format!("{}=http://127.0.0.1:{}", s.name, s.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            members: (0..n).map(|_| None).collect(),
            specs,
            initial,
            dir: dir.to_path_buf(),
            also: also.to_vec(),
        };
        // All at once: each waits for the others to form a quorum.
        let mut commands = Vec::new();
        for i in 0..n {
            commands.push(cluster.command(i, "new"));
        }
        for (i, cmd) in commands.into_iter().enumerate() {
            let name = format!("etcd {}", cluster.specs[i].name);
            cluster.members[i] = Some(Process::start(name, cmd, Ready::Spawned, WITHIN)?);
        }
        for i in 0..n {
            cluster.await_member(i)?;
        }
        Ok(cluster)
    }

    fn command(&self, i: usize, state: &str) -> Command {
        let s = &self.specs[i];
        let listen: Vec<String> = std::iter::once(Ipv4Addr::LOCALHOST)
            .chain(self.also.iter().copied())
            .map(|ip| format!("http://{ip}:{}", s.client))
            .collect();
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&s.name)
            .arg("--data-dir")
            .arg(self.dir.join(&s.name))
            .arg("--listen-client-urls")
            .arg(listen.join(","))
            .arg("--advertise-client-urls")
            .arg(format!("http://127.0.0.1:{}", s.client))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", s.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{}", s.peer))
            .arg("--initial-cluster")
            .arg(&self.initial)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg("kvtier-test")
            // Quick elections on loopback.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .env("ETCD_UNSUPPORTED_ARCH", "amd64");
        cmd
    }

    /// Waits until member `i` accepts clients; fails at once when any member reports one
    /// of its ports taken (the cluster would never form).
    fn await_member(&self, i: usize) -> Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.specs[i].client));
        let output = |m: &Option<Process>| m.as_ref().map(|p| format!("\n{}", p.stderr()));
        let taken = || {
            self.members
                .iter()
                .filter_map(output)
                .find(|out| port_taken(out))
        };
        let deadline = std::time::Instant::now() + WITHIN;
        let (ended, output) = loop {
            let up = crate::wait_for_port(addr, Duration::from_millis(200));
            // Checked even when the port answers: another process may be what answers.
            if let Some(out) = taken() {
                break ("a port was taken", out);
            }
            if up {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                break (
                    "still running",
                    output(&self.members[i]).unwrap_or_default(),
                );
            }
        };
        Err(Error::NotReady {
            name: format!("etcd {}", self.specs[i].name),
            waited_for: format!("{addr} accepting connections"),
            within: WITHIN,
            ended: ended.into(),
            output,
        })
    }

    /// `etcd://127.0.0.1:A,127.0.0.1:B,…`, as `kvtier serve --cluster` takes it.
    pub fn url(&self) -> String {
        self.url_at(Ipv4Addr::LOCALHOST)
    }

    /// [`EtcdCluster::url`] through `ip`, one of the addresses given to
    /// [`EtcdCluster::start_also_on`].
    pub fn url_at(&self, ip: Ipv4Addr) -> String {
        let list: Vec<String> = self
            .specs
            .iter()
            .map(|s| format!("{ip}:{}", s.client))
            .collect();
        format!("etcd://{}", list.join(","))
    }

    /// The client endpoints, `http://127.0.0.1:PORT`.
    pub fn endpoints(&self) -> Vec<String> {
        self.specs
            .iter()
            .map(|s| format!("http://127.0.0.1:{}", s.client))
            .collect()
    }

    /// SIGKILLs member `i` (its data stays).
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut p) = self.members[i].take() {
            p.kill_hard()?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data, after [`EtcdCluster::kill`].
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let cmd = self.command(i, "existing");
        let name = format!("etcd {}", self.specs[i].name);
        self.members[i] = Some(Process::start(name, cmd, Ready::Spawned, WITHIN)?);
        self.await_member(i)
    }

    /// The index of the member that is raft leader now, asked of every live member
    /// through etcd's JSON gateway (`/v3/maintenance/status`).
    pub fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for (i, spec) in self.specs.iter().enumerate() {
            if self.members[i].is_none() {
                continue;
            }
            let Some(body) = post_json(spec.client, "/v3/maintenance/status") else {
                continue;
            };
            if let Some(id) = json_string(&body, "member_id") {
                ids.push((i, id));
            }
            leader = leader.or_else(|| json_string(&body, "leader"));
        }
        let leader = leader?;
        ids.into_iter()
            .find(|(_, id)| *id == leader)
            .map(|(i, _)| i)
    }
}

/// POSTs `{}` to `path` on the loopback port; the response body.
fn post_json(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// The string value of `"key":"…"` in a flat JSON text (etcd's gateway writes 64-bit ids
/// as strings).
fn json_string(body: &str, key: &str) -> Option<String> {
    let at = body.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let rest = body.get(at..)?;
    rest.find('"').map(|end| rest[..end].to_owned())
}

/// Whether etcd's output says one of its ports was taken (by another process between the
/// test picking it free and etcd binding it).
fn port_taken(output: &str) -> bool {
    output.contains("address already in use")
}
