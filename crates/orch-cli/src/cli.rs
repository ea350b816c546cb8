//! The command line: every subcommand and flag (README.md has the tour).

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
    /// Take a GPU (index or uuid) or a MIG slice (uuid) out of service: no new job is placed
    /// there, running jobs finish (admins, through the daemon).
    Drain(DrainArgs),
    /// Put a drained device back in service, and forget the Xid events recorded for it.
    Undrain(UndrainArgs),
    /// Dry run: which devices the job's policy picks now, and why; places nothing.
    Plan(PlanArgs),
    /// Place a job (an atomic lease), run it on exactly its devices, release them.
    Run(RunArgs),
    /// An interactive allocation: hold GPUs for a shell (or CMD) in this terminal, released when
    /// it ends, at --time, or after --idle with its GPUs unused.
    Alloc(AllocArgs),
    /// Score a `[train]` job's checkpoint on the job's evaluation data (loss, accuracy), without
    /// training.
    Predict(PredictArgs),
    /// Generate text with a text job's checkpoint (the trainer's `predict`, orch's sampling).
    Sample(SampleArgs),
    /// Work with plugin components.
    Plugin(PluginArgs),
    /// The daemon: owns this machine's devices, queues jobs and runs each as its user.
    Serve(ServeArgs),
    /// Submit a job to the daemon; prints its id.
    Submit(SubmitArgs),
    /// List your jobs on the daemon (queued and running; --all for finished ones too).
    Jobs(JobsArgs),
    /// One job's state, devices and reason.
    Status(JobIdArgs),
    /// Cancel a queued or running job (its whole process tree ends, its devices are freed); a job
    /// array's id cancels every task left, `ID[N]` one task.
    Cancel(JobIdArgs),
    /// A job's output (stdout; --stderr for the other).
    Logs(LogsArgs),
    /// Wait for a job to end; exit with its status (a job array's id: every task, non-zero if any
    /// did not succeed).
    Wait(JobIdArgs),
    /// Fair share per tenant: share, decayed usage, fair-share factor, GPUs held, jobs.
    Usage(UsageArgs),
    /// Finished jobs and what each used: GPU-seconds, wall time, queue wait, CPU, memory, GPU
    /// memory and utilization (--by tenant: the sums per tenant).
    History(HistoryArgs),
    /// Replay a trace of submissions through the daemon's scheduler in virtual time.
    Simulate(SimulateArgs),
    /// Print a shell's completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the manual page (orch.1), or write every command's page into a folder.
    Man(ManArgs),
    /// The daemon's per-job supervisor (started by `orch serve`, not by hand).
    #[command(name = "__supervise", hide = true)]
    Supervise { dir: std::path::PathBuf },
    /// Runs another user's daemon `[train]` job as that user (started by the job's supervisor,
    /// not by hand): the job and its placement from the supervisor's spec.json, handed over open.
    #[command(name = "__train", hide = true)]
    TrainJob {
        /// The open descriptor of the job's spec.json.
        #[arg(long)]
        spec_fd: i32,
        /// The job's folder (for messages).
        dir: std::path::PathBuf,
    },
    /// Asks the placement policies a tenant sent, one JSON line in and out per ask (started by
    /// `orch serve`, one process per tenant's worker).
    #[command(name = "__policy-worker", hide = true)]
    PolicyWorker,
    /// Compiles a policy component a tenant sent, under caps (started by `orch serve`).
    #[command(name = "__compile-policy", hide = true)]
    CompilePolicy {
        /// CPU seconds it may use.
        #[arg(long)]
        cpu_s: u64,
        /// Bytes of address space it may add to what the engine reserves.
        #[arg(long)]
        memory: u64,
        /// The component's name in messages.
        #[arg(long)]
        name: String,
        /// The SHA-256 (hex) the source's bytes must have.
        #[arg(long)]
        sha256: Option<String>,
        source: std::path::PathBuf,
        out: std::path::PathBuf,
    },
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch predict examples/cnn/job.toml\n  orch predict --json examples/gpt/job.toml"
)]
pub struct PredictArgs {
    /// The `[train]` job whose checkpoint (in its output folder) to score.
    #[arg(value_name = "JOB.toml")]
    pub job: std::path::PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch sample examples/gpt/job.toml\n  orch sample examples/gpt/job.toml --prompt 'ROMEO:' --tokens 300 --temperature 0.8 --top-k 20"
)]
pub struct SampleArgs {
    /// A text `[train]` job (`[train.data] format = \"text\"`) with a checkpoint.
    #[arg(value_name = "JOB.toml")]
    pub job: std::path::PathBuf,
    /// The text to continue (default: a newline).
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Tokens to generate.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub tokens: usize,
    /// Softmax temperature; 0 takes the most likely token every time.
    #[arg(long, value_name = "T", default_value_t = orch_trainer::SAMPLE_TEMPERATURE)]
    pub temperature: f32,
    /// Draw only from the K most likely tokens.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Seed of the draws (the same seed, prompt and checkpoint give the same text).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object: the prompt, the text and the logits of the token after the prompt.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The tenants and limits (serve.toml); without it, serve the user who starts the daemon.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The socket to listen on (default: $ORCH_STATE_DIR/orch.sock, /run/orch/orch.sock for root,
    /// else $XDG_RUNTIME_DIR/orch.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<std::path::PathBuf>,
    /// Read the config, say whether it is valid, and exit (0 valid, 2 not) without serving.
    #[arg(long, requires = "config")]
    pub check: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch submit job.toml\n  orch submit --gpus 2 -- python train.py\n  orch submit --after-ok 12 eval.toml      # once job 12 succeeded\n  orch submit --slurm job.toml            # a Slurm batch job (sbatch)\n  orch submit --slurm --dry-run job.toml  # print the batch script"
)]
pub struct SubmitArgs {
    /// Submit to Slurm (sbatch) instead of the machine's daemon.
    #[arg(long, requires = "job")]
    pub slurm: bool,
    /// With --slurm: print the batch script, submit nothing.
    #[arg(long, requires = "slurm")]
    pub dry_run: bool,
    /// The job file; omit it and give the command after `--` for the quick form.
    #[arg(value_name = "JOB.toml", conflicts_with_all = [QUICK_FLAGS, &["tenant"]].concat())]
    pub job: Option<std::path::PathBuf>,
    /// With --slurm: more job files, each its own batch job.
    #[arg(value_name = "MORE.toml", requires = "slurm")]
    pub more: Vec<std::path::PathBuf>,
    #[command(flatten)]
    pub quick: QuickArgs,
    /// Quick form: the tenant, when you belong to several.
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
    /// Start only once these jobs succeeded; cancelled if one fails, is cancelled or is lost
    /// (ids, comma-separated; repeatable; adds to the file's `after_ok`; with --slurm, Slurm's
    /// job ids).
    #[arg(long, value_name = "IDS", value_delimiter = ',',
          value_parser = clap::value_parser!(i64).range(1..))]
    pub after_ok: Vec<i64>,
    /// Start only once these jobs ended, however they ended (adds to `after_any`).
    #[arg(long, value_name = "IDS", value_delimiter = ',',
          value_parser = clap::value_parser!(i64).range(1..))]
    pub after_any: Vec<i64>,
    /// Start only once these jobs ended without succeeding; cancelled if one succeeds (adds to
    /// `after_failed`).
    #[arg(long, value_name = "IDS", value_delimiter = ',',
          value_parser = clap::value_parser!(i64).range(1..))]
    pub after_failed: Vec<i64>,
    /// Run while no other job of yours with this name runs (later ones wait their turn).
    #[arg(long)]
    pub singleton: bool,
    /// Quick form: the command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    /// Finished jobs too.
    #[arg(long)]
    pub all: bool,
    /// Your orch jobs on Slurm (squeue), with each array task's parameters.
    #[arg(long, conflicts_with = "all")]
    pub slurm: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// One line per task of a job array, instead of its queued (and ended) tasks folded as
    /// `17[2-5]`.
    #[arg(long)]
    pub expand: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "TIME is a duration back from now (30d, 12h, 90m) or a moment: a date (2026-11-01, UTC midnight) or RFC 3339 (2026-11-01T08:00:00Z).\n\nExamples:\n  orch history --since 1d\n  orch history --by tenant --since 30d\n  orch history --user alice --state failed --csv > failed.csv"
)]
pub struct HistoryArgs {
    /// Jobs that ended at or after TIME (default: all that are kept, accounting_retention). TIME:
    /// a duration back from now (30d, 12h), a date (2026-11-01, midnight UTC) or a time with Z
    /// or an offset (2026-11-01T09:00:00+01:00), or without a zone for UTC.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Jobs that ended before TIME (as for --since).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only this user's jobs.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Only this tenant's jobs.
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
    /// Only jobs that ended so: succeeded, failed, cancelled, lost (repeat or comma-separate).
    #[arg(long, value_name = "STATE", value_delimiter = ',')]
    pub state: Vec<String>,
    /// Sums per tenant or per user instead of jobs: GPU-hours, jobs, mean utilization.
    #[arg(long, value_name = "tenant|user", value_parser = ["tenant", "user"])]
    pub by: Option<String>,
    /// At most this many of the newest jobs (0: as many as the daemon answers, 100,000); a line
    /// on stderr says when more matched. Not for --by, which sums every job.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub limit: u32,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV: a header line, then one job (or group) a line.
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The trace is JSON lines: {\"at\": 0.0, \"tenant\": \"vision\", \"gpus\": 1, \"duration\": 3600.0, \"priority\": 0, \"preemptible\": false}\nA job may wait on earlier lines' jobs (numbered from 1): \"after_ok\": [1], \"after_any\", \"after_failed\", \"singleton\": true (per tenant and \"name\"); \"exit\": 1 makes it fail at its end.\nWithout --config every tenant the trace names has an equal share and no limits; without TRACE.jsonl (or with -) the trace is read from standard input.\n\nExamples:\n  orch simulate --config serve.toml --devices sim:8gpus.toml trace.jsonl --until 604800\n  orch simulate --devices sim:8gpus.toml --json < trace.jsonl"
)]
pub struct SimulateArgs {
    /// The daemon's config: tenants, shares, limits, queue policy, usage half-life. Without
    /// it, every tenant the trace names has an equal share and no limits.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The trace of submissions (JSON lines, times in seconds); `-` or none reads standard
    /// input.
    #[arg(value_name = "TRACE.jsonl")]
    pub trace: Option<std::path::PathBuf>,
    /// Stop the virtual clock here (seconds) and report what was used by then.
    #[arg(long, value_name = "SECONDS")]
    pub until: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// With --json: each job's start and end too.
    #[arg(long, requires = "json")]
    pub jobs: bool,
}

