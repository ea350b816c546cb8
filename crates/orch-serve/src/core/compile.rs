//! The policy components tenants send, compiled off the scheduling thread.
//!
//! A job whose `[policy] plugin` is a file names a component by its SHA-256: uploaded once
//! (`PUT /v1/plugins/sha256:HEX`) or carried by the submission (`policy_wasm`), kept as
//! `STATE/plugins/HEX.wasm`. The engine thread never compiles one. Worker threads
//! ([`CompileCaps::workers`]) run each compile in a child process (`orch __compile-policy`, at
//! nice 19) under caps of its own: `RLIMIT_CPU` for its time, `RLIMIT_AS` for the memory it may
//! add to what the engine reserves. The child writes wasmtime's serialized component
//! (`STATE/plugins/HEX-KEY.cwasm`, KEY naming the engine's settings), the worker maps it
//! (`deserialize_file`) and keeps it ready; the engine hands it to its policy host when the job's
//! turn comes. Until then the job waits, saying "compiling its policy"; a component that does not
//! compile, or needs more than a cap, fails the jobs that name it with the sentence, and nobody
//! else's.
//!
//! Each tenant has a budget ([`CompileBudget`]): compiles queued or running at once, and CPU time
//! over a window, measured from each child's rusage. A submission (or an upload) that needs a new
//! compile past it is refused with 429 and a sentence saying which budget and when it frees up; a
//! component compiled already costs nothing. The budget's record is in memory: a restart clears
//! it.
//!
//! Design decision: a child process, not a thread. A compile of a 20 MB component takes seconds
//! of CPU and hundreds of MB; caps that the kernel enforces (and a compiler bug or a component
//! crafted to blow the compiler up) end that process, never the daemon.

use crate::core::config::{CompileBudget, CompileCaps};
use crate::core::kick::Kick;
use orch_core::sync::lock;
use orch_host::{CompiledComponent, ComponentLoader, PolicyHost};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Largest component `PUT /v1/plugins/sha256:HEX` takes.
pub const UPLOAD_LIMIT: u64 = 64 << 20;

/// Largest policy component a submission may carry in its body (bigger ones are uploaded first).
pub const POLICY_LIMIT: usize = 16 << 20;

/// The compile service: what is queued, compiling, compiled or failed, by digest (hex), and what
/// each tenant spent.
pub struct Compiler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("caps", &self.inner.caps)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The orch binary (`orch __compile-policy`).
    exe: PathBuf,
    /// `STATE/plugins`.
    dir: PathBuf,
    caps: CompileCaps,
    kick: Mutex<mpsc::Sender<Kick>>,
    state: Mutex<State>,
    work: Condvar,
    /// The engine's loader: set when the engine starts, with the workers.
    loader: OnceLock<ComponentLoader>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    queue: VecDeque<String>,
    /// Per tenant: when each of its compiles ended, and the CPU time it took.
    spent: HashMap<String, VecDeque<(Instant, Duration)>>,
}

enum Entry {
    Queued {
        tenant: String,
        bytes: u64,
    },
    Compiling {
        tenant: String,
        bytes: u64,
    },
    Ready(CompiledComponent),
    Failed {
        reason: String,
        /// A failure of the daemon's (not the component's) is tried again after this.
        retry_after: Option<Instant>,
    },
}

/// Whether a job's policy is ready for its placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// Compiled, and the host has it (or the policy is no file).
    Ready,
    /// Why it waits ("waiting: compiling its policy (12.0 MB)").
    Waits(String),
    /// It does not compile: the job fails with this sentence.
    Failed(String),
}

/// How long a failure of the daemon's own (a process it could not start, a file it could not
/// write) stands before a job naming that component tries again.
const RETRY_DAEMON_FAILURE: Duration = Duration::from_secs(30);

