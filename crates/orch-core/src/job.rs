//! `job.toml`, the whole schema of docs/JOBS.md: parsed with spans, validated, relative paths
//! resolved against the job file's folder.
//!
//! Every error is an [`InputError`]: file:line:col of the offending value, one sentence, and a
//! hint. Checks that need the machine (more GPUs than are visible, an unknown built-in policy)
//! happen at plan time; the spec keeps the locations they point at ([`Resources::gpus_at`],
//! [`PolicySpec::plugin_at`]).

use crate::limits::LimitSettings;
use crate::{ByteSize, InputError, Location};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// A parsed, valid job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The job file.
    pub path: PathBuf,
    /// Its folder: relative paths resolve here.
    pub dir: PathBuf,
    pub name: String,
    pub tenant: Option<String>,
    pub priority: i64,
    /// `[job] max_runtime`: the daemon stops the job after this long.
    pub max_runtime: Option<std::time::Duration>,
    /// `[job] requeue`: a daemon that finds the job's processes gone after a crash queues it
    /// again instead of marking it lost.
    pub requeue: bool,
    /// `[job] preemptible`: the daemon may stop the job for a tenant under its share.
    pub preemptible: bool,
    /// `[job] tags`: free words a queue policy may act on ("paper-deadline").
    pub tags: Vec<String>,
    /// `[job] signal` and `[job] grace`: the warning before the time limit, and the time from the
    /// stop signal to SIGKILL.
    pub stopping: Stopping,
    pub resources: Resources,
    /// `[slurm]`: `sbatch` options for `orch submit --slurm`.
    pub slurm: SlurmSpec,
    /// `[sweep]`: parameter lists; the job runs once per combination (their cross product).
    pub sweep: Sweep,
    pub policy: PolicySpec,
    pub work: Work,
    /// `[job] after_ok`, `after_any`, `after_failed`, `singleton`: what the daemon waits for
    /// before it considers the job.
    pub depends: Dependencies,
}

/// What a job waits for before the daemon considers it (as Slurm's `--dependency`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Dependencies {
    /// Jobs that must have succeeded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<i64>,
    /// Jobs that must have ended, however they ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<i64>,
    /// Jobs that must have ended without succeeding (failed, cancelled, lost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_failed: Vec<i64>,
    /// At most one running job per user and name: this one waits while another runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub singleton: bool,
}

impl Dependencies {
    pub fn is_empty(&self) -> bool {
        self.after_ok.is_empty()
            && self.after_any.is_empty()
            && self.after_failed.is_empty()
            && !self.singleton
    }

    /// Every `(key, job)` pair: `after_ok`, `after_any`, `after_failed` in that order.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, i64)> + '_ {
        self.after_ok
            .iter()
            .map(|&id| ("after_ok", id))
            .chain(self.after_any.iter().map(|&id| ("after_any", id)))
            .chain(self.after_failed.iter().map(|&id| ("after_failed", id)))
    }

    /// These and `more` together (a submission's flags add to its file's lists); each list
    /// keeps one of each id.
    pub fn merged(&self, more: &Dependencies) -> Dependencies {
        let join = |a: &[i64], b: &[i64]| {
            let mut out: Vec<i64> = Vec::with_capacity(a.len() + b.len());
            for &id in a.iter().chain(b) {
                if !out.contains(&id) {
                    out.push(id);
                }
            }
            out
        };
        Dependencies {
            after_ok: join(&self.after_ok, &more.after_ok),
            after_any: join(&self.after_any, &more.after_any),
            after_failed: join(&self.after_failed, &more.after_failed),
            singleton: self.singleton || more.singleton,
        }
    }
}

/// `[resources]`: what placement must find.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// How many devices (default 1); per node when `nodes` > 1.
    pub gpus: u32,
    /// How many machines (default 1): more is for Slurm (`orch submit --slurm`).
    pub nodes: u32,
    /// Where `gpus` is written (the table, or the file start when defaulted).
    pub gpus_at: Location,
    pub min_free_memory: Option<ByteSize>,
    pub max_utilization: Option<u32>,
    pub memory_limit: Option<ByteSize>,
    /// No other lease may share the devices (default true).
    pub exclusive: bool,
    /// Stop a command job whose processes exceed `memory_limit` on a real GPU (default false:
    /// the excess is reported).
    pub enforce_memory_limit: bool,
    /// `cpu_bind`: where the job's processes run and allocate memory; `None` (not said) binds to
    /// the GPUs' NUMA nodes where the inventory knows them ([`CpuBind::Numa`]).
    pub cpu_bind: Option<CpuBind>,
    /// `mig`: the job's `gpus` are MIG slices of this profile (`1g.10gb`), not whole GPUs.
    pub mig: Option<String>,
}

/// `[resources] cpu_bind`: which CPUs and memory a job's processes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuBind {
    /// The CPUs of the granted GPUs' NUMA nodes, memory from those nodes; each rank of a
    /// per-device launch its own GPU's.
    Numa,
    /// Wherever orch itself may run.
    None,
}

impl CpuBind {
    pub const VALUES: &'static str =
        "\"numa\" (the CPUs and memory of the GPUs' NUMA nodes, the default) or \"none\"";

    pub fn parse(text: &str) -> Option<CpuBind> {
        match text {
            "numa" => Some(CpuBind::Numa),
            "none" => Some(CpuBind::None),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CpuBind::Numa => "numa",
            CpuBind::None => "none",
        }
    }
}

