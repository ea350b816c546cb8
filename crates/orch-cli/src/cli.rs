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
    /// Dry run: which devices the job's policy picks now, and why; places nothing.
    Plan(PlanArgs),
    /// Place a job (an atomic lease), run it on exactly its devices, release them.
    Run(RunArgs),
    /// Work with plugin components.
    Plugin(PluginArgs),
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The job file.
    #[arg(value_name = "JOB.toml")]
    pub job: std::path::PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    #[command(subcommand)]
    pub action: PluginAction,
}

#[derive(Debug, Subcommand)]
pub enum PluginAction {
    /// Which world a component implements, its imports and exports, its size.
    Inspect {
        /// A .wasm component, or the name of a built-in policy.
        #[arg(value_name = "FILE.wasm")]
        file: std::path::PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
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

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch run job.toml\n  orch run --gpus 2 --policy least-loaded --min-free-memory 10GiB -- python train.py"
)]
pub struct RunArgs {
    /// The job file; omit it and give the command after `--` for the quick form.
    #[arg(value_name = "JOB.toml", conflicts_with_all = ["gpus", "policy", "min_free_memory", "max_utilization", "memory_limit", "exclusive", "shared", "per_device"])]
    pub job: Option<std::path::PathBuf>,
    /// When nothing fits now, wait (backing off, saying why) until something does.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (`90s`, `15m`, `2h`; default: forever).
    #[arg(long, value_name = "DURATION", requires = "wait")]
    pub timeout: Option<String>,
    /// Quick form: how many devices.
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Quick form: the policy, a built-in name or a .wasm path (default least-loaded).
    #[arg(long, value_name = "P")]
    pub policy: Option<String>,
    /// Quick form: free memory each device must have (`10GiB`).
    #[arg(long, value_name = "SIZE")]
    pub min_free_memory: Option<String>,
    /// Quick form: utilization each device may have at most, percent.
    #[arg(long, value_name = "PERCENT")]
    pub max_utilization: Option<u32>,
    /// Quick form: per-device memory limit (reserved in the lease, passed to the job).
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// Quick form: no other job may share the devices (the default).
    #[arg(long, conflicts_with = "shared")]
    pub exclusive: bool,
    /// Quick form: other shared jobs may use the devices too.
    #[arg(long)]
    pub shared: bool,
    /// Quick form: one process per device, with torchrun variables.
    #[arg(long)]
    pub per_device: bool,
    /// Quick form: the command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// A `[train]` job: continue from the checkpoint in its output folder (`[train] out`).
    #[arg(long, requires = "job")]
    pub resume: bool,
}
