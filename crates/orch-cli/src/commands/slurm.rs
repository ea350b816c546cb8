//! The client commands on Slurm jobs: `orch submit --slurm` (a job file as a batch script),
//! `orch jobs --slurm`, and `--slurm` on `status`, `cancel`, `logs` and `wait`, through Slurm's
//! own commands (`sbatch`, `squeue --json`, `scancel`, `sacct`) and the files the batch script
//! writes.
//!
//! What `submit` wrote is recorded under the state folder (`slurm/ID.json`): where the script
//! and the logs are, and each array task's parameters, so the other commands find them.

use crate::cli::{JobIdArgs, JobsArgs, LogsArgs, SubmitArgs};
use crate::failure::{CmdResult, Failure};
use crate::table;
use orch_core::job;
use orch_slurm::command::{SlurmError, run};
use orch_slurm::script::{ScriptInput, batch_script, log_file, safe_name};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What `orch submit --slurm` remembers of a submission.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    job_id: String,
    name: String,
    job_path: PathBuf,
    script: PathBuf,
    logs: PathBuf,
    /// Each array task's parameters (empty without a sweep).
    tasks: Vec<Vec<(String, String)>>,
}

fn records_dir() -> PathBuf {
    orch_leases::default_state_dir().join("slurm")
}

fn slurm_failure(e: SlurmError) -> Failure {
    match e {
        SlurmError::NotInstalled(_) => Failure::bad_input(e),
        SlurmError::Failed { .. } => Failure::failed(e),
    }
}

pub fn submit(args: &SubmitArgs) -> CmdResult {
    let Some(first) = &args.job else {
        return Err(Failure::bad_input_msg(
            "orch submit --slurm needs a job file: orch submit --slurm JOB.toml",
        ));
    };
    // Every file is read and checked before the first is submitted: a mistake in the tenth
    // submits nothing.
    let mut jobs = Vec::new();
    for path in std::iter::once(first).chain(&args.more) {
        let job_path = std::path::absolute(path).map_err(Failure::failed)?;
        let mut job = job::read(&job_path).map_err(Failure::bad_input)?;
        job.depends = job.depends.merged(&orch_core::job::Dependencies {
            after_ok: args.after_ok.clone(),
            after_any: args.after_any.clone(),
            after_failed: args.after_failed.clone(),
            singleton: args.singleton,
        });
        jobs.push((job_path, job));
    }
    for (job_path, job) in jobs {
        submit_one(args, job_path, job)?;
    }
    Ok(())
}

fn submit_one(args: &SubmitArgs, job_path: PathBuf, job: orch_core::JobSpec) -> CmdResult {
    let logs = job.dir.join("orch-slurm");
    let logs = std::path::absolute(&logs).map_err(Failure::failed)?;
    if let Some(why) =
        orch_slurm::script::unfit_path(&job_path).or_else(|| orch_slurm::script::unfit_path(&logs))
    {
        return Err(Failure::bad_input_msg(why));
    }
    let orch = std::env::current_exe().map_err(Failure::failed)?;
    let script = batch_script(&ScriptInput {
        job: &job,
        job_path: &job_path,
        orch: &orch,
        logs: &logs,
    });
    if args.dry_run {
        print!("{script}");
        return Ok(());
    }
    std::fs::create_dir_all(&logs)
        .map_err(|e| Failure::failed_msg(format!("cannot make {}: {e}", logs.display())))?;
    let name = safe_name(&job.name);
    let pending = logs.join(format!("{name}-{}.sbatch", std::process::id()));
    std::fs::write(&pending, &script)
        .map_err(|e| Failure::failed_msg(format!("cannot write {}: {e}", pending.display())))?;
    let answer = run(
        "sbatch",
        &["--parsable".into(), pending.display().to_string()],
    )
    .map_err(slurm_failure);
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            let _ = std::fs::remove_file(&pending);
            return Err(e);
        }
    };
    // `--parsable` prints `ID` or `ID;CLUSTER`.
    let job_id = answer.trim().split(';').next().unwrap_or("").to_string();
    if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_digit()) {
        return Err(Failure::failed_msg(format!(
            "sbatch answered `{}`, not a job id",
            answer.trim()
        )));
    }
    let script_path = logs.join(format!("{name}-{job_id}.sbatch"));
    let _ = std::fs::rename(&pending, &script_path);
    let record = Record {
        job_id: job_id.clone(),
        name: job.name.clone(),
        job_path,
        script: script_path,
        logs,
        tasks: (0..job.sweep.len())
            .filter_map(|t| job.sweep.task(t))
            .filter(|p| !p.is_empty())
            .collect(),
    };
    let dir = records_dir();
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            dir.join(format!("{job_id}.json")),
            serde_json::to_string(&record).unwrap_or_default(),
        )
    });
    if let Err(e) = written {
        tracing::warn!(
            "job {job_id} was submitted, but its record could not be written in {}: {e}; `orch logs --slurm` and `orch wait --slurm` will not find its files",
            dir.display()
        );
    }
    println!("{job_id}");
    Ok(())
}

