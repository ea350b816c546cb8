//! Progress is reported as events to the caller's sink, in order, nothing printed.

use crate::common::*;
use orch_trainer::{ProgressEvent, ProgressSink, RunOptions};
use std::sync::{Arc, Mutex};

#[test]
fn a_run_reports_its_start_every_step_each_epoch_and_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        // 1797 samples in batches of 256: 8 steps an epoch, the last a short one.
        "plugin = \"mlp\"\nepochs = 2\nbatch_size = 256\nseed = 1\n[train.config]\nhidden = \"16\"",
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    let options = RunOptions {
        progress: Some(ProgressSink::new(move |e| seen.lock().unwrap().push(e))),
        ..options()
    };
    let (devices, _pools) = sims(2, 64 << 20);
    let summary = run(&job, &devices, &options).unwrap();
    let events = events.lock().unwrap();
    let ProgressEvent::Started {
        text,
        epochs: 2,
        batches_per_epoch: 8,
        first_step: 0,
    } = &events[0]
    else {
        panic!("the run starts with its size: {:?}", events[0]);
    };
    assert!(text.contains("2 replica(s) on sim:0, sim:1"), "{text}");
    let steps: Vec<(u64, u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            ProgressEvent::Step {
                step,
                epoch,
                step_in_epoch,
                ..
            } => Some((*step, *epoch, *step_in_epoch)),
            _ => None,
        })
        .collect();
    let expected: Vec<(u64, u32, u64)> = (1..=16u64)
        .map(|s| (s, if s <= 8 { 1 } else { 2 }, (s - 1) % 8 + 1))
        .collect();
    assert_eq!(steps, expected, "every step once, in order");
    let epochs: Vec<(u32, bool)> = events
        .iter()
        .filter_map(|e| match e {
            ProgressEvent::Epoch {
                epoch,
                eval_accuracy,
                ..
            } => Some((*epoch, eval_accuracy.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, [(1, true), (2, true)]);
    let Some(ProgressEvent::Finished {
        steps, checkpoint, ..
    }) = events.last()
    else {
        panic!("the run ends with its summary: {:?}", events.last());
    };
    assert_eq!(*steps, summary.steps);
    assert!(checkpoint.join("state.json").is_file());
}
