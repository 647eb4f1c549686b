//! `kvtier`: the command-line tool of the kvtier KV-cache store.

mod bench;
mod cli;
mod cluster;
mod crash_writer;
mod demo;
mod inspect;
mod logging;
#[cfg(feature = "models")]
mod loopback;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc: per-thread free lists and no returning of pages to the kernel on every free;
/// measured on the server's small-request path (docs/adr/0007-server.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtier: {e:#}");
            ExitCode::FAILURE
        }
    }
}
