//! `kvtier demo`: a multi-turn chat workload on real models, cold and with kvtier
//! underneath — from RAM, after a process restart (the SSD tier), and through
//! `kvtier serve` — printed as a table and drawn as a PNG. The restarted phase needs a
//! program to re-run and the served phase a [`ServeLauncher`]; the caller supplies both.

mod chart;
mod phase;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use phase::{DemoModel, PhaseSummary, TurnResult, median, run_phase, summarize};
pub use workload::Workload;

use crate::gemma::{GemmaWeights, locate_gguf};
use crate::mamba::{MambaModel, synthetic_config, write_synthetic};
use crate::reuse::{Cache, ServeLauncher};
use crate::{Error, Result};

/// Longest context the demo's Gemma is loaded for.
const MAX_POSITIONS: usize = 4096;
/// Seed of the synthetic Mamba weights.
const MAMBA_SEED: u64 = 7;
/// The line a restarted child prints its results on.
const CHILD_PREFIX: &str = "kvtier-demo-phase ";

/// What the demo runs and where.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Working directory (stores, weights of the synthetic model); emptied first.
    pub dir: PathBuf,
    /// The workload.
    pub workload: Workload,
    /// Where to draw the chart (none: no chart).
    pub chart: Option<PathBuf>,
    /// The program to run the restarted phase in (normally this executable) and the
    /// arguments that make it run [`run_restarted_phase`].
    pub restart_command: Option<(PathBuf, Vec<String>)>,
    /// How to start `kvtier serve` on loopback for the served phase (none: the phase is
    /// skipped). The `kvtier` binary passes one built on `kvtier_server::LocalServer`.
    pub serve: Option<Arc<dyn ServeLauncher>>,
}

/// Everything the demo measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// One line per model and phase.
    pub rows: Vec<PhaseSummary>,
}

fn settings_for(dir: &Path) -> kvtier_node::Settings {
    kvtier_node::Settings {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        ram: kvtier_node::units::ByteSize(2 << 30),
        ..Default::default()
    }
}

fn embedded(dir: &Path) -> Result<Arc<kvtier_core::Engine>> {
    let app = kvtier_node::Node::open(settings_for(dir))?;
    Ok(app.engine.clone())
}

/// The demo's models, in the order they run.
const MODELS: [&str; 2] = ["gemma", "mamba"];

/// Loads model `name`; the synthetic Mamba's weights are written under `dir` once and
/// reused (the restarted process reads the same file).
fn load_model(name: &str, dir: &Path) -> Result<DemoModel> {
    match name {
        "gemma" => Ok(DemoModel::Gemma(GemmaWeights::load(
            &locate_gguf(true)?,
            MAX_POSITIONS,
        )?)),
        "mamba" => {
            let path = dir.join("mamba-synthetic.safetensors");
            if !path.is_file() {
                write_synthetic(&synthetic_config(), MAMBA_SEED, &path)?;
            }
            Ok(DemoModel::Mamba(MambaModel::load(
                &path,
                synthetic_config(),
            )?))
        }
        other => Err(Error::Invalid(format!("no model {other}"))),
    }
}

/// Runs the whole demo and prints the table.
pub fn run(opts: &DemoOptions) -> Result<DemoReport> {
    if opts.dir.exists() {
        std::fs::remove_dir_all(&opts.dir)
            .map_err(|e| Error::io(format!("cannot empty {}", opts.dir.display()), e))?;
    }
    std::fs::create_dir_all(&opts.dir)
        .map_err(|e| Error::io(format!("cannot create {}", opts.dir.display()), e))?;
    let w = opts.workload;
    println!(
        "kvtier demo: {} conversations x {} turns behind one shared system prompt (~{} words), {} tokens decoded per turn",
        w.conversations, w.turns, w.system_words, w.decode
    );
    let mut rows = Vec::new();
    for name in MODELS {
        let model = &load_model(name, &opts.dir)?;
        println!("\n[{name}] cold: every turn computed from nothing");
        let none = Arc::new(Cache::embedded(Arc::new(
            kvtier_core::Engine::builder().build()?,
        )));
        let cold = run_phase(model, none, false, &w)?;
        rows.push(summarize(name, "cold", &cold, &cold));
        if let (DemoModel::Gemma(weights), Some(first)) = (model, cold.first()) {
            println!(
                "[{name}] conversation 0, turn 0 answered: {:?}",
                weights.vocab().decode(&first.tokens)
            );
        }

        println!(
            "[{name}] RAM: embedded engine (RAM + SSD under {}), turns store their state",
            opts.dir.display()
        );
        let store_dir = opts.dir.join(format!("{name}-embedded"));
        let engine = embedded(&store_dir)?;
        let ram = run_phase(model, Arc::new(Cache::embedded(engine.clone())), true, &w)?;
        rows.push(summarize(name, "RAM", &ram, &cold));
        let shutdown = engine.shutdown(Duration::from_secs(120));
        if shutdown.is_some_and(|s| !s.clean) {
            return Err(Error::Invalid(
                "the SSD writer did not drain at shutdown".into(),
            ));
        }
        drop(engine);

        if let Some((program, args)) = &opts.restart_command {
            println!(
                "[{name}] restart: a new process on the same directory (RAM empty, SSD full) replays the same turns"
            );
            let restarted = restarted_phase(program, args, name, &store_dir, &w)?;
            rows.push(summarize(name, "SSD after restart", &restarted, &cold));
        }

        if let Some(launcher) = &opts.serve {
            println!("[{name}] served: the same turns through kvtier serve on loopback");
            let served_dir = opts.dir.join(format!("{name}-served"));
            let server = launcher.launch(settings_for(&served_dir))?;
            let backend = Arc::new(Cache::served(&server.url(), None)?);
            let served = run_phase(model, backend, true, &w)?;
            server.stop();
            rows.push(summarize(name, "kvtier serve", &served, &cold));
        } else {
            println!("[{name}] served: skipped (no way to start kvtier serve was given)");
        }
    }
    print_table(&rows);
    if let Some(path) = &opts.chart {
        match chart::draw(&rows, path) {
            Ok(()) => println!("chart: {}", path.display()),
            Err(e) => println!("chart not drawn: {e}"),
        }
    }
    let turns = w.conversations * w.turns;
    if let Some(bad) = rows.iter().find(|r| r.same_as_cold != turns) {
        return Err(Error::Invalid(format!(
            "{} {}: only {} of {turns} turns decoded the same tokens as cold",
            bad.model, bad.phase, bad.same_as_cold
        )));
    }
    Ok(DemoReport { rows })
}

