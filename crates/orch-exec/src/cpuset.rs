//! A bound job's CPUs as the cpuset of its own cgroup, where orch makes one with the cpuset
//! controller: then the job cannot widen its own affinity past them (`taskset`,
//! `sched_setaffinity`), as it can with affinity alone.
//!
//! Where: the job's own v2 cgroup ([`crate::JobCgroup`]), which its processes join anyway. orch
//! enables the controller for its children where its own cgroup has it (cpuset is a threaded
//! controller, which a cgroup holding processes may pass on). Elsewhere (not root, no cpuset in
//! the v2 hierarchy) the affinity alone binds, and nothing fails.
//!
//! Design decision: no v1 cpuset on v1 and hybrid systems. Joining one is a second cgroup
//! migration of every process, on top of the job's own cgroup: measured here
//! (`scripts/bench-bind.sh`, three runs), it added 1.3 to 3 ms to each `orch run`, over the 1 ms
//! a binding may cost; the affinity and memory policy cost well under that.
//!
//! Only the CPUs are fenced: `cpuset.mems` stays as inherited (it is a hard bind, and a full
//! node would then mean the OOM killer for the job while the other node has memory free); the
//! job's memory is preferred from its nodes by its memory policy ([`crate::CpuBinding`]).

use orch_core::CpuList;
use std::path::Path;

/// Puts `cpus` in the cpuset of the job's v2 cgroup `dir`; `false` (said at debug level) where
/// the cpuset controller cannot be had there.
pub fn fence(dir: &Path, cpus: &CpuList) -> bool {
    if cpus.is_empty() {
        return false;
    }
    match v2(dir, cpus) {
        Ok(()) => true,
        Err(why) => {
            tracing::debug!("the job's CPUs are not fenced by a cpuset: {why}");
            false
        }
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
