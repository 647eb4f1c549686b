//! Logs to stderr; `RUST_LOG` filters them (default: info for kvtier, warn otherwise).

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,kvtier=info,kvtier_server=info,kvtier_ssd=info,kvtier_core=info",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
