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
    end_quietly_on_a_closed_pipe();
    let cli = cli::Cli::parse();
    init_logging();
    match commands::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // The sentence may quote what someone typed (a name, a tenant, a reason).
            eprintln!("orch: {}", table::escape(&failure.render()));
            ExitCode::from(failure.code)
        }
    }
}

/// A closed pipe ends orch the way it ends any Unix tool: killed by SIGPIPE, with no message
/// (`orch jobs --all | head -1`; the shell sees 141). Rust ignores SIGPIPE, so printing to a
/// stdout or stderr whose reader is gone panics ("failed printing to stdout: Broken pipe"); this
/// hook turns that one panic, wherever it happens, back into the signal. SIGPIPE stays ignored
/// for everything else: a daemon that hangs up on a client is an error the client reports, and
/// `orch serve` never dies of a client that went away.
fn end_quietly_on_a_closed_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        let broken_pipe = format!("(os error {})", libc::EPIPE);
        if (message.starts_with("failed printing to stdout")
            || message.starts_with("failed printing to stderr"))
            && message.ends_with(&broken_pipe)
        {
            // SAFETY: signal and raise with constants; the default action ends the process.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
        }
        default_hook(info);
    }));
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
        // A log line that cannot be written (a supervisor's log on a full disk) is dropped: the
        // subscriber's own report of it would go to the same stderr, fail, and abort orch.
        .log_internal_errors(false)
        .init();
}
