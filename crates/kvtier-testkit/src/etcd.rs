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
    /// Clients speak TLS and must present a certificate of this authority.
    tls: Option<TlsFiles>,
}

/// A certificate authority made for one test, and certificates it signed: the server's
/// (for `127.0.0.1`), a client's, and a client certificate of another authority (one a
/// server of this authority must refuse). PEM files, made by the `openssl` command.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The authority's certificate.
    pub ca: std::path::PathBuf,
    /// The server's certificate and key.
    pub server_cert: std::path::PathBuf,
    /// The server's key.
    pub server_key: std::path::PathBuf,
    /// A client's certificate, signed by [`TlsFiles::ca`].
    pub client_cert: std::path::PathBuf,
    /// Its key.
    pub client_key: std::path::PathBuf,
    /// A client certificate signed by another authority.
    pub stranger_cert: std::path::PathBuf,
    /// Its key.
    pub stranger_key: std::path::PathBuf,
}

impl TlsFiles {
    /// Makes the files under `dir` (created), keys EC P-256, valid for a day.
    pub fn generate(dir: &Path) -> Result<Self> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| Error::io(what, e)
        };
        std::fs::create_dir_all(dir).map_err(io("create the certificates' directory"))?;
        let p = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| -> Result<()> {
            let context = format!("openssl {}", args.join(" "));
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .map_err(io(&context))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(Error::Tool {
                    context,
                    output: String::from_utf8_lossy(&out.stderr).into_owned(),
                })
            }
        };
        let key = |name: &str| {
            openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                name,
            ])
        };
        for (ca, subject) in [("ca", "/CN=kvtier test CA"), ("other-ca", "/CN=another CA")] {
            key(&format!("{ca}.key"))?;
            openssl(&[
                "req",
                "-x509",
                "-new",
                "-key",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-days",
                "1",
                "-subj",
                subject,
            ])?;
        }
        std::fs::write(
            p("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(io("write server.ext"))?;
        std::fs::write(p("client.ext"), "extendedKeyUsage=clientAuth\n")
            .map_err(io("write client.ext"))?;
        for (name, ca, ext, subject) in [
            ("server", "ca", "server.ext", "/CN=127.0.0.1"),
            ("client", "ca", "client.ext", "/CN=root"),
            ("stranger", "other-ca", "client.ext", "/CN=root"),
        ] {
            key(&format!("{name}.key"))?;
            openssl(&[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                subject,
            ])?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "1",
                "-extfile",
                ext,
            ])?;
        }
        Ok(Self {
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            stranger_cert: p("stranger.pem"),
            stranger_key: p("stranger.key"),
        })
    }
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
        Self::start_with(dir, n, also, None)
    }

    /// [`EtcdCluster::start`] serving clients over TLS only, with certificates of
    /// `tls`'s authority required of every client (`--client-cert-auth`).
    pub fn start_tls(dir: &Path, n: usize, tls: &TlsFiles) -> Result<Self> {
        Self::start_with(dir, n, &[], Some(tls))
    }

    fn start_with(dir: &Path, n: usize, also: &[Ipv4Addr], tls: Option<&TlsFiles>) -> Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The first try keeps `dir` itself; a retry may not reuse a half-made member.
            let at = if attempt == 1 {
                dir.to_path_buf()
            } else {
                dir.join(format!("retry{attempt}"))
            };
            match Self::try_start(&at, n, also, tls) {
                Err(Error::NotReady { output, .. }) if attempt < 3 && port_taken(&output) => {}
                other => return other,
            }
        }
    }

    fn try_start(dir: &Path, n: usize, also: &[Ipv4Addr], tls: Option<&TlsFiles>) -> Result<Self> {
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
            tls: tls.cloned(),
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
        let scheme = self.scheme();
        let listen: Vec<String> = std::iter::once(Ipv4Addr::LOCALHOST)
            .chain(self.also.iter().copied())
            .map(|ip| format!("{scheme}://{ip}:{}", s.client))
            .collect();
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&s.name)
            .arg("--data-dir")
            .arg(self.dir.join(&s.name))
            .arg("--listen-client-urls")
            .arg(listen.join(","))
            .arg("--advertise-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", s.client))
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
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
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

    /// `https` when the members serve clients over TLS, else `http`.
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The client endpoints, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.specs
            .iter()
            .map(|s| format!("{}://127.0.0.1:{}", self.scheme(), s.client))
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
