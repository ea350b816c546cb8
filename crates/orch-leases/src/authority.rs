//! Who hands out this machine's devices: the daemon a client talks to, and the machine daemon's
//! claim on the devices.
//!
//! One authority per machine: where `orch serve` runs as the machine's daemon (root, listening
//! on [`MACHINE_SOCKET`]), every user's `orch run`, `orch submit` and `import orch` goes through
//! it, because every user's own lease store is blind to the leases of another user. Clients look
//! for a daemon in this order ([`find_daemon`]):
//!
//! 1. `ORCH_SERVER`, a socket path named by hand;
//! 2. with `ORCH_STATE_DIR` set, that folder's socket and no other: the variable sets up an orch
//!    of its own (tests, a single user's experiments), apart from the machine's;
//! 3. the machine daemon's socket, `/run/orch/orch.sock`, when it exists;
//! 4. the user's own daemon (`$XDG_RUNTIME_DIR/orch.sock`, else the state folder's).
//!
//! The machine daemon also records which devices it owns ([`Owner`], `/run/orch/owner.json`,
//! readable by everyone). A local claim of real GPUs on a machine whose daemon owns them is
//! refused ([`refuse_local_claim`]), and a user's own `orch serve` does not start beside it:
//! whatever a user sets, two authorities never hand out the same GPU. Simulated and CPU
//! inventories are exempt: nothing real is at stake, and tests run many of them side by side.

use crate::Holder;
use std::path::{Path, PathBuf};

/// Where the machine's daemon listens.
pub const MACHINE_SOCKET: &str = "/run/orch/orch.sock";

/// The machine daemon's record of the devices it owns, beside its socket.
pub const OWNER_FILE: &str = "/run/orch/owner.json";

/// How a client came to a daemon's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// `ORCH_SERVER`.
    Named,
    /// `$ORCH_STATE_DIR/orch.sock`.
    StateDir,
    /// The machine daemon's socket.
    Machine,
    /// The user's own daemon's socket.
    Own,
}

impl Found {
    /// Whether this daemon is the authority over the devices: named by hand, or the machine's.
    /// A user's own daemon shares the user's lease store, so claiming there directly is safe.
    pub fn is_authority(self) -> bool {
        matches!(self, Found::Named | Found::Machine)
    }
}

/// A daemon's socket and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSocket {
    pub path: PathBuf,
    pub found: Found,
}

/// The daemon a client should talk to, in the order the module documents. The socket may not
/// exist: a client says then that no daemon answers there.
pub fn find_daemon() -> DaemonSocket {
    find_daemon_with(
        &|name| std::env::var_os(name).filter(|v| !v.is_empty()),
        Path::new(MACHINE_SOCKET),
        &crate::default_socket,
    )
}

/// [`find_daemon`] over a given environment, machine socket and own socket (for tests).
pub fn find_daemon_with(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    machine: &Path,
    own: &dyn Fn() -> PathBuf,
) -> DaemonSocket {
    if let Some(named) = env("ORCH_SERVER") {
        return DaemonSocket {
            path: PathBuf::from(named),
            found: Found::Named,
        };
    }
    if let Some(dir) = env("ORCH_STATE_DIR") {
        return DaemonSocket {
            path: PathBuf::from(dir).join("orch.sock"),
            found: Found::StateDir,
        };
    }
    if machine.exists() {
        return DaemonSocket {
            path: machine.to_path_buf(),
            found: Found::Machine,
        };
    }
    DaemonSocket {
        path: own(),
        found: Found::Own,
    }
}

/// Whether something accepts connections on the socket now.
pub fn answers(socket: &Path) -> bool {
    socket.exists() && std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// What the machine daemon owns, as it wrote it at start-up.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    /// The daemon's process.
    pub holder: Holder,
    /// Its inventory, as `--devices` names it (`auto`, `nvml`, `cpu`, `sim:/path`).
    pub inventory: String,
    /// Whether that inventory is real GPUs (NVML).
    pub real: bool,
    /// Its socket.
    pub socket: PathBuf,
}

impl Owner {
    /// The owner record of a live machine daemon, if one is there.
    pub fn read() -> Option<Owner> {
        Owner::read_from(Path::new(OWNER_FILE))
    }

