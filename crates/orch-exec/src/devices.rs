//! The kernel's rule of which GPUs a job may open, as Slurm's `ConstrainDevices`: where orch
//! starts a job as root (the daemon's jobs, root's `orch run`), the job's processes may open only
//! the device nodes of its granted GPUs (`/dev/nvidiaN`, character `195:N`, N the GPU's minor
//! number), the shared control nodes (`nvidiactl` 195:255, `nvidia-modeset` 195:254,
//! `nvidia-uvm*` on a major of their own) and every device that is no NVIDIA GPU node. Setting
//! `CUDA_VISIBLE_DEVICES` again inside the job changes nothing: the other GPUs' nodes fail to open
//! with EPERM.
//!
//! Two mechanisms, chosen once per process ([`Mechanism::detect`]):
//! - the cgroup v1 `devices` controller where it is mounted (v1 and hybrid systems): a devices
//!   cgroup `orch-NAME` with one deny line per other GPU minor, which the job's processes join
//!   between fork and exec ([`v1`]);
//! - a cgroup v2 device program (`BPF_PROG_TYPE_CGROUP_DEVICE`) where only cgroup v2 exists,
//!   attached to the job's own v2 cgroup ([`crate::JobCgroup`]), which the processes join ([`bpf`]).
//!
//! `ORCH_DEVICE_CONSTRAINT` chooses: `auto` (the default: v1 where mounted, else the program),
//! `v1`, `bpf`, or `off`. Not root, `off`, or neither mechanism: nothing is confined (said once,
//! never a failure of the job). A lease holder that orch did not start (an interactive
//! `orch run`, a Python process) is confined the same way through [`constrain_process`].

mod bpf;
mod v1;

use std::path::Path;
use std::sync::OnceLock;

pub use orch_core::process::{MAX_GPU_MINOR, NVIDIA_MAJOR};

/// Which GPU nodes a job may not open: the minors (of character major 195) denied to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRule {
    /// Sorted, distinct, each at most [`MAX_GPU_MINOR`].
    denied: Vec<u32>,
    /// MIG capability nodes denied (`/dev/nvidia-caps/nvidia-cap<N>`): their character major
    /// (`nvidia-caps` in `/proc/devices`) and the minors, sorted and distinct.
    caps: Option<(u32, Vec<u32>)>,
}

impl DeviceRule {
    /// Every GPU node but the granted ones: the minors 0..=253 less `minors`.
    pub fn granting(minors: &[u32]) -> DeviceRule {
        DeviceRule {
            denied: (0..=MAX_GPU_MINOR)
                .filter(|m| !minors.contains(m))
                .collect(),
            caps: None,
        }
    }

    /// Exactly these GPU nodes (minors above 253 are no GPU's and are left out).
    pub fn denying(minors: &[u32]) -> DeviceRule {
        let mut denied: Vec<u32> = minors
            .iter()
            .copied()
            .filter(|&m| m <= MAX_GPU_MINOR)
            .collect();
        denied.sort_unstable();
        denied.dedup();
        DeviceRule { denied, caps: None }
    }

    /// This rule, and also the MIG capability nodes `denied` of character major `major` (the
    /// capabilities of the slices the job was not granted); nothing added when `denied` is empty.
    pub fn with_caps(mut self, major: u32, denied: &[u32]) -> DeviceRule {
        let mut denied = denied.to_vec();
        denied.sort_unstable();
        denied.dedup();
        self.caps = (!denied.is_empty()).then_some((major, denied));
        self
    }

    /// The denied MIG capability nodes: their major and minors.
    pub fn caps(&self) -> Option<(u32, &[u32])> {
        self.caps
            .as_ref()
            .map(|(major, minors)| (*major, minors.as_slice()))
    }

    /// Every denied node as `(major, minor)`: the GPU nodes', then the capability nodes'.
    pub fn denied_nodes(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.denied.iter().map(|&m| (NVIDIA_MAJOR, m)).chain(
            self.caps
                .iter()
                .flat_map(|(major, minors)| minors.iter().map(move |&m| (*major, m))),
        )
    }

