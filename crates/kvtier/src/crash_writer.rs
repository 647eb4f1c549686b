//! `kvtier __crash-writer`: a hidden subcommand the crash tests run as a child process and
//! kill with SIGKILL at random moments. It stores blocks into an SSD store as fast as it
//! can and, after each store is acknowledged, appends the block's hash to an ack log. The
//! payload of every block is a function of its hash, so the parent can check any block it
//! finds without the log; with `fsync` the log also tells which blocks must have survived.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use kvtier_core::clock::SystemClock;
use kvtier_core::hash::{self, BlockHash};
use kvtier_core::tier::{BlockMeta, NoSink, PutOutcome, Tier};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{Durability, SsdConfig, SsdTier};

/// Options of the hidden crash-writer subcommand.
#[derive(Debug, clap::Args)]
pub struct CrashWriterArgs {
    /// Store directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// Ack log: one hex hash per acknowledged store.
    #[arg(long)]
    pub ack_log: PathBuf,
    /// Distinguishes the blocks of successive runs.
    #[arg(long)]
    pub round: u32,
    /// Sync data and index before acknowledging.
    #[arg(long)]
    pub fsync: bool,
}

/// The layout the crash writer and its checker agree on: 16 KiB blocks.
pub fn crash_layout() -> anyhow::Result<Layout> {
    Ok(Layout::new(LayoutKey::new(
        "crash-test",
        KvDtype::F16,
        16,
        2,
        2,
        64,
    ))?)
}

/// The payload stored under `hash`.
pub fn crash_payload(hash: &BlockHash, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| hash.0[i % 16] ^ (i as u8) ^ ((i >> 8) as u8))
        .collect()
}

/// Runs until killed (or until 100,000 blocks are stored).
pub fn run(args: &CrashWriterArgs) -> anyhow::Result<()> {
    let layout = crash_layout()?;
    let mut config = SsdConfig::new(&args.dir);
    config.store.segment_bytes = 1 << 20;
    if args.fsync {
        config.store.durability = Durability::Synced;
    }
    let tier = SsdTier::open(config, Arc::new(SystemClock::new()), Arc::new(NoSink))?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.ack_log)
        .with_context(|| format!("opening {}", args.ack_log.display()))?;
    let root = hash::chain_root(&layout);
    for i in 0..100_000u32 {
        let tokens: Vec<u32> = (0..16)
            .map(|t| args.round * 1_000_000 + i * 16 + t)
            .collect();
        let h = hash::block_hash(root, &tokens, None);
        let meta = BlockMeta {
            layout: layout.digest(),
            hash: h,
            parent: root,
            position: 0,
            tokens: tokens.into(),
            extra_tag: None,
        };
        let payload = crash_payload(&h, layout.block_bytes() as usize);
        if tier.put(&meta, payload.into())? == PutOutcome::Stored {
            // One write per line: a kill cannot leave half a line for the next round's
            // first line to be appended to (a formatted `writeln!` may write in pieces).
            log.write_all(format!("{h}\n").as_bytes())?;
            if args.fsync {
                log.sync_data()?;
            }
        }
    }
    Ok(())
}
