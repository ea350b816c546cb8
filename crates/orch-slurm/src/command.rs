//! Slurm's client commands, run with their output captured. A command that is not installed is
//! one sentence saying so, never a panic or an OS error code.

use std::process::{Command, Output};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(
        "`{0}` is not installed here: Slurm's client commands (sbatch, squeue, scancel, scontrol) are needed; install them (Debian: apt-get install slurm-client) or run on a login node of the cluster"
    )]
    NotInstalled(String),
    #[error("`{command}` failed: {message}")]
    Failed { command: String, message: String },
}

/// Runs `program args...`; its stdout on success.
pub fn run(program: &str, args: &[String]) -> Result<String, SlurmError> {
    let out = output(program, args)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn output(program: &str, args: &[String]) -> Result<Output, SlurmError> {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null());
    let child = command.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SlurmError::NotInstalled(program.to_string()),
        _ => SlurmError::Failed {
            command: program.to_string(),
            message: e.to_string(),
        },
    })?;
    let out = child.wait_with_output().map_err(|e| SlurmError::Failed {
        command: program.to_string(),
        message: e.to_string(),
    })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(SlurmError::Failed {
            command: format!("{program} {}", args.join(" ")),
            message: if message.is_empty() {
                format!("exit status {}", out.status)
            } else {
                message
            },
        });
    }
    Ok(out)
}

/// The host names of a Slurm node list (`scontrol show hostnames LIST`).
pub fn hostnames(list: &str) -> Result<Vec<String>, String> {
    run(
        "scontrol",
        &["show".into(), "hostnames".into(), list.into()],
    )
    .map(|text| {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    })
    .map_err(|e| e.to_string())
}