    /// The rule for a grant: `granted` holds each granted GPU's minor number where known, `known`
    /// the minor numbers of every GPU of the inventory. When every granted GPU's node is known,
    /// every other GPU node is denied ([`DeviceRule::granting`]); when one is not (a sim GPU
    /// without `minor_number`), its node could be any, so only the known nodes of the GPUs not
    /// granted are denied. `None` when that denies nothing (no GPU's node is known).
    pub fn for_grant(granted: &[Option<u32>], known: &[u32]) -> Option<DeviceRule> {
        if known.is_empty() {
            return None;
        }
        let rule = match granted.iter().copied().collect::<Option<Vec<u32>>>() {
            Some(minors) => DeviceRule::granting(&minors),
            None => {
                let others: Vec<u32> = known
                    .iter()
                    .copied()
                    .filter(|m| !granted.contains(&Some(*m)))
                    .collect();
                DeviceRule::denying(&others)
            }
        };
        (!rule.is_empty()).then_some(rule)
    }

    /// The denied minors, in order.
    pub fn denied(&self) -> &[u32] {
        &self.denied
    }

    pub fn is_empty(&self) -> bool {
        self.denied.is_empty() && self.caps.is_none()
    }

    /// The denied minors as inclusive ranges of consecutive ones.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        ranges(&self.denied)
    }

    /// Per major, the denied minors as inclusive ranges: the GPU nodes' (when any), then the
    /// capability nodes' (when any).
    pub fn blocks(&self) -> Vec<(u32, Vec<(u32, u32)>)> {
        let mut out = Vec::new();
        if !self.denied.is_empty() {
            out.push((NVIDIA_MAJOR, ranges(&self.denied)));
        }
        if let Some((major, minors)) = &self.caps {
            out.push((*major, ranges(minors)));
        }
        out
    }
}

/// Sorted minors as inclusive ranges of consecutive ones.
fn ranges(minors: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &m in minors {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == m => *hi = m,
            _ => out.push((m, m)),
        }
    }
    out
}

/// `c 195:0-2,4-253` (the denied nodes), `nothing` when empty.
impl std::fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing");
        }
        let blocks: Vec<String> = self
            .blocks()
            .into_iter()
            .map(|(major, ranges)| {
                let ranges: Vec<String> = ranges
                    .into_iter()
                    .map(|(lo, hi)| {
                        if lo == hi {
                            lo.to_string()
                        } else {
                            format!("{lo}-{hi}")
                        }
                    })
                    .collect();
                format!("c {major}:{}", ranges.join(","))
            })
            .collect();
        write!(f, "{}", blocks.join(" and "))
    }
}

/// How the rule is enforced on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mechanism {
    /// The cgroup v1 `devices` controller, mounted here.
    DevicesCgroup { mount: std::path::PathBuf },
    /// A cgroup v2 device program attached to each job's v2 cgroup.
    Bpf,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mechanism::DevicesCgroup { mount } => {
                write!(f, "the cgroup v1 devices controller ({})", mount.display())
            }
            Mechanism::Bpf => write!(f, "a cgroup v2 device program (BPF)"),
        }
    }
}

/// Why nothing is confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unconstrained {
    /// `ORCH_DEVICE_CONSTRAINT=off`.
    Off,
    /// Only root may create the cgroups (orch not root runs jobs as its own user).
    NotRoot,
    /// Neither mechanism works here, and why.
    Unavailable(String),
}

impl std::fmt::Display for Unconstrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unconstrained::Off => write!(f, "ORCH_DEVICE_CONSTRAINT is off"),
            Unconstrained::NotRoot => write!(f, "orch is not root"),
            Unconstrained::Unavailable(why) => write!(f, "{why}"),
        }
    }
}

/// What `ORCH_DEVICE_CONSTRAINT` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The v1 devices controller where it is mounted, else the v2 device program (the default).
    Auto,
    V1,
    Bpf,
    Off,
}

impl Choice {
    /// `ORCH_DEVICE_CONSTRAINT`: `auto` (also when unset), `v1`, `bpf` or `off`; another value is
    /// warned of and read as `auto`, so a typo never leaves jobs unconfined.
    pub fn from_env() -> Choice {
        match std::env::var("ORCH_DEVICE_CONSTRAINT").as_deref() {
            Err(_) | Ok("" | "auto") => Choice::Auto,
            Ok("v1") => Choice::V1,
            Ok("bpf") => Choice::Bpf,
            Ok("off") => Choice::Off,
            Ok(other) => {
                tracing::warn!(
                    "ORCH_DEVICE_CONSTRAINT={other} is not one of auto, v1, bpf, off: using auto"
                );
                Choice::Auto
            }
        }
    }
}

