//! `orch simulate`: a trace replayed through the daemon's scheduler in virtual time.

use crate::cli::SimulateArgs;
use crate::commands::load_inventory;
use crate::failure::{CmdResult, Failure};
use orch_devices::InventorySpec;
use orch_serve::Config;
use std::path::Path;

pub fn run(spec: &InventorySpec, args: &SimulateArgs) -> CmdResult {
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
    let trace_path = args.trace.as_deref().filter(|p| *p != Path::new("-"));
    if args.trace.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Err(Failure::bad_input_msg(
            "orch simulate needs a trace: give TRACE.jsonl, or pipe one in (orch simulate < trace.jsonl)",
        ));
    }
    let trace = match trace_path {
        Some(path) => orch_serve::simulate::read_trace(path),
        None => orch_serve::simulate::read_trace_stdin(),
    }
    .map_err(Failure::bad_input)?;
    let config = match &args.config {
        Some(path) => Config::read(path).map_err(Failure::bad_input)?,
        None => {
            // Every tenant of the trace, in the order it first appears.
            let mut tenants: Vec<String> = Vec::new();
            for job in &trace {
                if !tenants.contains(&job.tenant) {
                    tenants.push(job.tenant.clone());
                }
            }
            Config::equal_shares(&tenants)
        }
    };
    let config_name = args
        .config
        .as_ref()
        .map_or("the equal-share config".to_string(), |p| {
            p.display().to_string()
        });
    let trace_name = trace_path.map_or("the trace on standard input".to_string(), |p| {
        p.display().to_string()
    });
    let policy = orch_serve::core::queue_policy::for_simulator(&config)
        .map_err(|e| Failure::bad_input_msg(format!("{config_name}: {e}")))?;
    let report =
        orch_serve::simulate::simulate_with(&config, gpus, &trace, policy, args.until, args.jobs)
            .map_err(|e| Failure::bad_input_msg(format!("{trace_name}: {e}")))?;
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
