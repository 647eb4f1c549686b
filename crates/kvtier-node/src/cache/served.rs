//! A `kvtier serve` called from synchronous code: the client and a small runtime of its
//! own that runs each call to completion on the caller's thread.

use std::future::Future;

use kvtier_client::shm::ShmClient;
use kvtier_client::{Client, ClientError, Deadlines};
use kvtier_core::{Error, ErrorKind, Result};

/// A client of one server with the runtime its calls run on.
#[derive(Debug)]
pub(super) struct Served {
    pub(super) client: Client,
    runtime: tokio::runtime::Runtime,
    /// The server's shared arena, when the caller connected to it (loads of whole blocks
    /// and stores go through it; everything else over HTTP).
    pub(super) shm: Option<ShmClient>,
}

impl Served {
    /// A client of the server at `url` (`http://HOST:PORT`), sending `token` when given,
    /// its calls bounded by `deadlines`.
    pub(super) fn connect(
        url: &str,
        token: Option<String>,
        shm: Option<&std::path::Path>,
        deadlines: Deadlines,
    ) -> Result<Self> {
        let mut client = Client::with_deadlines(url, deadlines).map_err(Error::from)?;
        if let Some(token) = token {
            client = client.with_token(token);
        }
        // One worker: it keeps the pooled connections' tasks going between calls, while
        // the calling thread waits in `block_on`.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvtier-client")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(ErrorKind::Internal, "start the client's runtime").with_source(e)
            })?;
        let shm = shm
            .map(|path| ShmClient::connect_with(path, deadlines.transfer))
            .transpose()
            .map_err(Error::from)?;
        Ok(Self {
            client,
            runtime,
            shm,
        })
    }

    /// Runs `call` to completion on this thread.
    pub(super) fn call<T>(&self, call: impl Future<Output = Result<T, ClientError>>) -> Result<T> {
        self.runtime.block_on(call).map_err(Error::from)
    }
}
