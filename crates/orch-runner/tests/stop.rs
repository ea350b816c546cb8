//! Stopping a trainer run in this process from another thread: the first cause counts, and a
//! run that outlives its grace period is handed to the caller's `overdue`.

use orch_runner::{JobStopper, Overdue, StopCause, TrainStopper};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn the_first_stop_from_outside_counts_and_a_late_stop_calls_overdue_once_the_grace_is_over() {
    let flag = Arc::new(AtomicBool::new(false));
    let called = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&called);
    let overdue: Overdue = Arc::new(move |c: &StopCause| {
        orch_core::sync::lock(&seen).push(c.clone());
    });
    let stopper = JobStopper::Train(TrainStopper::new(
        Arc::clone(&flag),
        Duration::from_millis(50),
        Some(overdue),
    ));
    stopper.stop_with("cancelled", libc::SIGTERM);
    stopper.stop_with("time limit", libc::SIGTERM);
    stopper.signal(libc::SIGUSR1);
    assert!(flag.load(Ordering::Acquire));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while orch_core::sync::lock(&called).is_empty() {
        assert!(std::time::Instant::now() < deadline, "overdue never called");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        orch_core::sync::lock(&called).as_slice(),
        &[StopCause {
            reason: Some("cancelled".into()),
            signal: libc::SIGTERM
        }]
    );
}

#[test]
fn a_cancel_after_the_warning_signal_is_the_cause_and_only_it_has_a_grace_period() {
    let flag = Arc::new(AtomicBool::new(false));
    let called = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&called);
    let overdue: Overdue = Arc::new(move |c: &StopCause| {
        orch_core::sync::lock(&seen).push(c.clone());
    });
    let train = TrainStopper::new(Arc::clone(&flag), Duration::from_millis(50), Some(overdue));
    let stopper = JobStopper::Train(train.clone());
    stopper.signal(libc::SIGUSR1);
    assert!(flag.load(Ordering::Acquire));
    // A warning alone never ends in a kill.
    std::thread::sleep(Duration::from_millis(150));
    assert!(orch_core::sync::lock(&called).is_empty());
    stopper.stop_with("cancelled", libc::SIGTERM);
    let cancelled = StopCause {
        reason: Some("cancelled".into()),
        signal: libc::SIGTERM,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while orch_core::sync::lock(&called).is_empty() {
        assert!(std::time::Instant::now() < deadline, "overdue never called");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        orch_core::sync::lock(&called).as_slice(),
        std::slice::from_ref(&cancelled)
    );
    assert_eq!(train.finished(), Some(cancelled));
}

#[test]
fn a_run_that_ends_in_time_is_not_overdue() {
    let called = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&called);
    let stopper = TrainStopper::new(
        Arc::new(AtomicBool::new(false)),
        // A grace long enough that a busy machine cannot run it out between `stop` and
        // `finished` below: the point is that `finished` disarms it.
        Duration::from_secs(1),
        Some(Arc::new(move |_: &StopCause| {
            seen.store(true, Ordering::SeqCst)
        })),
    );
    JobStopper::Train(stopper.clone()).stop("time limit");
    assert_eq!(
        stopper.finished(),
        Some(StopCause {
            reason: Some("time limit".into()),
            signal: libc::SIGTERM
        })
    );
    std::thread::sleep(Duration::from_millis(1300));
    assert!(!called.load(Ordering::SeqCst));
}