/// `1234` or `1234_5` as (array or job id, task).
fn split_id(id: &str) -> Result<(&str, Option<usize>), Failure> {
    let bad = || {
        Failure::bad_input_msg(format!(
            "`{id}` is not a Slurm job id: give 1234, or 1234_5 for task 5 of array 1234"
        ))
    };
    let (base, task) = match id.split_once('_') {
        Some((base, task)) => (base, Some(task.parse::<usize>().map_err(|_| bad())?)),
        None => (id, None),
    };
    if base.is_empty() || !base.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    Ok((base, task))
}

fn record(base: &str) -> Result<Record, Failure> {
    let path = records_dir().join(format!("{base}.json"));
    let text = std::fs::read_to_string(&path).map_err(|_| {
        Failure::bad_input_msg(format!(
            "Slurm job {base} was not submitted by `orch submit --slurm` from this account (no {})",
            path.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| Failure::failed_msg(format!("{}: {e}", path.display())))
}

/// The user's orch jobs Slurm knows now (`ids`: only those, an array's id naming all its tasks).
fn squeue(ids: Option<&str>) -> Result<Vec<orch_slurm::squeue::SlurmJob>, Failure> {
    let mut args = vec!["--json".to_string()];
    match ids {
        Some(ids) => args.extend(["--jobs".to_string(), ids.to_string()]),
        None => args.push("--me".into()),
    }
    match run("squeue", &args) {
        Ok(text) => orch_slurm::squeue::parse(&text).map_err(Failure::failed_msg),
        // A job Slurm has forgotten (it ended a while ago) is no error here: it is not queued.
        Err(SlurmError::Failed { message, .. }) if message.contains("Invalid job id") => {
            Ok(Vec::new())
        }
        Err(e) => Err(slurm_failure(e)),
    }
}

#[derive(Serialize)]
struct Listed<'a> {
    #[serde(flatten)]
    job: &'a orch_slurm::squeue::SlurmJob,
    params: Vec<(String, String)>,
}

pub fn list(args: &JobsArgs) -> CmdResult {
    let jobs = squeue(None)?;
    let params = |job: &orch_slurm::squeue::SlurmJob| -> Vec<(String, String)> {
        let base = job.id.split('_').next().unwrap_or("");
        match (job.array_task, record(base)) {
            (Some(task), Ok(r)) => r.tasks.get(task as usize).cloned().unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    let listed: Vec<Listed<'_>> = jobs
        .iter()
        .map(|job| Listed {
            job,
            params: params(job),
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&listed).map_err(Failure::failed)?
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|l| {
            vec![
                l.job.id.clone(),
                l.job.name.clone(),
                l.job.state.clone(),
                l.job.node_count.map_or_else(String::new, |n| n.to_string()),
                l.job
                    .gpus_per_node
                    .map_or_else(String::new, |g| g.to_string()),
                if l.job.nodes.is_empty() {
                    l.job.reason.clone()
                } else {
                    l.job.nodes.clone()
                },
                l.params
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &[
                "ID",
                "NAME",
                "STATE",
                "NODES",
                "GPUS/NODE",
                "WHERE/WHY",
                "PARAMS"
            ],
            &rows
        )
    );
    Ok(())
}

pub fn status(args: &JobIdArgs) -> CmdResult {
    let (base, task) = split_id(&args.id)?;
    let jobs = squeue(Some(base))?;
    let pending = format!("{base}_[");
    let mine: Vec<_> = jobs
        .iter()
        .filter(|j| task.is_none() || j.id == args.id || j.id.starts_with(&pending))
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&mine).map_err(Failure::failed)?
        );
        return Ok(());
    }
    if mine.iter().all(|j| j.ended()) {
        let ended = exit_codes(&args.id);
        match ended {
            Ok(codes) => println!("job {} ended; exit status {}", args.id, worst(&codes)),
            Err(why) => println!("job {}: not queued or running; {why}", args.id),
        }
        return Ok(());
    }
    for job in mine {
        println!(
            "job {} ({}): {} {}",
            table::escape(&job.id),
            table::escape(&job.name),
            table::escape(&job.state),
            table::escape(if job.nodes.is_empty() {
                &job.reason
            } else {
                &job.nodes
            })
        );
    }
    Ok(())
}

pub fn cancel(args: &JobIdArgs) -> CmdResult {
    split_id(&args.id)?;
    run("scancel", std::slice::from_ref(&args.id)).map_err(slurm_failure)?;
    println!("Slurm job {} cancelled", args.id);
    Ok(())
}

/// The log file of job or task `id`.
fn log_of(id: &str, stderr: bool) -> Result<PathBuf, Failure> {
    let (base, task) = split_id(id)?;
    let r = record(base)?;
    if !r.tasks.is_empty() && task.is_none() {
        return Err(Failure::bad_input_msg(format!(
            "job {base} is an array of {} tasks: name one, such as {base}_0",
            r.tasks.len()
        )));
    }
    Ok(log_file(
        &r.logs,
        &r.name,
        id,
        if stderr { "err" } else { "out" },
    ))
}

pub fn logs(args: &LogsArgs) -> CmdResult {
    let path = log_of(&args.id, args.stderr)?;
    let mut out = std::io::stdout().lock();
    let mut offset = 0u64;
    loop {
        if let Ok(mut file) = std::fs::File::open(&path) {
            use std::io::{Read, Seek};
            file.seek(std::io::SeekFrom::Start(offset))
                .map_err(Failure::failed)?;
            let mut chunk = Vec::new();
            file.read_to_end(&mut chunk).map_err(Failure::failed)?;
            offset += chunk.len() as u64;
            if out.write_all(&chunk).and_then(|()| out.flush()).is_err() {
                return Ok(()); // the reader went away
            }
        } else if !args.follow {
            return Err(Failure::failed_msg(format!(
                "{} does not exist yet: the job has not started (see orch jobs --slurm)",
                path.display()
            )));
        }
        if !args.follow {
            return Ok(());
        }
        let (base, _) = split_id(&args.id)?;
        let active = squeue(Some(base))?
            .iter()
            .filter(|j| !j.ended())
            .any(|j| j.id == args.id || j.id.starts_with(&format!("{base}_[")) || j.id == base);
        if !active {
            // One last read after the end, then stop.
            if let Ok(text) = std::fs::read(&path)
                && (text.len() as u64) > offset
            {
                let _ = out.write_all(&text[offset as usize..]);
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The exit statuses job `id` recorded (one per task for an array), or why there are none.
fn exit_codes(id: &str) -> Result<Vec<i32>, String> {
    let (base, task) = split_id(id).map_err(|e| e.render())?;
    let r = record(base).map_err(|e| e.render())?;
    let ids: Vec<String> = match (r.tasks.len(), task) {
        (0, _) => vec![base.to_string()],
        (_, Some(t)) => vec![format!("{base}_{t}")],
        (n, None) => (0..n).map(|t| format!("{base}_{t}")).collect(),
    };
    let mut codes = Vec::new();
    for one in ids {
        let file = log_file(&r.logs, &r.name, &one, "exit");
        match std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["exit_code"].as_i64())
        {
            Some(code) => codes.push(code as i32),
            None => codes.push(sacct_exit(&one).ok_or_else(|| {
                format!(
                    "task {one} left no exit record ({}) and Slurm keeps no accounting here: it was cancelled or killed before it ended",
                    file.display()
                )
            })?),
        }
    }
    Ok(codes)
}

/// `sacct`'s exit code of job `id`, where Slurm keeps accounting.
fn sacct_exit(id: &str) -> Option<i32> {
    let text = run(
        "sacct",
        &[
            "-j".into(),
            id.into(),
            "-X".into(),
            "-n".into(),
            "-P".into(),
            "-o".into(),
            "ExitCode".into(),
        ],
    )
    .ok()?;
    text.lines().next()?.split(':').next()?.trim().parse().ok()
}

fn worst(codes: &[i32]) -> i32 {
    codes.iter().copied().find(|&c| c != 0).unwrap_or(0)
}

pub fn wait(args: &JobIdArgs) -> CmdResult {
    let (base, task) = split_id(&args.id)?;
    record(base)?;
    let started = Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        let jobs = squeue(Some(base))?;
        // Pending tasks of an array are one record, `ID_[2-3]`: it may hold the task asked for.
        let pending = format!("{base}_[");
        let active = jobs.iter().filter(|j| !j.ended()).any(|j| match task {
            Some(_) => j.id == args.id || j.id.starts_with(&pending),
            None => true,
        });
        if !active {
            break;
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(if started.elapsed() > Duration::from_secs(60) {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(1)
        });
    }
    let codes = exit_codes(&args.id).map_err(Failure::failed_msg)?;
    let code = worst(&codes);
    if args.json {
        println!(
            "{}",
            serde_json::json!({"job": args.id, "exit_codes": codes})
        );
    }
    if code == 0 {
        Ok(())
    } else {
        Err(Failure {
            code: u8::try_from(code.clamp(1, 255)).unwrap_or(1),
            error: anyhow::anyhow!("Slurm job {} ended with exit status {code}", args.id),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(split_id("123").unwrap(), ("123", None));
        assert_eq!(split_id("123_4").unwrap(), ("123", Some(4)));
        for bad in ["", "abc", "12_x", "_3", "1;rm -rf /"] {
            assert!(split_id(bad).is_err(), "{bad}");
        }
        assert_eq!(worst(&[0, 0, 3, 1]), 3);
    }
}
