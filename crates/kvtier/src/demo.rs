//! `kvtier demo`: real models through kvtier (crates/kvtier-candle). Built only with the
//! `models` feature, so the rest of the tool never compiles candle.

use std::path::PathBuf;

/// Options of `kvtier demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Working directory for the demo's stores and the synthetic Mamba weights; emptied
    /// at the start. Default: `kvtier-demo` in the current directory.
    #[arg(long, value_name = "DIR", default_value = "kvtier-demo")]
    pub dir: PathBuf,
    /// Conversations sharing the system prompt.
    #[arg(long, default_value_t = 4)]
    pub conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Rough length of the shared system prompt, in words.
    #[arg(long, default_value_t = 300)]
    pub system_words: usize,
    /// Tokens decoded per turn.
    #[arg(long, default_value_t = 12)]
    pub decode: usize,
    /// Where to draw the chart. Default: `kvtier-demo.png` in the current directory.
    #[arg(long, value_name = "FILE", default_value = "kvtier-demo.png")]
    pub chart: PathBuf,
    /// A small run (2 conversations x 2 turns, a short system prompt): about a minute.
    #[arg(long)]
    pub quick: bool,
}

/// Arguments of the hidden restarted phase.
#[derive(Debug, clap::Args)]
pub struct RestartedArgs {
    /// `gemma` or `mamba`.
    pub model: String,
    /// The store directory the first process used.
    pub store_dir: PathBuf,
    /// The workload, JSON.
    pub workload: String,
}

#[cfg(feature = "models")]
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    use kvtier_candle::demo::{DemoOptions, Workload};
    let mut workload = Workload {
        conversations: args.conversations,
        turns: args.turns,
        system_words: args.system_words,
        decode: args.decode,
    };
    if args.quick {
        workload = Workload {
            conversations: 2,
            turns: 2,
            system_words: 120,
            decode: 8,
        };
    }
    if workload.conversations == 0 || workload.turns == 0 || workload.decode == 0 {
        anyhow::bail!("conversations, turns and decode must each be at least 1");
    }
    let exe = std::env::current_exe()?;
    let opts = DemoOptions {
        dir: args.dir.clone(),
        workload,
        chart: Some(args.chart.clone()),
        restart_command: Some((exe, vec!["__demo-restarted".to_owned()])),
        serve: Some(std::sync::Arc::new(crate::loopback::InProcess)),
    };
    kvtier_candle::demo::run(&opts)?;
    Ok(())
}

#[cfg(feature = "models")]
pub fn run_restarted(args: &RestartedArgs) -> anyhow::Result<()> {
    kvtier_candle::demo::run_restarted_phase(&args.model, &args.store_dir, &args.workload)?;
    Ok(())
}

#[cfg(not(feature = "models"))]
const WITHOUT_MODELS: &str = "this kvtier was built without real models; run the demo with \
     `cargo run --release -p kvtier --features models -- demo`";

#[cfg(not(feature = "models"))]
pub fn run(_args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!(WITHOUT_MODELS)
}

#[cfg(not(feature = "models"))]
pub fn run_restarted(_args: &RestartedArgs) -> anyhow::Result<()> {
    anyhow::bail!(WITHOUT_MODELS)
}
