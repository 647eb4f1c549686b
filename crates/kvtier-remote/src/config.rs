//! Settings of the remote tier.

use std::time::Duration;

/// One S3-compatible place to keep objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://host:port` or `https://host:port` (AWS: `https://s3.REGION.amazonaws.com`).
    pub url: String,
    /// The bucket.
    pub bucket: String,
    /// Region for the signature (default `us-east-1`).
    pub region: String,
    /// Access key; `None` takes `AWS_ACCESS_KEY_ID` from the environment.
    pub access_key: Option<String>,
    /// Secret key; `None` takes `AWS_SECRET_ACCESS_KEY` from the environment.
    pub secret_key: Option<String>,
    /// Send requests unsigned (a gateway in `--auth none` mode).
    pub unsigned: bool,
}

impl Endpoint {
    /// `bucket` at `url`, region `us-east-1`, credentials from the environment.
    pub fn new(url: impl Into<String>, bucket: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            bucket: bucket.into(),
            region: "us-east-1".into(),
            access_key: None,
            secret_key: None,
            unsigned: false,
        }
    }

    /// With these credentials.
    pub fn with_credentials(mut self, access_key: &str, secret_key: &str) -> Self {
        self.access_key = Some(access_key.into());
        self.secret_key = Some(secret_key.into());
        self
    }

    /// The placement identity: URL and bucket.
    pub fn id(&self) -> String {
        format!("{}/{}", self.url.trim_end_matches('/'), self.bucket)
    }

    /// Whether `id` is this endpoint's [`Self::id`] (without building it: a follower
    /// asks once per record it receives).
    pub fn has_id(&self, id: &str) -> bool {
        id.strip_suffix(self.bucket.as_str())
            .and_then(|rest| rest.strip_suffix('/'))
            .is_some_and(|url| url == self.url.trim_end_matches('/'))
    }
}

/// Settings of a [`crate::RemoteTier`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Where objects go, by rendezvous hashing of their names (at least one).
    pub endpoints: Vec<Endpoint>,
    /// Name prefix of every object (default `kv`); tiers with other prefixes never see
    /// each other's objects.
    pub prefix: String,
    /// Longest time one tier call may take, retries included (default 2 s). Past it the
    /// call is a miss (a load) or a failed write (counted); nothing waits longer.
    pub deadline: Duration,
    /// Retries of a failed request (5xx, reset, timeout) within the deadline (default 3).
    pub retries: usize,
    /// Most blocks in one run object (default 1,024).
    pub max_run_blocks: usize,
    /// The cluster's signing key (`crate::sign`): with one, every object the tier writes
    /// is signed, and an object that is not signed with it — manifest, block or state — is
    /// never served (a miss, counted as `remote_forged`). Every replica sharing the bucket
    /// needs the same key.
    pub signing_key: Option<crate::SigningKey>,
    /// How block payloads and states are written (default raw; ADR 0021). Each manifest
    /// and state object says how its bytes were written, so this may change between
    /// runs and differ between replicas sharing a bucket.
    pub codec: kvtier_codec::CodecConfig,
}

impl RemoteConfig {
    /// Defaults over `endpoints`.
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        Self {
            endpoints,
            prefix: "kv".into(),
            deadline: Duration::from_secs(2),
            retries: 3,
            max_run_blocks: 1024,
            signing_key: None,
            codec: kvtier_codec::CodecConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    /// `has_id` says yes exactly to the id `id()` builds, however the URL ends.
    #[test]
    fn has_id_matches_id_and_nothing_else() {
        for url in [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
            "http://s3//",
        ] {
            let e = Endpoint::new(url, "kv");
            assert!(e.has_id(&e.id()), "{url}");
            for other in [
                format!("{}x", e.id()),
                format!("{}1/kv", url.trim_end_matches('/')),
                format!("{}kv", url.trim_end_matches('/')),
                format!("{}/kv", url.trim_end_matches('/')).replace("kv", "kvv"),
                "kv".to_string(),
                "/kv".to_string(),
            ] {
                assert!(!e.has_id(&other), "{url} vs {other}");
            }
        }
    }
}