impl Compiler {
    /// A compile service for the state folder `state_dir`, compiling with `exe`; its workers start
    /// with [`Compiler::start`].
    pub fn new(
        exe: PathBuf,
        state_dir: &Path,
        caps: CompileCaps,
        kick: mpsc::Sender<Kick>,
    ) -> Compiler {
        Compiler {
            inner: Arc::new(Inner {
                exe,
                dir: plugins_dir(state_dir),
                caps,
                kick: Mutex::new(kick),
                state: Mutex::default(),
                work: Condvar::new(),
                loader: OnceLock::new(),
            }),
        }
    }

    /// Starts the workers, loading for the engine's host through `loader` (once; later calls do
    /// nothing).
    pub fn start(&self, loader: ComponentLoader) {
        if self.inner.loader.set(loader).is_err() {
            return;
        }
        for n in 0..self.inner.caps.workers {
            let inner = Arc::clone(&self.inner);
            let started = std::thread::Builder::new()
                .name(format!("orch-compile-{n}"))
                .spawn(move || inner.work());
            if let Err(e) = started {
                tracing::error!("cannot start a compile worker: {e}");
            }
        }
    }

    /// The kept component of digest `hex`.
    pub fn source(&self, hex: &str) -> PathBuf {
        self.inner.dir.join(format!("{hex}.wasm"))
    }

    /// Asks for component `hex` (`bytes` long) to be compiled for `tenant`, within `budget` when
    /// one is given (a submission or an upload; none for a job accepted already). Nothing to do
    /// when it is compiled, queued or compiling already (whoever asked first); `Err`: the sentence
    /// of the budget it is past.
    pub fn request(
        &self,
        hex: &str,
        tenant: &str,
        budget: Option<&CompileBudget>,
        bytes: u64,
    ) -> Result<(), String> {
        let mut state = lock(&self.inner.state);
        match state.entries.get(hex) {
            Some(Entry::Failed {
                retry_after: Some(at),
                ..
            }) if Instant::now() >= *at => {}
            Some(_) => return Ok(()),
            None => {}
        }
        let compiled_before = self.inner.artifact(hex).is_some_and(|a| a.is_file());
        if let Some(budget) = budget
            && !compiled_before
        {
            self.inner.check_budget(&mut state, tenant, budget)?;
        }
        state.entries.insert(
            hex.to_string(),
            Entry::Queued {
                tenant: tenant.to_string(),
                bytes,
            },
        );
        state.queue.push_back(hex.to_string());
        self.inner.work.notify_one();
        Ok(())
    }

    /// For the engine, before it places a job whose policy is the file `plugin` (digest `hex`):
    /// hands the compiled component to `host`, or says why the job waits or fails. A component
    /// nobody asked for yet (a job queued before a restart) is queued for compiling now.
    pub fn prepare(
        &self,
        host: &mut PolicyHost,
        hex: &str,
        tenant: &str,
        plugin: &orch_core::PluginRef,
    ) -> Prepared {
        let orch_core::PluginRef::Path(path) = plugin else {
            return Prepared::Ready;
        };
        if host.is_provided(path) {
            return Prepared::Ready;
        }
        let state = lock(&self.inner.state);
        match state.entries.get(hex) {
            Some(Entry::Ready(component)) => {
                host.provide(path, component);
                Prepared::Ready
            }
            Some(Entry::Queued { bytes, .. }) => {
                let ahead = state.queue.iter().take_while(|h| *h != hex).count();
                Prepared::Waits(match ahead {
                    0 => format!("waiting: compiling its policy ({})", megabytes(*bytes)),
                    n => format!(
                        "waiting: compiling its policy ({}), behind {n} other compile(s)",
                        megabytes(*bytes)
                    ),
                })
            }
            Some(Entry::Compiling { bytes, .. }) => Prepared::Waits(format!(
                "waiting: compiling its policy ({})",
                megabytes(*bytes)
            )),
            Some(Entry::Failed {
                reason,
                retry_after,
            }) if retry_after.is_none_or(|at| Instant::now() < at) => {
                Prepared::Failed(reason.clone())
            }
            _ => {
                drop(state);
                let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
                let _ = self.request(hex, tenant, None, bytes);
                Prepared::Waits(format!(
                    "waiting: compiling its policy ({})",
                    megabytes(bytes)
                ))
            }
        }
    }

