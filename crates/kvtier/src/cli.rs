//! Command-line parsing and dispatch.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// kvtier: a tiered, persistent, shareable KV-cache store for LLM inference.
///
/// It keeps KV blocks (and recurrent-state snapshots) in host RAM, and answers "how much of
/// this prompt is already computed?" from memory alone.
#[derive(Debug, Parser)]
#[command(name = "kvtier", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run kvtier as a daemon: RAM + SSD under a data directory, with the network API,
    /// Prometheus metrics, health and the admin control plane (docs/API.md). Settings come
    /// from defaults, then --config FILE, then the environment, then the flags below, then
    /// --set; every setting and its default is listed at the end of --help.
    Serve(Box<kvtier_node::ServeArgs>),
    /// Serve an S3-compatible object store (kvtier's shared data plane) from a local
    /// directory: buckets, PUT/GET with ranges, listings, multipart, SigV4
    /// (docs/gateway.md). Prints `listening on http://ADDR`; stops on SIGINT/SIGTERM.
    Gateway(kvtier_gateway::cli::GatewayArgs),
    /// Measure kvtier against the machine's physical baselines (memcpy, a plain hash, a plain
    /// hash map) in the same run, and print every figure beside its baseline and the ratio.
    Bench(BenchArgs),
    /// Run real models (Gemma 3 270M, a Mamba) on a multi-turn chat workload cold, from
    /// RAM, after a process restart (SSD) and through `kvtier serve`; print TTFT, hit
    /// rates and bytes moved, and draw them as a PNG. Needs the `models` feature:
    /// `cargo run --release -p kvtier --features models -- demo`.
    Demo(crate::demo::DemoArgs),
    /// Demo helper: the restarted process of `kvtier demo`.
    #[command(name = "__demo-restarted", hide = true)]
    DemoRestarted(crate::demo::RestartedArgs),
    /// Operate a cluster of replicas sharing a cache through etcd: `status`, `reconcile`
    /// (docs/cluster.md).
    Cluster(crate::cluster::ClusterArgs),
    /// Print the version of kvtier and of the formats it reads and writes.
    Version,
    /// Make the keys a deployment needs, printed TOML-ready: a CURVE key pair for the
    /// KV-event sockets (docs/kv-events.md; the secret key goes into the server's
    /// `kv_events.curve_secret_key`, the public key to the other side, in Z85), and a
    /// cluster signing key (`remote.signing_key`, the same on every replica; hex).
    Keys,
    /// Show what an SSD store holds per namespace; `--verify` checks every checksum.
    Inspect(crate::inspect::InspectArgs),
    /// Test helper: store blocks until killed (used by the crash tests).
    #[command(name = "__crash-writer", hide = true)]
    CrashWriter(crate::crash_writer::CrashWriterArgs),
}

/// Options of `kvtier bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Run fewer, smaller samples: a smoke run, as CI does (about a minute on a 2-core
    /// machine). Default: off (the full run takes 3x the samples on up to 4x the data).
    /// Either way each group is announced on stderr as it starts, and a group running
    /// longer than 5 s says every 5 s which row it is on.
    #[arg(long)]
    pub quick: bool,

    /// Also write the rows as a JSON array of {"name","value","unit","baseline","ratio"}
    /// objects to FILE (plus `"paired": true` where the ratio is the median of per-sample
    /// ratios). Default: no file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Run only the rows whose name contains this text (e.g. `ram.load`).
    /// Default: every row.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,

    /// Directory for the SSD rows' stores and raw files (removed afterwards); put it on
    /// the disk you want measured. Default: a new directory in the system temp dir.
    #[arg(long, value_name = "DIR")]
    pub ssd_dir: Option<std::path::PathBuf>,

    /// MiB each SSD store and load row writes and reads per sample. Where reads are held
    /// to a rate by a throttle (`scripts/slow-disk.sh`), runs must be long against the
    /// throttle's time slice to measure the rate rather than the slice: BENCHMARKS.md
    /// uses 1024 there. Default: 256, 64 with --quick.
    #[arg(long, value_name = "MIB")]
    pub ssd_mib: Option<usize>,

    /// Also run the `model.*` rows: real models (Gemma 3 270M, a Mamba) with a 2,048-token
    /// cached prefix against a cold prefill. Needs the `models` feature; takes minutes
    /// (one cold Gemma prefill is about 20 s here). Default: off.
    #[arg(long)]
    pub models: bool,

    /// `kvtier bench s3 --endpoint URL --bucket B`: load any S3 endpoint instead.
    #[command(subcommand)]
    pub target: Option<BenchTarget>,

    /// Blocks in the store the recovery row reopens (8 KiB of disk each).
    /// Default: 25,000 with --quick, 100,000 otherwise; the 1M row extrapolates from it.
    #[arg(long, value_name = "N")]
    pub recover_blocks: Option<usize>,
}

/// What `kvtier bench` measures instead of its own rows.
#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// Stress an S3 endpoint (seed 001 §15): preload objects with PUT, then ranged GETs
    /// of their leading bytes from C concurrent clients for a bounded count; prints
    /// p50/p99 latency, ops/s and the clients' CPU.
    S3(crate::bench::S3BenchArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Gateway(args) => {
            kvtier_gateway::cli::init_logging();
            kvtier_gateway::cli::run(&args).map_err(anyhow::Error::msg)
        }
        Command::Bench(args) => crate::bench::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
        Command::DemoRestarted(args) => crate::demo::run_restarted(&args),
        Command::CrashWriter(args) => crate::crash_writer::run(&args),
        Command::Inspect(args) => crate::inspect::run(&args),
        Command::Cluster(args) => crate::cluster::run(&args),
        Command::Keys => {
            let pair = kvtier_events::zmq::CurveKeyPair::generate()
                .map_err(|e| anyhow::anyhow!("cannot make a CURVE key pair: {e}"))?;
            println!(
                "public_key = \"{}\"",
                kvtier_events::zmq::z85_encode(&pair.public)
            );
            println!(
                "secret_key = \"{}\"",
                kvtier_events::zmq::z85_encode(&pair.secret)
            );
            let mut signing = [0u8; 32];
            std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut signing)?;
            println!("signing_key = \"{}\"", kvtier_core::hash::hex(&signing));
            Ok(())
        }
        Command::Version => {
            println!("kvtier {}", env!("CARGO_PKG_VERSION"));
            println!(
                "layout key schema v{}",
                kvtier_core::layout::LAYOUT_SCHEMA_VERSION
            );
            println!("block hash chain v1 (SHA-256 compression, 128-bit keys)");
            println!("SSD store format v{}", kvtier_ssd::format::FORMAT_VERSION);
            Ok(())
        }
    }
}

fn serve(args: &kvtier_node::ServeArgs) -> anyhow::Result<()> {
    let settings = args.settings().map_err(anyhow::Error::msg)?;
    if args.print_config {
        print!(
            "{}",
            settings.to_toml_redacted().map_err(anyhow::Error::msg)?
        );
        return Ok(());
    }
    crate::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.worker_threads())
        .enable_all()
        .thread_name("kvtier-serve")
        .build()?;
    let stopped = runtime
        .block_on(kvtier_server::run(settings))
        .map_err(anyhow::Error::msg)?;
    if stopped.requests_finished && stopped.writer_clean {
        Ok(())
    } else {
        anyhow::bail!("shutdown was not clean: {stopped:?}")
    }
}
