//! Cluster settings.

use std::collections::BTreeMap;
use std::time::Duration;

use kvtier_core::Error;

use crate::record::Priority;

/// The user and password etcd asks for when its authentication is on.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS to etcd: the authority whose certificates the members must show, and the
/// replica's own certificate when the members ask clients for one
/// (`--client-cert-auth`). PEM bytes, read at start.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The authority's certificate(s).
    pub ca: Vec<u8>,
    /// The replica's certificate and its key, if it shows one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_bytes", &self.ca.len())
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// How a replica reaches etcd: in plain TCP or TLS, anonymously or as a user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// etcd's user and password, when its authentication is on.
    pub auth: Option<EtcdAuth>,
    /// TLS, when the members serve clients over it (the endpoints become `https://`).
    pub tls: Option<EtcdTls>,
}

/// How a replica joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// How to reach etcd: TLS, and a user and password.
    pub access: EtcdAccess,
    /// The cluster's signing key: records are signed with it and only records signed
    /// with it are used (`crate::signed`). The remote tier's objects are signed with the
    /// same key (`kvtier_remote::RemoteConfig::signing_key`).
    pub signing_key: Option<kvtier_remote::SigningKey>,
    /// The cluster's name: every key lives under `kvtier/<name>/`.
    pub name: String,
    /// This replica's id (`[a-z0-9_-]`, stable across restarts: ownership follows it).
    pub replica: String,
    /// TTL of the member lease: how long after its last renewal a silent replica counts as
    /// gone (and can no longer publish or delete under its generation).
    pub lease_ttl: Duration,
    /// Advertisements waiting to be published; a full queue drops (counted) and
    /// `kvtier cluster reconcile` re-advertises what was dropped.
    pub queue: usize,
    /// Namespace written into advertisements (budgets are per namespace).
    pub namespace: String,
    /// Priority written into advertisements: [`Priority::Pinned`] for a replica that
    /// stores shared prefixes (system prompts) no budget may delete.
    pub priority: Priority,
    /// How long a withdrawn object stays in the store before it is deleted: longer than
    /// a withdrawal takes to reach every replica plus the remote read deadline, so a read
    /// that started before the withdrawal finishes before the delete.
    pub gc_grace: Duration,
    /// Whether this replica stands for GC leader.
    pub gc_leader: bool,
    /// TTL of the GC leader's lease: how long a dead leader blocks GC.
    pub leader_ttl: Duration,
    /// How often the GC leader sweeps (due tombstones, orphans, budgets).
    pub gc_interval: Duration,
    /// How long an object's owner must have been gone (no member key) before the leader
    /// reclaims the object as an orphan.
    pub orphan_after: Duration,
    /// Byte budget of the shared tier per namespace; a namespace without one is unbounded.
    pub budgets: BTreeMap<String, u64>,
    /// Test hook: each watch response is applied this much later, as by a slow consumer
    /// (also `KVTIER_TEST_WATCH_DELAY_MS` in the environment). Zero in production.
    pub watch_delay: Duration,
}

impl ClusterConfig {
    /// A cluster `name` on `endpoints`, this replica being `replica`, with defaults.
    pub fn new(endpoints: Vec<String>, name: &str, replica: &str) -> Self {
        Self {
            endpoints,
            access: EtcdAccess::default(),
            signing_key: None,
            name: name.to_string(),
            replica: replica.to_string(),
            lease_ttl: Duration::from_secs(10),
            queue: 16_384,
            namespace: crate::record::DEFAULT_NAMESPACE.into(),
            priority: Priority::Normal,
            gc_grace: Duration::from_secs(30),
            gc_leader: true,
            leader_ttl: Duration::from_secs(5),
            gc_interval: Duration::from_secs(5),
            orphan_after: Duration::from_secs(3600),
            budgets: BTreeMap::new(),
            watch_delay: Duration::ZERO,
        }
    }

    /// Why the settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid(
                "cluster mode needs at least one etcd endpoint",
            ));
        }
        let plain = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        };
        if !plain(&self.replica) {
            return Err(Error::invalid(format!(
                "replica id `{}` must be 1 to 64 characters of [a-z0-9_-]",
                self.replica
            )));
        }
        if self.replica == crate::record::UNOWNED {
            return Err(Error::invalid(format!(
                "replica id `{}` is reserved for objects whose writer is unknown",
                self.replica
            )));
        }
        if !plain(&self.name) {
            return Err(Error::invalid(format!(
                "cluster name `{}` must be 1 to 64 characters of [a-z0-9_-]",
                self.name
            )));
        }
        if self.lease_ttl < Duration::from_secs(2) || self.leader_ttl < Duration::from_secs(2) {
            return Err(Error::invalid(
                "the member and leader leases must be at least 2 s",
            ));
        }
        if self.gc_interval.is_zero() {
            return Err(Error::invalid("the GC interval must be more than 0"));
        }
        if !plain(&self.namespace) {
            return Err(Error::invalid(format!(
                "namespace `{}` must be 1 to 64 characters of [a-z0-9_-]",
                self.namespace
            )));
        }
        Ok(())
    }
}

/// `etcd://host:port,host:port` (or a plain comma-separated list of `host:port` or
/// `http://host:port`) → etcd endpoint URLs.
pub fn parse_endpoints(spec: &str) -> Result<Vec<String>, Error> {
    let list = spec.strip_prefix("etcd://").unwrap_or(spec);
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let hostport = part
            .strip_prefix("http://")
            .unwrap_or(part)
            .trim_end_matches('/');
        if hostport.starts_with("https://") || !hostport.contains(':') || hostport.contains('/') {
            return Err(Error::invalid(format!("`{part}` is not host:port")));
        }
        out.push(format!("http://{hostport}"));
    }
    if out.is_empty() {
        return Err(Error::invalid(format!("no etcd endpoint in `{spec}`")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_from_an_etcd_url_list() {
        assert_eq!(
            parse_endpoints("etcd://a:1,b:2"),
            Ok(vec!["http://a:1".to_string(), "http://b:2".to_string()])
        );
        assert!(parse_endpoints("etcd://").is_err());
        assert!(parse_endpoints("etcd://a").is_err());
    }

    #[test]
    fn replica_ids_are_plain_names() {
        let mut c = ClusterConfig::new(vec!["http://a:1".into()], "c", "r-1");
        assert!(c.check().is_ok());
        c.replica = "R.1".into();
        assert!(c.check().is_err());
        c.replica = crate::record::UNOWNED.into();
        assert!(
            c.check().is_err(),
            "a replica took the id of unknown writers"
        );
    }
}
