//! The command line, as DESIGN.md fixes it.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "orch",
    version,
    about = "Places GPU jobs and runs them: atomic leases, exact device hand-off, sandboxed Wasm policies and trainers."
)]
pub struct Cli {
    /// Device inventory: auto (NVML if it finds a GPU, else the CPU), nvml, cpu, or sim:PATH.
    #[arg(
        long,
        global = true,
        env = "ORCH_DEVICES",
        default_value = "auto",
        value_name = "SPEC"
    )]
    pub devices: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List devices with telemetry, the physical (nvidia-smi) and the CUDA index side by side.
    Devices(DevicesArgs),
    /// List the leases (which job holds which devices), or release one by hand.
    Leases(LeasesArgs),
}

#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    pub watch: Option<f64>,
    /// Create a CUDA context on every CUDA device and report each; exit 1 if any fails.
    #[arg(long, conflicts_with_all = ["json", "watch"])]
    pub check_cuda: bool,
}

#[derive(Debug, clap::Args)]
pub struct LeasesArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<LeasesAction>,
}

#[derive(Debug, Subcommand)]
pub enum LeasesAction {
    /// Free a lease by its id (the job keeps running; its devices become free to others).
    Release {
        /// The lease id, as `orch leases` shows it.
        id: String,
    },
}
