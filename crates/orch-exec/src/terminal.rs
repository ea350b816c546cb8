//! A job in a terminal gets the terminal: it becomes the foreground process group while it runs
//! (so pdb, `input()` and password prompts read the keyboard instead of stopping on SIGTTIN, and
//! Ctrl-C reaches the job directly), and orch takes the terminal back when it ends.

/// orch's hold on its terminal, to give back to orch when the job ends.
#[derive(Debug)]
pub struct Foreground {
    own_group: libc::pid_t,
}

impl Foreground {
    /// Some when stdin is a terminal whose foreground group is orch's own: only then may orch
    /// hand it to the job.
    pub fn available() -> Option<Foreground> {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read.
        unsafe {
            if libc::isatty(libc::STDIN_FILENO) != 1 {
                return None;
            }
            let own_group = libc::getpgrp();
            (libc::tcgetpgrp(libc::STDIN_FILENO) == own_group).then_some(Foreground { own_group })
        }
    }

    /// Makes orch's group the terminal's foreground again. orch is in the background by then,
    /// so SIGTTOU is ignored for the call.
    pub fn restore(self) {
        // SAFETY: signal dispositions and tcsetpgrp on our own terminal; the old disposition is
        // put back.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(libc::STDIN_FILENO, self.own_group);
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

/// In the child, between fork and exec: make the child's own group (already created) the
/// terminal's foreground. Async-signal-safe: system calls only.
pub(crate) fn take_in_child() {
    // SAFETY: called in the forked child before exec; SIGTTOU is blocked so that a background
    // group may call tcsetpgrp, then unblocked.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpgrp());
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}