impl Mechanism {
    /// The mechanism `ORCH_DEVICE_CONSTRAINT` and this machine give this process; `Err` says why
    /// there is none (`.ok()` for just the answer). [`detected`] is the same, found once.
    pub fn detect() -> Result<Mechanism, Unconstrained> {
        Mechanism::detect_with(Choice::from_env())
    }

    /// The mechanism `choice` gives on this machine.
    pub fn detect_with(choice: Choice) -> Result<Mechanism, Unconstrained> {
        if choice == Choice::Off {
            return Err(Unconstrained::Off);
        }
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Unconstrained::NotRoot);
        }
        let v1 = || match orch_core::process::cgroup_v1_mount("devices") {
            Some(mount) if v1::place("probe").is_ok() => Ok(Mechanism::DevicesCgroup { mount }),
            Some(mount) => Err(format!(
                "this process's devices cgroup under {} is not found",
                mount.display()
            )),
            None => Err("no cgroup v1 devices controller is mounted".to_string()),
        };
        let program = || {
            if orch_core::process::cgroup_v2_mount().is_none() {
                return Err("no cgroup v2 hierarchy is mounted".to_string());
            }
            bpf::probe().map(|()| Mechanism::Bpf)
        };
        let found = match choice {
            Choice::V1 => v1(),
            Choice::Bpf => program(),
            _ => v1().or_else(|a| program().map_err(|b| format!("{a}, and {b}"))),
        };
        found.map_err(Unconstrained::Unavailable)
    }
}

/// [`Mechanism::detect`], once per process.
pub fn detected() -> &'static Result<Mechanism, Unconstrained> {
    static DETECTED: OnceLock<Result<Mechanism, Unconstrained>> = OnceLock::new();
    DETECTED.get_or_init(Mechanism::detect)
}

/// The daemon's start-up line: how its jobs are confined to their GPUs, or why they are not.
pub fn announce_for_daemon() {
    match detected() {
        Ok(Mechanism::Bpf) if crate::cgroup::disabled() => tracing::warn!(
            "orch serve: jobs are not confined to their GPUs' device nodes: the cgroup v2 device program needs each job's own cgroup, and ORCH_CGROUPS=off turns those off"
        ),
        Ok(mechanism) => tracing::info!(
            "orch serve: jobs may open only their granted GPUs' device nodes ({mechanism})"
        ),
        Err(Unconstrained::Unavailable(why)) => {
            tracing::warn!("orch serve: jobs are not confined to their GPUs' device nodes: {why}")
        }
        Err(why) => {
            tracing::info!("orch serve: jobs are not confined to their GPUs' device nodes: {why}")
        }
    }
}

/// How a started process takes on its constraint between fork and exec ([`crate::LaunchSpec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceJoin {
    /// Join this v1 devices cgroup (its folder); a process that cannot is not started.
    DevicesCgroup(std::path::PathBuf),
    /// The program is on the job's v2 cgroup ([`crate::LaunchSpec::cgroup`]): joining that one
    /// is then required.
    JobCgroup,
}

/// A constraint orch put in place. Dropped, it removes what it made once nothing is left inside
/// (a process still inside keeps its rule until it ends; [`remove_leftover`] cleans up later);
/// [`DeviceConstraint::lift`] frees remaining processes first; [`DeviceConstraint::keep`] leaves it.
#[derive(Debug)]
pub struct DeviceConstraint {
    how: Option<How>,
}

#[derive(Debug)]
enum How {
    DevicesCgroup(v1::DevicesCgroup),
    /// Goes with the v2 cgroup when that is removed.
    Program(bpf::Attached),
}

