//! A job file as a Slurm batch script. The script is written beside the job's logs, so a user can
//! read exactly what was submitted; its body runs `orch run JOB.toml` inside the allocation, and
//! records the exit status for `orch wait` when Slurm keeps no accounting.

use orch_core::JobSpec;
use std::fmt::Write;
use std::path::Path;

/// What a batch script is made from.
#[derive(Debug, Clone, Copy)]
pub struct ScriptInput<'a> {
    pub job: &'a JobSpec,
    /// The job file, absolute (the script names it for `orch run`).
    pub job_path: &'a Path,
    /// The `orch` binary, absolute (the same path must hold it on the cluster's nodes).
    pub orch: &'a Path,
    /// Where the output, error and exit files go, absolute.
    pub logs: &'a Path,
}

/// A name safe in file names and `--job-name`.
pub fn safe_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "job".into() } else { s }
}

/// `text` quoted for bash.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// Minutes for `--time`, rounded up (Slurm's minimum is one).
fn minutes(runtime: std::time::Duration) -> u64 {
    runtime.as_secs().div_ceil(60).max(1)
}

/// The file of a job's output (`out`), errors (`err`) or exit record (`exit`) once Slurm gave
/// it `id` (`1234`, or `1234_5` for an array's task).
pub fn log_file(logs: &Path, name: &str, id: &str, kind: &str) -> std::path::PathBuf {
    logs.join(format!("{}-{id}.{kind}", safe_name(name)))
}

/// Why `path` cannot stand in an `#SBATCH` line or the script's comment, if it cannot: Slurm
/// splits directives at spaces, and a line break would end the comment.
pub fn unfit_path(path: &Path) -> Option<String> {
    let text = path.display().to_string();
    text.chars()
        .any(|c| c.is_control() || c.is_whitespace())
        .then(|| {
            format!(
                "{text} holds a space or a control character, which an #SBATCH line cannot carry; move the job file to a folder whose path has none"
            )
        })
}

