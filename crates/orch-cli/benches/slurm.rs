//! `orch submit --slurm` against plain `sbatch` on a local one-node Slurm (tests/slurm/start.sh):
//! 50 job files submitted one after another, beside 50 equivalent batch scripts given to sbatch
//! (the scripts orch writes, so both submit the same work). Needs root and Slurm's packages.
//!
//! `cargo bench -p orch-cli --bench slurm`

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const JOBS: usize = 50;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `program args` with the cluster's environment; panics with its stderr on failure.
fn must(program: &str, args: &[&std::ffi::OsStr], env: &[(&str, String)]) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn main() {
    let have = ["slurmctld", "slurmd", "munged", "sbatch"].iter().all(|b| {
        Command::new("which")
            .arg(b)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    // SAFETY: geteuid cannot fail.
    if !have || unsafe { libc::geteuid() } != 0 {
        println!("slurm bench: skipped (needs root and Slurm: slurmctld, slurmd, munge)");
        return;
    }
    let base = std::env::temp_dir().join(format!("orch-slurm-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let started = Command::new(root().join("tests/slurm/start.sh"))
        .arg(&base)
        .arg(free_port().to_string())
        .arg(free_port().to_string())
        .output()
        .unwrap();
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let conf = base.join("etc/slurm.conf");
    let dir = base.join("jobs");
    std::fs::create_dir_all(&dir).unwrap();
    let sim = dir.join("sim.toml");
    std::fs::write(
        &sim,
        (0..4)
            .map(|i| format!("[[gpu]]\nname = \"A100\"\nmemory_total = \"40GiB\"\nuuid = \"GPU-{i:08x}-2222-4000-8000-000000000000\"\n"))
            .collect::<String>(),
    )
    .unwrap();
    let orch = env!("CARGO_BIN_EXE_orch");
    let env: [(&str, String); 3] = [
        ("SLURM_CONF", conf.display().to_string()),
        ("ORCH_DEVICES", format!("sim:{}", sim.display())),
        ("ORCH_STATE_DIR", dir.join("state").display().to_string()),
    ];
    let files: Vec<PathBuf> = (0..JOBS)
        .map(|i| {
            let path = dir.join(format!("job{i}.toml"));
            std::fs::write(
                &path,
                format!("[job]\nname = \"bench{i}\"\n[resources]\ngpus = 1\n[command]\nargv = [\"true\"]\n"),
            )
            .unwrap();
            path
        })
        .collect();
    // The equivalent scripts, as orch writes them.
    let scripts: Vec<PathBuf> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let script = must(
                orch,
                &[
                    "submit".as_ref(),
                    "--slurm".as_ref(),
                    "--dry-run".as_ref(),
                    f.as_os_str(),
                ],
                &env,
            );
            let path = dir.join(format!("plain{i}.sbatch"));
            std::fs::write(&path, script).unwrap();
            path
        })
        .collect();
    let t = Instant::now();
    for s in &scripts {
        must("sbatch", &["--parsable".as_ref(), s.as_os_str()], &env);
    }
    let plain = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for f in &files {
        must(
            orch,
            &["submit".as_ref(), "--slurm".as_ref(), f.as_os_str()],
            &env,
        );
    }
    let ours = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut all: Vec<&std::ffi::OsStr> = vec!["submit".as_ref(), "--slurm".as_ref()];
    all.extend(files.iter().map(|f| f.as_os_str()));
    must(orch, &all, &env);
    let batch = t.elapsed().as_secs_f64();
    println!(
        "{JOBS} job files in one `orch submit --slurm` command: {:.2} s ({:.1} ms each): {:.2}x",
        batch,
        batch * 1000.0 / JOBS as f64,
        batch / plain
    );
    println!(
        "{JOBS} submissions: sbatch {:.2} s ({:.1} ms each), orch submit --slurm {:.2} s ({:.1} ms each): {:.2}x   (goal <= 1.2x)",
        plain,
        plain * 1000.0 / JOBS as f64,
        ours,
        ours * 1000.0 / JOBS as f64,
        ours / plain
    );
    let _ = Command::new("scancel")
        .args(["--me"])
        .envs(env.clone())
        .output();
    let _ = Command::new(root().join("tests/slurm/stop.sh"))
        .arg(&base)
        .output();
}
