//! `orch serve`: the daemon (orch-serve does the work), and `orch __supervise DIR`, the per-job
//! supervisor it starts.

use crate::cli::ServeArgs;
use crate::failure::{CmdResult, Failure};
use orch_serve::{Config, ServeOptions};

pub fn run(devices: &str, args: &ServeArgs) -> CmdResult {
    let config = match &args.config {
        Some(path) => Config::read(path).map_err(Failure::bad_input)?,
        None => {
            let me = orch_serve::core::users::Identity::of_uid(
                orch_serve::core::users::current_uid(),
                // SAFETY: getgid cannot fail.
                unsafe { libc::getgid() },
            );
            Config::single_user(&me.name)
        }
    };
    let state_dir = orch_leases::default_state_dir();
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(orch_serve::default_socket);
    let exe = std::env::current_exe().map_err(Failure::failed)?;
    devices
        .parse::<orch_devices::InventorySpec>()
        .map_err(|e| Failure::bad_input_msg(format!("--devices / ORCH_DEVICES: {e}")))?;
    // A relative sim path must mean the same to the supervisors, whatever their folder.
    let devices = match devices.strip_prefix("sim:") {
        Some(path) => format!(
            "sim:{}",
            std::path::absolute(path)
                .map_err(Failure::failed)?
                .display()
        ),
        None => devices.to_string(),
    };
    orch_serve::serve(ServeOptions {
        state_dir,
        socket,
        config,
        devices,
        exe,
    })
    // Every error of `serve` is a start-up failure (a config, a state folder, a port or another
    // daemon in the way): exit 2, as for a bad config. Once it serves, it ends only on a signal.
    .map_err(Failure::bad_input)
}

pub fn supervise(dir: &std::path::Path) -> CmdResult {
    match orch_serve::supervise(dir) {
        0 => Ok(()),
        code => Err(Failure {
            code: code as u8,
            error: anyhow::anyhow!("the supervisor of {} ended early", dir.display()),
        }),
    }
}
