//! The daemon's client commands: `orch submit`, `jobs`, `status`, `cancel`, `logs`, `wait`.

use crate::cli::{JobIdArgs, JobsArgs, LogsArgs, SubmitArgs, UsageArgs};
use crate::client::{Client, answer_failure};
use crate::failure::{CmdResult, Failure};
use crate::table;
use hyper::{Method, StatusCode};
use orch_serve::{ArraySummary, Job, State, SubmitRequest, SubmitResponse};
use std::io::Write;
use std::time::{Duration, Instant};

pub fn submit(args: &SubmitArgs) -> CmdResult {
    let cwd = std::env::current_dir().map_err(Failure::failed)?;
    let (job_text, job_path) = match &args.job {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::bad_input_msg(format!("cannot read {}: {e}", path.display()))
            })?;
            (text, std::path::absolute(path).map_err(Failure::failed)?)
        }
        None => (quick_job_text(args)?, cwd.join("command line")),
    };
    let text = |p: &std::path::Path, what: &str| {
        p.to_str().map(str::to_string).ok_or_else(|| {
            Failure::bad_input_msg(format!(
                "the {what} {} is not UTF-8: the daemon cannot be told it exactly; submit from a folder whose path is UTF-8",
                p.display()
            ))
        })
    };
    let env = utf8_env();
    let client = Client::from_env()?;
    let (policy_wasm, policy_digest) = send_policy(&client, &job_path, &job_text)?;
    let request_text = job_text.clone();
    let request = SubmitRequest {
        policy_wasm,
        policy_digest,
        job_text,
        job_path: text(&job_path, "job file's path")?,
        cwd: text(&cwd, "working folder")?,
        env,
        key: Some(submission_key()),
        depends: orch_core::job::Dependencies {
            after_ok: args.after_ok.clone(),
            after_any: args.after_any.clone(),
            after_failed: args.after_failed.clone(),
            singleton: args.singleton,
        },
    };
    let body = serde_json::to_vec(&request).map_err(Failure::failed)?;
    let (status, answer) = client.call(Method::POST, "/v1/jobs", Some(body))?;
    if status != StatusCode::CREATED {
        return Err(answer_failure(status, &answer));
    }
    let created: SubmitResponse = serde_json::from_slice(&answer).map_err(Failure::failed)?;
    println!("{}", created.id);
    if let Ok(spec) = orch_core::job::parse(&job_path, &request_text)
        && !spec.sweep.is_empty()
    {
        // stdout stays the id alone, for scripts: `orch wait ID` waits for the whole array.
        eprintln!(
            "orch: job array {}[0-{}]: {} task(s), one per combination of [sweep]",
            created.id,
            spec.sweep.len() - 1,
            spec.sweep.len()
        );
    }
    Ok(())
}

/// This process's environment, as a submission carries it. Variables whose name or value is
/// not UTF-8 cannot travel in JSON: they are left out, and the user is told which.
pub(crate) fn utf8_env() -> Vec<(String, String)> {
    let mut env = Vec::new();
    for (key, value) in std::env::vars_os() {
        match (key.into_string(), value.into_string()) {
            (Ok(k), Ok(v)) => env.push((k, v)),
            (k, _) => tracing::warn!(
                "the variable {} is not UTF-8 and is not passed to the job",
                k.unwrap_or_else(|k| k.to_string_lossy().into_owned())
            ),
        }
    }
    env
}

