//! A process that holds a lease through the daemon (`orch run`, `import orch`), watched with
//! everything it starts.
//!
//! A root daemon moves the holder into a cgroup (v2) of its own, under the daemon's, before it
//! answers: every process the holder starts from then on is born there and cannot leave, so the
//! lease lives exactly as long as the holder's process tree, even when `orch run` itself is
//! killed while its job runs on. The cgroup is named after the process
//! (`orch-holder-PID-START`), which a restarted daemon finds again in the fence. Where the
//! daemon may not create cgroups (not root, no cgroup2 mount, `ORCH_CGROUPS=off`), the holder is
//! the process alone, as before.

use orch_leases::Holder;
use std::path::PathBuf;

/// `holder`, moved into a cgroup of its own when this daemon may make one; the returned holder
/// names that cgroup, so it is alive while anything in it runs.
pub fn track(root: bool, holder: Holder) -> Holder {
    if !root || orch_exec::cgroups_disabled() {
        return holder;
    }
    match move_into_own(&holder) {
        Ok(dir) => holder.with_cgroup(Some(dir)),
        Err(e) => {
            tracing::debug!(
                "lease holder pid {}: watched as a process only ({e})",
                holder.pid
            );
            holder
        }
    }
}

fn move_into_own(holder: &Holder) -> Result<PathBuf, String> {
    let dir = orch_core::process::cgroup_v2_dir(std::process::id())
        .ok_or("no cgroup2 mount, or this daemon's own cgroup is unknown")?
        .join(format!("orch-holder-{}-{}", holder.pid, holder.start_time));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    // The pid is checked against its start time just before the move: a process that ended
    // since the request came is not confused with a newcomer under its pid.
    if Holder::of_pid(holder.pid).is_none_or(|now| !now.same_process(holder)) {
        let _ = std::fs::remove_dir(&dir);
        return Err("the process ended".into());
    }
    if let Err(e) = std::fs::write(dir.join("cgroup.procs"), holder.pid.to_string()) {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("cannot move it into {}: {e}", dir.display()));
    }
    Ok(dir)
}

/// Removes the holder's cgroup once its lease ended, when nothing runs in it any more (a
/// process that gave its lease back and goes on keeps it until it ends: removing a cgroup
/// that holds a process fails, harmlessly).
pub fn untrack(holder: &Holder) {
    if let Some(dir) = &holder.cgroup
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("orch-holder-"))
        && let Err(e) = remove_tree(dir)
    {
        tracing::debug!("{} stays for now: {e}", dir.display());
    }
}

/// Removes the empty holder cgroups an earlier run of the daemon left (their processes ended
/// after their leases did).
pub fn sweep(root: bool) {
    if !root {
        return;
    }
    let Some(own) = orch_core::process::cgroup_v2_dir(std::process::id()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(own) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("orch-holder-")
            && !orch_core::process::cgroup_populated(&path)
        {
            let _ = remove_tree(&path);
        }
    }
}

/// Removes an empty cgroup and the empty cgroups under it (a job's cgroup that `orch run` made
/// inside, left when it was killed).
fn remove_tree(dir: &std::path::Path) -> std::io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = remove_tree(&entry.path());
            }
        }
    }
    std::fs::remove_dir(dir)
}