fn restarted_phase(
    program: &Path,
    args: &[String],
    model: &str,
    store_dir: &Path,
    w: &Workload,
) -> Result<Vec<TurnResult>> {
    let out = std::process::Command::new(program)
        .args(args)
        .arg(model)
        .arg(store_dir)
        .arg(serde_json::to_string(w).map_err(|e| Error::Invalid(e.to_string()))?)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::io(format!("cannot run {}", program.display()), e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "the restarted phase failed ({}): {stdout}",
            out.status
        )));
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(CHILD_PREFIX))
        .ok_or_else(|| {
            Error::Invalid(format!("the restarted phase printed no results: {stdout}"))
        })?;
    serde_json::from_str(line).map_err(|e| Error::Invalid(format!("restarted phase results: {e}")))
}

/// The child side of the restart: opens the embedded engine on `store_dir` (recovering
/// the SSD store), replays the workload without storing, and prints the results.
pub fn run_restarted_phase(model: &str, store_dir: &Path, workload_json: &str) -> Result<()> {
    let w: Workload =
        serde_json::from_str(workload_json).map_err(|e| Error::Invalid(e.to_string()))?;
    let dir = store_dir
        .parent()
        .ok_or_else(|| Error::Invalid("the store directory has no parent".into()))?;
    let model = load_model(model, dir)?;
    let engine = embedded(store_dir)?;
    let turns = run_phase(&model, Arc::new(Cache::embedded(engine.clone())), false, &w)?;
    engine.shutdown(Duration::from_secs(30));
    println!(
        "{CHILD_PREFIX}{}",
        serde_json::to_string(&turns).map_err(|e| Error::Invalid(e.to_string()))?
    );
    Ok(())
}

fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

fn print_table(rows: &[PhaseSummary]) {
    println!();
    println!(
        "{:<6} {:<18} {:>12} {:>12} {:>9} {:>10} {:>11} {:>11} {:>11}",
        "model",
        "phase",
        "TTFT med ms",
        "hit TTFT ms",
        "turns hit",
        "tokens hit",
        "loaded",
        "stored",
        "same tokens"
    );
    for r in rows {
        let cold = rows
            .iter()
            .find(|c| c.model == r.model && c.phase == "cold")
            .map_or(0.0, |c| c.ttft_median_ms);
        let speedup = if r.ttft_hit_median_ms > 0.0 {
            cold / r.ttft_hit_median_ms
        } else {
            0.0
        };
        println!(
            "{:<6} {:<18} {:>12.1} {:>12} {:>9} {:>9.0}% {:>11} {:>11} {:>11}",
            r.model,
            r.phase,
            r.ttft_median_ms,
            if r.ttft_hit_median_ms > 0.0 {
                format!("{:.1} ({speedup:.0}x)", r.ttft_hit_median_ms)
            } else {
                "-".into()
            },
            format!("{}/{}", r.turns_hit.0, r.turns_hit.1),
            r.token_hit_rate * 100.0,
            human_bytes(r.bytes_loaded),
            human_bytes(r.bytes_stored),
            format!("{}/{}", r.same_as_cold, r.turns_hit.1),
        );
    }
}