impl DeviceConstraint {
    /// Puts `rule` in place for processes yet to start: v1, a devices cgroup `orch-NAME` they
    /// join ([`DeviceConstraint::join`]); v2, the program on `v2_cgroup` (which they join).
    pub fn prepare(
        mechanism: &Mechanism,
        name: &str,
        v2_cgroup: Option<&Path>,
        rule: &DeviceRule,
    ) -> Result<DeviceConstraint, String> {
        let how = match mechanism {
            Mechanism::DevicesCgroup { .. } => {
                How::DevicesCgroup(v1::DevicesCgroup::create(name, rule)?)
            }
            Mechanism::Bpf => {
                let dir = v2_cgroup.ok_or_else(|| {
                    format!(
                        "a device program needs a cgroup v2 folder for {name}, and there is none"
                    )
                })?;
                How::Program(bpf::attach(dir, rule)?)
            }
        };
        Ok(DeviceConstraint { how: Some(how) })
    }

    /// What a process started under this constraint does between fork and exec.
    pub fn join(&self) -> Option<DeviceJoin> {
        match self.how.as_ref()? {
            How::DevicesCgroup(c) => Some(DeviceJoin::DevicesCgroup(c.dir().to_path_buf())),
            How::Program(_) => Some(DeviceJoin::JobCgroup),
        }
    }

    /// Ends the constraint now: v1, remaining processes go back to the parent devices cgroup
    /// and the cgroup is removed; v2, the program is detached from the v2 cgroup.
    pub fn lift(mut self) {
        match self.how.take() {
            Some(How::DevicesCgroup(c)) => {
                c.lift();
            }
            Some(How::Program(p)) => p.detach(),
            None => {}
        }
    }

    /// Leaves the constraint in place past this value (a daemon that stops while the holder
    /// runs on); [`remove_leftover`] removes it later.
    pub fn keep(mut self) {
        self.how = None;
    }
}

impl Drop for DeviceConstraint {
    fn drop(&mut self) {
        if let Some(How::DevicesCgroup(c)) = &self.how {
            c.remove();
        }
    }
}

/// Confines process `pid`, which holds a lease but was not started by orch, to `rule`: v1, a
/// devices cgroup `orch-NAME` made with the rule and the process (all its threads) moved into it;
/// v2, the program attached to `v2_cgroup`, the process's own v2 cgroup (where the caller has
/// already moved it). What the process starts afterwards inherits the rule. `Ok(None)`: nothing is
/// confined on this machine ([`detected`] says why); `Err`: the mechanism is there but failed.
pub fn constrain_process(
    name: &str,
    pid: u32,
    v2_cgroup: Option<&Path>,
    rule: &DeviceRule,
) -> Result<Option<DeviceConstraint>, String> {
    let Ok(mechanism) = detected() else {
        return Ok(None);
    };
    if let (Mechanism::Bpf, Some(dir)) = (mechanism, v2_cgroup)
        && !in_v2_cgroup(pid, dir)
    {
        return Err(format!(
            "process {pid} is not in the cgroup {}: move it there first",
            dir.display()
        ));
    }
    let constraint = DeviceConstraint::prepare(mechanism, name, v2_cgroup, rule)?;
    if let Some(How::DevicesCgroup(c)) = &constraint.how {
        c.add(pid)?;
    }
    Ok(Some(constraint))
}

/// The name under which the job of lease `lease_id` is confined (its v1 devices cgroup is
/// `orch-job-LEASE`, beside its v2 cgroup of the same name).
pub fn job_name(lease_id: &str) -> String {
    format!("job-{lease_id}")
}

/// Removes the devices cgroup `orch-NAME` a constraint left (a daemon restarted and found its
/// lease gone; a job whose supervisor died), once it is empty: a process still inside stays
/// confined (an `Err` names it), as nothing but [`DeviceConstraint::lift`] frees one. Nothing to
/// do with the v2 program: it goes with the v2 cgroup.
pub fn remove_leftover(name: &str) -> Result<(), String> {
    match detected() {
        Ok(Mechanism::DevicesCgroup { .. }) => v1::remove_leftover(name),
        _ => Ok(()),
    }
}

fn in_v2_cgroup(pid: u32, dir: &Path) -> bool {
    orch_core::process::cgroup_v2_dir(pid).is_some_and(|own| own == dir)
}

/// Whether the v1 devices controller is there for this process (tests).
#[cfg(test)]
pub(crate) fn v1_available() -> bool {
    orch_core::process::cgroup_v1_dir(std::process::id(), "devices").is_some()
}

#[cfg(test)]
mod tests;
