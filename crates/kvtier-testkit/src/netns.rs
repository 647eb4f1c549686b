//! A second host on this machine: a network namespace of the test's own, joined to the
//! test's namespace by veth links that the test can take down — a partition the kernel
//! makes (packets vanish, connections hang), not one a proxy imitates by closing sockets.
//!
//! Needs root (`ip netns add`, as CI runs). The links use private addresses from
//! 10.213.0.0/16 that exist only between the two namespaces; nothing outside the machine
//! can reach them. The namespace and its links are deleted when the [`Host`] is dropped.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Error, Result};

/// Links made by this process so far: each takes its own /30.
static LINKS: AtomicU32 = AtomicU32::new(0);

/// One veth pair between the test's namespace and the host's.
#[derive(Debug)]
pub struct Link {
    /// The test's end of the link (its interface name).
    outer_if: String,
    /// The address on the test's side: servers the host must reach listen here.
    pub outside: Ipv4Addr,
    /// The address on the host's side: the host's servers listen here.
    pub inside: Ipv4Addr,
}

/// A network namespace with its links; deleted (with its links) when dropped.
#[derive(Debug)]
pub struct Host {
    name: String,
    links: Vec<Link>,
}

impl Host {
    /// Creates a namespace with its loopback up and `links` veth links to the test's
    /// namespace, each up and addressed.
    pub fn create(links: usize) -> Result<Self> {
        let pid = std::process::id();
        let first = LINKS.fetch_add(links as u32, Ordering::SeqCst);
        let name = format!("kvtier-{pid}-{first}");
        ip(&["netns", "add", &name])?;
        let mut host = Self {
            name,
            links: Vec::new(),
        };
        ip(&["-n", &host.name, "link", "set", "lo", "up"])?;
        for k in first..first + links as u32 {
            // A /30 per link: the third octet from the process id, the fourth from the
            // link's number, so concurrent test processes rarely meet (and a clash fails
            // loudly at `ip addr add`, never silently).
            let (third, slot) = ((pid % 251) as u8, (k % 64) as u8);
            let outside = Ipv4Addr::new(10, 213, third, slot * 4 + 1);
            let inside = Ipv4Addr::new(10, 213, third, slot * 4 + 2);
            let (outer_if, inner_if) = (format!("kvo{pid}x{k}"), format!("kvi{pid}x{k}"));
            ip(&[
                "link", "add", &outer_if, "type", "veth", "peer", "name", &inner_if, "netns",
                &host.name,
            ])?;
            host.links.push(Link {
                outer_if: outer_if.clone(),
                outside,
                inside,
            });
            ip(&["addr", "add", &format!("{outside}/30"), "dev", &outer_if])?;
            ip(&["link", "set", &outer_if, "up"])?;
            let n = &host.name;
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("{inside}/30"),
                "dev",
                &inner_if,
            ])?;
            ip(&["-n", n, "link", "set", &inner_if, "up"])?;
        }
        Ok(host)
    }

    /// Link `i`.
    pub fn link(&self, i: usize) -> &Link {
        &self.links[i]
    }

    /// A command that runs `program` inside the namespace (`ip netns exec` execs it, so
    /// the child's PID is the program's own and killing it by PID kills the program).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Takes link `i` down: packets between the namespaces over it are dropped from now
    /// on, and open connections hang rather than close.
    pub fn cut(&self, i: usize) -> Result<()> {
        ip(&["link", "set", &self.links[i].outer_if, "down"])
    }

    /// Brings link `i` up again.
    pub fn heal(&self, i: usize) -> Result<()> {
        ip(&["link", "set", &self.links[i].outer_if, "up"])
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Deleting the namespace deletes the inner ends, and with them the pairs.
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// Runs `ip ARGS`; an error with what it printed unless it succeeds.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::io("cannot run `ip` (Debian's iproute2)", e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::io(
        format!(
            "`ip {}` failed (network namespaces need root): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        std::io::Error::other(crate::error::describe(out.status)),
    ))
}
