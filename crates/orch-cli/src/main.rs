//! `orch`: places GPU jobs and runs them. This crate is the edge: argument parsing, output
//! formatting and exit statuses (0 success, 1 a failed job or no fit, 2 bad input). `anyhow`
//! lives here and nowhere below.

mod cli;
mod client;
mod commands;
mod failure;
mod progress;
mod table;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_logging();
    match commands::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("orch: {}", failure.render());
            ExitCode::from(failure.code)
        }
    }
}

/// Logs go to stderr as plain lines (`RUST_LOG` selects; default: orch's own info lines).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(
            "warn,orch=info,orch_devices=info,orch_leases=info,orch_exec=info,orch_runner=info,orch_host=info,orch_serve=info",
        ));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_level(false)
        .init();
}