    /// Where the compiled form of component `hex` is kept (`None` before the workers start).
    pub fn artifact(&self, hex: &str) -> Option<PathBuf> {
        self.inner.artifact(hex)
    }

    /// Why component `hex` does not compile, when it does not.
    pub fn failure(&self, hex: &str) -> Option<String> {
        match lock(&self.inner.state).entries.get(hex) {
            Some(Entry::Failed { reason, .. }) => Some(reason.clone()),
            _ => None,
        }
    }

    /// Where component `hex` stands: `compiled`, `compiling`, `queued`, `failed`, or `stored`
    /// (kept, not compiled in this daemon's life).
    pub fn describe(&self, hex: &str) -> &'static str {
        match lock(&self.inner.state).entries.get(hex) {
            Some(Entry::Ready(_)) => "compiled",
            Some(Entry::Compiling { .. }) => "compiling",
            Some(Entry::Queued { .. }) => "queued",
            Some(Entry::Failed { .. }) => "failed",
            None => "stored",
        }
    }
}

impl Inner {
    /// The compiled form of `hex` for the engine's settings (once the engine has started).
    fn artifact(&self, hex: &str) -> Option<PathBuf> {
        let key = self.loader.get()?.compatibility_key();
        Some(self.dir.join(format!("{hex}-{key}.cwasm")))
    }

    fn check_budget(
        &self,
        state: &mut State,
        tenant: &str,
        budget: &CompileBudget,
    ) -> Result<(), String> {
        let busy = state
            .entries
            .values()
            .filter(|e| match e {
                Entry::Queued { tenant: t, .. } | Entry::Compiling { tenant: t, .. } => t == tenant,
                _ => false,
            })
            .count();
        if budget.concurrency == 0 {
            return Err(format!(
                "tenant {tenant} may not compile policy components (its compile_concurrency = 0 in serve.toml): use a built-in policy, or one compiled here already"
            ));
        }
        if busy >= budget.concurrency as usize {
            return Err(format!(
                "tenant {tenant} already compiles {busy} policy component(s), its compile_concurrency = {}: that frees up when one of those compiles ends (each within {} of CPU time); submit again then",
                budget.concurrency,
                seconds(self.caps.cpu)
            ));
        }
        let now = Instant::now();
        let spent = state.spent.entry(tenant.to_string()).or_default();
        spent.retain(|(at, _)| now.duration_since(*at) < budget.window);
        let used: Duration = spent.iter().map(|(_, cpu)| *cpu).sum();
        if used >= budget.cpu {
            // It frees up once enough of the oldest compiles leave the window.
            let mut left = used;
            let mut frees = budget.window;
            for (at, cpu) in spent.iter() {
                left = left.saturating_sub(*cpu);
                frees = (*at + budget.window).saturating_duration_since(now);
                if left < budget.cpu {
                    break;
                }
            }
            return Err(format!(
                "tenant {tenant} used {:.1} CPU-s compiling policy components in the last {}, its compile_cpu = {} per compile_window = {}: that frees up in {}; submit again then, or use a policy compiled here already",
                used.as_secs_f64(),
                seconds(budget.window),
                seconds(budget.cpu),
                seconds(budget.window),
                seconds(frees + Duration::from_millis(999))
            ));
        }
        Ok(())
    }

