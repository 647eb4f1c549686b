//! `kvtier gateway`: flags, and running until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;

use kvtier_ssd::Durability;

use crate::serve::{Auth, GatewayConfig, RunningGateway};

/// When a PUT is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    /// After the record and its index entry are synced (`fdatasync`).
    Fsync,
    /// Once written to the page cache (survives a killed process, not a power loss).
    BestEffort,
}

/// How requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthArg {
    /// AWS SigV4 with --access-key/--secret-key (header or presigned).
    Sigv4,
    /// None: every request allowed. Only on a loopback address, for local tests.
    None,
}

/// Options of `kvtier gateway`.
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Directory of the object store (created if missing; locked while serving).
    #[arg(
        long,
        env = "KVTIER_GATEWAY_DIR",
        default_value = "kvtier-gateway-data"
    )]
    pub dir: PathBuf,

    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, env = "KVTIER_GATEWAY_LISTEN", default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,

    /// Authentication: `sigv4` (required off loopback) or `none`.
    /// Default: sigv4 when an access key is set, none otherwise.
    #[arg(long, value_enum)]
    pub auth: Option<AuthArg>,

    /// Access key id accepted with SigV4.
    #[arg(long, env = "KVTIER_GATEWAY_ACCESS_KEY")]
    pub access_key: Option<String>,

    /// Secret key of that access key.
    #[arg(long, env = "KVTIER_GATEWAY_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,

    /// When a PUT is acknowledged.
    #[arg(long, value_enum, default_value = "fsync")]
    pub durability: DurabilityArg,

    /// Worker threads. Default: one per core.
    #[arg(long)]
    pub workers: Option<usize>,

    /// Create this bucket at start if it does not exist (repeatable).
    /// Default: none.
    #[arg(long, value_name = "NAME")]
    pub create_bucket: Vec<String>,
}

impl GatewayArgs {
    /// The configuration these flags describe.
    pub fn config(&self) -> Result<GatewayConfig, String> {
        let mut config = GatewayConfig::new(self.dir.clone());
        config.listen = self.listen;
        let auth = self.auth.unwrap_or(if self.access_key.is_some() {
            AuthArg::Sigv4
        } else {
            AuthArg::None
        });
        config.auth = match auth {
            AuthArg::None => Auth::None,
            AuthArg::Sigv4 => match (&self.access_key, &self.secret_key) {
                (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => Auth::SigV4 {
                    access_key: a.clone(),
                    secret_key: s.clone(),
                },
                _ => return Err("--auth sigv4 needs --access-key and --secret-key".into()),
            },
        };
        config.durability = match self.durability {
            DurabilityArg::Fsync => Durability::Fsync,
            DurabilityArg::BestEffort => Durability::BestEffort,
        };
        if let Some(w) = self.workers {
            config.workers = w.max(1);
        }
        config.create_buckets = self.create_bucket.clone();
        Ok(config)
    }
}

/// Serves until SIGINT or SIGTERM. Prints `kvtier gateway: listening on http://ADDR`
/// once it accepts connections.
pub fn run(args: &GatewayArgs) -> Result<(), String> {
    let config = args.config()?;
    let running = RunningGateway::start(config)?;
    println!("kvtier gateway: listening on http://{}", running.addr);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let waiter = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot wait for signals: {e}"))?;
    waiter.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok::<(), String>(())
    })?;
    let (gets, ranged, bytes, requests) = running.counters().snapshot();
    running.stop();
    println!(
        "kvtier gateway: stopped after {requests} requests ({gets} GETs, {ranged} ranged, {bytes} bytes sent)"
    );
    Ok(())
}