/// A path in an `#SBATCH --output`/`--error` line: `%` is Slurm's pattern sign, written `%%`.
fn directive_path(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

/// `[job] after_ok`, `after_any`, `after_failed` and `singleton` as `sbatch --dependency`; on
/// Slurm the ids are Slurm's job ids (what `orch submit --slurm` printed), and every condition
/// must hold (`,`), as on orch's daemon.
pub fn dependency(depends: &orch_core::job::Dependencies) -> Option<String> {
    let mut parts: Vec<String> = [
        ("afterok", &depends.after_ok),
        ("afterany", &depends.after_any),
        ("afternotok", &depends.after_failed),
    ]
    .into_iter()
    .filter(|(_, ids)| !ids.is_empty())
    .map(|(kind, ids)| {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        format!("{kind}:{}", ids.join(":"))
    })
    .collect();
    if depends.singleton {
        parts.push("singleton".into());
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The batch script (the caller checks the paths with [`unfit_path`] first).
pub fn batch_script(input: &ScriptInput<'_>) -> String {
    let job = input.job;
    let name = safe_name(&job.name);
    let array = job.sweep.len() > 1 || !job.sweep.is_empty();
    let pattern = if array { "%A_%a" } else { "%j" };
    let logs = input.logs.display().to_string();
    let logs_directive = directive_path(input.logs);
    let mut s = String::new();
    let _ = writeln!(s, "#!/bin/bash");
    let _ = writeln!(
        s,
        "# Written by `orch submit --slurm` for {}: runs `orch run` inside the allocation.",
        input.job_path.display()
    );
    let _ = writeln!(s, "#SBATCH --job-name={name}");
    let _ = writeln!(s, "#SBATCH --comment=orch");
    let _ = writeln!(s, "#SBATCH --nodes={}", job.resources.nodes);
    let _ = writeln!(s, "#SBATCH --ntasks-per-node=1");
    let gres = match &job.slurm.gpu_type {
        Some(kind) => format!("gpu:{kind}:{}", job.resources.gpus),
        None => format!("gpu:{}", job.resources.gpus),
    };
    let _ = writeln!(s, "#SBATCH --gres={gres}");
    if let Some(runtime) = job.max_runtime {
        let _ = writeln!(s, "#SBATCH --time={}", minutes(runtime));
    }
    // The warning goes to the batch shell (`B:`), which passes it on to orch, which passes it on
    // to the job (a [train] job saves on it); Slurm counts the offset in seconds, at most 65535.
    let warning = job.stopping.signal.and_then(|w| {
        let name = orch_core::job::signal_name(w.number)?;
        Some((name, w.before.as_secs().clamp(1, 65535)))
    });
    if let Some((name, seconds)) = warning {
        let _ = writeln!(s, "#SBATCH --signal=B:{name}@{seconds}");
    }
    if let Some(dependency) = dependency(&job.depends) {
        let _ = writeln!(s, "#SBATCH --dependency={dependency}");
        // As on orch's daemon: a dependency that can no longer be met ends the job instead of
        // leaving it pending for ever.
        let _ = writeln!(s, "#SBATCH --kill-on-invalid-dep=yes");
    }
    let _ = writeln!(s, "#SBATCH --output={logs_directive}/{name}-{pattern}.out");
    let _ = writeln!(s, "#SBATCH --error={logs_directive}/{name}-{pattern}.err");
    if array {
        // `%M`: at most M tasks of the array run at once (`[sweep] max_parallel`).
        let throttle = job
            .sweep
            .max_parallel
            .map_or(String::new(), |m| format!("%{m}"));
        let _ = writeln!(s, "#SBATCH --array=0-{}{throttle}", job.sweep.len() - 1);
    }
    for (key, value) in &job.slurm.options {
        let _ = writeln!(s, "#SBATCH --{}={value}", key.replace('_', "-"));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "set -u");
    if array {
        let _ = writeln!(s, "ID=\"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"");
        let _ = writeln!(s, "TASK=(--sweep-task \"$SLURM_ARRAY_TASK_ID\")");
    } else {
        let _ = writeln!(s, "ID=\"$SLURM_JOB_ID\"");
        let _ = writeln!(s, "TASK=()");
    }
    let run = format!(
        "{} run {} \"${{TASK[@]}}\"",
        quote(&input.orch.display().to_string()),
        quote(&input.job_path.display().to_string())
    );
    // In the background, with the script waiting: a cancel (SIGTERM to the script) is passed on
    // to orch, which stops the job's processes and releases its devices before the script ends;
    // a script that ended at once would leave orch to Slurm's SIGKILL and the job's processes
    // running on, holding their devices.
    let _ = writeln!(s, "trap 'kill -TERM \"$child\" 2>/dev/null' TERM INT");
    if let Some((name, _)) = warning.filter(|(name, _)| !matches!(*name, "TERM" | "INT")) {
        let _ = writeln!(s, "trap 'kill -{name} \"$child\" 2>/dev/null' {name}");
    }
    if job.resources.nodes > 1 {
        // One `orch run` per node; each launches its node's processes with torchrun's variables.
        let _ = writeln!(
            s,
            "srun --nodes={} --ntasks-per-node=1 --kill-on-bad-exit=1 {run} &",
            job.resources.nodes
        );
    } else {
        let _ = writeln!(s, "{run} &");
    }
    let _ = writeln!(s, "child=$!");
    let _ = writeln!(s, "wait \"$child\"");
    let _ = writeln!(s, "status=$?");
    // A trapped signal ends `wait` early: wait again for orch's own status.
    let _ = writeln!(
        s,
        "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; status=$?; done"
    );
    let _ = writeln!(
        s,
        "printf '{{\"exit_code\": %d}}\\n' \"$status\" > {}/{name}-\"$ID\".exit",
        quote(&logs)
    );
    let _ = writeln!(s, "exit \"$status\"");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> JobSpec {
        orch_core::job::parse(Path::new("/lab/job.toml"), text).unwrap()
    }

    fn script(text: &str) -> String {
        let job = job(text);
        batch_script(&ScriptInput {
            job: &job,
            job_path: Path::new("/lab/job.toml"),
            orch: Path::new("/usr/local/bin/orch"),
            logs: Path::new("/lab/orch-slurm"),
        })
    }

    #[test]
    fn one_node() {
        let s = script(
            "[job]\nname = \"mnist run\"\nmax_runtime = \"90m\"\n[resources]\ngpus = 2\n[slurm]\npartition = \"gpu\"\ngpu_type = \"a100\"\ncpus_per_task = 8\n[command]\nargv = [\"python\", \"train.py\"]\n",
        );
        for line in [
            "#SBATCH --job-name=mnist_run",
            "#SBATCH --nodes=1",
            "#SBATCH --gres=gpu:a100:2",
            "#SBATCH --time=90",
            "#SBATCH --output=/lab/orch-slurm/mnist_run-%j.out",
            "#SBATCH --partition=gpu",
            "#SBATCH --cpus-per-task=8",
            "'/usr/local/bin/orch' run '/lab/job.toml' \"${TASK[@]}\" &",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} in\n{s}");
        }
        assert!(!s.contains("srun") && !s.contains("--array"));
    }

    #[test]
    fn a_warning_signal_goes_to_the_batch_shell_which_passes_it_on() {
        let s = script(
            "[job]\nname = \"w\"\nmax_runtime = \"1h\"\nsignal = \"SIGUSR1@5m\"\n[command]\nargv = [\"true\"]\n",
        );
        for line in [
            "#SBATCH --signal=B:USR1@300",
            "trap 'kill -USR1 \"$child\" 2>/dev/null' USR1",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} in\n{s}");
        }
        let term =
            script("[job]\nname = \"w\"\nsignal = \"TERM@1m\"\n[command]\nargv = [\"true\"]\n");
        assert!(term.contains("#SBATCH --signal=B:TERM@60\n"), "{term}");
        assert!(
            !term.contains("' TERM\n"),
            "TERM is passed on already: {term}"
        );
    }

    #[test]
    fn two_nodes_run_orch_on_each_through_srun() {
        let s = script(
            "[job]\nname = \"ddp\"\n[resources]\ngpus = 4\nnodes = 2\n[command]\nargv = [\"python\", \"ddp.py\"]\nlaunch = \"per-device\"\n",
        );
        assert!(
            s.contains("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 '/usr/local/bin/orch' run"
            ),
            "{s}"
        );
        assert!(
            s.contains("trap 'kill -TERM \"$child\" 2>/dev/null' TERM INT"),
            "{s}"
        );
    }

    #[test]
    fn a_sweep_is_an_array() {
        let s = script(
            "[job]\nname = \"sw\"\n[sweep]\nlr = [0.1, 0.01]\nseed = [1, 2]\n[command]\nargv = [\"true\"]\n",
        );
        assert!(s.contains("#SBATCH --array=0-3\n"), "{s}");
        let s = script(
            "[job]\nname = \"sw\"\n[sweep]\nlr = [0.1, 0.01, 0.001]\nmax_parallel = 2\n[command]\nargv = [\"true\"]\n",
        );
        assert!(s.contains("#SBATCH --array=0-2%2\n"), "{s}");
        assert!(
            s.contains("#SBATCH --output=/lab/orch-slurm/sw-%A_%a.out"),
            "{s}"
        );
        assert!(
            s.contains("TASK=(--sweep-task \"$SLURM_ARRAY_TASK_ID\")"),
            "{s}"
        );
    }

    #[test]
    fn paths_with_quotes_stay_one_word() {
        assert_eq!(quote("/a b/it's"), "'/a b/it'\\''s'");
        assert_eq!(safe_name("x/../y z"), "x_.._y_z");
    }

    #[test]
    fn dependencies_become_slurms_and_an_unmeetable_one_ends_the_job() {
        let s = script(
            "[job]\nname = \"eval\"\nafter_ok = [101, 102]\nafter_any = [7]\nafter_failed = [9]\nsingleton = true\n[command]\nargv = [\"true\"]\n",
        );
        assert!(
            s.contains("#SBATCH --dependency=afterok:101:102,afterany:7,afternotok:9,singleton\n"),
            "{s}"
        );
        assert!(s.contains("#SBATCH --kill-on-invalid-dep=yes\n"), "{s}");
        let none = script("[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n");
        assert!(!none.contains("--dependency"), "{none}");
        assert!(!none.contains("--kill-on-invalid-dep"), "{none}");
    }
}