    /// A worker: takes the next queued component, compiles or loads it, records the outcome and
    /// wakes the engine; for ever.
    fn work(self: Arc<Inner>) {
        loop {
            let (hex, tenant, bytes) = {
                let mut state = lock(&self.state);
                loop {
                    if let Some(hex) = state.queue.pop_front() {
                        if let Some(Entry::Queued { tenant, bytes }) = state.entries.get(&hex) {
                            let (tenant, bytes) = (tenant.clone(), *bytes);
                            state.entries.insert(
                                hex.clone(),
                                Entry::Compiling {
                                    tenant: tenant.clone(),
                                    bytes,
                                },
                            );
                            break (hex, tenant, bytes);
                        }
                        continue;
                    }
                    state = self
                        .work
                        .wait(state)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            let started = Instant::now();
            let (cpu, outcome) = self.build(&hex, bytes);
            let entry = match outcome {
                Ok(component) => {
                    tracing::info!(
                        "policy sha256:{} ({}) of tenant {tenant} compiled in {:.1} s ({:.1} CPU-s)",
                        short(&hex),
                        megabytes(bytes),
                        started.elapsed().as_secs_f64(),
                        cpu.as_secs_f64()
                    );
                    Entry::Ready(component)
                }
                Err(Failure { reason, ours }) => {
                    tracing::warn!("policy sha256:{} of tenant {tenant}: {reason}", short(&hex));
                    Entry::Failed {
                        reason,
                        retry_after: ours.then(|| Instant::now() + RETRY_DAEMON_FAILURE),
                    }
                }
            };
            let mut state = lock(&self.state);
            if !cpu.is_zero() {
                state
                    .spent
                    .entry(tenant)
                    .or_default()
                    .push_back((Instant::now(), cpu));
            }
            state.entries.insert(hex.clone(), entry);
            drop(state);
            let _ = lock(&self.kick).send(Kick::PolicyCompiled(hex));
        }
    }

    /// Component `hex`, loaded from its compiled form, compiled first when there is none; and
    /// the CPU time the compile took.
    fn build(&self, hex: &str, bytes: u64) -> (Duration, Result<CompiledComponent, Failure>) {
        let (Some(loader), Some(artifact)) = (self.loader.get(), self.artifact(hex)) else {
            return (
                Duration::ZERO,
                Err(Failure::ours("the engine has not started")),
            );
        };
        if artifact.is_file() {
            match loader.load(&artifact) {
                Ok(component) => return (Duration::ZERO, Ok(component)),
                Err(e) => {
                    tracing::warn!("compiling again: {e}");
                    let _ = std::fs::remove_file(&artifact);
                }
            }
        }
        let what = format!("its policy (sha256:{}, {})", short(hex), megabytes(bytes));
        let tmp = self.dir.join(format!(
            ".{hex}.{}.{}.cwasm.tmp",
            std::process::id(),
            unique()
        ));
        let run = self.run_child(hex, &tmp);
        let remove_tmp = || {
            let _ = std::fs::remove_file(&tmp);
        };
        let (cpu, ended) = match run {
            Ok(done) => done,
            Err(e) => {
                remove_tmp();
                return (
                    Duration::ZERO,
                    Err(Failure::ours(format!(
                        "the daemon could not start a compile of {what}: {e}"
                    ))),
                );
            }
        };
        let caps = &self.caps;
        let failed = |reason: String| {
            remove_tmp();
            (
                cpu,
                Err(Failure {
                    reason,
                    ours: false,
                }),
            )
        };
        match ended {
            Ended::Done => {}
            Ended::Refused(message) => {
                return failed(format!("{what} does not compile: {message}"));
            }
            Ended::OverCpu => {
                return failed(format!(
                    "{what} did not compile within the compile time cap of {} CPU-s ([compile] cpu in the daemon's serve.toml)",
                    caps.cpu.as_secs()
                ));
            }
            Ended::OverMemory => {
                return failed(format!(
                    "{what} needed more memory to compile than the compile memory cap of {} ([compile] memory in the daemon's serve.toml)",
                    orch_core::ByteSize(caps.memory)
                ));
            }
            Ended::OverTime(wall) => {
                return failed(format!(
                    "{what} did not compile within {} of wall time (ten times the compile time cap of {} CPU-s, and half an hour)",
                    seconds(wall),
                    caps.cpu.as_secs()
                ));
            }
            Ended::Crashed(how) => return failed(format!("{what} made the compiler fail: {how}")),
            Ended::Damaged => {
                remove_tmp();
                let _ = std::fs::remove_file(self.dir.join(format!("{hex}.wasm")));
                return (
                    cpu,
                    Err(Failure::ours(format!(
                        "the daemon's copy of {what} was damaged (a crash, say) and is removed: submit the job again (`orch submit` uploads the policy again)"
                    ))),
                );
            }
        }
        if let Err(e) = std::fs::rename(&tmp, &artifact) {
            remove_tmp();
            return (
                cpu,
                Err(Failure::ours(format!(
                    "the daemon could not keep the compiled form of {what}: {e}"
                ))),
            );
        }
        match loader.load(&artifact) {
            Ok(component) => (cpu, Ok(component)),
            Err(e) => {
                let _ = std::fs::remove_file(&artifact);
                (
                    cpu,
                    Err(Failure::ours(format!(
                        "the daemon could not load the compiled form of {what}: {e}"
                    ))),
                )
            }
        }
    }

    /// Runs `orch __compile-policy` on component `hex`, writing `out`, and waits for it: the CPU
    /// time it used and how it ended.
    fn run_child(&self, hex: &str, out: &Path) -> std::io::Result<(Duration, Ended)> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        let caps = &self.caps;
        let mut child = std::process::Command::new(&self.exe)
            .arg("__compile-policy")
            .arg("--cpu-s")
            .arg(caps.cpu.as_secs().to_string())
            .arg("--memory")
            .arg(caps.memory.to_string())
            .arg("--name")
            .arg(format!("sha256:{}", short(hex)))
            .arg("--sha256")
            .arg(hex)
            .arg(self.dir.join(format!("{hex}.wasm")))
            .arg(out)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            // A panic's message, not a backtrace, is what the job's reason quotes.
            .env("RUST_BACKTRACE", "0")
            // Compiles use half the cores at most, all workers together: a compile on every core
            // (even at nice 19) held up other jobs' starts several times over on 2 cores, one
            // thread on one of them did not.
            .env(
                "RAYON_NUM_THREADS",
                compile_threads(caps.workers).to_string(),
            )
            // Its own group: a Ctrl-C meant for the daemon does not reach it.
            .process_group(0)
            .spawn()?;
        let pid = child.id() as i32;
        let stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(pipe) = stderr {
                let _ = pipe.take(16 << 10).read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        });
        // Past its CPU cap the kernel stops it. The wall-clock cap is a safety net for a compile
        // that waits on something instead (it should not): generous, since at nice 19 on a busy
        // machine a compile gets a small share of the CPU.
        let wall_cap = caps.cpu * 10 + Duration::from_secs(1800);
        let started = Instant::now();
        let mut killed = false;
        let (status, usage) = loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 on our own child, with pointers to locals.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
            if r == pid {
                break (status, usage);
            }
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if !killed && started.elapsed() > wall_cap {
                // Our own child, not reaped yet: its pid is still its own.
                orch_core::process::signal(child.id(), libc::SIGKILL);
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let text = reader.join().unwrap_or_default();
        let time = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        let cpu = time(usage.ru_utime) + time(usage.ru_stime);
        let ended = if killed {
            Ended::OverTime(started.elapsed())
        } else if libc::WIFEXITED(status) {
            match libc::WEXITSTATUS(status) {
                0 => Ended::Done,
                DAMAGED => Ended::Damaged,
                REFUSED if memory_failure(&text) => Ended::OverMemory,
                REFUSED => Ended::Refused(last_line(&text)),
                _ if memory_failure(&text) => Ended::OverMemory,
                code => Ended::Crashed(format!(
                    "it exited with status {code}: {}",
                    last_line(&text)
                )),
            }
        } else {
            let signal = libc::WTERMSIG(status);
            if signal == libc::SIGXCPU || (signal == libc::SIGKILL && cpu >= caps.cpu) {
                Ended::OverCpu
            } else if memory_failure(&text) || signal == libc::SIGKILL {
                // SIGKILL short of the CPU cap: the kernel's OOM killer.
                Ended::OverMemory
            } else {
                Ended::Crashed(format!(
                    "it was killed by signal {signal}: {}",
                    last_line(&text)
                ))
            }
        };
        Ok((cpu, ended))
    }
}

/// How a compile failed: the job's sentence, and whether the daemon is to blame (it is tried
/// again later) rather than the component.
struct Failure {
    reason: String,
    ours: bool,
}

impl Failure {
    fn ours(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            ours: true,
        }
    }
}

