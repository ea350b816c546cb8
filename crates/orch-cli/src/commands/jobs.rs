//! The daemon's client commands: `orch submit`, `jobs`, `status`, `cancel`, `logs`, `wait`.

use crate::cli::{JobIdArgs, JobsArgs, LogsArgs, SubmitArgs, UsageArgs};
use crate::client::{Client, answer_failure};
use crate::failure::{CmdResult, Failure};
use crate::table;
use hyper::{Method, StatusCode};
use orch_serve::{Job, State, SubmitRequest, SubmitResponse};
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
fn submission_key() -> String {
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
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.id.to_string(),
                if j.interactive {
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
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
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
    let mut lines = vec![
        (
            "job",
            format!("{} ({})", esc(&job.id.to_string()), esc(&job.name)),
        ),
        (
            "tenant",
            format!("{} (user {})", esc(&job.tenant), esc(&job.user)),
        ),
        ("state", job.state.as_str().to_string()),
        ("gpus", job.gpus.to_string()),
    ];
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
    match status {
        StatusCode::OK => println!("job {} cancelled", table::escape(&args.id)),
        StatusCode::ACCEPTED => println!("job {} is being stopped", table::escape(&args.id)),
        _ => return Err(answer_failure(status, &body)),
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
        if !job.state.is_final() && !told {
            // Waiting is what was asked for: no client timeout ends it, and stderr says so.
            eprintln!(
                "orch: waiting for job {} ({}) to end (Ctrl-C stops waiting, not the job)",
                job.id,
                job.state.as_str()
            );
            told = true;
        }
        if job.state.is_final() {
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
