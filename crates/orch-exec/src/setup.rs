//! What a job's process does between fork and exec: join the job's cgroup and the one that
//! confines it to its GPUs, become the job's user, enter its folder, take the terminal, and die
//! with its parent. Everything the child needs is
//! prepared here, in the parent, so the child runs only system calls (async-signal-safe).

use crate::devices::DeviceJoin;
use crate::spec::{Credentials, ExecError, LaunchSpec, StdioMode};
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

#[derive(Debug)]
pub(crate) struct ChildSetup {
    cgroup_procs: Option<CString>,
    /// The job's cgroup carries its device program: a process that cannot join is not started.
    cgroup_required: bool,
    /// The v1 devices cgroup's `cgroup.procs`, which every process must join.
    devices_procs: Option<CString>,
    credentials: Option<Credentials>,
    cwd: Option<CString>,
    foreground: bool,
    /// The write ends of the pipes to the log copiers (`StdioMode::Files`).
    files: Option<(std::io::PipeWriter, std::io::PipeWriter)>,
    /// The read ends and their logs, for [`crate::logs::Copiers::start`].
    pub(crate) streams: Vec<(std::io::PipeReader, crate::logs::CappedLog)>,
    /// Which step a child failed at ([`Step`]): the parent's only way to tell that failure from
    /// the program's own (both come back as an errno).
    failed_step: Option<SharedFlag>,
    /// Each slot's CPU binding, made ready for the child.
    bindings: Vec<Option<crate::bind::PreparedBinding>>,
}

/// The steps of the child that can fail before exec, as [`SharedFlag`] values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Cgroup = 1,
    DevicesCgroup = 2,
    Folder = 3,
    Bind = 4,
}