/// A file policy, read here as the submitting user (the daemon never opens a user's path) and
/// sent content-addressed: uploaded (`PUT /v1/plugins/sha256:HEX`) only when the daemon lacks
/// it, then named by its digest. A daemon too old for uploads gets the bytes in the submission
/// (base64, within its 16 MiB). A job file that does not parse is sent as it is (the daemon says
/// what is wrong). Returns `(policy_wasm, policy_digest)`.
pub(crate) fn send_policy(
    client: &Client,
    job_path: &std::path::Path,
    job_text: &str,
) -> Result<(Option<String>, Option<String>), Failure> {
    use base64::Engine as _;
    use sha2::Digest as _;
    use std::io::Read;
    let Ok(spec) = orch_core::job::parse(job_path, job_text) else {
        return Ok((None, None));
    };
    let orch_core::PluginRef::Path(path) = &spec.policy.plugin else {
        return Ok((None, None));
    };
    let cannot = |why: String| {
        Failure::bad_input_msg(format!(
            "{}: cannot send the policy {}: {why}",
            spec.policy.plugin_at,
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(|e| cannot(e.to_string()))?;
    let meta = file.metadata().map_err(|e| cannot(e.to_string()))?;
    if !meta.is_file() {
        return Err(cannot("it is not a regular file".into()));
    }
    let limit = orch_serve::http::wire::UPLOAD_LIMIT;
    let mut wasm = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut wasm)
        .map_err(|e| cannot(e.to_string()))?;
    if wasm.len() as u64 > limit {
        return Err(cannot(format!("it is over {} MiB", limit >> 20)));
    }
    let digest = orch_core::hex::encode(&sha2::Sha256::digest(&wasm));
    let address = format!("/v1/plugins/sha256:{digest}");
    let (status, answer) = client.call(Method::HEAD, &address, None)?;
    match status {
        StatusCode::OK => return Ok((None, Some(format!("sha256:{digest}")))),
        StatusCode::NOT_FOUND => {}
        _ => return Err(answer_failure(status, &answer)),
    }
    // Its compile is paid from the job's tenant's budget.
    let upload = match &spec.tenant {
        Some(tenant) => format!("{address}?tenant={}", percent_encode(tenant)),
        None => address,
    };
    let (status, answer) = client.call(Method::PUT, &upload, Some(wasm.clone()))?;
    match status {
        StatusCode::OK | StatusCode::CREATED => Ok((None, Some(format!("sha256:{digest}")))),
        // A daemon from before uploads: the bytes travel with the submission.
        StatusCode::NOT_FOUND if wasm.len() <= orch_serve::http::wire::POLICY_LIMIT => Ok((
            Some(base64::engine::general_purpose::STANDARD.encode(wasm)),
            None,
        )),
        StatusCode::NOT_FOUND => Err(cannot(format!(
            "it is over {} MiB, and this daemon takes no uploads (an older orch serve); upgrade it",
            orch_serve::http::wire::POLICY_LIMIT >> 20
        ))),
        _ => Err(answer_failure(status, &answer)),
    }
}

/// `text` for a query string: what is not a letter, digit, `-`, `_` or `.` as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// 128 random bits, so a submission sent again after a daemon restart is recognised.
/// Without the kernel's source, the time and pid stand in: the key must be unique, not secret.
pub(super) fn submission_key() -> String {
    orch_core::random::random_hex(16).unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:032x}", nanos ^ (u128::from(std::process::id()) << 64))
    })
}

/// The quick form as the job file it stands for: what `orch run` with the same flags would run,
/// in the tenant `--tenant` names.
fn quick_job_text(args: &SubmitArgs) -> Result<String, Failure> {
    let mut spec = super::quick::job("submit", &args.quick, &args.command)?;
    spec.tenant.clone_from(&args.tenant);
    Ok(super::quick::job_text(&spec))
}

pub fn list(args: &JobsArgs) -> CmdResult {
    let client = Client::from_env()?;
    let path = if args.all {
        "/v1/jobs?all=true"
    } else {
        "/v1/jobs"
    };
    let (status, body) = client.call(Method::GET, path, None)?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &body));
    }
    if args.json {
        println!("{}", String::from_utf8_lossy(&body));
        return Ok(());
    }
    let jobs: Vec<Job> = serde_json::from_slice(&body).map_err(Failure::failed)?;
    let now = orch_core::time::now_ms();
    let rows: Vec<Vec<String>> = fold(&jobs, args.expand)
        .into_iter()
        .map(|(id, j)| {
            vec![
                id,
                if j.alloc {
                    format!("{} (interactive alloc)", j.name)
                } else if j.interactive {
                    format!("{} (interactive)", j.name)
                } else {
                    j.name.clone()
                },
                j.tenant.clone(),
                j.user.clone(),
                j.state.as_str().to_string(),
                j.gpus.to_string(),
                age(now.saturating_sub(j.submitted_at_ms)),
                j.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "ID", "NAME", "TENANT", "USER", "STATE", "GPUS", "AGE", "REASON"
            ],
            &rows
        )
    );
    Ok(())
}

