//! Who may read the events. They carry every tenant's token ids, so plaintext sockets stay
//! on this host (loopback TCP, `ipc://`, `inproc://`); anything that can reach beyond it
//! needs CURVE, and then only the configured clients' keys pass the handshake — checked by
//! a ZAP handler (ZeroMQ RFC 27) that the sockets' thread answers.

use std::collections::HashSet;
use std::net::IpAddr;

use kvtier_core::{Error, Result};

use crate::config::KvEventsConfig;
use crate::zmq::{self, Context, Socket};

/// The ZAP domain the sockets authenticate in.
pub(crate) const ZAP_DOMAIN: &str = "kvtier-kv-events";

/// Where libzmq looks for the ZAP handler of a context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// Whether a socket at `endpoint` could be reached from (or, connecting, reach) another
/// host. Unknown forms count as reaching beyond: when in doubt, CURVE.
pub(crate) fn beyond_host(endpoint: &str) -> bool {
    if endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://") {
        return false;
    }
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return true;
    };
    // `host:port`, `[v6]:port`, or `interface;host:port` (a source address): the host is
    // what follows the last `;`, before the port.
    let rest = rest.rsplit(';').next().unwrap_or(rest);
    let host = match rest.rsplit_once(':') {
        Some((host, _port)) => host,
        None => return true,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => host != "localhost",
    }
}

/// Refuses a configuration whose sockets would carry plaintext beyond this host.
pub(crate) fn check(config: &KvEventsConfig) -> Result<()> {
    if config.curve.is_some() {
        return Ok(());
    }
    let endpoints = std::iter::once(&config.endpoint).chain(config.replay_endpoint.iter());
    for at in endpoints {
        if beyond_host(at) {
            return Err(Error::invalid(format!(
                "KV events at {at} could be read from another host (or the transport is not \
                 one known to stay on it), and they carry every tenant's token ids: bind a loopback address (tcp://127.0.0.1:PORT) or an \
                 ipc:// path, or configure CURVE (kv_events.curve_secret_key and \
                 kv_events.curve_clients; docs/kv-events.md)"
            )));
        }
    }
    Ok(())
}

/// The ZAP handler: a REP socket bound where libzmq sends a context's authentication
/// requests, and the client keys it lets through.
pub(crate) struct Zap {
    socket: Socket,
    clients: HashSet<[u8; 32]>,
}

impl Zap {
    /// Binds the handler in `ctx` (before any CURVE socket of the context binds or
    /// connects, so no handshake can find it missing).
    pub(crate) fn bind(ctx: &Context, clients: &[[u8; 32]]) -> zmq::ZmqResult<Self> {
        let socket = ctx.socket(zmq::REP)?;
        socket.bind(ZAP_ENDPOINT)?;
        Ok(Self {
            socket,
            clients: clients.iter().copied().collect(),
        })
    }

    /// Answers every waiting request; returns how many were refused.
    pub(crate) fn serve(&self) -> u64 {
        let mut refused = 0;
        while self.socket.readable(0).unwrap_or(false) {
            let Ok(request) = self.socket.recv_multipart(true) else {
                break;
            };
            let (status, text) = self.judge(&request);
            if status != b"200" {
                refused += 1;
            }
            // [version, request id, status, text, user id, metadata]
            let version: &[u8] = b"1.0";
            let id: &[u8] = request.get(1).map_or(&[], Vec::as_slice);
            let reply: [&[u8]; 6] = [version, id, status, text, b"", b""];
            // A REP socket must answer before it can read the next request.
            if self.socket.send_multipart(reply, true).is_err() {
                break;
            }
        }
        refused
    }

    /// RFC 27's request: version, request id, domain, address, routing id, mechanism,
    /// then the credentials (for CURVE, the client's public key).
    fn judge(&self, request: &[Vec<u8>]) -> (&'static [u8], &'static [u8]) {
        match request {
            [version, _id, domain, _address, _routing, mechanism, key]
                if version.as_slice() == b"1.0"
                    && domain.as_slice() == ZAP_DOMAIN.as_bytes()
                    && mechanism.as_slice() == b"CURVE" =>
            {
                match <[u8; 32]>::try_from(key.as_slice()) {
                    Ok(k) if self.clients.contains(&k) => (b"200", b"OK"),
                    _ => (b"400", b"this client's key is not allowed"),
                }
            }
            _ => (b"400", b"not a CURVE request of this publisher"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_endpoints_that_stay_on_this_host_count_as_local() {
        for local in [
            "tcp://127.0.0.1:5557",
            "tcp://127.0.0.1:0",
            "tcp://localhost:5557",
            "tcp://[::1]:5557",
            "tcp://lo;127.0.0.1:5557",
            "ipc:///run/kvtier-events",
            "inproc://events",
        ] {
            assert!(!beyond_host(local), "{local}");
        }
        for beyond in [
            "tcp://*:5557",
            "tcp://0.0.0.0:5557",
            "tcp://10.1.2.3:5557",
            "tcp://[::]:5557",
            "tcp://router.example:5557",
            "tcp://eth0:5557",
            "udp://127.0.0.1:5557",
            "tcp://127.0.0.1",
        ] {
            assert!(beyond_host(beyond), "{beyond}");
        }
    }
}
