//! `orch simulate`: a trace replayed through the daemon's scheduler in virtual time.

use crate::cli::SimulateArgs;
use crate::commands::load_inventory;
use crate::failure::{CmdResult, Failure};
use orch_devices::InventorySpec;
use orch_serve::Config;

pub fn run(spec: &InventorySpec, args: &SimulateArgs) -> CmdResult {
    let config = Config::read(&args.config).map_err(Failure::bad_input)?;
    if let Some(until) = args.until
        && !(until.is_finite() && until >= 0.0)
    {
        return Err(Failure::bad_input_msg(format!(
            "--until {until}: give a time in seconds, 0 or more"
        )));
    }
    let inventory = load_inventory(spec)?;
    // The machine's devices, whatever this shell's CUDA_VISIBLE_DEVICES says.
    let gpus = inventory.devices.len() as u32;
    if gpus == 0 {
        return Err(Failure::bad_input_msg(
            "the inventory has no devices to simulate: give --devices sim:FILE",
        ));
    }
    let trace = orch_serve::simulate::read_trace(&args.trace).map_err(Failure::bad_input)?;
    let policy = orch_serve::core::queue_policy::for_simulator(&config)
        .map_err(|e| Failure::bad_input_msg(format!("{}: {e}", args.config.display())))?;
    let report =
        orch_serve::simulate::simulate_with(&config, gpus, &trace, policy, args.until, args.jobs)
            .map_err(|e| Failure::bad_input_msg(format!("{}: {e}", args.trace.display())))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(Failure::failed)?
        );
    } else {
        print!("{}", orch_serve::simulate::render(&report));
    }
    Ok(())
}