/// `[command] device_ids`: how `CUDA_VISIBLE_DEVICES` names the granted GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceIds {
    /// `GPU-…`/`MIG-…` UUIDs: the same in every process (the default).
    Uuid,
    /// The indices CUDA numbers the granted GPUs by inside the job, for programs that refuse
    /// UUIDs.
    Index,
}

impl DeviceIds {
    pub const VALUES: &'static str =
        "\"uuid\" (the default) or \"index\" (for programs that refuse UUIDs)";

    pub fn parse(text: &str) -> Option<DeviceIds> {
        match text {
            "uuid" => Some(DeviceIds::Uuid),
            "index" => Some(DeviceIds::Index),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceIds::Uuid => "uuid",
            DeviceIds::Index => "index",
        }
    }
}

/// `[slurm]`: the `sbatch` options a job file may set. Values reach a batch script's `#SBATCH`
/// lines, so none may hold a line break or another control character.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmSpec {
    /// `(option, value)` by key: `partition`, `account`, `qos`, `constraint`, ... as
    /// `sbatch --partition=VALUE` etc.
    pub options: Vec<(String, String)>,
    /// `gpu_type`: the GPU type in `--gres=gpu:TYPE:N`.
    pub gpu_type: Option<String>,
}

/// The `[slurm]` keys that become `sbatch` options (`gpu_type` goes into `--gres`).
pub const SLURM_OPTIONS: &[&str] = &[
    "partition",
    "account",
    "qos",
    "constraint",
    "reservation",
    "cpus_per_task",
    "mem",
    "mem_per_gpu",
    "exclude",
    "nodelist",
    "mail_user",
    "mail_type",
    "begin",
];

/// `[sweep]`: each key with its values, keys in alphabetical order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sweep {
    pub params: Vec<(String, Vec<String>)>,
    /// `[sweep] max_parallel`: at most this many tasks of the array run at once (Slurm's
    /// `--array=0-N%M`; the daemon's scheduler holds back the rest). `None`: no bound.
    pub max_parallel: Option<u32>,
}

impl Sweep {
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// How many combinations (1 without a sweep; `usize::MAX` past what a machine can count).
    pub fn len(&self) -> usize {
        self.params
            .iter()
            .try_fold(1usize, |n, (_, v)| n.checked_mul(v.len()))
            .unwrap_or(usize::MAX)
    }

    /// Combination `task` (0-based; the last key varies fastest), as `(key, value)` pairs.
    pub fn task(&self, task: usize) -> Option<Vec<(String, String)>> {
        if task >= self.len() {
            return None;
        }
        let mut rest = task;
        let mut out = vec![(String::new(), String::new()); self.params.len()];
        for (i, (key, values)) in self.params.iter().enumerate().rev() {
            out[i] = (key.clone(), values[rest % values.len()].clone());
            rest /= values.len();
        }
        Some(out)
    }
}

impl JobSpec {
    /// Task `task` of the job's `[sweep]`: a `[train]` job gets `seed`, `epochs` (or `steps`,
    /// when it trains by steps) and `batch_size` as its own and every other parameter as a `[train.config]` entry, and writes
    /// to `OUT/sweep-TASK`; a `[command]` job gets each as an
    /// environment variable (the key in capitals) and in its arguments where they say `{key}`.
    /// Both get `ORCH_SWEEP_TASK`. `None` past the last task.
    pub fn sweep_task(&self, task: usize) -> Option<JobSpec> {
        let params = self.sweep.task(task)?;
        let mut job = self.clone();
        job.sweep = Sweep::default();
        job.name = format!("{}-{task}", self.name);
        match &mut job.work {
            Work::Train(train) => {
                for (key, value) in &params {
                    // `seed`, `epochs` and `batch_size` are the run's own; the rest is the
                    // trainer's configuration.
                    let number = value.parse::<u64>().ok();
                    match (key.as_str(), number) {
                        ("seed", Some(n)) => train.seed = n,
                        ("epochs", Some(n)) if n > 0 => {
                            train.epochs = u32::try_from(n).unwrap_or(u32::MAX)
                        }
                        ("steps", Some(n)) if n > 0 && train.steps.is_some() => {
                            train.steps = Some(n)
                        }
                        ("batch_size", Some(n)) if n > 0 => {
                            train.batch_size = u32::try_from(n).unwrap_or(u32::MAX)
                        }
                        _ => {
                            train.config.retain(|(k, _)| k != key);
                            train.config.push((key.clone(), value.clone()));
                        }
                    }
                }
                train.out = train.out.join(format!("sweep-{task}"));
            }
            Work::Command(command) => {
                for (key, value) in &params {
                    let var: String = key
                        .chars()
                        .map(|c| {
                            if c.is_ascii_alphanumeric() {
                                c.to_ascii_uppercase()
                            } else {
                                '_'
                            }
                        })
                        .collect();
                    command.env.insert(var, value.clone());
                    for arg in &mut command.argv {
                        *arg = arg.replace(&format!("{{{key}}}"), value);
                    }
                }
                command
                    .env
                    .insert("ORCH_SWEEP_TASK".into(), task.to_string());
            }
        }
        Some(job)
    }
}