impl ChildSetup {
    pub(crate) fn new(spec: &LaunchSpec, foreground: bool) -> Result<ChildSetup, ExecError> {
        let c_path = |p: &std::path::Path, what: &str| {
            CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| ExecError::Spawn {
                program: spec.argv.first().cloned().unwrap_or_default(),
                reason: format!("the {what} path {} holds a NUL byte", p.display()),
            })
        };
        let cgroup_procs = match &spec.cgroup {
            Some(dir) => Some(c_path(&dir.join("cgroup.procs"), "cgroup")?),
            None => None,
        };
        let cgroup_required = spec.devices == Some(DeviceJoin::JobCgroup);
        if cgroup_required && cgroup_procs.is_none() {
            return Err(ExecError::Spawn {
                program: spec.argv.first().cloned().unwrap_or_default(),
                reason: "its device rule is a program on the job's cgroup, and the job has none"
                    .into(),
            });
        }
        let devices_procs = match &spec.devices {
            Some(DeviceJoin::DevicesCgroup(dir)) => {
                Some(c_path(&dir.join("cgroup.procs"), "devices cgroup")?)
            }
            _ => None,
        };
        // The folder is entered in the child, after becoming the job's user when there is one,
        // so a job cannot start in a folder its user may not enter.
        let cwd = match &spec.cwd {
            Some(cwd) => Some(c_path(cwd, "working folder")?),
            None => None,
        };
        let bindings: Vec<Option<crate::bind::PreparedBinding>> = spec
            .cpu_binding
            .iter()
            .map(|b| b.as_ref().map(crate::bind::PreparedBinding::new))
            .collect();
        let bound = bindings.iter().any(Option::is_some);
        let failed_step = (cwd.is_some() || cgroup_required || devices_procs.is_some() || bound)
            .then(SharedFlag::new)
            .flatten();
        let mut streams = Vec::new();
        let files = match &spec.stdio {
            StdioMode::Inherit => None,
            StdioMode::Files {
                stdout,
                stderr,
                cap,
            } => {
                let mut open = |path: &std::path::Path| {
                    let failed = |e: std::io::Error| ExecError::Spawn {
                        program: spec.argv.first().cloned().unwrap_or_default(),
                        reason: format!("cannot open the log {}: {e}", path.display()),
                    };
                    let log = crate::logs::CappedLog::open(path, *cap).map_err(failed)?;
                    let (reader, writer) = std::io::pipe().map_err(failed)?;
                    streams.push((reader, log));
                    Ok::<_, ExecError>(writer)
                };
                Some((open(stdout)?, open(stderr)?))
            }
        };
        Ok(ChildSetup {
            cgroup_procs,
            cgroup_required,
            devices_procs,
            credentials: spec.credentials.clone(),
            cwd,
            foreground,
            files,
            streams,
            failed_step,
            bindings,
        })
    }

    /// Why `spawn` failed with `error`, as the job's reason: its working folder, when the child
    /// could not enter it, or the cgroup that confines it to its GPUs, when it could not join;
    /// `None` for any other failure (the program's own).
    pub(crate) fn step_failure(
        &self,
        spec: &LaunchSpec,
        slot: usize,
        error: &std::io::Error,
    ) -> Option<ExecError> {
        let step = self.failed_step.as_ref().map_or(0, SharedFlag::get);
        if step == Step::Bind as u8 {
            let binding = spec.cpu_binding.get(slot).cloned().flatten();
            return Some(ExecError::Bind {
                binding: binding.map_or_else(|| "its CPUs".to_string(), |b| b.to_string()),
                reason: error.to_string(),
            });
        }
        let confine = |cgroup: Option<&std::path::PathBuf>| ExecError::Confine {
            cgroup: cgroup.cloned().unwrap_or_default(),
            reason: error.to_string(),
        };
        if step == Step::Cgroup as u8 {
            return Some(confine(spec.cgroup.as_ref()));
        }
        if step == Step::DevicesCgroup as u8 {
            let dir = match &spec.devices {
                Some(DeviceJoin::DevicesCgroup(dir)) => Some(dir),
                _ => None,
            };
            return Some(confine(dir));
        }
        if step != Step::Folder as u8 {
            return None;
        }
        let uid = match &self.credentials {
            Some(c) => c.uid,
            // SAFETY: getuid cannot fail.
            None => unsafe { libc::getuid() },
        };
        let reason = match error.kind() {
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            std::io::ErrorKind::NotFound => "it does not exist".to_string(),
            _ => error.to_string(),
        };
        Some(ExecError::WorkingFolder {
            folder: spec.cwd.clone().unwrap_or_default(),
            user: user_name(uid),
            reason,
        })
    }

    /// Standard input and output for one process; only the first (`reads_input`) reads input.
    pub(crate) fn stdio(&self, command: &mut Command, reads_input: bool) -> Result<(), ExecError> {
        let clone = |f: &std::io::PipeWriter| {
            f.try_clone().map_err(|e| ExecError::Spawn {
                program: String::new(),
                reason: format!("cannot share the log pipe: {e}"),
            })
        };
        match &self.files {
            Some((out, err)) => {
                command
                    .stdin(Stdio::null())
                    .stdout(clone(out)?)
                    .stderr(clone(err)?);
            }
            None if !reads_input => {
                command.stdin(Stdio::null());
            }
            None => {}
        }
        Ok(())
    }

    /// Installs the between-fork-and-exec steps on `command`, the process of `slot`.
    pub(crate) fn install(&self, command: &mut Command, slot: usize, reads_input: bool) {
        let binding = self.bindings.get(slot).cloned().flatten();
        let cgroup_procs = self.cgroup_procs.clone();
        let cgroup_required = self.cgroup_required;
        let devices_procs = self.devices_procs.clone();
        let credentials = self.credentials.clone();
        let cwd = self.cwd.clone();
        let failed_step = self.failed_step.as_ref().map(SharedFlag::address);
        if let Some(flag) = &self.failed_step {
            flag.clear();
        }
        let fail = move |step: Step, error: std::io::Error| -> std::io::Result<()> {
            if let Some(flag) = failed_step {
                // SAFETY: the address of the live flag's page, mapped before the fork.
                unsafe { SharedFlag::set_at(flag, step as u8) };
            }
            Err(error)
        };
        let foreground = self.foreground && reads_input;
        // SAFETY: the closure runs in the forked child and makes only async-signal-safe system
        // calls on data prepared before the fork (no allocation, no locks).
        unsafe {
            command.pre_exec(move || {
                // Both joins come before the change of user: only root may move a process.
                if let Some(procs) = &cgroup_procs
                    && let Err(e) = join_cgroup(procs)
                    && cgroup_required
                {
                    return fail(Step::Cgroup, e);
                }
                if let Some(procs) = &devices_procs
                    && let Err(e) = join_cgroup(procs)
                {
                    return fail(Step::DevicesCgroup, e);
                }
                if let Some(binding) = &binding
                    && let Err(e) = binding.apply()
                {
                    return fail(Step::Bind, e);
                }
                if let Some(c) = &credentials {
                    become_user(c)?;
                }
                if let Some(cwd) = &cwd
                    && libc::chdir(cwd.as_ptr()) != 0
                {
                    return fail(Step::Folder, std::io::Error::last_os_error());
                }
                if foreground {
                    crate::terminal::take_in_child();
                }
                // After any change of user: a credential change clears the parent-death signal.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
}

/// Writes "0" (this process) to the cgroup's `cgroup.procs` (v1 or v2). A failure of the job's
/// own cgroup leaves the process where it is (its process group still tracks it) unless the
/// cgroup carries the device program; a failure of the devices cgroup stops the start.
unsafe fn join_cgroup(procs: &CString) -> std::io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path prepared before the fork; the errno is
    // read (no allocation) before close can change it.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, c"0".as_ptr().cast(), 1);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

/// setgroups, setgid, setuid, in that order (each needs the privilege the next one drops).
unsafe fn become_user(c: &Credentials) -> std::io::Result<()> {
    // SAFETY: the group list lives in the closure's captured data; the calls only read it.
    unsafe {
        if libc::setgroups(c.groups.len(), c.groups.as_ptr()) != 0
            || libc::setgid(c.gid) != 0
            || libc::setuid(c.uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One byte of memory shared with forked children (an anonymous `MAP_SHARED` page): what a child
/// writes there between fork and exec, the parent reads after `spawn` returns.
#[derive(Debug)]
struct SharedFlag(*mut u8);

// SAFETY: the page is only read and written with volatile byte accesses; it is unmapped once,
// on drop, after every child that could write it has been spawned.
unsafe impl Send for SharedFlag {}
// SAFETY: as above.
unsafe impl Sync for SharedFlag {}

impl SharedFlag {
    /// `None` when no page can be mapped: the reason then falls back to the plain errno.
    fn new() -> Option<SharedFlag> {
        // SAFETY: an anonymous mapping of one page; the result is checked.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (page != libc::MAP_FAILED).then(|| SharedFlag(page.cast()))
    }

    fn address(&self) -> usize {
        self.0 as usize
    }

    fn clear(&self) {
        // SAFETY: the page is mapped while `self` lives.
        unsafe { std::ptr::write_volatile(self.0, 0) }
    }

    fn get(&self) -> u8 {
        // SAFETY: as in `clear`.
        unsafe { std::ptr::read_volatile(self.0) }
    }

    /// Sets the flag at `address` (from [`SharedFlag::address`]) to `value`; async-signal-safe.
    ///
    /// # Safety
    /// `address` must come from a live [`SharedFlag`].
    unsafe fn set_at(address: usize, value: u8) {
        // SAFETY: the caller passes the address of a mapped page.
        unsafe { std::ptr::write_volatile(address as *mut u8, value) }
    }
}

impl Drop for SharedFlag {
    fn drop(&mut self) {
        // SAFETY: unmaps the page `new` mapped, once.
        unsafe {
            libc::munmap(self.0.cast(), 1);
        }
    }
}

/// The name of `uid` in the user database; `uid N` when it has none.
fn user_name(uid: u32) -> String {
    passwd_entry(uid).map_or_else(|| format!("uid {uid}"), |(name, _)| name)
}

/// `(name, primary gid)` of `uid` from the user database.
pub fn passwd_entry(uid: u32) -> Option<(String, u32)> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain data; getpwuid_r fills it with pointers into `buf`, which outlives
    // the reads below.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(pwd.pw_name)
            .to_string_lossy()
            .into_owned();
        Some((name, pwd.pw_gid))
    }
}
