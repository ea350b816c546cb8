//! The quick form, `orch run|submit --gpus N … -- CMD ARGS…`: the flags as a job, with the same
//! checks and sentences for both commands. `orch run` runs the [`JobSpec`]; `orch submit` sends
//! the daemon [`job_text`], the job file it stands for.

use crate::cli::QuickArgs;
use crate::failure::Failure;
use orch_core::ByteSize;
use orch_core::job::{CommandSpec, CpuBind, DeviceIds, JobSpec, Launch, PluginRef, Work};

pub const DEFAULT_POLICY: &str = "least-loaded";

/// The job the quick form of `orch COMMAND` describes (`command`: `run` or `submit`, for the
/// sentence that asks for a job file or a command). Relative policy paths resolve in the
/// working folder.
pub fn job(command: &str, args: &QuickArgs, argv: &[String]) -> Result<JobSpec, Failure> {
    let Some(program) = argv.first() else {
        return Err(Failure::bad_input_msg(format!(
            "orch {command} needs a job file or a command: orch {command} JOB.toml, or orch {command} --gpus N -- CMD ARGS"
        )));
    };
    let here = std::env::current_dir().map_err(Failure::failed)?;
    let size = |flag: &str, text: &Option<String>| -> Result<Option<ByteSize>, Failure> {
        text.as_deref()
            .map(|t| {
                t.parse::<ByteSize>()
                    .map_err(|e| Failure::bad_input_msg(format!("{flag}: {e}")))
            })
            .transpose()
    };
    if let Some(u) = args.max_utilization.filter(|u| *u > 100) {
        return Err(Failure::bad_input_msg(format!(
            "--max-utilization is a percent from 0 to 100, found {u}"
        )));
    }
    let stopping = orch_core::job::Stopping {
        signal: args
            .signal
            .as_deref()
            .map(|t| {
                orch_core::job::parse_signal(t)
                    .map_err(|why| Failure::bad_input_msg(format!("--signal: {why}")))
            })
            .transpose()?,
        grace: args
            .grace
            .as_deref()
            .map(|t| {
                orch_core::duration::parse(t).ok_or_else(|| {
                    Failure::bad_input_msg(format!(
                        "--grace: \"{t}\" is not a duration: give the time from the stop signal to SIGKILL, such as 60s"
                    ))
                })
            })
            .transpose()?,
    };
    let gpus = args.gpus.unwrap_or(1);
    if gpus == 0 {
        return Err(Failure::bad_input_msg("--gpus must be at least 1"));
    }
    if let Some(profile) = args
        .mig
        .as_deref()
        .filter(|p| !orch_core::job::mig::is_profile(p))
    {
        return Err(Failure::bad_input_msg(format!(
            "--mig {profile:?} is not a MIG profile: {}",
            orch_core::job::mig::PROFILE_HINT
        )));
    }
    // Named after its program, cleaned (not refused) where the program's name is no job name.
    let name = orch_core::text::derived_name(
        &std::path::Path::new(program)
            .file_name()
            .map_or_else(|| program.clone(), |n| n.to_string_lossy().into_owned()),
    );
    let spec = orch_runner::QuickJob {
        origin: "command line".into(),
        dir: here.clone(),
        name,
        tenant: None,
        priority: 0,
        gpus,
        min_free_memory: size("--min-free-memory", &args.min_free_memory)?,
        max_utilization: args.max_utilization,
        memory_limit: size("--memory-limit", &args.memory_limit)?,
        exclusive: !args.shared,
        cpu_bind: args.cpu_bind.as_deref().and_then(CpuBind::parse),
        mig: args.mig.clone(),
        policy: PluginRef::parse(args.policy.as_deref().unwrap_or(DEFAULT_POLICY), &here),
        config: Vec::new(),
        stopping,
        command: CommandSpec {
            argv: argv.to_vec(),
            env: Default::default(),
            launch: if args.per_device {
                Launch::PerDevice
            } else {
                Launch::Single
            },
            device_ids: args.device_ids.as_deref().and_then(DeviceIds::parse),
        },
    }
    .job();
    if let Some(problem) = orch_core::job::mig::launch_problem(&spec.resources, &spec.work) {
        return Err(Failure::bad_input_msg(format!(
            "--mig: {problem} (--per-device)"
        )));
    }
    Ok(spec)
}

