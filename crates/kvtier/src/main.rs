//! `kvtier`: the command-line tool of the kvtier KV-cache store.

mod bench;
mod cli;
mod crash_writer;
mod inspect;
mod logging;

use std::process::ExitCode;

use clap::Parser;

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
