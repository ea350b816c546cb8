//! What a job's process does between fork and exec: join the job's cgroup, become the job's user,
//! enter its folder, take the terminal, and die with its parent. Everything the child needs is
//! prepared here, in the parent, so the child runs only system calls (async-signal-safe).

use crate::launch::{Credentials, ExecError, LaunchSpec, StdioMode};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

#[derive(Debug)]
pub(crate) struct ChildSetup {
    cgroup_procs: Option<CString>,
    credentials: Option<Credentials>,
    cwd: Option<CString>,
    foreground: bool,
    files: Option<(File, File)>,
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
        // With another user's credentials, the folder is entered after becoming that user, so a
        // job cannot start in a folder its user may not enter.
        let cwd = match (&spec.credentials, &spec.cwd) {
            (Some(_), Some(cwd)) => Some(c_path(cwd, "working folder")?),
            _ => None,
        };
        let files = match &spec.stdio {
            StdioMode::Inherit => None,
            StdioMode::Files { stdout, stderr } => {
                let open = |path: &std::path::Path| {
                    OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| ExecError::Spawn {
                            program: spec.argv.first().cloned().unwrap_or_default(),
                            reason: format!("cannot open the log {}: {e}", path.display()),
                        })
                };
                Some((open(stdout)?, open(stderr)?))
            }
        };
        Ok(ChildSetup {
            cgroup_procs,
            credentials: spec.credentials.clone(),
            cwd,
            foreground,
            files,
        })
    }

    /// Standard input and output for one process; only the first (`reads_input`) reads input.
    pub(crate) fn stdio(&self, command: &mut Command, reads_input: bool) -> Result<(), ExecError> {
        let clone = |f: &File| {
            f.try_clone().map_err(|e| ExecError::Spawn {
                program: String::new(),
                reason: format!("cannot share the log file: {e}"),
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

    /// Installs the between-fork-and-exec steps on `command`.
    pub(crate) fn install(&self, command: &mut Command, reads_input: bool) {
        let cgroup_procs = self.cgroup_procs.clone();
        let credentials = self.credentials.clone();
        let cwd = self.cwd.clone();
        let foreground = self.foreground && reads_input;
        // SAFETY: the closure runs in the forked child and makes only async-signal-safe system
        // calls on data prepared before the fork (no allocation, no locks).
        unsafe {
            command.pre_exec(move || {
                if let Some(procs) = &cgroup_procs {
                    join_cgroup(procs);
                }
                if let Some(c) = &credentials {
                    become_user(c)?;
                }
                if let Some(cwd) = &cwd
                    && libc::chdir(cwd.as_ptr()) != 0
                {
                    return Err(std::io::Error::last_os_error());
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

/// Writes "0" (this process) to the cgroup's `cgroup.procs`. A failure leaves the process where it
/// is: its process group still tracks it.
unsafe fn join_cgroup(procs: &CString) {
    // SAFETY: open/write/close on a NUL-terminated path prepared before the fork.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, c"0".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
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