#[derive(Debug, clap::Args)]
pub struct JobIdArgs {
    /// The job id `orch submit` printed.
    pub id: String,
    /// A Slurm job (`orch submit --slurm` printed its id; `1234_5` is task 5 of array 1234).
    #[arg(long)]
    pub slurm: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The job id.
    pub id: String,
    /// A Slurm job (`1234`, or `1234_5` for an array's task).
    #[arg(long)]
    pub slurm: bool,
    /// Keep printing as the job writes, until it ends.
    #[arg(long, short)]
    pub follow: bool,
    /// The job's stderr instead of its stdout.
    #[arg(long)]
    pub stderr: bool,
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
        /// A .wasm component, or the name of a built-in policy, queue policy or trainer.
        #[arg(value_name = "FILE.wasm")]
        file: std::path::PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The compile cache: compiled plugins by last use, their sizes and the cap
    /// (`ORCH_CACHE_SIZE`, default 1GiB); `--clear` empties it.
    Cache {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Remove every compiled plugin (the next load of each compiles it again).
        #[arg(long)]
        clear: bool,
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
    /// Print how the devices are connected, as `nvidia-smi topo -m` does: the link between every
    /// pair (X, NV#, PIX, PXB, PHB, NODE, SYS), each device's CPU and NUMA affinity, a legend.
    #[arg(long, conflicts_with_all = ["json", "check_cuda"])]
    pub topo: bool,
    /// Say why a device is drained or unhealthy in the STATE column.
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch drain 1 --reason \"fan replacement\"\n  orch drain GPU-8932f937\n  orch undrain 1"
)]
pub struct DrainArgs {
    /// The device: a GPU's index (as orch devices shows it), its GPU-… uuid (or its first 12
    /// characters), or a MIG slice's MIG-… uuid.
    pub device: String,
    /// Why, shown in orch devices -v, the page and the reason of a job that waits for it.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct UndrainArgs {
    /// The device, named as for orch drain.
    pub device: String,
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
    after_help = "Through the machine's daemon the allocation is a job of your tenant's queue, shown as `NAME (interactive alloc)` in `orch jobs`; without one it is a lease of the local store.\n\nExamples:\n  orch alloc --gpus 2                      # $SHELL on 2 GPUs, until it exits\n  orch alloc --gpus 1 --time 4h --idle 30m # ended at 4h, or after 30 min of idle GPUs\n  orch alloc --gpus 2 --wait -- python debug.py"
)]
pub struct AllocArgs {
    #[command(flatten)]
    pub quick: QuickArgs,
    /// Its time limit (`4h`, `90m`): the shell's processes get SIGHUP and SIGTERM then, SIGKILL
    /// after the grace period.
    #[arg(long, value_name = "DURATION")]
    pub time: Option<String>,
    /// Release it once all its GPUs have stayed idle this long (`30m`); needs the machine's
    /// daemon, which reads the GPUs' utilization.
    #[arg(long, value_name = "DURATION")]
    pub idle: Option<String>,
    /// When nothing fits now, wait in the queue (saying why) until something does.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (`90s`, `15m`, `2h`; default: forever).
    #[arg(long, value_name = "DURATION", requires = "wait")]
    pub timeout: Option<String>,
    /// The command to run instead of $SHELL (or /bin/sh), and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The quick form's flags, `orch run` and `orch submit` alike: `--gpus N … -- CMD` stands for a
/// job file (commands/quick.rs builds the job from them).
#[derive(Debug, clap::Args)]
pub struct QuickArgs {
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
    /// Quick form: a warning signal that long before the time limit, and at a cancel or a
    /// preemption (`USR1@300s`; `[job] signal`).
    #[arg(long, value_name = "SIG@DURATION")]
    pub signal: Option<String>,
    /// Quick form: from the stop signal to SIGKILL (`60s`; `[job] grace`; default 10s).
    #[arg(long, value_name = "DURATION")]
    pub grace: Option<String>,
    /// Quick form: how CUDA_VISIBLE_DEVICES names the GPUs: `uuid` (the default) or `index`,
    /// CUDA's numbers inside the job, for programs that refuse UUIDs (`[command] device_ids`).
    #[arg(long, value_name = "FORM", value_parser = ["uuid", "index"])]
    pub device_ids: Option<String>,
    /// Quick form: `numa` runs the job on its GPUs' NUMA nodes' CPUs and memory (the default
    /// where the devices' nodes are known), `none` leaves it where orch runs
    /// (`[resources] cpu_bind`).
    #[arg(long, value_name = "HOW", value_parser = ["numa", "none"])]
    pub cpu_bind: Option<String>,
    /// Quick form: the devices are MIG slices of this profile (`1g.10gb`), `--gpus` of them
    /// (`[resources] mig`); several need `--per-device`.
    #[arg(long, value_name = "PROFILE")]
    pub mig: Option<String>,
}

/// The quick form's flags, which a job file excludes.
pub const QUICK_FLAGS: &[&str] = &[
    "gpus",
    "policy",
    "min_free_memory",
    "max_utilization",
    "memory_limit",
    "exclusive",
    "shared",
    "per_device",
    "signal",
    "grace",
    "device_ids",
    "cpu_bind",
    "mig",
];

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch run job.toml\n  orch run --gpus 2 --policy least-loaded --min-free-memory 10GiB -- python train.py"
)]
pub struct RunArgs {
    /// The job file; omit it and give the command after `--` for the quick form.
    #[arg(value_name = "JOB.toml", conflicts_with_all = QUICK_FLAGS)]
    pub job: Option<std::path::PathBuf>,
    /// When nothing fits now, wait (backing off, saying why) until something does.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (`90s`, `15m`, `2h`; default: forever).
    #[arg(long, value_name = "DURATION", requires = "wait")]
    pub timeout: Option<String>,
    #[command(flatten)]
    pub quick: QuickArgs,
    /// Quick form: the command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// A `[train]` job: continue from the checkpoint in its output folder (`[train] out`).
    #[arg(long, requires = "job")]
    pub resume: bool,
    /// Run only task N (from 0) of the job's [sweep] (a Slurm job array runs one per task).
    #[arg(long, value_name = "N", requires = "job")]
    pub sweep_task: Option<usize>,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch completions bash > /etc/bash_completion.d/orch\n  orch completions zsh > \"${fpath[1]}/_orch\"\n  orch completions fish > ~/.config/fish/completions/orch.fish"
)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  orch man | man -l -\n  orch man --out /usr/local/share/man/man1"
)]
pub struct ManArgs {
    /// Write orch.1 and one page per subcommand (orch-run.1, ...) into this folder instead.
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}