/// `[policy]`: which plugin chooses, with its configuration as strings.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    pub plugin: PluginRef,
    pub plugin_at: Location,
    pub config: Vec<(String, String)>,
    /// `deadline` and `memory`: the plugin's limits, when the job sets them (bounded by the
    /// machine's maxima, [`crate::MachineLimits`]).
    pub limits: LimitSettings,
}

/// A policy (or trainer) plugin: a built-in name, or a `.wasm` component file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginRef {
    Builtin(String),
    Path(PathBuf),
}

impl PluginRef {
    /// `text` is a path when it ends in `.wasm` or has a `/`; relative paths resolve against
    /// `base`. Anything else names a built-in.
    pub fn parse(text: &str, base: &Path) -> PluginRef {
        if text.ends_with(".wasm") || text.contains('/') || text.contains('\\') {
            PluginRef::Path(base.join(text))
        } else {
            PluginRef::Builtin(text.to_string())
        }
    }
}

impl std::fmt::Display for PluginRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginRef::Builtin(name) => f.write_str(name),
            PluginRef::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Exactly one of `[command]` or `[train]`.
// One per job, parsed once: the size of the larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    Command(CommandSpec),
    Train(TrainSpec),
}

/// `[command]`: a program to run on the granted devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub launch: Launch,
    /// `device_ids`: `None` when the job does not say (a tenant's default, else UUIDs).
    pub device_ids: Option<DeviceIds>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launch {
    /// One process sees every granted device.
    Single,
    /// One process per device, with torchrun-style variables.
    PerDevice,
}

/// The longest closing sample a text job may ask for (`[train] sample_tokens`): every character
/// is one call of the model, made after training, while the job still holds its devices.
pub const MAX_SAMPLE_TOKENS: u64 = 100_000;

/// `[train]`: a Wasm trainer run data-parallel on the granted devices.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSpec {
    /// A built-in trainer name (`mlp`) or a `.wasm` component.
    pub plugin: PluginRef,
    pub plugin_at: Location,
    /// Passes over the data set (1 when the job trains by `steps` and does not say).
    pub epochs: u32,
    /// `[train] steps`: the run's training steps, instead of `epochs` passes (and text data is
    /// trained by steps only).
    pub steps: Option<u64>,
    /// `[train] eval_every`: evaluate every this many steps and at the end (`None`: at the end
    /// of every epoch, or at the end of a run by steps).
    pub eval_every: Option<u64>,
    /// `[train] eval_batches`: evaluation batches per evaluation (`None`: the whole
    /// evaluation set, or 20 batches of text windows).
    pub eval_batches: Option<u32>,
    /// `[train] sample_tokens`: text only: characters the trained model generates at the end of
    /// the run, printed and written to `sample.txt` (`None`: 200 when the trainer can predict;
    /// `Some(0)`: none).
    pub sample_tokens: Option<u64>,
    /// Global batch, split across replicas.
    pub batch_size: u32,
    pub seed: u64,
    pub data: DataSpec,
    pub config: Vec<(String, String)>,
    /// `deadline` (how long one plugin call, `init-replica` with the instantiation before it, a
    /// training or an evaluation step, may run; `step_timeout` is its older name) and `memory`
    /// (the plugin's linear memory; tensors live outside it), when the job sets them. Unset, a
    /// trainer gets 60 s and 256 MiB, within the machine's maxima ([`crate::MachineLimits`]).
    pub limits: LimitSettings,
    /// Save a checkpoint every this many steps (and always at the end); `None`: only at the end.
    pub checkpoint_every: Option<u64>,
    /// Replicas (data parallel); `None`: one per granted device. Fewer replicas than devices
    /// leave the other devices to the trainer (model parallel).
    pub replicas: Option<u32>,
    /// Where metrics, the plot and checkpoints go (default `runs/<job name>` beside the job).
    pub out: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataSpec {
    pub format: DataFormat,
    pub train: PathBuf,
    /// The evaluation set: for `mnist-idx`, a folder with the `t10k-*` files (default: the
    /// `train` folder); for `csv`, a file (default: no evaluation).
    pub test: Option<PathBuf>,
    /// CSV: the label column, negative from the end (default -1, the last).
    pub label_column: i64,
    /// CSV: skip the first line.
    pub header: bool,
    /// CSV: every feature is divided by this (default 1).
    pub scale: f32,
    /// Standardise features with the training set's mean and deviation (default true; never
    /// for text).
    pub normalize: bool,
    /// Text: the window length, tokens per sample.
    pub block_size: Option<u32>,
    /// Text: the 256 byte values as the vocabulary, instead of the training text's characters.
    pub bytes_vocab: bool,
    /// Text: leave out evaluation characters outside the vocabulary instead of refusing them.
    pub skip_unknown: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataFormat {
    /// MNIST's IDX files, gzip-compressed or raw.
    MnistIdx,
    Csv,
    /// One safetensors file: `features` `[samples, ...]` and `labels` `[samples]`.
    Safetensors,
    /// Plain or gzipped text, tokenised by character (or byte), in windows of `block_size`.
    Text,
}

/// A job file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("cannot read job file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Invalid(#[from] InputError),
}

/// Reads and validates the job file at `path`.
pub fn read(path: &Path) -> Result<JobSpec, JobError> {
    let text = std::fs::read_to_string(path).map_err(|source| JobError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse(path, &text)?)
}

