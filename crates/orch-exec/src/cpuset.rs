//! A bound job's CPUs as a cgroup cpuset, where orch may make one: then the job cannot widen
//! its own affinity past them (`taskset`, `sched_setaffinity`), as it can with affinity alone.
//!
//! Where: the job's own v2 cgroup ([`crate::JobCgroup`]) when the cpuset controller is there
//! (orch enables it for its children: cpuset is a threaded controller, which a cgroup holding
//! processes may pass on), which the job's processes join anyway; else, on v1 and hybrid
//! systems, a cpuset `orch-cpus-LIST` under this process's cgroup of the v1 cpuset hierarchy,
//! which they join between fork and exec. Neither (not root, no controller): the affinity alone
//! binds, nothing fails.
//!
//! Design decision: a v1 cpuset is named by its CPUs and shared by every job bound to them, and
//! stays: making and removing one per job cost 1.6 ms and 1.2 ms of the job's start and end here
//! (measured), over the 1 ms a binding may add to a start. A box has a handful of such sets (one
//! per NUMA node, and their unions).
//!
//! Only the CPUs are fenced. The cpuset's memory nodes stay orch's own (`cpuset.mems` is a hard
//! bind, and a full node would then mean the OOM killer for the job while the other node has
//! memory free): the job's memory is preferred from its nodes by its memory policy
//! ([`crate::CpuBinding`]).

use orch_core::CpuList;
use std::path::{Path, PathBuf};

/// The cpuset of a bound job.
#[derive(Debug)]
pub struct JobCpuset {
    dir: PathBuf,
    /// A v1 cpuset the processes must join; a v2 one is the job's cgroup, which they join anyway.
    v1: bool,
}

impl JobCpuset {
    /// Fences `cpus` for the job `name`, whose v2 cgroup is `v2_cgroup` (when it has one);
    /// `None` where this machine or these permissions allow no cpuset (said at debug level).
    pub fn create(name: &str, v2_cgroup: Option<&Path>, cpus: &CpuList) -> Option<JobCpuset> {
        if crate::cgroup::disabled() || cpus.is_empty() {
            return None;
        }
        if let Some(dir) = v2_cgroup {
            match v2(dir, cpus) {
                Ok(()) => {
                    return Some(JobCpuset {
                        dir: dir.to_path_buf(),
                        v1: false,
                    });
                }
                Err(why) => tracing::debug!("no v2 cpuset for job {name}: {why}"),
            }
        }
        match v1(cpus) {
            Ok(dir) => Some(JobCpuset { dir, v1: true }),
            Err(why) => {
                tracing::debug!("no cpuset for job {name}: {why}");
                None
            }
        }
    }

    /// The v1 cpuset's folder, which every process of the job joins; `None` for a v2 one.
    pub fn join(&self) -> Option<&Path> {
        self.v1.then_some(self.dir.as_path())
    }
}

fn has_cpuset(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpuset"))
}

/// The job's v2 cgroup with `cpus` in its `cpuset.cpus`, the controller enabled by its parent
/// first where the parent has it.
fn v2(dir: &Path, cpus: &CpuList) -> Result<(), String> {
    if !has_cpuset(dir) {
        let parent = dir.parent().ok_or("the job's cgroup has no parent")?;
        if !has_cpuset(parent) {
            return Err(format!(
                "the cpuset controller is not available in {}",
                parent.display()
            ));
        }
        std::fs::write(parent.join("cgroup.subtree_control"), "+cpuset").map_err(|e| {
            format!(
                "cannot enable the cpuset controller under {}: {e}",
                parent.display()
            )
        })?;
    }
    let file = dir.join("cpuset.cpus");
    std::fs::write(&file, cpus.to_string())
        .map_err(|e| format!("cannot write {cpus} to {}: {e}", file.display()))
}

/// `orch-cpus-LIST` under this process's v1 cpuset cgroup, with `cpus` and the parent's memory
/// nodes: made by the first job bound to those CPUs, joined by the next ones.
fn v1(cpus: &CpuList) -> Result<PathBuf, String> {
    let parent = orch_core::process::cgroup_v1_dir(std::process::id(), "cpuset")
        .ok_or("no v1 cpuset hierarchy holds this process")?;
    // `0-3,8` as `0-3_8`: a folder's name, and no two lists share one.
    let name = crate::cgroup::safe_name(&cpus.to_string().replace(',', "_"));
    let dir = parent.join(format!("orch-cpus-{name}"));
    let ready = |dir: &Path| {
        std::fs::read_to_string(dir.join("cpuset.cpus"))
            .is_ok_and(|c| c.trim().parse::<CpuList>().is_ok_and(|c| &c == cpus))
            && std::fs::read_to_string(dir.join("cpuset.mems")).is_ok_and(|m| !m.trim().is_empty())
    };
    if ready(&dir) {
        return Ok(dir);
    }
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let read = |file: &str| std::fs::read_to_string(parent.join(file)).ok();
    // A v1 cpuset takes processes only once both are set.
    let mems = read("cpuset.effective_mems")
        .or_else(|| read("cpuset.mems"))
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "0".to_string());
    let write = |file: &str, value: &str| {
        std::fs::write(dir.join(file), value)
            .map_err(|e| format!("cannot write {value} to {}: {e}", dir.join(file).display()))
    };
    write("cpuset.cpus", &cpus.to_string())?;
    write("cpuset.mems", &mems)?;
    Ok(dir)
}