/// A quick-form job (what [`job`] builds, with a tenant perhaps) as the job file it stands for:
/// parsed again, it is the same job. Policy paths are absolute, so the file may be read anywhere.
pub fn job_text(spec: &JobSpec) -> String {
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    // TOML integers are i64: a size past that (8 EiB) is written with its unit.
    let size = |s: ByteSize| match i64::try_from(s.bytes()) {
        Ok(n) => n.to_string(),
        Err(_) => quote(&format!("{}B", s.bytes())),
    };
    let mut text = format!("[job]\nname = {}\n", quote(&spec.name));
    if let Some(t) = &spec.tenant {
        text.push_str(&format!("tenant = {}\n", quote(t)));
    }
    if let Some(limit) = spec.max_runtime {
        let limit = humantime::format_duration(limit).to_string();
        text.push_str(&format!("max_runtime = {}\n", quote(&limit)));
    }
    if let Some(signal) = &spec.stopping.signal {
        text.push_str(&format!("signal = {}\n", quote(&signal.to_string())));
    }
    if let Some(grace) = spec.stopping.grace {
        let grace = humantime::format_duration(grace).to_string();
        text.push_str(&format!("grace = {}\n", quote(&grace)));
    }
    let r = &spec.resources;
    text.push_str(&format!("[resources]\ngpus = {}\n", r.gpus));
    if let Some(m) = r.min_free_memory {
        text.push_str(&format!("min_free_memory = {}\n", size(m)));
    }
    if let Some(u) = r.max_utilization {
        text.push_str(&format!("max_utilization = {u}\n"));
    }
    if let Some(m) = r.memory_limit {
        text.push_str(&format!("memory_limit = {}\n", size(m)));
    }
    text.push_str(&format!("exclusive = {}\n", r.exclusive));
    if let Some(bind) = r.cpu_bind {
        text.push_str(&format!("cpu_bind = \"{}\"\n", bind.as_str()));
    }
    if let Some(profile) = &r.mig {
        text.push_str(&format!("mig = {}\n", quote(profile)));
    }
    text.push_str(&format!(
        "[policy]\nplugin = {}\n",
        quote(&spec.policy.plugin.to_string())
    ));
    if let Work::Command(command) = &spec.work {
        let argv: Vec<String> = command.argv.iter().map(|a| quote(a)).collect();
        let launch = match command.launch {
            Launch::Single => "single",
            Launch::PerDevice => "per-device",
        };
        text.push_str(&format!(
            "[command]\nargv = [{}]\nlaunch = \"{launch}\"\n",
            argv.join(", ")
        ));
        if let Some(ids) = command.device_ids {
            text.push_str(&format!("device_ids = \"{}\"\n", ids.as_str()));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(flags: &[&str]) -> QuickArgs {
        use clap::{Args, FromArgMatches};
        let cmd = QuickArgs::augment_args(clap::Command::new("orch"));
        let matches = cmd
            .try_get_matches_from(std::iter::once("orch").chain(flags.iter().copied()))
            .unwrap();
        QuickArgs::from_arg_matches(&matches).unwrap()
    }

    /// The text `orch submit` sends parses, on the daemon's side, to the job `orch run` runs.
    #[test]
    fn the_job_text_is_the_same_job() {
        let argv: Vec<String> = ["python", "train.py", "--lr", "3e-4 \"x\""]
            .map(String::from)
            .to_vec();
        for flags in [
            &[][..],
            &[
                "--gpus",
                "2",
                "--shared",
                "--min-free-memory",
                "10GiB",
                "--max-utilization",
                "50",
                "--memory-limit",
                "1.5GiB",
                "--per-device",
                "--policy",
                "plugins/pack.wasm",
            ][..],
            &["--exclusive", "--policy", "most-free-memory"][..],
            &["--signal", "SIGUSR2@90s", "--grace", "1m 30s"][..],
            &["--device-ids", "index", "--cpu-bind", "none"][..],
            &["--mig", "1g.10gb", "--gpus", "2", "--per-device"][..],
        ] {
            let mut spec = job("submit", &quick(flags), &argv).unwrap();
            spec.tenant = Some("vision".into());
            let path = spec.dir.join("command line");
            let text = job_text(&spec);
            let parsed = orch_core::job::parse(&path, &text).unwrap();
            assert_eq!(parsed.name, spec.name, "{text}");
            assert_eq!(parsed.tenant, spec.tenant, "{text}");
            assert_eq!(parsed.policy.plugin, spec.policy.plugin, "{text}");
            assert_eq!(parsed.work, spec.work, "{text}");
            assert_eq!(parsed.stopping, spec.stopping, "{text}");
            let (a, b) = (&parsed.resources, &spec.resources);
            assert_eq!(
                (a.gpus, a.nodes, a.min_free_memory, a.max_utilization),
                (b.gpus, b.nodes, b.min_free_memory, b.max_utilization),
                "{text}"
            );
            assert_eq!(
                (a.memory_limit, a.exclusive, a.enforce_memory_limit),
                (b.memory_limit, b.exclusive, b.enforce_memory_limit),
                "{text}"
            );
            assert_eq!(a.cpu_bind, b.cpu_bind, "{text}");
            assert_eq!(a.mig, b.mig, "{text}");
        }
    }

    /// `orch alloc --time` is the job text's `max_runtime`, read back to the same limit.
    #[test]
    fn an_allocations_time_limit_is_its_max_runtime() {
        let argv = vec!["bash".to_string()];
        for limit in [90, 4 * 3600 + 30 * 60, 3 * 86400] {
            let mut spec = job("alloc", &quick(&[]), &argv).unwrap();
            spec.max_runtime = Some(std::time::Duration::from_secs(limit));
            let text = job_text(&spec);
            let parsed = orch_core::job::parse(&spec.dir.join("command line"), &text).unwrap();
            assert_eq!(parsed.max_runtime, spec.max_runtime, "{text}");
        }
    }

    #[test]
    fn bad_flags_are_one_sentence_naming_the_flag_and_the_command() {
        let argv = vec!["true".to_string()];
        let message = |command: &str, flags: &[&str], argv: &[String]| {
            job(command, &quick(flags), argv).unwrap_err().render()
        };
        assert_eq!(
            message("submit", &[], &[]),
            "orch submit needs a job file or a command: orch submit JOB.toml, or orch submit --gpus N -- CMD ARGS"
        );
        assert!(message("run", &[], &[]).starts_with("orch run needs a job file"));
        assert_eq!(
            message("submit", &["--max-utilization", "101"], &argv),
            "--max-utilization is a percent from 0 to 100, found 101"
        );
        assert_eq!(
            message("submit", &["--gpus", "0"], &argv),
            "--gpus must be at least 1"
        );
        assert!(
            message("submit", &["--signal", "KILL@5s"], &argv)
                .starts_with("--signal: SIGKILL cannot be a warning signal"),
        );
        assert!(message("run", &["--grace", "soon"], &argv).starts_with("--grace: \"soon\""));
        assert!(
            message("submit", &["--memory-limit", "lots"], &argv).starts_with("--memory-limit: "),
            "{}",
            message("submit", &["--memory-limit", "lots"], &argv)
        );
    }
}