/// Parses a job file's text; `path` locates errors and anchors relative paths.
pub fn parse(path: &Path, text: &str) -> Result<JobSpec, InputError> {
    let raw: RawJob = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
    Checker { path, text }.job(raw)
}

fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> InputError {
    let error = InputError::from_toml(path, text, err);
    let hint = if error.message.contains("unknown field") {
        "check the spelling; docs/JOBS.md lists every key"
    } else if error.message.contains("missing field") {
        "add the missing key"
    } else if error.message.contains("invalid type") {
        "check the value's type: sizes are \"10GiB\" or integers, flags true/false"
    } else {
        "see the example in docs/JOBS.md"
    };
    error.with_hint(hint)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    job: RawJobTable,
    resources: Option<Spanned<RawResources>>,
    slurm: Option<toml::Table>,
    sweep: Option<toml::Table>,
    policy: Option<RawPolicy>,
    command: Option<Spanned<RawCommand>>,
    train: Option<Spanned<RawTrain>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobTable {
    name: Spanned<String>,
    tenant: Option<String>,
    #[serde(default)]
    priority: i64,
    max_runtime: Option<Spanned<String>>,
    #[serde(default)]
    requeue: bool,
    #[serde(default)]
    preemptible: bool,
    #[serde(default)]
    tags: Vec<String>,
    signal: Option<Spanned<String>>,
    grace: Option<Spanned<String>>,
    after_ok: Option<Spanned<Vec<Spanned<i64>>>>,
    after_any: Option<Spanned<Vec<Spanned<i64>>>>,
    after_failed: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    singleton: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    gpus: Option<Spanned<i64>>,
    nodes: Option<Spanned<i64>>,
    min_free_memory: Option<ByteSize>,
    max_utilization: Option<Spanned<i64>>,
    memory_limit: Option<Spanned<ByteSize>>,
    exclusive: Option<bool>,
    enforce_memory_limit: Option<Spanned<bool>>,
    cpu_bind: Option<Spanned<String>>,
    mig: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    plugin: Option<Spanned<String>>,
    config: Option<BTreeMap<String, Spanned<toml::Value>>>,
    deadline: Option<Spanned<toml::Value>>,
    memory: Option<Spanned<toml::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    argv: Spanned<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    launch: Option<Launch>,
    device_ids: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrain {
    plugin: Spanned<String>,
    epochs: Option<Spanned<i64>>,
    steps: Option<Spanned<i64>>,
    eval_every: Option<Spanned<i64>>,
    eval_batches: Option<Spanned<i64>>,
    sample_tokens: Option<Spanned<i64>>,
    batch_size: Spanned<i64>,
    #[serde(default)]
    seed: u64,
    data: RawData,
    config: Option<BTreeMap<String, Spanned<toml::Value>>>,
    deadline: Option<Spanned<toml::Value>>,
    step_timeout: Option<Spanned<toml::Value>>,
    memory: Option<Spanned<toml::Value>>,
    checkpoint_every: Option<Spanned<i64>>,
    replicas: Option<Spanned<i64>>,
    out: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawData {
    format: DataFormat,
    train: Spanned<String>,
    #[serde(alias = "val")]
    test: Option<Spanned<String>>,
    label_column: Option<i64>,
    block_size: Option<Spanned<i64>>,
    vocab: Option<Spanned<String>>,
    unknown: Option<Spanned<String>>,
    #[serde(default)]
    header: bool,
    scale: Option<Spanned<f64>>,
    normalize: Option<bool>,
}

/// Most devices one job may ask for; more is surely a typo.
const MAX_GPUS: i64 = 4096;

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Checker<'_> {
    fn at(&self, span: Range<usize>, message: impl Into<String>) -> InputError {
        InputError::at(self.path, self.text, span.start, message)
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    fn job(&self, raw: RawJob) -> Result<JobSpec, InputError> {
        let name = raw.job.name;
        if name.get_ref().trim().is_empty() {
            return Err(self
                .at(name.span(), "[job] name is empty")
                .with_hint("name the job, such as name = \"mnist-mlp\""));
        }
        // Everyone's `orch jobs`, `orch status` and web page show the name: it may not carry
        // terminal escapes, line breaks or bidirectional overrides, nor pad every row.
        if let Some(problem) = crate::text::name_problem(name.get_ref()) {
            return Err(self
                .at(name.span(), format!("[job] name {problem}"))
                .with_hint(crate::text::NAME_RULE));
        }
        let work = self.work(raw.command, raw.train, name.get_ref().trim())?;
        let resources = self.resources(raw.resources)?;
        if resources.nodes > 1 && matches!(work, Work::Train(_)) {
            let at = self.text.find("nodes").unwrap_or(0);
            return Err(self
                .at(
                    at..at,
                    format!(
                        "nodes = {}: a [train] job runs within one machine (its replicas share the host's memory for gradients)",
                        resources.nodes
                    ),
                )
                .with_hint("use nodes = 1 with more gpus, or a [command] job (PyTorch DDP, JAX, TensorFlow) across nodes"));
        }
        if let Some(problem) = mig::launch_problem(&resources, &work) {
            let at = self.key_at("resources", "mig");
            return Err(self.at(at, problem).with_hint(
                "a job of one slice runs as one process; several slices run as one process each",
            ));
        }
        let slurm = self.slurm(raw.slurm)?;
        let sweep = self.sweep(raw.sweep)?;
        let max_runtime = match &raw.job.max_runtime {
            None => None,
            Some(text) => Some(crate::duration::parse(text.get_ref()).ok_or_else(|| {
                self.at(
                    text.span(),
                    format!("max_runtime = \"{}\" is not a duration", text.get_ref()),
                )
                .with_hint("give a positive duration such as \"90m\", \"12h\" or \"3d\"")
            })?),
        };
        let stopping = self.stopping(&raw.job.signal, &raw.job.grace)?;
        let depends = Dependencies {
            after_ok: self.job_ids("after_ok", raw.job.after_ok)?,
            after_any: self.job_ids("after_any", raw.job.after_any)?,
            after_failed: self.job_ids("after_failed", raw.job.after_failed)?,
            singleton: raw.job.singleton,
        };
        Ok(JobSpec {
            depends,
            path: self.path.to_path_buf(),
            dir: self.dir(),
            name: name.into_inner(),
            tenant: raw.job.tenant,
            priority: raw.job.priority,
            max_runtime,
            requeue: raw.job.requeue,
            preemptible: raw.job.preemptible,
            tags: raw.job.tags,
            stopping,
            resources,
            slurm,
            sweep,
            policy: self.policy(raw.policy)?,
            work,
        })
    }

    /// `[job] signal` and `[job] grace`.
    fn stopping(
        &self,
        signal: &Option<Spanned<String>>,
        grace: &Option<Spanned<String>>,
    ) -> Result<Stopping, InputError> {
        let signal = match signal {
            None => None,
            Some(text) => Some(stopping::parse_signal(text.get_ref()).map_err(|why| {
                self.at(text.span(), format!("signal = {why}")).with_hint(
                    "signal = \"USR1@300s\" sends SIGUSR1 300 s before the job's max_runtime (and at a cancel or a preemption)",
                )
            })?),
        };
        let grace = match grace {
            None => None,
            Some(text) => Some(crate::duration::parse(text.get_ref()).ok_or_else(|| {
                self.at(
                    text.span(),
                    format!("grace = \"{}\" is not a duration", text.get_ref()),
                )
                .with_hint(
                    "give the time from the stop signal to SIGKILL, such as \"60s\" or \"5m\"",
                )
            })?),
        };
        Ok(Stopping { signal, grace })
    }

    /// A dependency list of `[job]` (`key = [12, 13]`): job ids, each a positive number.
    fn job_ids(
        &self,
        key: &str,
        raw: Option<Spanned<Vec<Spanned<i64>>>>,
    ) -> Result<Vec<i64>, InputError> {
        let mut ids = Vec::new();
        for id in raw.map(Spanned::into_inner).into_iter().flatten() {
            if *id.get_ref() < 1 {
                return Err(self
                    .at(
                        id.span(),
                        format!("{key}: {} is not a job id", id.get_ref()),
                    )
                    .with_hint("give the ids `orch submit` printed, such as after_ok = [12]"));
            }
            if !ids.contains(id.get_ref()) {
                ids.push(*id.get_ref());
            }
        }
        Ok(ids)
    }

    fn resources(&self, raw: Option<Spanned<RawResources>>) -> Result<Resources, InputError> {
        let Some(raw) = raw else {
            return Ok(Resources {
                gpus: 1,
                nodes: 1,
                gpus_at: Location::from_offset(self.path, self.text, 0),
                min_free_memory: None,
                max_utilization: None,
                memory_limit: None,
                exclusive: true,
                enforce_memory_limit: false,
                cpu_bind: None,
                mig: None,
            });
        };
        let table_span = raw.span();
        let raw = raw.into_inner();
        let (gpus, gpus_at) = match raw.gpus {
            None => (1, table_span),
            Some(gpus) if !(1..=MAX_GPUS).contains(gpus.get_ref()) => {
                return Err(self
                    .at(
                        gpus.span(),
                        format!("gpus = {} is impossible", gpus.get_ref()),
                    )
                    .with_hint(format!("ask for 1 to {MAX_GPUS} devices")));
            }
            Some(gpus) => (*gpus.get_ref() as u32, gpus.span()),
        };
        let nodes = match raw.nodes {
            None => 1,
            Some(n) if !(1..=MAX_GPUS).contains(n.get_ref()) => {
                return Err(self
                    .at(n.span(), format!("nodes = {} is impossible", n.get_ref()))
                    .with_hint(format!("ask for 1 to {MAX_GPUS} machines")));
            }
            Some(n) => *n.get_ref() as u32,
        };
        let max_utilization = match raw.max_utilization {
            None => None,
            Some(u) if !(0..=100).contains(u.get_ref()) => {
                return Err(self
                    .at(
                        u.span(),
                        format!("max_utilization = {} is not a percent", u.get_ref()),
                    )
                    .with_hint("give 0 to 100"));
            }
            Some(u) => Some(*u.get_ref() as u32),
        };
        if let Some(limit) = &raw.memory_limit
            && limit.get_ref().bytes() == 0
        {
            return Err(self
                .at(limit.span(), "memory_limit = 0 leaves the job no memory")
                .with_hint("give a size such as \"16GiB\", or leave memory_limit out"));
        }
        if let Some(enforce) = raw.enforce_memory_limit.as_ref().filter(|e| *e.get_ref())
            && raw.memory_limit.is_none()
        {
            return Err(self
                .at(
                    enforce.span(),
                    "enforce_memory_limit = true needs a memory_limit to enforce",
                )
                .with_hint("add memory_limit = \"16GiB\" (per device) to [resources]"));
        }
        let cpu_bind = match &raw.cpu_bind {
            None => None,
            Some(text) => Some(CpuBind::parse(text.get_ref()).ok_or_else(|| {
                self.at(
                    text.span(),
                    format!("cpu_bind = {:?} is not known", text.get_ref()),
                )
                .with_hint(format!("give {}", CpuBind::VALUES))
            })?),
        };
        let mig = match raw.mig {
            Some(text) if !mig::is_profile(text.get_ref()) => {
                return Err(self
                    .at(
                        text.span(),
                        format!("mig = {:?} is not a MIG profile", text.get_ref()),
                    )
                    .with_hint(mig::PROFILE_HINT));
            }
            other => other.map(Spanned::into_inner),
        };
        Ok(Resources {
            mig,
            cpu_bind,
            gpus,
            nodes,
            gpus_at: Location::from_offset(self.path, self.text, gpus_at.start),
            min_free_memory: raw.min_free_memory,
            max_utilization,
            memory_limit: raw.memory_limit.map(Spanned::into_inner),
            exclusive: raw.exclusive.unwrap_or(true),
            enforce_memory_limit: raw.enforce_memory_limit.is_some_and(|e| *e.get_ref()),
        })
    }

    /// The place of `key` in table `[name]` (for messages about a value of a plain table).
    fn key_at(&self, table: &str, key: &str) -> Range<usize> {
        let start = self.text.find(&format!("[{table}]")).unwrap_or(0);
        let at = self.text[start..].find(key).map_or(start, |i| start + i);
        at..at + key.len()
    }

    fn slurm(&self, raw: Option<toml::Table>) -> Result<SlurmSpec, InputError> {
        let mut spec = SlurmSpec::default();
        for (key, value) in raw.into_iter().flatten() {
            let at = self.key_at("slurm", &key);
            let text = match &value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                _ => {
                    return Err(self
                        .at(at, format!("[slurm] {key} must be a string or a number"))
                        .with_hint(format!("such as {key} = \"gpu\"")));
                }
            };
            if text.trim().is_empty() || text.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(self
                    .at(
                        at,
                        format!("[slurm] {key} is empty or holds a space, line break or control character"),
                    )
                    .with_hint("give one plain value such as \"gpu\"; it becomes one #SBATCH option"));
            }
            if key == "gpu_type" {
                spec.gpu_type = Some(text);
            } else if SLURM_OPTIONS.contains(&key.as_str()) {
                spec.options.push((key, text));
            } else {
                return Err(self
                    .at(at, format!("unknown [slurm] key `{key}`"))
                    .with_hint(format!(
                        "known keys: gpu_type, {}",
                        SLURM_OPTIONS.join(", ")
                    )));
            }
        }
        Ok(spec)
    }

    fn sweep(&self, raw: Option<toml::Table>) -> Result<Sweep, InputError> {
        let mut params = Vec::new();
        let mut max_parallel = None;
        for (key, value) in raw.into_iter().flatten() {
            let at = self.key_at("sweep", &key);
            if key == "max_parallel" {
                let n = match &value {
                    toml::Value::Integer(n) => u32::try_from(*n).ok().filter(|n| *n > 0),
                    _ => None,
                };
                let Some(n) = n else {
                    return Err(self
                        .at(at, format!("[sweep] max_parallel = {value} is impossible"))
                        .with_hint("max_parallel is how many tasks of the sweep may run at once: a whole number of at least 1 (it is not swept over)"));
                };
                max_parallel = Some(n);
                continue;
            }
            let list = match &value {
                toml::Value::Array(list) if !list.is_empty() => list,
                _ => {
                    return Err(self
                        .at(at, format!("[sweep] {key} is not a list of values"))
                        .with_hint(format!("such as {key} = [0.1, 0.05, 0.01]")));
                }
            };
            let mut values = Vec::with_capacity(list.len());
            for v in list {
                values.push(match v {
                    toml::Value::String(s) if !s.chars().any(char::is_control) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    _ => {
                        return Err(self
                            .at(at, format!("[sweep] {key} holds a value that is not a plain string, number or boolean"))
                            .with_hint("sweep over numbers, words or booleans"));
                    }
                });
            }
            params.push((key, values));
        }
        if max_parallel.is_some() && params.is_empty() {
            let at = self.key_at("sweep", "max_parallel");
            return Err(self
                .at(
                    at,
                    "[sweep] sets max_parallel but no parameter to sweep over",
                )
                .with_hint("add a list such as lr = [0.1, 0.01], or leave out [sweep]"));
        }
        let sweep = Sweep {
            params,
            max_parallel,
        };
        if sweep.len() > 10_000 {
            let at = self.key_at("sweep", "");
            return Err(self
                .at(at, format!("[sweep] makes {} combinations", sweep.len()))
                .with_hint("sweep over at most 10,000 combinations per job file"));
        }
        Ok(sweep)
    }

    fn policy(&self, raw: Option<RawPolicy>) -> Result<PolicySpec, InputError> {
        let (plugin, config, limits) = match raw {
            Some(raw) => {
                let limits = LimitSettings::parse(
                    self.path,
                    self.text,
                    "[policy]",
                    raw.deadline.as_ref(),
                    raw.memory.as_ref(),
                )?;
                (raw.plugin, raw.config, limits)
            }
            None => (None, None, LimitSettings::default()),
        };
        let (plugin, plugin_at) = match plugin {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self
                    .at(p.span(), "[policy] plugin is empty")
                    .with_hint("name a built-in such as \"least-loaded\", or a path to a .wasm"));
            }
            Some(p) => (
                PluginRef::parse(p.get_ref().trim(), &self.dir()),
                Location::from_offset(self.path, self.text, p.span().start),
            ),
            None => (
                PluginRef::Builtin("least-loaded".to_string()),
                Location::from_offset(self.path, self.text, 0),
            ),
        };
        Ok(PolicySpec {
            plugin,
            plugin_at,
            config: self.config(config)?,
            limits,
        })
    }

    /// A free-form table as key/value strings: strings, numbers and booleans are accepted.
    fn config(
        &self,
        raw: Option<BTreeMap<String, Spanned<toml::Value>>>,
    ) -> Result<Vec<(String, String)>, InputError> {
        let mut pairs = Vec::new();
        for (key, value) in raw.unwrap_or_default() {
            let span = value.span();
            let text = match value.into_inner() {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(self
                        .at(span, format!("config key `{key}` is {}", other.type_str()))
                        .with_hint("config values are strings, numbers or booleans: write a list as \"0,2\""));
                }
            };
            pairs.push((key, text));
        }
        Ok(pairs)
    }

    fn work(
        &self,
        command: Option<Spanned<RawCommand>>,
        train: Option<Spanned<RawTrain>>,
        job_name: &str,
    ) -> Result<Work, InputError> {
        match (command, train) {
            (Some(_), Some(train)) => Err(self
                .at(train.span(), "the job has both [command] and [train]")
                .with_hint("a job runs a command or trains a Wasm plugin: keep one of the two")),
            (None, None) => Err(self
                .at(0..0, "the job has neither [command] nor [train]")
                .with_hint("add [command] argv = [...] to run a program, or [train] to train a Wasm plugin")),
            (Some(command), None) => self.command(command.into_inner()).map(Work::Command),
            (None, Some(train)) => self.train(train.into_inner(), job_name).map(Work::Train),
        }
    }

    fn command(&self, raw: RawCommand) -> Result<CommandSpec, InputError> {
        if raw.argv.get_ref().first().is_none_or(|a| a.is_empty()) {
            return Err(self
                .at(raw.argv.span(), "[command] argv names no program")
                .with_hint(
                    "give the program and its arguments, such as argv = [\"python\", \"train.py\"]",
                ));
        }
        let device_ids = match &raw.device_ids {
            None => None,
            Some(text) => Some(DeviceIds::parse(text.get_ref()).ok_or_else(|| {
                self.at(
                    text.span(),
                    format!("device_ids = {:?} is not known", text.get_ref()),
                )
                .with_hint(format!("give {}", DeviceIds::VALUES))
            })?),
        };
        Ok(CommandSpec {
            argv: raw.argv.into_inner(),
            env: raw.env,
            launch: raw.launch.unwrap_or(Launch::Single),
            device_ids,
        })
    }

    fn train(&self, raw: RawTrain, job_name: &str) -> Result<TrainSpec, InputError> {
        let positive = |value: &Spanned<i64>, key: &str| -> Result<u32, InputError> {
            u32::try_from(*value.get_ref())
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| {
                    self.at(
                        value.span(),
                        format!("{key} = {} is impossible", value.get_ref()),
                    )
                    .with_hint(format!("{key} is a whole number of at least 1"))
                })
        };
        let batch_size = positive(&raw.batch_size, "batch_size")?;
        let count = |value: &Option<Spanned<i64>>, key: &str| -> Result<Option<u64>, InputError> {
            value
                .as_ref()
                .map(|v| {
                    u64::try_from(*v.get_ref())
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            self.at(v.span(), format!("{key} = {} is impossible", v.get_ref()))
                                .with_hint(format!(
                                    "{key} is a whole number of at least 1, or leave it out"
                                ))
                        })
                })
                .transpose()
        };
        let steps = count(&raw.steps, "steps")?;
        let eval_every = count(&raw.eval_every, "eval_every")?;
        let eval_batches =
            count(&raw.eval_batches, "eval_batches")?.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        let epochs = match (&raw.epochs, steps) {
            (Some(epochs), None) => positive(epochs, "epochs")?,
            (None, Some(_)) => 1,
            (Some(epochs), Some(_)) => {
                return Err(self
                    .at(epochs.span(), "[train] sets both epochs and steps")
                    .with_hint(
                        "keep one: `epochs` passes over the data, or `steps` training steps",
                    ));
            }
            (None, None) => {
                return Err(self
                    .at(
                        raw.batch_size.span(),
                        "[train] says neither epochs nor steps",
                    )
                    .with_hint(
                        "add `epochs = N` (passes over the data) or `steps = N` (training steps)",
                    ));
            }
        };
        let text = raw.data.format == DataFormat::Text;
        let block_size = match (&raw.data.block_size, text) {
            (Some(v), true) => Some(positive(v, "data.block_size")?),
            (None, true) => {
                return Err(self
                    .at(
                        raw.data.train.span(),
                        "[train.data] format = \"text\" needs block_size",
                    )
                    .with_hint("add `block_size = 64`: the tokens of context each sample has"));
            }
            (Some(v), false) => {
                return Err(self
                    .at(v.span(), "[train.data] block_size is for format = \"text\"")
                    .with_hint("leave it out: samples of this format have the file's shape"));
            }
            (None, false) => None,
        };
        if text && steps.is_none() {
            let at = raw
                .epochs
                .as_ref()
                .map_or(raw.batch_size.span(), |e| e.span());
            return Err(self
                .at(at, "text data is trained by steps, not epochs")
                .with_hint("replace `epochs` with `steps = N`: every step draws batch_size windows at random offsets"));
        }
        let text_only = |value: &Option<Spanned<String>>,
                         key: &str,
                         allowed: &str|
         -> Result<Option<String>, InputError> {
            match value {
                None => Ok(None),
                Some(v) if !text => Err(self
                    .at(
                        v.span(),
                        format!("[train.data] {key} is for format = \"text\""),
                    )
                    .with_hint("leave it out")),
                Some(v) if v.get_ref() == allowed => Ok(Some(allowed.to_string())),
                Some(v) => Err(self
                    .at(
                        v.span(),
                        format!("[train.data] {key} = {:?} is not known", v.get_ref()),
                    )
                    .with_hint(format!(
                        "the one value is \"{allowed}\"; leave it out for the default"
                    ))),
            }
        };
        let sample_tokens = match &raw.sample_tokens {
            None => None,
            Some(v) if !text => {
                return Err(self
                    .at(v.span(), "[train] sample_tokens is for format = \"text\"")
                    .with_hint("leave it out: only a text model generates a sample"));
            }
            Some(v) => Some(
                u64::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| *n <= MAX_SAMPLE_TOKENS)
                    .ok_or_else(|| {
                        self.at(
                            v.span(),
                            format!("sample_tokens = {} is impossible", v.get_ref()),
                        )
                        .with_hint(format!(
                            "give 0 (no sample) to {MAX_SAMPLE_TOKENS} characters, or leave it out; `orch sample` writes longer texts"
                        ))
                    })?,
            ),
        };
        let bytes_vocab = text_only(&raw.data.vocab, "vocab", "bytes")?.is_some();
        let skip_unknown = text_only(&raw.data.unknown, "unknown", "skip")?.is_some();
        for (value, key) in [(&raw.plugin, "plugin"), (&raw.data.train, "data.train")] {
            if value.get_ref().trim().is_empty() {
                return Err(self
                    .at(value.span(), format!("[train] {key} is empty"))
                    .with_hint("give a path, relative to the job file's folder"));
            }
        }
        if let (Some(_), Some(old)) = (&raw.deadline, &raw.step_timeout) {
            return Err(self
                .at(old.span(), "[train] sets both deadline and step_timeout")
                .with_hint("keep `deadline`: `step_timeout` is its older name"));
        }
        let limits = LimitSettings::parse(
            self.path,
            self.text,
            "[train]",
            raw.deadline.as_ref().or(raw.step_timeout.as_ref()),
            raw.memory.as_ref(),
        )?;
        let checkpoint_every = raw
            .checkpoint_every
            .as_ref()
            .map(|v| {
                u64::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        self.at(
                            v.span(),
                            format!("checkpoint_every = {} is impossible", v.get_ref()),
                        )
                        .with_hint("give a number of steps, at least 1, or leave it out")
                    })
            })
            .transpose()?;
        let replicas = raw
            .replicas
            .as_ref()
            .map(|v| positive(v, "replicas"))
            .transpose()?;
        let scale = match &raw.data.scale {
            None => 1.0,
            Some(v) if v.get_ref().is_finite() && *v.get_ref() > 0.0 => *v.get_ref() as f32,
            Some(v) => {
                return Err(self
                    .at(
                        v.span(),
                        format!("data.scale = {} is impossible", v.get_ref()),
                    )
                    .with_hint("give a positive number, such as 255"));
            }
        };
        let out = match &raw.out {
            Some(out) if out.get_ref().trim().is_empty() => {
                return Err(self
                    .at(out.span(), "[train] out is empty")
                    .with_hint("give a folder, or leave out for runs/<job name>"));
            }
            Some(out) => self.dir().join(out.get_ref()),
            None => self.dir().join("runs").join(job_name),
        };
        Ok(TrainSpec {
            plugin: PluginRef::parse(raw.plugin.get_ref().trim(), &self.dir()),
            plugin_at: Location::from_offset(self.path, self.text, raw.plugin.span().start),
            epochs,
            steps,
            eval_every,
            eval_batches,
            sample_tokens,
            batch_size,
            seed: raw.seed,
            data: DataSpec {
                format: raw.data.format,
                train: self.dir().join(raw.data.train.get_ref()),
                test: raw.data.test.as_ref().map(|t| self.dir().join(t.get_ref())),
                label_column: raw.data.label_column.unwrap_or(-1),
                header: raw.data.header,
                scale,
                normalize: raw.data.normalize.unwrap_or(!text),
                block_size,
                bytes_vocab,
                skip_unknown,
            },
            config: self.config(raw.config)?,
            limits,
            checkpoint_every,
            replicas,
            out,
        })
    }
}

pub mod mig;
mod stopping;
pub use stopping::{DEFAULT_GRACE, Stopping, WarningSignal, parse_signal, signal_name};

#[cfg(test)]
mod tests;