/// How a compile process ended.
enum Ended {
    Done,
    /// The component is not one orch can compile: its sentence.
    Refused(String),
    OverCpu,
    OverMemory,
    OverTime(Duration),
    Crashed(String),
    /// The kept copy no longer has its digest.
    Damaged,
}

/// Threads of one compile, with `workers` compiling at once: half the cores between them, at
/// least one each.
fn compile_threads(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 2 / workers.max(1)).max(1)
}

/// The exit status of `orch __compile-policy` when the component is at fault.
pub const REFUSED: i32 = 3;

/// The exit status of `orch __compile-policy` when the file is not the component its digest
/// names (a crash damaged the copy).
pub const DAMAGED: i32 = 4;

/// Whether a compile's last words say it ran out of memory (an allocation, a mapping or a thread
/// refused under its `RLIMIT_AS`).
fn memory_failure(text: &str) -> bool {
    [
        "memory allocation of",
        "Cannot allocate memory",
        "os error 12",
        "out of memory",
        "failed to spawn thread",
        "os error 11",
        "Resource temporarily unavailable",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// What a compile said last: its error's sentence, or a panic's message.
fn last_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = match text.lines().position(|l| l.contains("panicked at")) {
        Some(at) => text
            .lines()
            .skip(at + 1)
            .map(str::trim)
            .find(|l| !l.is_empty()),
        None => lines.next_back(),
    };
    line.unwrap_or("it said nothing")
        .chars()
        .take(500)
        .collect()
}

/// `orch __compile-policy`: compiles the component `source` (named `name` in messages) to
/// `out`, at the lowest priority (nice 19, SCHED_BATCH), under `cpu_s` seconds of CPU and `memory` bytes of address space beyond
/// what the engine reserves. Exit 0: compiled; [`REFUSED`]: not a component orch compiles (the
/// sentence on stderr); [`DAMAGED`]: the bytes of `source` do not have the digest `sha256`;
/// 1: something else went wrong.
pub fn compile_child(
    cpu_s: u64,
    memory: u64,
    name: &str,
    sha256: Option<&str>,
    source: &Path,
    out: &Path,
) -> i32 {
    // The daemon and the jobs come first: nice 19 and SCHED_BATCH (inherited by the compiler's
    // threads) give it what they leave, and a small share under load, never none (SCHED_IDLE
    // could starve it behind a job's own CPU work for ever). A failure only leaves it at the
    // daemon's priority.
    // SAFETY: setpriority and sched_setscheduler on this process, with a valid parameter.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
    // The engine the daemon's host uses (engine.rs makes it with `Limits::default()`): its
    // artifacts are what that host accepts.
    let compiler = match orch_host::Precompiler::new(&orch_host::Limits::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    // The engine's pool of instance slots is reserved address space already: the cap is on
    // what the compile adds.
    let reserved = vm_size().unwrap_or(0);
    let set = |resource, soft: u64, hard: u64| {
        let limit = libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        // SAFETY: setrlimit on this process with a valid struct.
        unsafe { libc::setrlimit(resource, &limit) == 0 }
    };
    let address_space = reserved.saturating_add(memory);
    if !set(libc::RLIMIT_AS, address_space, address_space)
        || !set(libc::RLIMIT_CPU, cpu_s, cpu_s.saturating_add(2))
    {
        eprintln!(
            "cannot set the compile's caps: {}",
            std::io::Error::last_os_error()
        );
        return 1;
    }
    let wasm = match std::fs::read(source) {
        Ok(wasm) => wasm,
        Err(e) => {
            eprintln!("cannot read {}: {e}", source.display());
            return 1;
        }
    };
    if let Some(want) = sha256
        && orch_core::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&wasm)) != want
    {
        eprintln!(
            "the daemon's copy of the component is damaged (its bytes no longer have its digest)"
        );
        return DAMAGED;
    }
    match compiler.compile(name, &wasm) {
        Ok(compiled) => match std::fs::write(out, compiled) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cannot write {}: {e}", out.display());
                1
            }
        },
        Err(e) => {
            eprintln!("{e}");
            REFUSED
        }
    }
}

