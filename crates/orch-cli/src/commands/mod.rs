//! One module per command.

mod alloc;
mod devices;
mod drain;
mod granted;
mod history;
mod jobs;
mod leases;
mod manual;
mod model;
mod plan;
mod plugin;
mod quick;
mod run;
mod serve;
mod simulate;
mod slurm;

use crate::cli::{Cli, Command};
use crate::failure::{CmdResult, Failure};
use orch_devices::{Inventory, InventorySpec};

pub fn dispatch(cli: Cli) -> CmdResult {
    let spec = parse_spec(&cli.devices)?;
    match cli.command {
        Command::Devices(args) => devices::run(&spec, &args),
        Command::Leases(args) => leases::run(&args),
        Command::Drain(args) => drain::drain(&spec, &args),
        Command::Undrain(args) => drain::undrain(&spec, &args),
        Command::Plan(args) => plan::run(&spec, &args),
        Command::Run(args) => run::run(&spec, &args),
        Command::Alloc(args) => alloc::run(&spec, &args),
        Command::Predict(args) => model::predict(&args),
        Command::Sample(args) => model::sample(&args),
        Command::Plugin(args) => plugin::run(&args),
        Command::Serve(args) => serve::run(&cli.devices, &args),
        Command::Submit(args) if args.slurm => slurm::submit(&args),
        Command::Submit(args) => jobs::submit(&args),
        Command::Jobs(args) if args.slurm => slurm::list(&args),
        Command::Jobs(args) => jobs::list(&args),
        Command::Status(args) if args.slurm => slurm::status(&args),
        Command::Status(args) => jobs::status(&args),
        Command::Cancel(args) if args.slurm => slurm::cancel(&args),
        Command::Cancel(args) => jobs::cancel(&args),
        Command::Logs(args) if args.slurm => slurm::logs(&args),
        Command::Logs(args) => jobs::logs(&args),
        Command::Wait(args) if args.slurm => slurm::wait(&args),
        Command::Wait(args) => jobs::wait(&args),
        Command::Usage(args) => jobs::usage(&args),
        Command::History(args) => history::run(&args),
        Command::Simulate(args) => simulate::run(&spec, &args),
        Command::Completions(args) => manual::completions(&args),
        Command::Man(args) => manual::man(&args),
        Command::Supervise { dir } => serve::supervise(&dir),
        Command::TrainJob { spec_fd, dir } => run::train_child(spec_fd, &dir),
        Command::PolicyWorker => std::process::exit(orch_serve::core::policy_worker::worker_main()),
        // Its exit status and its last line on stderr are what the daemon reads.
        Command::CompilePolicy {
            cpu_s,
            memory,
            name,
            sha256,
            source,
            out,
        } => std::process::exit(orch_serve::core::compile::compile_child(
            cpu_s,
            memory,
            &name,
            sha256.as_deref(),
            &source,
            &out,
        )),
    }
}

fn parse_spec(text: &str) -> Result<InventorySpec, Failure> {
    text.parse::<InventorySpec>()
        .map_err(|e| Failure::bad_input_msg(format!("--devices / ORCH_DEVICES: {e}")))
}

/// Loads the inventory; failing to is bad input (a spec this machine cannot serve, a bad file).
pub fn load_inventory(spec: &InventorySpec) -> Result<Inventory, Failure> {
    Inventory::load(spec).map_err(Failure::bad_input)
}
