//! `kvtier cluster status` and `kvtier cluster reconcile` (docs/cluster.md, "Operations").
//! Both read the cluster's settings the way `kvtier serve` does (`--config FILE`, the
//! environment, flags), so an operator points them at a replica's own configuration.

use std::sync::Arc;
use std::time::Duration;

use kvtier_meta::reconcile::{self, Survey};
use kvtier_meta::status::Status;

/// Options of `kvtier cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClusterCommand {
    /// Print the cluster as etcd has it: live replicas and generations, the GC leader,
    /// advertised objects and bytes per owner and per namespace, pending tombstones.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        settings: Box<kvtier_node::ServeArgs>,
    },
    /// Repair the records after crashes: advertise objects whose manifest checks out but
    /// that were never advertised, and delete what cannot be advertised (a damaged
    /// manifest, a duplicate of an advertised run, data without its manifest) once older
    /// than --older-than. Prints a JSON report.
    Reconcile {
        /// Only debris older than this is deleted [default: 1h].
        #[arg(long, value_name = "DURATION", default_value = "1h")]
        older_than: kvtier_node::units::HumanDuration,
        /// Count what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        settings: Box<kvtier_node::ServeArgs>,
    },
}

/// Runs `kvtier cluster …`.
pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    crate::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match &args.command {
        ClusterCommand::Status { json, settings } => {
            let settings = settings.settings().map_err(anyhow::Error::msg)?;
            let (endpoints, name) =
                kvtier_node::cluster_endpoints(&settings).map_err(anyhow::Error::msg)?;
            let access = settings.cluster.etcd_access().map_err(anyhow::Error::msg)?;
            let status = runtime
                .block_on(async {
                    let mut client = kvtier_meta::connect_once_as(&endpoints, &access).await?;
                    kvtier_meta::status::status(&mut client, &name).await
                })
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot read cluster {name} from etcd at {}: {e}",
                        endpoints.join(",")
                    )
                })?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", text(&status));
            }
            Ok(())
        }
        ClusterCommand::Reconcile {
            older_than,
            dry_run,
            settings,
        } => {
            let settings = settings.settings().map_err(anyhow::Error::msg)?;
            let (endpoints, name) =
                kvtier_node::cluster_endpoints(&settings).map_err(anyhow::Error::msg)?;
            let access = settings.cluster.etcd_access().map_err(anyhow::Error::msg)?;
            let remote = kvtier_node::remote_config(&settings)
                .map_err(anyhow::Error::msg)?
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "reconcile needs the shared tier's endpoints (--remote-endpoints)"
                    )
                })?;
            let tier = Arc::new(kvtier_remote::RemoteTier::open_with_catalog(
                remote,
                Arc::new(kvtier_core::tier::NoSink),
                Arc::new(Survey),
            )?);
            let options = reconcile::Options {
                cluster: name,
                older_than: older_than.0,
                namespace: settings.cluster.namespace.clone(),
                dry_run: *dry_run,
                now_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
                    .as_millis() as u64,
            };
            let report = runtime.block_on(async {
                let mut client = kvtier_meta::connect_once_as(&endpoints, &access)
                    .await
                    .map_err(|e| format!("cannot reach etcd at {}: {e}", endpoints.join(",")))?;
                reconcile::reconcile(&mut client, &tier, &options).await
            });
            let report = report.map_err(anyhow::Error::msg)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

/// The status as text.
fn text(s: &Status) -> String {
    let mut out = format!(
        "cluster {} at etcd revision {}\nGC leader: {}\n\nreplicas (live):\n",
        s.cluster,
        s.revision,
        s.leader.as_deref().unwrap_or("none")
    );
    for r in &s.replicas {
        out.push_str(&format!("  {} generation {}\n", r.replica, r.generation));
    }
    out.push_str("generations (every replica ever registered):\n");
    for (r, g) in &s.generations {
        out.push_str(&format!("  {r} {g}\n"));
    }
    for (title, usage) in [("owner", &s.owners), ("namespace", &s.namespaces)] {
        out.push_str(&format!("objects per {title}:\n"));
        for (k, u) in usage {
            out.push_str(&format!(
                "  {k}: {} objects, {} states, {} bytes, {} pinned\n",
                u.objects, u.states, u.bytes, u.pinned
            ));
        }
    }
    out.push_str(&format!(
        "tombstones waiting: {}\nunreadable records: {}\n",
        s.tombstones, s.unreadable
    ));
    out
}