/// This process's address space, bytes (`VmSize` of /proc/self/status).
pub(crate) fn vm_size() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kb: u64 = line
        .trim_start_matches("VmSize:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn plugins_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("plugins")
}

/// The first 12 hex digits, as messages name a component.
fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// `12.0 MB`.
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// As humantime writes it, to the second (`2m 30s`), or to the millisecond under a second.
fn seconds(d: Duration) -> String {
    let rounded = if d < Duration::from_secs(1) {
        Duration::from_millis(d.as_millis().max(1) as u64)
    } else {
        Duration::from_secs(d.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

pub(crate) fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The 64 lowercase hex digits of an address `sha256:HEX`, or the sentence saying what is wrong.
pub fn parse_digest(text: &str) -> Result<String, String> {
    let hex = text.strip_prefix("sha256:").unwrap_or("");
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(format!(
            "\"{}\" is not a component's address: give sha256: and the 64 hex digits of the file's SHA-256 (`sha256sum FILE`)",
            text.chars().take(80).collect::<String>()
        ))
    }
}

/// Keeps a submitted policy component as `STATE/plugins/SHA256.wasm` (written once, atomically);
/// returns its hash.
pub fn store_policy(state_dir: &Path, base64_text: &str) -> Result<String, String> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let limit = POLICY_LIMIT;
    if base64_text.len() > limit / 3 * 4 + 4 {
        return Err(format!(
            "the policy component is over {} MiB; `orch submit` uploads bigger ones first (PUT /v1/plugins/sha256:HEX, up to {} MiB)",
            limit >> 20,
            UPLOAD_LIMIT >> 20
        ));
    }
    let wasm = base64::engine::general_purpose::STANDARD
        .decode(base64_text)
        .map_err(|e| format!("the policy component's bytes are not base64: {e}"))?;
    let hash = orch_core::hex::encode(&sha2::Sha256::digest(&wasm));
    let dir = plugins_dir(state_dir);
    let path = dir.join(format!("{hash}.wasm"));
    if !path.is_file() {
        let keep = |e: std::io::Error| format!("the daemon could not keep the policy: {e}");
        std::fs::create_dir_all(&dir).map_err(keep)?;
        let tmp = dir.join(format!("{hash}.tmp-{}-{}", std::process::id(), unique()));
        std::fs::write(&tmp, &wasm).map_err(keep)?;
        std::fs::rename(&tmp, &path).map_err(keep)?;
    }
    Ok(hash)
}

/// The sentence for a component digest `hex` the daemon does not have.
pub fn no_such(hex: &str) -> String {
    format!(
        "the daemon has no policy component sha256:{hex}: upload it first with PUT /v1/plugins/sha256:{hex} (`orch submit` does)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiler() -> Compiler {
        let (kick, _kicks) = mpsc::channel();
        Compiler::new(
            PathBuf::from("/nonexistent/orch"),
            Path::new("/nonexistent-state"),
            CompileCaps {
                cpu: Duration::from_secs(60),
                memory: 2 << 30,
                workers: 1,
            },
            kick,
        )
    }

    #[test]
    fn addresses_are_sha256_and_64_hex_digits() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_digest(&format!("sha256:{hex}")), Ok(hex.clone()));
        assert_eq!(
            parse_digest(&format!("sha256:{}", hex.to_uppercase())),
            Ok(hex.clone())
        );
        for bad in ["", "sha256:", "sha256:xyz", &format!("md5:{hex}"), &hex] {
            let e = parse_digest(bad).unwrap_err();
            assert!(e.contains("64 hex digits"), "{e}");
        }
    }

    #[test]
    fn a_tenants_budget_counts_its_compiles_and_their_cpu() {
        let c = compiler();
        let one = CompileBudget {
            concurrency: 1,
            cpu: Duration::from_secs(10),
            window: Duration::from_secs(600),
        };
        // No workers run: what is asked stays queued.
        assert_eq!(c.request("a", "vision", Some(&one), 100), Ok(()));
        // The same component again costs nothing; another is one compile too many.
        assert_eq!(c.request("a", "vision", Some(&one), 100), Ok(()));
        let e = c.request("b", "vision", Some(&one), 100).unwrap_err();
        assert!(
            e.contains("tenant vision already compiles 1") && e.contains("compile_concurrency = 1"),
            "{e}"
        );
        // Another tenant has a budget of its own; a job accepted already needs none.
        assert_eq!(c.request("b", "nlp", Some(&one), 100), Ok(()));
        assert_eq!(c.request("c", "vision", None, 100), Ok(()));
        // CPU time spent within the window.
        let mut state = lock(&c.inner.state);
        state.entries.clear();
        state.queue.clear();
        let now = Instant::now();
        state.spent.insert(
            "vision".into(),
            VecDeque::from([(now, Duration::from_secs(6)), (now, Duration::from_secs(5))]),
        );
        drop(state);
        let e = c.request("d", "vision", Some(&one), 100).unwrap_err();
        assert!(
            e.contains("used 11.0 CPU-s")
                && e.contains("compile_cpu = 10s per compile_window = 10m")
                && e.contains("frees up in 10m"),
            "{e}"
        );
        let none = CompileBudget {
            concurrency: 0,
            ..one
        };
        let e = c.request("e", "nlp", Some(&none), 100).unwrap_err();
        assert!(e.contains("compile_concurrency = 0"), "{e}");
    }

    #[test]
    fn a_waiting_job_says_it_compiles_and_a_failed_compile_says_why() {
        let c = compiler();
        let mut host = PolicyHost::with_cache_dir(orch_host::Limits::default(), None).unwrap();
        let plugin = orch_core::PluginRef::Path(PathBuf::from("/nonexistent-state/plugins/a.wasm"));
        c.request("a", "vision", None, 12_043_028).unwrap();
        c.request("b", "vision", None, 1_000).unwrap();
        let other = orch_core::PluginRef::Path(PathBuf::from("/nonexistent-state/plugins/b.wasm"));
        assert_eq!(
            c.prepare(&mut host, "a", "vision", &plugin),
            Prepared::Waits("waiting: compiling its policy (12.0 MB)".into())
        );
        assert_eq!(
            c.prepare(&mut host, "b", "vision", &other),
            Prepared::Waits(
                "waiting: compiling its policy (0.0 MB), behind 1 other compile(s)".into()
            )
        );
        lock(&c.inner.state).entries.insert(
            "a".into(),
            Entry::Failed {
                reason: "its policy does not compile".into(),
                retry_after: None,
            },
        );
        assert_eq!(
            c.prepare(&mut host, "a", "vision", &plugin),
            Prepared::Failed("its policy does not compile".into())
        );
        assert_eq!(c.describe("a"), "failed");
        // A built-in needs nothing.
        let builtin = orch_core::PluginRef::Builtin("least-loaded".into());
        assert_eq!(
            c.prepare(&mut host, "", "vision", &builtin),
            Prepared::Ready
        );
    }

    #[test]
    fn a_compile_that_ran_out_of_memory_is_told_apart() {
        assert!(memory_failure("memory allocation of 4096 bytes failed\n"));
        assert!(memory_failure(
            "Error: Cannot allocate memory (os error 12)"
        ));
        assert!(!memory_failure("`x` is not a WebAssembly component"));
        assert_eq!(last_line("a\nlast words\n\n"), "last words");
        assert_eq!(
            last_line(
                "thread 'main' panicked at src/x.rs:1:1:\nthe message\nnote: run with RUST_BACKTRACE=1\n"
            ),
            "the message"
        );
    }
}
