//! A real `kvtier serve` process on an ephemeral loopback port, for the server tests.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test code: a failed expectation is a failed test; not every test uses every helper"
)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use kvtier_client::Client;
use kvtier_client::wire::{LayoutInfo, LayoutSpec, PromptSpec};
use kvtier_core::{KvDtype, LayoutKey};
use kvtier_testkit::{Process, Ready};

/// The admin token the helpers start servers with.
pub const ADMIN: &str = "admin-token-for-tests-0001";

/// How long a server may take to listen, and to stop after SIGTERM.
const WITHIN: Duration = Duration::from_secs(60);

/// A running server; killed (SIGKILL) when dropped unless stopped before.
pub struct Server {
    process: Process,
    /// `http://ADDRESS:PORT` (127.0.0.1 unless started in a namespace).
    pub url: String,
}

impl Server {
    /// Starts `kvtier serve` on `data_dir` with `extra` arguments and waits until it
    /// listens.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let cmd = Command::new(env!("CARGO_BIN_EXE_kvtier"));
        Self::launch(cmd, &["--listen", "127.0.0.1:0"], data_dir, extra)
    }

    /// [`Server::start`] under the open-file limits `soft` and `hard` (see
    /// `kvtier_testkit::with_nofile_limit`).
    pub fn start_with_nofile(data_dir: &Path, soft: u64, hard: u64, extra: &[&str]) -> Server {
        let cmd = kvtier_testkit::with_nofile_limit(env!("CARGO_BIN_EXE_kvtier"), soft, hard);
        Self::launch(cmd, &["--listen", "127.0.0.1:0"], data_dir, extra)
    }

    /// [`Server::start`] inside the network namespace `host`, listening on the inside
    /// address of its link `link` (the test reaches it over that link).
    pub fn start_in(
        host: &kvtier_testkit::Host,
        link: usize,
        data_dir: &Path,
        extra: &[&str],
    ) -> Server {
        let cmd = host.command(env!("CARGO_BIN_EXE_kvtier"));
        let listen = format!("{}:0", host.link(link).inside);
        // Not a loopback address, but only the test's namespace reaches it.
        let listen = ["--listen", &listen, "--allow-insecure-listen"];
        Self::launch(cmd, &listen, data_dir, extra)
    }

    /// Runs `serve` with the `listen` flags through `cmd` (the program, or a command
    /// that runs it).
    fn launch(mut cmd: Command, listen: &[&str], data_dir: &Path, extra: &[&str]) -> Server {
        cmd.arg("serve").args(listen);
        // Test defaults, unless the test sets them: a small RAM, no free-space watermark
        // (the test machine's disk may be nearly full). A `--set` in `extra` comes after
        // this one and wins.
        if !extra.contains(&"--ram") {
            cmd.args(["--ram", "256MiB"]);
        }
        cmd.args(["--set", "ssd.min_free=0"]);
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args(["--admin-token", ADMIN])
            .args(extra)
            .env_remove("KVTIER_CONFIG");
        let process = Process::start(
            "kvtier serve",
            cmd,
            Ready::StdoutLine("kvtier serve: listening on ".into()),
            WITHIN,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let url = process.announced().to_owned();
        Server { process, url }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Everything it logged (stderr) so far.
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client without tokens.
    pub fn client(&self) -> Client {
        Client::new(&self.url).unwrap()
    }

    /// A client sending the admin token.
    pub fn admin(&self) -> Client {
        self.client().with_token(ADMIN)
    }

    /// Sends SIGTERM and waits (at most 60 s) for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.process
            .terminate(WITHIN)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGKILL, now.
    pub fn kill9(mut self) {
        self.process.kill_hard().unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A small layout: 16 tokens per block, 1 KiB per block... scaled by `layers`.
pub fn layout_spec(model: &str, layers: u32) -> LayoutSpec {
    let mut key = LayoutKey::new(model, KvDtype::F16, 16, layers, 2, 64);
    key.weights_digest = "w1".into();
    key.tokenizer_digest = "t1".into();
    LayoutSpec::of_key(&key, None)
}

/// A prompt of `blocks` whole blocks, distinct per `seed`.
pub fn prompt(layout: &LayoutInfo, seed: u32, blocks: usize) -> PromptSpec {
    PromptSpec::new(
        layout.layout.clone(),
        (0..blocks as u32 * layout.tokens_per_block)
            .map(|t| seed.wrapping_mul(1_000_003).wrapping_add(t))
            .collect(),
    )
}

/// The bytes block `i` of prompt `seed` must hold: any mix-up shows.
pub fn payload(layout: &LayoutInfo, seed: u32, i: usize) -> Bytes {
    let mut x = (seed as u64) << 32 | i as u64 | 1;
    (0..layout.block_bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Every payload of prompt `seed`.
pub fn payloads(layout: &LayoutInfo, seed: u32, blocks: usize) -> Vec<Bytes> {
    (0..blocks).map(|i| payload(layout, seed, i)).collect()
}

/// Loads every block a lookup matched (all layers), which must succeed.
pub async fn load_all(
    c: &Client,
    layout: &LayoutInfo,
    hit: &kvtier_client::wire::LookupAnswer,
) -> kvtier_client::LoadedPrefix {
    c.load(&kvtier_client::wire::LoadRequest {
        layout: layout.layout.clone(),
        handles: hit.handles.clone(),
        layers: None,
        chains: None,
    })
    .await
    .expect("load")
}

/// A runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The status and code of an error answer; anything else fails the test.
pub fn api_error(e: kvtier_client::ClientError) -> (u16, String) {
    match e {
        kvtier_client::ClientError::Api { status, code, .. } => (status, code),
        other => panic!("expected an error answer, got {other:?}"),
    }
}