/// The lines of `orch jobs`: each job by its id, and each job array's tasks as squeue shows them:
/// its running tasks one by one (`17[0]`), its tasks in any other state folded into one line per
/// state (`17[2-5]`), at the place of its first task listed. `expand`: every task on a line of its
/// own. Each line with the job it shows (a folded line, its first task).
fn fold(jobs: &[Job], expand: bool) -> Vec<(String, &Job)> {
    let mut arrays: std::collections::HashMap<i64, Vec<&Job>> = std::collections::HashMap::new();
    for j in jobs {
        if let (Some(array), Some(_)) = (j.array_id, j.array_task) {
            arrays.entry(array).or_default().push(j);
        }
    }
    let mut lines = Vec::new();
    for j in jobs {
        let (Some(array), Some(task)) = (j.array_id, j.array_task) else {
            lines.push((j.id.to_string(), j));
            continue;
        };
        if expand {
            lines.push((format!("{array}[{task}]"), j));
            continue;
        }
        // The array's lines go where its first listed task is.
        let Some(tasks) = arrays.remove(&array) else {
            continue;
        };
        for state in State::ALL {
            let group: Vec<&Job> = tasks.iter().copied().filter(|t| t.state == state).collect();
            let Some(first) = group.first() else {
                continue;
            };
            if state == State::Running {
                for t in &group {
                    lines.push((format!("{array}[{}]", t.array_task.unwrap_or(0)), *t));
                }
            } else {
                let indexes: Vec<u32> = group.iter().filter_map(|t| t.array_task).collect();
                lines.push((format!("{array}[{}]", ranges(&indexes)), *first));
            }
        }
    }
    lines
}

/// Task indexes as Slurm writes them: `0-3,5,7-8` (sorted first).
fn ranges(indexes: &[u32]) -> String {
    let mut sorted = indexes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// How a job is named to its user: `17`, or `17[3]` for task 3 of job array 17.
fn job_name(job: &Job) -> String {
    match (job.array_id, job.array_task) {
        (Some(array), Some(task)) => format!("{array}[{task}]"),
        _ => job.id.to_string(),
    }
}

/// A job array in one line: `17[0-5]: 6 tasks (at most 2 at once): 2 running, 4 queued`.
fn array_line(id: i64, array: &ArraySummary) -> String {
    let bound = array
        .max_parallel
        .map_or(String::new(), |m| format!(" (at most {m} at once)"));
    let states: Vec<String> = [
        (array.running, "running"),
        (array.queued, "queued"),
        (array.succeeded, "succeeded"),
        (array.failed, "failed"),
        (array.cancelled, "cancelled"),
        (array.lost, "lost"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, state)| format!("{n} {state}"))
    .collect();
    format!(
        "{id}[0-{}]: {} task(s){bound}: {}",
        array.tasks.saturating_sub(1),
        array.tasks,
        states.join(", ")
    )
}

/// `orch usage`: the tenants' fair-share standing, as Slurm's `sshare` shows it.
pub fn usage(args: &UsageArgs) -> CmdResult {
    let client = Client::from_env()?;
    let (status, body) = client.call(Method::GET, "/v1/tenants", None)?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &body));
    }
    if args.json {
        println!("{}", String::from_utf8_lossy(&body));
        return Ok(());
    }
    let tenants: Vec<orch_serve::TenantRow> =
        serde_json::from_slice(&body).map_err(Failure::failed)?;
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                format!("{}", t.share),
                format!("{:.3}", t.normalized_share),
                format!("{:.2}", t.usage_gpu_seconds / 3600.0),
                format!("{:.3}", t.normalized_usage),
                format!("{:.3}", t.fair_share),
                match t.max_gpus {
                    Some(max) => format!("{}/{max}", t.gpus_held),
                    None => t.gpus_held.to_string(),
                },
                t.jobs_queued.to_string(),
                t.jobs_running.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "TENANT",
                "SHARE",
                "NORM-SHARE",
                "USAGE-GPU-H",
                "NORM-USAGE",
                "FAIR-SHARE",
                "GPUS",
                "QUEUED",
                "RUNNING"
            ],
            &rows
        )
    );
    Ok(())
}

/// A moment as UTC, to the second.
fn clock(ms: u64) -> String {
    orch_core::time::rfc3339(ms)
}

fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

fn fetch(client: &Client, id: &str) -> Result<Job, Failure> {
    let (status, body) = client.call(Method::GET, &format!("/v1/jobs/{}", encode(id)), None)?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &body));
    }
    serde_json::from_slice(&body).map_err(Failure::failed)
}

