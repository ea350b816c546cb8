//! The scheduler's dependencies and `singleton` ([`super::deps`]).

use super::deps::{Kind, Standing, Wait};
use super::*;

fn wait(after: &[(Kind, u64)], singleton: bool, group: &str) -> Wait {
    Wait {
        after: after.to_vec(),
        singleton,
        group: group.into(),
    }
}

/// Jobs are active unless `ended` names them.
fn standing(ended: &[(u64, bool, &str)]) -> impl FnMut(u64) -> Standing {
    let ended: Vec<(u64, bool, String)> = ended
        .iter()
        .map(|&(id, ok, how)| (id, ok, how.to_string()))
        .collect();
    move |id| match ended.iter().find(|e| e.0 == id) {
        Some((_, ok, how)) => Standing::Ended {
            ok: *ok,
            how: how.clone(),
        },
        None => Standing::Active,
    }
}

#[test]
fn a_waiting_job_is_held_out_of_the_pass_and_says_what_it_waits_for() {
    let mut s = sched(&[1.0], "fifo");
    s.enqueue(job(1, 0, 1, 0, 0.0));
    s.enqueue_after(
        job(2, 0, 1, 0, 1.0),
        wait(&[(Kind::AfterOk, 1)], false, "u/b"),
        &mut standing(&[]),
    )
    .unwrap();
    assert_eq!(s.queued(), 1);
    assert_eq!(s.held_back(), 1);
    assert_eq!(
        s.held_reasons(),
        vec![(2, "waiting for job 1 (queued)".into())]
    );
    // Devices for both: only 1 starts; 2 is not charged as queued for its tenant.
    let r = pass(&mut s, 2.0, 8);
    assert_eq!(r.started, vec![1]);
    assert!(r.reasons.iter().all(|(id, _)| *id != 2), "{:?}", r.reasons);
    assert_eq!(s.counts(0), (0, 1));
    assert_eq!(
        s.held_reasons(),
        vec![(2, "waiting for job 1 (running)".into())]
    );
    s.end(1, 10.0);
    assert!(s.dependency_ended(1, true, "succeeded".into()).is_empty());
    assert_eq!(s.held_back(), 0);
    assert_eq!(s.queued_job(2).map(|j| j.queued_s), Some(10.0));
    assert_eq!(pass(&mut s, 11.0, 8).started, vec![2]);
}

#[test]
fn a_dependency_never_met_cancels_its_chain_and_after_any_and_after_failed_run() {
    let mut s = sched(&[1.0], "fifo");
    s.enqueue(job(1, 0, 1, 0, 0.0));
    let mut none = standing(&[]);
    for (id, kind, on) in [
        (2, Kind::AfterOk, 1),
        (3, Kind::AfterOk, 2),
        (4, Kind::AfterAny, 1),
        (5, Kind::AfterFailed, 1),
        (6, Kind::AfterAny, 3),
    ] {
        s.enqueue_after(
            job(id, 0, 1, 0, 1.0),
            wait(&[(kind, on)], false, "u/x"),
            &mut none,
        )
        .unwrap();
    }
    pass(&mut s, 2.0, 8);
    s.end(1, 5.0);
    let mut cancelled = s.dependency_ended(1, false, "failed (exit 1)".into());
    cancelled.sort();
    assert_eq!(
        cancelled,
        vec![
            (
                2,
                "dependency never satisfied: job 1 failed (exit 1)".into()
            ),
            (3, "dependency never satisfied: job 2 was cancelled".into()),
        ]
    );
    // 4 (after_any 1), 5 (after_failed 1) and 6 (after_any 3, cancelled) go into the queue.
    let mut started = pass(&mut s, 6.0, 8).started;
    started.sort();
    assert_eq!(started, vec![4, 5, 6]);
    // At submission, the ends already known decide at once.
    let e = s
        .enqueue_after(
            job(7, 0, 1, 0, 7.0),
            wait(&[(Kind::AfterFailed, 4)], false, "u/x"),
            &mut standing(&[(4, true, "succeeded")]),
        )
        .unwrap_err();
    assert_eq!(
        e,
        "dependency never satisfied: job 4 succeeded (after_failed needs it to end without succeeding)"
    );
    s.enqueue_after(
        job(8, 0, 1, 0, 7.0),
        wait(&[(Kind::AfterOk, 4)], false, "u/x"),
        &mut standing(&[(4, true, "succeeded")]),
    )
    .unwrap();
    assert_eq!(s.queued(), 1);
}

#[test]
fn singleton_runs_one_job_of_a_user_and_name_at_a_time_in_order() {
    let mut s = sched(&[1.0], "fifo");
    let mut none = standing(&[]);
    for id in 1..=3 {
        s.enqueue_after(
            job(id, 0, 1, 0, id as f64),
            wait(&[], true, "alice/train"),
            &mut none,
        )
        .unwrap();
    }
    // Another user's job of the same name, and a plain job of the group, are not held.
    s.enqueue_after(
        job(4, 0, 1, 0, 4.0),
        wait(&[], true, "bob/train"),
        &mut none,
    )
    .unwrap();
    let mut started = pass(&mut s, 5.0, 8).started;
    started.sort();
    assert_eq!(started, vec![1, 4]);
    assert_eq!(
        s.held_reasons()[0],
        (
            2,
            "waiting for job 1 (running): singleton, one job of this user and name runs at a time"
                .into()
        )
    );
    // A preempted singleton keeps its group's turn.
    s.end(1, 6.0);
    s.enqueue(job(1, 0, 1, 0, 1.0));
    assert_eq!(pass(&mut s, 7.0, 8).started, vec![1]);
    s.end(1, 8.0);
    s.dependency_ended(1, true, "succeeded".into());
    assert_eq!(pass(&mut s, 9.0, 8).started, vec![2]);
    s.end(2, 10.0);
    s.dependency_ended(2, false, "failed (exit 1)".into());
    assert_eq!(pass(&mut s, 11.0, 8).started, vec![3]);
    // A running job of the group holds a new singleton back, singleton or not.
    s.note_group(9, "carol/eval".into());
    s.add_running(RunningJob {
        id: 9,
        tenant: 0,
        gpus: 1,
        exclusive: true,
        preemptible: false,
        started_s: 11.0,
        charged_s: 11.0,
        gpu_s: 0.0,
    });
    s.enqueue_after(
        job(10, 0, 1, 0, 12.0),
        wait(&[], true, "carol/eval"),
        &mut none,
    )
    .unwrap();
    assert!(pass(&mut s, 12.0, 8).started.is_empty());
    s.end(9, 13.0);
    assert_eq!(pass(&mut s, 13.0, 8).started, vec![10]);
}

#[test]
fn a_held_job_cancelled_leaves_nothing_behind() {
    let mut s = sched(&[1.0], "fifo");
    s.enqueue(job(1, 0, 1, 0, 0.0));
    s.enqueue_after(
        job(2, 0, 1, 0, 1.0),
        wait(&[(Kind::AfterOk, 1)], false, "u/b"),
        &mut standing(&[]),
    )
    .unwrap();
    s.dequeue(2);
    assert_eq!(s.held_back(), 0);
    s.end(1, 2.0);
    assert!(s.dependency_ended(1, true, "succeeded".into()).is_empty());
    assert_eq!(s.queued(), 1);
}
