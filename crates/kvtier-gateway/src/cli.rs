//! `kvtier gateway`: flags, and running until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvtier_ssd::Durability;

use crate::serve::{Auth, GatewayConfig, RunningGateway};

/// When a PUT is acknowledged: the names of `kvtier serve`'s levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    /// After the record and its index entry are synced (`fdatasync`): survives a power loss.
    #[value(alias = "fsync")]
    Synced,
    /// Once written to the page cache: survives a killed process, not a power loss.
    #[value(alias = "best-effort")]
    Written,
}

/// How requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthArg {
    /// AWS SigV4 with --access-key/--secret-key (header or presigned).
    Sigv4,
    /// None: every request allowed, signed or not (signatures are not checked). Only on a loopback address, for local tests.
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
    #[arg(long, value_enum, default_value = "synced")]
    pub durability: DurabilityArg,

    /// Worker threads. Default: one per core.
    #[arg(long)]
    pub workers: Option<usize>,

    /// Create this bucket at start if it does not exist (repeatable). The name must
    /// follow S3's bucket naming rules (3-63 characters of a-z, 0-9, '.', '-', starting
    /// and ending with a letter or digit, no '..', not an IP address). Default: none.
    #[arg(long, value_name = "NAME")]
    pub create_bucket: Vec<String>,

    /// A request head (request line and headers) must arrive within this.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// A request body may send nothing for at most this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub body_timeout: Duration,

    /// A keep-alive connection with no request in flight is closed after this.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Open connections at most; at the cap the longest-idle connection is closed to
    /// admit a new one, and a new one is refused only when all are busy. Lowered at start
    /// (and logged) if the open-file limit, raised to the hard limit, leaves room for
    /// fewer.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_connections: usize,

    /// Refused requests (bad signature, unknown key, malformed) are logged at WARN at
    /// most once per this interval, with the count since the last line.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub refusal_log_interval: Duration,

    /// Bytes per segment file (at least 16 MiB); the largest object is 1 MiB less.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub segment_bytes: u64,

    /// How often compaction runs; each pass moves at most one segment's worth of bytes.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub compact_interval: Duration,

    /// Compact a sealed segment whose current objects fill less than this fraction of it
    /// (0 < F < 1; 0: never compact). The disk then holds at most about live / F bytes,
    /// plus the active segment.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5)]
    pub compact_below: f64,
}

/// `250ms`, `10s`, `2m`, `1h`, `1d`, or plain seconds; not zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    // The parser of every kvtier setting (`kvtier serve`'s durations read the same).
    let d = s.parse::<kvtier_core::units::HumanDuration>()?.0;
    if d.is_zero() {
        return Err("a timeout must be longer than zero".into());
    }
    Ok(d)
}

/// Whether `name` follows S3's bucket naming rules, so every client can address it.
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && !name.contains("..")
        && !name.contains(".-")
        && !name.contains("-.")
        && name.parse::<std::net::Ipv4Addr>().is_err()
        && !name.starts_with("xn--")
        && !name.ends_with("-s3alias")
}

/// Logging for `kvtier gateway`: `RUST_LOG` decides; by default info for kvtier, warn
/// otherwise, and s3s's own per-error lines off (the gateway logs refusals itself,
/// rate-limited, and server errors where they arise).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,kvtier=info,kvtier_gateway=info,kvtier_ssd=info,s3s=off",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

impl GatewayArgs {
    /// The configuration these flags describe.
    /// Flags that cannot work are `Invalid`.
    pub fn config(&self) -> Result<GatewayConfig, kvtier_core::Error> {
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
                _ => {
                    return Err(kvtier_core::Error::invalid(
                        "--auth sigv4 needs --access-key and --secret-key",
                    ));
                }
            },
        };
        config.durability = match self.durability {
            DurabilityArg::Synced => Durability::Synced,
            DurabilityArg::Written => Durability::Written { retries: 0 },
        };
        if let Some(w) = self.workers {
            config.workers = w.max(1);
        }
        if let Some(bad) = self.create_bucket.iter().find(|b| !valid_bucket_name(b)) {
            return Err(kvtier_core::Error::invalid(format!(
                "--create-bucket `{bad}`: not a valid S3 bucket name (3-63 characters of a-z, 0-9, '.', '-', starting and ending with a letter or digit, no '..', not an IP address)"
            )));
        }
        config.create_buckets = self.create_bucket.clone();
        config.header_timeout = self.header_timeout;
        config.body_timeout = self.body_timeout;
        config.idle_timeout = self.idle_timeout;
        config.max_connections = self.max_connections.max(1);
        config.refusal_log_interval = self.refusal_log_interval;
        if self.segment_bytes < 16 << 20 {
            return Err(kvtier_core::Error::invalid(
                "--segment-bytes must be at least 16 MiB (16777216)",
            ));
        }
        config.segment_bytes = self.segment_bytes;
        if !(0.0..1.0).contains(&self.compact_below) {
            return Err(kvtier_core::Error::invalid(
                "--compact-below is a fraction: at least 0 (off), below 1",
            ));
        }
        config.compact_interval = self.compact_interval;
        config.compact_below = self.compact_below;
        Ok(config)
    }
}

/// Serves until SIGINT or SIGTERM. Prints `kvtier gateway: listening on http://ADDR`
/// once it accepts connections.
pub fn run(args: &GatewayArgs) -> Result<(), kvtier_core::Error> {
    let config = args.config()?;
    // Signals are watched before the gateway starts: a SIGTERM from then on (while the
    // store opens, or the moment the listening line appears) is a clean stop, not the
    // default action's exit.
    let waiter = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            kvtier_core::Error::new(
                kvtier_core::ErrorKind::Unavailable,
                "cannot wait for signals",
            )
            .with_source(e)
        })?;
    let stop = {
        let _in_runtime = waiter.enter();
        kvtier_listen::signals::stop_signals()
    };
    let running = RunningGateway::start(config)?;
    println!("kvtier gateway: listening on http://{}", running.addr);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    waiter.block_on(stop);
    // Read from the gateway's one list of counters (`RunningGateway::samples`).
    let counts = running.samples().flat();
    running.stop();
    let n = |name: &str| counts.get(name).copied().unwrap_or(0);
    println!(
        "kvtier gateway: stopped after {} requests ({} GETs, {} ranged, {} bytes sent)",
        n("gateway_requests"),
        n("gateway_gets"),
        n("gateway_ranged_gets"),
        n("gateway_sent_bytes"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_follow_s3_rules() {
        for ok in ["abc", "my-bucket.1", "a1b", &"a".repeat(63)] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "Abc",
            "a_b",
            "-ab",
            "ab-",
            "a..b",
            "a.-b",
            "192.168.1.1",
            &"a".repeat(64),
            "xn--ab",
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").is_err());
        // Days are a unit of every kvtier setting since the parsers became one; an
        // unknown unit is still refused.
        assert_eq!(parse_duration("5d"), Ok(Duration::from_secs(5 * 86_400)));
        assert!(parse_duration("5 weeks").is_err());
    }
}
