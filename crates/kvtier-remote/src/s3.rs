//! The S3 client: building object_store's client for an endpoint, and the bridge that
//! runs one of its requests on the tier's runtime and waits for it within the deadline —
//! a miss, never a hang, whatever the endpoint does. What a call came to is a [`Fetch`].
//! And the one check a node may make before it starts: [`check_reachable`].

use std::future::Future;
use std::time::Duration;

use kvtier_core::tier::ShortRead;
use kvtier_core::{Error, ErrorKind, Result};
use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::config::RemoteConfig;
use crate::runtime::IoRuntime;

/// What one remote call came to.
pub(crate) enum Fetch<T> {
    Got(T),
    /// 404: the object is gone.
    Gone,
    /// Failed after retries, or the deadline passed.
    Failed(CallError),
}

impl<T> Fetch<T> {
    /// The answer, changed by `f` if there is one.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Fetch<U> {
        match self {
            Self::Got(v) => Fetch::Got(f(v)),
            Self::Gone => Fetch::Gone,
            Self::Failed(e) => Fetch::Failed(e),
        }
    }
}

/// Why a remote call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The object store answered with an error (after its retries).
    #[error(transparent)]
    Store(object_store::Error),
    /// A direct read failed (after its retries).
    #[error(transparent)]
    Direct(crate::http1::DirectError),
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Deadline(Duration),
}

impl CallError {
    /// How a read that failed this way shows in the engine's hit accounting: as a read
    /// past its deadline when it ran out of time (the tier's own deadline, or a socket
    /// read that timed out), as a failed read otherwise.
    pub(crate) fn short_read(&self) -> ShortRead {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match self {
            CallError::Deadline(_) => return ShortRead::Deadline,
            CallError::Store(e) => Some(e),
            CallError::Direct(e) => Some(e),
        };
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            {
                return ShortRead::Deadline;
            }
            cause = e.source();
        }
        ShortRead::Failed
    }
}

/// Runs `fut` on `runtime` and waits at most `deadline` (plus a margin for the runtime's
/// own scheduling); safe to call from any thread, async or not.
pub(crate) fn call_within<T: Send + 'static>(
    runtime: &IoRuntime,
    deadline: Duration,
    fut: impl Future<Output = object_store::Result<T>> + Send + 'static,
) -> Fetch<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.handle().spawn(async move {
        let out = match tokio::time::timeout(deadline, fut).await {
            Ok(Ok(v)) => Fetch::Got(v),
            Ok(Err(object_store::Error::NotFound { .. })) => Fetch::Gone,
            Ok(Err(e)) => Fetch::Failed(CallError::Store(e)),
            Err(_) => Fetch::Failed(CallError::Deadline(deadline)),
        };
        let _ = tx.send(out);
    });
    rx.recv_timeout(deadline + Duration::from_millis(250))
        .unwrap_or_else(|_| Fetch::Failed(CallError::Deadline(deadline)))
}

pub(crate) fn build_store(
    e: &crate::config::Endpoint,
    config: &RemoteConfig,
) -> Result<object_store::aws::AmazonS3> {
    let mut b = AmazonS3Builder::from_env()
        .with_endpoint(e.url.trim_end_matches('/'))
        .with_bucket_name(&e.bucket)
        .with_region(&e.region)
        .with_virtual_hosted_style_request(false)
        .with_skip_signature(e.unsigned)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(20),
                max_backoff: config.deadline / 4,
                base: 2.0,
            },
            max_retries: config.retries,
            retry_timeout: config.deadline,
        })
        .with_client_options(
            // Client options replace the builder's: allow_http must be set here.
            ClientOptions::new()
                .with_allow_http(e.url.starts_with("http://"))
                .with_timeout(config.deadline)
                .with_connect_timeout(config.deadline.min(Duration::from_secs(1))),
        );
    if let Some(k) = &e.access_key {
        b = b.with_access_key_id(k);
    }
    if let Some(s) = &e.secret_key {
        b = b.with_secret_access_key(s);
    }
    b.build()
        .map_err(|err| Error::invalid(format!("remote endpoint {}", e.id())).with_source(err))
}

/// Whether every endpoint of `config` lists its bucket under the prefix (one page),
/// within the deadline. `Unavailable`, naming the first endpoint that does not and with
/// the call's error as the source: no answer in time, a refused connection, or an error
/// answer (a missing bucket, credentials it refuses); `Invalid` if an endpoint's client
/// cannot be built. The tier itself never needs this: it starts without an endpoint that
/// does not answer. A node calls it before opening anything when its settings require
/// the remote tier.
pub fn check_reachable(config: &RemoteConfig, runtime: &IoRuntime) -> Result<()> {
    for e in &config.endpoints {
        let store = build_store(e, config)?;
        let prefix = object_store::path::Path::from(config.prefix.as_str());
        let listed = call_within(runtime, config.deadline, async move {
            store.list_with_delimiter(Some(&prefix)).await.map(|_| ())
        });
        let unlisted = |what: String| {
            Error::new(
                ErrorKind::Unavailable,
                format!("remote endpoint `{}` did not list its bucket{what}", e.id()),
            )
        };
        match listed {
            Fetch::Got(()) => {}
            // A listing is never 404 for a bucket that exists (an empty prefix lists
            // nothing): the bucket is missing.
            Fetch::Gone => return Err(unlisted(": no such bucket".into())),
            Fetch::Failed(why) => return Err(unlisted(String::new()).with_source(why)),
        }
    }
    Ok(())
}
