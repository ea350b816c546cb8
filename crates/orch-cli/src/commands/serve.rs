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
    if args.check {
        let names: Vec<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
        println!(
            "{}: valid; tenants: {}",
            args.config
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
            names.join(", ")
        );
        return Ok(());
    }
    let state_dir = orch_leases::default_state_dir();
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(orch_serve::default_socket);
    let exe = std::env::current_exe().map_err(Failure::failed)?;
    let spec = devices
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
    let real = owns_real_gpus(&spec);
    // Real devices are the machine's: their daemon always takes the machine-wide lock. Others
    // take it when the config says `machine_lock = true`.
    if real && config.machine_lock == Some(false) {
        let file = args
            .config
            .as_ref()
            .map_or_else(|| "the config".into(), |p| p.display().to_string());
        return Err(Failure::bad_input_msg(format!(
            "machine_lock = false (in {file}) cannot apply to a daemon of this machine's real GPUs: two such daemons would hand the same GPU out twice; remove the line"
        )));
    }
    let machine_lock =
        (real || config.machine_lock == Some(true)).then(orch_serve::server::machine_lock_path);
    let machine = socket == std::path::Path::new(orch_leases::MACHINE_SOCKET);
    let owner_file = std::path::Path::new(orch_leases::OWNER_FILE);
    if !machine
        && real
        && let Some(owner) = orch_leases::Owner::read().filter(|o| o.real)
    {
        return Err(Failure::bad_input_msg(format!(
            "this machine's GPUs belong to the orch daemon at {} (pid {}): a second daemon would hand them out again; submit to that one (orch submit, orch run and import orch find it), or serve a sim: or cpu inventory",
            owner.socket.display(),
            owner.holder.pid
        )));
    }
    // The machine's daemon says which devices it owns, for every user's orch to read. Not while
    // another live daemon's record is there: that daemon keeps its socket, and this start fails.
    let record = machine
        && orch_leases::Owner::read_from(owner_file).is_none()
        && match (orch_leases::Owner {
            holder: orch_leases::Holder::current(),
            inventory: devices.clone(),
            real,
            socket: socket.clone(),
        })
        .write(owner_file)
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "cannot write {} ({e}): other users' orch cannot tell that this daemon owns the GPUs",
                    owner_file.display()
                );
                false
            }
        };
    let served = orch_serve::serve(ServeOptions {
        state_dir,
        socket,
        config,
        devices,
        exe,
        machine_lock,
    });
    if record {
        orch_leases::Owner::remove(owner_file);
    }
    // Every error of `serve` is a start-up failure (a config, a state folder, a port or another
    // daemon in the way): exit 2, as for a bad config. Once it serves, it ends only on a signal.
    served.map_err(Failure::bad_input)
}

/// Whether the inventory is this machine's real GPUs (NVML), which only one daemon may own.
fn owns_real_gpus(spec: &orch_devices::InventorySpec) -> bool {
    match spec {
        orch_devices::InventorySpec::Nvml => true,
        orch_devices::InventorySpec::Auto => {
            orch_devices::nvml::read().is_ok_and(|d| !d.is_empty())
        }
        orch_devices::InventorySpec::Cpu | orch_devices::InventorySpec::Sim(_) => false,
    }
}

pub fn supervise(dir: &std::path::Path) -> CmdResult {
    match orch_serve::supervise(dir, crate::progress::lines) {
        0 => Ok(()),
        code => Err(Failure {
            code: code as u8,
            error: anyhow::anyhow!("the supervisor of {} ended early", dir.display()),
        }),
    }
}