/// Job ids are numbers; anything else is sent escaped and gets its 404.
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn status(args: &JobIdArgs) -> CmdResult {
    let client = Client::from_env()?;
    let job = fetch(&client, &args.id)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&job).map_err(Failure::failed)?
        );
        return Ok(());
    }
    // Everything here may hold what a user typed (escaped as `orch jobs` escapes it).
    let esc = table::escape;
    let named = match (job.array_id, job.array_task) {
        (Some(_), Some(_)) => format!("{} (job {})", job_name(&job), job.id),
        _ => job.id.to_string(),
    };
    let mut lines = vec![("job", format!("{} ({})", esc(&named), esc(&job.name)))];
    if let Some(array) = &job.array {
        lines.push(("array", array_line(job.id, array)));
    }
    lines.extend([
        (
            "tenant",
            format!("{} (user {})", esc(&job.tenant), esc(&job.user)),
        ),
        ("state", job.state.as_str().to_string()),
        ("gpus", job.gpus.to_string()),
    ]);
    if job.alloc {
        let idle = job.idle_limit_s.map_or(String::new(), |s| {
            let limit = Duration::from_millis((s * 1000.0) as u64);
            format!(", idle limit {}", humantime::format_duration(limit))
        });
        lines.push(("kind", format!("interactive allocation (orch alloc){idle}")));
    }
    if !job.devices.is_empty() {
        lines.push(("devices", esc(&job.devices.join(", "))));
    }
    if let Some(code) = job.exit_code {
        lines.push(("exit status", code.to_string()));
    }
    if let Some(reason) = &job.reason {
        lines.push(("reason", esc(reason)));
    }
    if job.gpu_seconds > 0.0 {
        let used = if job.gpu_seconds < 3600.0 {
            format!("{:.0} GPU-seconds", job.gpu_seconds)
        } else {
            format!("{:.2} GPU-hours", job.gpu_seconds / 3600.0)
        };
        lines.push(("gpu time", used));
    }
    if let Some(a) = &job.accounting {
        let secs = |s: f64| humantime::format_duration(Duration::from_secs(s.round() as u64));
        lines.push(("wall time", secs(a.wall_s).to_string()));
        lines.push(("queue wait", secs(a.queue_wait_s).to_string()));
        if a.gpu_seconds > 0.0 && job.gpu_seconds <= 0.0 {
            lines.push(("gpu time", format!("{:.0} GPU-seconds", a.gpu_seconds)));
        }
        if let Some(cpu) = a.cpu_seconds {
            lines.push(("cpu time", format!("{cpu:.1} s")));
        }
        let size = |n: u64| orch_core::ByteSize(n).to_string();
        if let Some(rss) = a.peak_rss_bytes {
            lines.push(("peak memory", size(rss)));
        }
        if let Some(mem) = a.peak_gpu_memory_bytes {
            lines.push(("peak gpu mem", size(mem)));
        }
        if let Some(util) = a.mean_gpu_utilization {
            lines.push(("gpu util", format!("{util:.0}% (mean while it ran)")));
        }
    }
    for (key, value) in lines {
        println!("{key:<12} {value}");
    }
    if !job.events.is_empty() {
        println!("events");
        for event in &job.events {
            println!(
                "  {}  {:<9} {}",
                clock(event.at_ms),
                esc(&event.kind),
                esc(&event.message)
            );
        }
    }
    Ok(())
}

pub fn cancel(args: &JobIdArgs) -> CmdResult {
    let client = Client::from_env()?;
    let (status, body) = client.call(
        Method::POST,
        &format!("/v1/jobs/{}/cancel", encode(&args.id)),
        None,
    )?;
    if !matches!(status, StatusCode::OK | StatusCode::ACCEPTED) {
        return Err(answer_failure(status, &body));
    }
    // A job array's answer carries the whole array after the cancel.
    let array = serde_json::from_slice::<Job>(&body)
        .ok()
        .and_then(|job| job.array.map(|a| (job.id, a)));
    match (status, array) {
        (_, Some((id, array))) => println!(
            "job array {id} cancelled ({} running task(s) being stopped): {}",
            array.running,
            array_line(id, &array)
        ),
        (StatusCode::OK, None) => println!("job {} cancelled", table::escape(&args.id)),
        _ => println!("job {} is being stopped", table::escape(&args.id)),
    }
    Ok(())
}

pub fn logs(args: &LogsArgs) -> CmdResult {
    let stream = if args.stderr { "stderr" } else { "stdout" };
    let client = Client::from_env()?;
    // A followed log is silent while its job is: only the daemon's first answer is bounded.
    let client = if args.follow {
        client.following(format!("job {}'s {stream}", table::escape(&args.id)))
    } else {
        client
    };
    let path = format!(
        "/v1/jobs/{}/logs?stream={stream}{}",
        encode(&args.id),
        if args.follow { "&follow=true" } else { "" }
    );
    let mut out = std::io::stdout().lock();
    // Only the job's output reaches stdout; an error answer is the failure's sentence (stderr).
    let (status, error_body) = client.stream(Method::GET, &path, None, |chunk| {
        out.write_all(chunk)?;
        out.flush()
    })?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &error_body));
    }
    Ok(())
}

