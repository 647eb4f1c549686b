//! `kvtier bench`: whole-system figures, each beside the physical baseline measured in the
//! same run and the ratio between them.
//!
//! Row names are stable: BENCHMARKS.md and CI scripts refer to them.

mod cold_loads;
mod measure;
mod progress;
mod raw_write;
mod rows_cluster;
mod rows_durable;
mod rows_hash;
mod rows_lookup;
mod rows_model;
mod rows_ram;
mod rows_remote_codec;
mod rows_server;
mod rows_server_mixed;
mod rows_shm;
mod rows_snapshot;
mod rows_snapshot_remote;
mod rows_ssd;
mod rows_ssd_codec;
mod s3;

pub use s3::S3BenchArgs;

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

use crate::cli::BenchArgs;

/// One figure, its baseline and their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Stable name, e.g. `ram.load.2MiB.GBps`.
    pub name: String,
    /// The measured median.
    pub value: f64,
    /// Unit of `value` and `baseline`.
    pub unit: &'static str,
    /// The physical baseline for the same bytes, measured in the same run.
    pub baseline: f64,
    /// `value / baseline`, or for a paired row the median of the per-sample ratios.
    pub ratio: f64,
    /// Whether `ratio` is the median of per-sample ratios ([`Row::paired`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paired: bool,
    /// What the baseline is.
    #[serde(skip)]
    pub baseline_is: std::borrow::Cow<'static, str>,
}

impl Row {
    fn new(
        name: impl Into<String>,
        value: f64,
        unit: &'static str,
        baseline: f64,
        baseline_is: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        let ratio = if baseline > 0.0 {
            value / baseline
        } else {
            f64::NAN
        };
        Self {
            name: name.into(),
            value,
            unit,
            baseline,
            ratio,
            paired: false,
            baseline_is: baseline_is.into(),
        }
    }

    /// A row from paired samples: `values[i]` and `baselines[i]` were measured side by
    /// side. Value and baseline are the medians; the ratio is the median of the
    /// per-sample ratios, which a disk whose speed drifts over seconds (this machine's
    /// virtual disk does, by up to 2x) cannot skew the way it skews a ratio of medians.
    pub fn paired(
        name: impl Into<String>,
        values: &[f64],
        baselines: &[f64],
        unit: &'static str,
        baseline_is: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let mut ratios: Vec<f64> = values
            .iter()
            .zip(baselines)
            .filter(|(_, b)| **b > 0.0)
            .map(|(v, b)| v / b)
            .collect();
        let mut row = Self::new(
            name,
            median(&mut values.to_vec()),
            unit,
            median(&mut baselines.to_vec()),
            baseline_is,
        );
        row.ratio = median(&mut ratios);
        row.paired = true;
        row
    }
}

/// A function measuring one group of rows; the closure says which row names are wanted.
type RowGroup = fn(Effort, &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>>;

/// How hard to measure.
#[derive(Debug, Clone, Copy)]
pub struct Effort {
    /// Samples per figure (the median is reported).
    pub samples: usize,
    /// Scales iteration counts and data sizes.
    pub scale: usize,
    /// Bytes each SSD store and load row moves per sample (`--ssd-mib`; 64 MiB × `scale`
    /// unless given).
    pub ssd_bytes: usize,
}

/// Runs the bench and prints the table (and writes JSON if asked).
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(crate::cli::BenchTarget::S3(s3_args)) = &args.target {
        return s3::run_cli(s3_args);
    }
    let (samples, scale) = if args.quick { (5, 1) } else { (15, 4) };
    let effort = Effort {
        samples,
        scale,
        ssd_bytes: args.ssd_mib.map_or(64 * scale, |m| m.max(1)) << 20,
    };
    if args.models {
        rows_model::available()?;
    }
    let run_start = std::time::Instant::now();
    let current: std::cell::RefCell<Option<progress::GroupProgress>> = Default::default();
    let wanted = |name: &str| {
        let yes = args.filter.as_deref().is_none_or(|f| name.contains(f));
        if yes && let Some(p) = current.borrow().as_ref() {
            p.row(name);
        }
        yes
    };
    let group_started = |name: &'static str| {
        // The previous group's heartbeat stops before the next one starts.
        current.replace(None);
        current.replace(Some(progress::GroupProgress::start(name, run_start)));
    };
    println!(
        "kvtier bench ({}) on {} cores; figures are medians of {} samples",
        if args.quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        effort.samples
    );
    let groups: [(&str, RowGroup); 10] = [
        ("hash", rows_hash::rows),
        ("lookup", rows_lookup::rows),
        ("ram", rows_ram::rows),
        ("snapshot", rows_snapshot::rows),
        ("snapshot.remote", rows_snapshot_remote::rows),
        ("remote.codec", rows_remote_codec::rows),
        ("server", rows_server::rows),
        ("shm", rows_shm::rows),
        ("s3", s3::rows),
        ("cluster", rows_cluster::rows),
    ];
    let mut rows = Vec::new();
    let ssd_dir = args.ssd_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()))
    });
    for (prefix, group) in groups {
        group_started(prefix);
        let got = group(effort, &wanted).with_context(|| format!("bench group `{prefix}`"))?;
        for r in &got {
            print_row(r);
        }
        rows.extend(got);
    }
    // The SSD rows write real files: into `--ssd-dir`, removed afterwards.
    let recover_blocks = args.recover_blocks.unwrap_or(25_000 * effort.scale);
    group_started("ssd");
    let got =
        rows_ssd::rows(effort, &wanted, &ssd_dir, recover_blocks).context("bench group `ssd`");
    let _ = std::fs::remove_dir_all(&ssd_dir);
    for r in got.as_deref().unwrap_or(&[]) {
        print_row(r);
    }
    rows.extend(got?);
    if args.models {
        group_started("model");
        let got = rows_model::rows(effort, &wanted).context("bench group `model`")?;
        for r in &got {
            print_row(r);
        }
        rows.extend(got);
    }
    current.replace(None);
    println!(
        "kvtier bench: done in {:.0} s",
        run_start.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&rows)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} rows to {}", rows.len(), path.display());
    }
    Ok(())
}

fn print_row(r: &Row) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (e.g. piped into `head`) is not worth failing the run for.
    let _ = writeln!(
        out,
        "{:<28} {:>12} {:<8} baseline {:>12} {:<8} ratio {:>9}  ({})",
        r.name,
        fmt_num(r.value),
        r.unit,
        fmt_num(r.baseline),
        r.unit,
        fmt_num(r.ratio),
        r.baseline_is
    );
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1e5 {
        format!("{v:.3e}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}