    pub fn read_from(path: &Path) -> Option<Owner> {
        let text = std::fs::read_to_string(path).ok()?;
        let owner: Owner = serde_json::from_str(&text).ok()?;
        // A daemon killed with -9 leaves its record: it counts only while its process lives.
        (!owner.holder.process_liveness().is_dead()).then_some(owner)
    }

    /// Writes the record (readable by every user); removed by [`Owner::remove`] at shutdown.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        orch_core::fsutil::write_atomic(path, &text)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
    }

    /// Removes the record at `path` if it is this process's.
    pub fn remove(path: &Path) {
        if Owner::read_from(path).is_some_and(|o| o.holder.same_process(&Holder::current())) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Refuses a claim of real GPUs made outside the machine daemon while that daemon owns them:
/// the sentence names the daemon and what to do. `real`: the claim's inventory is NVML's.
pub fn refuse_local_claim(real: bool) -> Result<(), String> {
    refuse_local_claim_at(real, Path::new(OWNER_FILE))
}

pub fn refuse_local_claim_at(real: bool, owner_file: &Path) -> Result<(), String> {
    if !real {
        return Ok(());
    }
    match Owner::read_from(owner_file) {
        Some(owner) if owner.real && !owner.holder.same_process(&Holder::current()) => {
            Err(format!(
                "this machine's GPUs belong to the orch daemon at {} (pid {}): a lease taken \
                 outside it could hand a GPU to two jobs; unset ORCH_STATE_DIR (and ORCH_SERVER) \
                 so that orch asks that daemon",
                owner.socket.display(),
                owner.holder.pid
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn find(vars: &[(&str, &str)], machine: &Path) -> DaemonSocket {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        find_daemon_with(&|name| vars.get(name).map(Into::into), machine, &|| {
            PathBuf::from("/home/u/own.sock")
        })
    }

    #[test]
    fn clients_look_for_the_named_then_the_state_folder_then_the_machine_then_their_own() {
        let dir = std::env::temp_dir().join(format!("orch-authority-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let machine = dir.join("machine.sock");
        let absent = dir.join("absent.sock");
        std::fs::write(&machine, "").unwrap();

        let named = find(
            &[("ORCH_SERVER", "/x.sock"), ("ORCH_STATE_DIR", "/s")],
            &machine,
        );
        assert_eq!(named.path, Path::new("/x.sock"));
        assert_eq!(named.found, Found::Named);
        let state = find(&[("ORCH_STATE_DIR", "/s")], &machine);
        assert_eq!(state.path, Path::new("/s/orch.sock"));
        assert_eq!(state.found, Found::StateDir);
        let at_machine = find(&[], &machine);
        assert_eq!(at_machine.path, machine);
        assert!(at_machine.found.is_authority());
        let own = find(&[], &absent);
        assert_eq!(own.path, Path::new("/home/u/own.sock"));
        assert!(!own.found.is_authority());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_live_machine_daemon_owning_real_gpus_refuses_local_claims_of_them() {
        let dir = std::env::temp_dir().join(format!("orch-owner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("owner.json");
        // Another live process (our parent stands in for the daemon).
        let parent = Holder::of_pid(std::os::unix::process::parent_id()).unwrap();
        let owner = Owner {
            holder: parent.clone(),
            inventory: "auto".into(),
            real: true,
            socket: "/run/orch/orch.sock".into(),
        };
        owner.write(&file).unwrap();
        let refused = refuse_local_claim_at(true, &file).unwrap_err();
        assert!(refused.contains("/run/orch/orch.sock"), "{refused}");
        assert!(refused.contains("unset ORCH_STATE_DIR"), "{refused}");
        // Simulated devices are nobody's: always claimable.
        assert!(refuse_local_claim_at(false, &file).is_ok());
        // A daemon that owns a simulated inventory owns no real GPU.
        Owner {
            real: false,
            ..owner.clone()
        }
        .write(&file)
        .unwrap();
        assert!(refuse_local_claim_at(true, &file).is_ok());
        // A dead daemon's record counts for nothing.
        let mut dead = parent;
        dead.start_time += 1;
        Owner {
            holder: dead,
            ..owner
        }
        .write(&file)
        .unwrap();
        assert!(Owner::read_from(&file).is_none());
        assert!(refuse_local_claim_at(true, &file).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
