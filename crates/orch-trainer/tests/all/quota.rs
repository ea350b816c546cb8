//! The job's quota is an error value the trainer can recover from; so are the handle cap and a
//! device outside the grant.

use crate::common::*;
use orch_trainer::report::{Record, read_metrics};

#[test]
fn past_the_quota_the_trainer_gets_out_of_memory_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut job = job(
        dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 1797\n[train.config]\nmode = \"quota\"",
            fixture().display()
        ),
    );
    let quota = 2u64 << 20;
    job.resources.memory_limit = Some(orch_core::ByteSize(quota));
    let (devices, pools) = sims(1, 64 << 20);
    let options = orch_trainer::RunOptions {
        max_tensors: 64,
        ..options()
    };
    run(&job, &devices, &options).unwrap();

    let records = read_metrics(&spec(&job).out.join("metrics.jsonl"));
    let Some(Record::Step { scalars, .. }) = records.first() else {
        panic!("a step record: {records:?}")
    };
    let get = |name: &str| scalars.get(name).copied().unwrap_or(f64::NAN);
    assert_eq!(
        get("oom_requested"),
        quota as f64,
        "the whole quota was asked for"
    );
    assert_eq!(
        get("oom_in_use"),
        4096.0,
        "one 1024-element tensor was held"
    );
    assert_eq!(get("oom_limit"), quota as f64);
    assert_eq!(get("oom_device"), 0.0);
    assert_eq!(get("recovered_sum"), 2.0 * (quota / 8) as f64);
    assert_eq!(get("no_such_device"), 1.0);
    assert_eq!((get("handle_cap"), get("handles_held")), (64.0, 64.0));
    assert_eq!(pools[0].in_use(), 0);
}