/// Waits for the job to end; exits with its status (0 succeeded, its exit code when it failed
/// with one, 1 otherwise).
pub fn wait(args: &JobIdArgs) -> CmdResult {
    let client = Client::from_env()?;
    let mut delay = Duration::from_millis(20);
    let started = Instant::now();
    let mut told = false;
    loop {
        let job = fetch(&client, &args.id)?;
        if let Some(array) = &job.array {
            if !array.ended() {
                if !told {
                    eprintln!(
                        "orch: waiting for every task of job array {} to end (Ctrl-C stops waiting, not the jobs)",
                        job.id
                    );
                    told = true;
                }
            } else {
                return array_ended(&job, array, args.json);
            }
        } else if !job.state.is_final() && !told {
            // Waiting is what was asked for: no client timeout ends it, and stderr says so.
            eprintln!(
                "orch: waiting for job {} ({}) to end (Ctrl-C stops waiting, not the job)",
                job.id,
                job.state.as_str()
            );
            told = true;
        }
        if job.array.is_none() && job.state.is_final() {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&job).map_err(Failure::failed)?
                );
            }
            return match job.state {
                State::Succeeded => Ok(()),
                state => Err(Failure {
                    code: job
                        .exit_code
                        .filter(|c| *c > 0)
                        .map_or(1, |c| (c & 0xff) as u8),
                    error: anyhow::anyhow!(
                        "job {} {}{}",
                        job.id,
                        state.as_str(),
                        job.reason.map(|r| format!(": {r}")).unwrap_or_default()
                    ),
                }),
            };
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(if started.elapsed() < Duration::from_secs(10) {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        });
    }
}

/// Most characters of task indexes a message lists.
const MAX_TASKS_TEXT: usize = 200;

/// `orch wait ARRAY` once every task has ended: 0 when all succeeded, 1 naming those that did not.
fn array_ended(job: &Job, array: &ArraySummary, json: bool) -> CmdResult {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(job).map_err(Failure::failed)?
        );
    }
    if array.succeeded == array.tasks {
        return Ok(());
    }
    // Folded as `orch jobs` folds them, and cut: an array may have 10,000 tasks.
    let mut tasks = ranges(&array.unsuccessful);
    if tasks.len() > MAX_TASKS_TEXT {
        let mut end = MAX_TASKS_TEXT;
        while !tasks.is_char_boundary(end) {
            end -= 1;
        }
        tasks.truncate(end);
        tasks.push_str(",...");
    }
    Err(Failure {
        code: 1,
        error: anyhow::anyhow!(
            "job array {}: {} of {} task(s) did not succeed ({}[{tasks}]): {}",
            job.id,
            array.tasks - array.succeeded,
            array.tasks,
            job.id,
            array_line(job.id, array)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: i64, array: i64, task: u32, state: State) -> Job {
        let row = orch_serve::JobRow {
            id,
            name: "sw".into(),
            state,
            array: Some(orch_serve::core::db::ArrayTask {
                id: array,
                task,
                max_parallel: Some(2),
            }),
            ..orch_serve::JobRow::queued(0)
        };
        Job::from(row)
    }

    #[test]
    fn an_arrays_tasks_fold_as_squeue_folds_them() {
        assert_eq!(ranges(&[5, 0, 1, 2, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[3]), "3");
        let mut plain = task(3, 0, 0, State::Queued);
        plain.array_id = None;
        plain.array_task = None;
        let jobs = vec![
            plain,
            task(17, 17, 0, State::Running),
            task(18, 17, 1, State::Succeeded),
            task(19, 17, 2, State::Running),
            task(20, 17, 3, State::Queued),
            task(21, 17, 4, State::Queued),
            task(22, 17, 5, State::Queued),
            task(30, 30, 0, State::Queued),
        ];
        let ids = |lines: Vec<(String, &Job)>| -> Vec<String> {
            lines.into_iter().map(|(id, _)| id).collect()
        };
        assert_eq!(
            ids(fold(&jobs, false)),
            ["3", "17[3-5]", "17[0]", "17[2]", "17[1]", "30[0]"]
        );
        assert_eq!(
            ids(fold(&jobs, true)),
            [
                "3", "17[0]", "17[1]", "17[2]", "17[3]", "17[4]", "17[5]", "30[0]"
            ]
        );
    }
}
