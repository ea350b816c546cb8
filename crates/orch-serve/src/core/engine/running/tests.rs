//! Every transition of a running job and every recovery rule, without a socket, a process or a
//! folder: holders are made up, time is given.

use super::*;
use crate::core::config::Config;
use std::path::Path;

fn holder(pid: u32) -> Holder {
    Holder {
        pid,
        start_time: 1,
        host: None,
        machine: None,
        boot: None,
        pgid: None,
        cgroup: None,
    }
}

fn start(requeue: bool) -> Start {
    Start {
        tenant: "a".into(),
        devices: vec!["GPU-0".into()],
        attempt: 1,
        lease_id: "lease".into(),
        requeue,
        prior_gpu_s: 0.0,
    }
}

fn spawned(now: Instant) -> Running {
    Running::new(start(false), Origin::Spawned, None, now)
}

fn exit(state: State, reason: Option<&str>) -> ExitRecord {
    ExitRecord {
        state,
        exit_code: None,
        reason: reason.map(str::to_string),
        ended_at_ms: 5,
        late: None,
    }
}

fn tenant(extra: &str) -> Tenant {
    let text = format!("[[tenant]]\nname = \"a\"\nusers = [\"root\"]\n{extra}\n");
    Config::parse(Path::new("serve.toml"), &text)
        .unwrap()
        .tenants
        .remove(0)
}

#[test]
fn a_cancel_waits_for_the_supervisor_then_is_sent_once() {
    let now = Instant::now();
    let mut job = spawned(now);
    assert!(job.cancel());
    assert!(!job.cancel(), "a second cancel changes nothing");
    // No supervisor known yet: nothing to signal.
    assert_eq!(job.signal_due(), None);
    job.learn_supervisor(Some(holder(42)));
    let due = job.signal_due().unwrap();
    assert_eq!(
        (due.pid, due.signal, due.purpose),
        (42, libc::SIGTERM, Purpose::Cancel)
    );
    job.signalled(due.purpose);
    assert_eq!(job.cancel_state(), Cancel::Sent);
    assert_eq!(job.signal_due(), None);
}

#[test]
fn a_preemption_is_decided_once_and_sent_with_its_signal() {
    let mut job = Running::new(
        start(false),
        Origin::Spawned,
        Some(holder(7)),
        Instant::now(),
    );
    assert!(job.preempt("for job 9".into()));
    assert!(!job.preempt("again".into()), "the first stop stands");
    let due = job.signal_due().unwrap();
    assert_eq!(due.signal, folders::PREEMPT_SIGNAL);
    job.signalled(due.purpose);
    assert!(job.stop().unwrap().sent);
    assert_eq!(job.signal_due(), None);
}

#[test]
fn a_cancel_goes_before_a_stop() {
    let mut job = Running::new(
        start(false),
        Origin::Spawned,
        Some(holder(7)),
        Instant::now(),
    );
    job.preempt("for job 9".into());
    job.cancel();
    assert_eq!(job.signal_due().unwrap().purpose, Purpose::Cancel);
    job.signalled(Purpose::Cancel);
    // Once cancelled, the preemption's signal is never sent.
    assert_eq!(job.signal_due(), None);
}

#[test]
fn a_held_lease_is_asked_to_end_whatever_the_stop() {
    let mut job = Running::new(start(false), Origin::Held, Some(holder(7)), Instant::now());
    job.preempt("for job 9".into());
    assert_eq!(job.signal_due().unwrap().signal, libc::SIGTERM);
}

#[test]
fn an_idle_job_is_warned_then_stopped_and_a_busy_one_is_told() {
    let t = tenant("idle_timeout = \"10m\"\nidle_grace = \"5m\"\nidle_utilization = 5");
    let t0 = Instant::now();
    let mut job = spawned(t0);
    assert!(job.look_idle(&t, &[Some(1)], t0).is_empty());
    let warned = job.look_idle(&t, &[Some(1)], t0 + Duration::from_secs(600));
    assert_eq!(warned.len(), 1);
    assert_eq!(warned[0].kind, "idle");
    assert!(
        warned[0].message.contains("under 5% utilization for 10m"),
        "{warned:?}"
    );
    // Busy again: told so, and the clock starts over.
    let busy = job.look_idle(&t, &[Some(50)], t0 + Duration::from_secs(700));
    assert_eq!(
        busy[0].message,
        "its GPUs are busy again; it will not be stopped"
    );
    let t1 = t0 + Duration::from_secs(800);
    job.look_idle(&t, &[Some(1)], t1);
    job.look_idle(&t, &[Some(1)], t1 + Duration::from_secs(600));
    let stopped = job.look_idle(&t, &[Some(1)], t1 + Duration::from_secs(900));
    assert_eq!(stopped[0].kind, "stopping");
    assert_eq!(stopped[0].message, "idle for 10m; GPUs reclaimed");
    assert_eq!(job.stop().unwrap().kind, StopKind::Idle);
    // Stopping: not looked at again.
    assert!(
        job.look_idle(&t, &[Some(1)], t1 + Duration::from_secs(2000))
            .is_empty()
    );
}

#[test]
fn a_device_whose_utilization_cannot_be_read_is_never_idle() {
    let t = tenant("idle_timeout = \"1s\"\nidle_grace = \"1s\"");
    let t0 = Instant::now();
    let mut job = spawned(t0);
    for s in 0..5 {
        assert!(
            job.look_idle(&t, &[None], t0 + Duration::from_secs(s))
                .is_empty()
        );
    }
    assert!(job.stop().is_none());
}

#[test]
fn without_idle_timeout_nothing_is_reclaimed() {
    let t = tenant("");
    let t0 = Instant::now();
    let mut job = spawned(t0);
    assert!(
        job.look_idle(&t, &[Some(0)], t0 + Duration::from_secs(86400))
            .is_empty()
    );
}

#[test]
fn exits_are_reconciled_with_the_stop_that_caused_them() {
    let now = Instant::now();
    // Preempted: queued again, saying why.
    let mut job = spawned(now);
    job.preempt("preempted for job 9".into());
    let (record, idle) = job.exited(exit(State::Queued, Some(folders::PREEMPTED)));
    assert_eq!(
        (record.state, record.reason.as_deref(), idle),
        (State::Queued, Some("preempted for job 9"), false)
    );
    // A cancel during the preemption: cancelled.
    job.cancel();
    let (record, _) = job.exited(exit(State::Queued, Some(folders::PREEMPTED)));
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Cancelled, Some(folders::CANCELLED))
    );
    // An idle stop: failed, with how long it idled.
    let t = tenant("idle_timeout = \"1s\"\nidle_grace = \"1s\"");
    let mut job = spawned(now);
    job.look_idle(&t, &[Some(0)], now);
    job.look_idle(&t, &[Some(0)], now + Duration::from_secs(2));
    let (record, idle) = job.exited(exit(State::Cancelled, Some(folders::IDLE)));
    assert_eq!(
        (record.state, record.reason.as_deref(), idle),
        (State::Failed, Some("idle for 1s; GPUs reclaimed"), true)
    );
    // Nothing decided: the record stands.
    let job = spawned(now);
    let record = exit(State::Failed, Some("exit 3"));
    assert_eq!(job.exited(record.clone()), (record, false));
}

#[test]
fn a_supervisor_s_liveness_comes_from_the_wait_or_from_proc() {
    let t0 = Instant::now();
    let late = t0 + FENCE_PATIENCE + Duration::from_secs(1);
    let never = |_: &Holder| -> Liveness { panic!("/proc is not asked") };
    // This daemon's child: alive until the wait says it ended, however long it takes.
    let child = spawned(t0);
    assert_eq!(child.liveness(false, late, never), Liveness::Alive);
    assert_eq!(child.liveness(true, t0, never), Liveness::Dead);
    // Adopted with no fence yet: given FENCE_PATIENCE to write one.
    let adopted = Running::new(start(false), Origin::Adopted, None, t0);
    assert_eq!(adopted.liveness(false, t0, never), Liveness::Alive);
    assert_eq!(adopted.liveness(false, late, never), Liveness::Dead);
    // A known supervisor: `/proc` says.
    let known = Running::new(start(false), Origin::Adopted, Some(holder(3)), t0);
    assert_eq!(
        known.liveness(false, t0, |h| {
            assert_eq!(h.pid, 3);
            Liveness::Dead
        }),
        Liveness::Dead
    );
}

#[test]
fn a_dead_supervisor_is_told_apart() {
    // Ended before it took the fence: never started.
    let job = spawned(Instant::now());
    assert_eq!(
        job.died(
            Some("its supervisor (pid 5) exited with status 2".into()),
            9
        ),
        Death::NeverStarted(
            "queued again: its supervisor (pid 5) exited with status 2; the job never started"
                .into()
        )
    );
    // Took the fence, then ended: vanished, queued again with requeue unless cancelled.
    let mut job = Running::new(
        start(true),
        Origin::Adopted,
        Some(holder(5)),
        Instant::now(),
    );
    assert_eq!(
        job.died(None, 9),
        Death::Vanished {
            requeue: true,
            reason: "its supervisor (pid 5) ended before it recorded how the job ended".into()
        }
    );
    job.cancel();
    assert!(matches!(
        job.died(None, 9),
        Death::Vanished { requeue: false, .. }
    ));
    let job = Running::new(start(false), Origin::Adopted, None, Instant::now());
    assert_eq!(
        job.died(None, 9),
        Death::Vanished {
            requeue: false,
            reason: "its supervisor never started".into()
        }
    );
}

#[test]
fn a_held_lease_ends_when_its_process_does() {
    let now = Instant::now();
    let job = Running::new(start(false), Origin::Held, Some(holder(8)), now);
    assert_eq!(job.died(None, 9), Death::Finish(held_ended(8, 9)));
    assert_eq!(
        held_ended(8, 9).reason.as_deref(),
        Some("its process (pid 8) ended")
    );
    let mut stopped = job.clone();
    stopped.preempt("preempted for job 2".into());
    let Death::Finish(record) = stopped.died(None, 9) else {
        panic!("a held lease finishes")
    };
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Failed, Some("preempted for job 2"))
    );
    let mut cancelled = job.clone();
    cancelled.cancel();
    let Death::Finish(record) = cancelled.died(None, 9) else {
        panic!("a held lease finishes")
    };
    assert_eq!(record.state, State::Cancelled);
    // Given back by its process: succeeded.
    let record = job.released(9).unwrap();
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Succeeded, Some("released by its process"))
    );
    assert_eq!(
        spawned(now).released(9),
        None,
        "only a held lease is released this way"
    );
}

#[test]
fn recovery_adopts_the_living_and_tells_the_rest_apart() {
    assert_eq!(
        recovery(false, Some((holder(4), false)), false),
        Recovery::Adopt(holder(4))
    );
    assert_eq!(
        recovery(false, Some((holder(4), false)), true),
        Recovery::Adopt(holder(4))
    );
    assert_eq!(
        recovery(false, Some((holder(4), true)), true),
        Recovery::HeldEnded(4)
    );
    assert_eq!(recovery(true, None, false), Recovery::QueueAgain);
    assert_eq!(
        recovery(false, Some((holder(4), true)), false),
        Recovery::Vanished
    );
    assert_eq!(recovery(false, None, false), Recovery::Vanished);
}

#[test]
fn the_time_limit_is_the_shorter_of_the_job_s_and_the_tenant_s() {
    let spec = |extra: &str| {
        let text = format!("[job]\nname = \"j\"\n{extra}\n[command]\nargv = [\"true\"]\n");
        orch_core::job::parse(Path::new("/tmp/job.toml"), &text).unwrap()
    };
    let t = tenant("max_runtime = \"1h\"");
    assert_eq!(
        time_limit(&spec(""), Some(&t)),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        time_limit(&spec("max_runtime = \"10m\""), Some(&t)),
        Some(Duration::from_secs(600))
    );
    assert_eq!(
        time_limit(&spec("max_runtime = \"2h\""), Some(&t)),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(time_limit(&spec(""), None), None);
}

fn alloc(idle: Option<u64>, time: Option<(u64, u64)>) -> Running {
    let mut job = Running::new(start(false), Origin::Held, Some(holder(7)), Instant::now());
    job.set_alloc(AllocLimits {
        idle: idle.map(Duration::from_secs),
        time: time.map(|(limit, at)| (Duration::from_secs(limit), at)),
    });
    job
}

#[test]
fn an_allocation_is_released_at_its_own_idle_limit_without_a_warning() {
    // No idle_timeout for the tenant: the allocation's own limit applies alone.
    let t = tenant("idle_utilization = 5");
    let mut job = alloc(Some(30), None);
    let t0 = Instant::now();
    assert!(job.look_idle(&t, &[Some(1)], t0).is_empty());
    assert!(
        job.look_idle(&t, &[Some(1)], t0 + Duration::from_secs(29))
            .is_empty()
    );
    // Busy in between: the count starts again.
    assert!(
        job.look_idle(&t, &[Some(60)], t0 + Duration::from_secs(40))
            .is_empty()
    );
    let t1 = t0 + Duration::from_secs(50);
    assert!(job.look_idle(&t, &[Some(0)], t1).is_empty());
    let stopped = job.look_idle(&t, &[Some(0)], t1 + Duration::from_secs(30));
    assert_eq!(
        stopped,
        [Note {
            kind: "stopping",
            message: "released after 30s idle on its GPUs".into()
        }]
    );
    assert_eq!(job.stop().unwrap().kind, StopKind::Idle);
    // Its process is asked to end; given back then, the lease ends failed with the reason.
    assert_eq!(job.signal_due().map(|s| s.signal), Some(libc::SIGTERM));
    let record = job.released(9).unwrap();
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Failed, Some("released after 30s idle on its GPUs"))
    );
    let (record, idle) = job.exited(record);
    assert!(idle, "counted as an idle stop");
    assert_eq!(record.state, State::Failed);
    // Without a limit of its own nor the tenant's, an allocation idles on.
    let mut free = alloc(None, Some((3600, u64::MAX)));
    assert!(
        free.look_idle(&t, &[Some(0)], t0 + Duration::from_secs(86400))
            .is_empty()
    );
}

#[test]
fn an_allocation_is_released_at_its_time_limit_once() {
    let mut job = alloc(None, Some((7200, 1_000_000)));
    assert_eq!(job.look_time(999_999), None);
    let note = job.look_time(1_000_000).unwrap();
    assert_eq!(note.message, "released at its time limit (2h)");
    assert_eq!(job.stop().unwrap().kind, StopKind::TimeLimit);
    assert_eq!(job.look_time(2_000_000), None, "decided once");
    assert_eq!(job.signal_due().map(|s| s.signal), Some(libc::SIGTERM));
    let Death::Finish(record) = job.died(None, 9) else {
        panic!("a held lease finishes")
    };
    assert_eq!(
        (record.state, record.reason.as_deref()),
        (State::Failed, Some("released at its time limit (2h)"))
    );
    // A lease that is no allocation has no time limit here.
    let mut plain = Running::new(start(false), Origin::Held, Some(holder(7)), Instant::now());
    assert_eq!(plain.look_time(u64::MAX), None);
    // The limit runs from the start.
    let limits = AllocLimits::new(
        &crate::core::db::Alloc {
            idle_ms: Some(1500),
        },
        Some(Duration::from_secs(4)),
        10_000,
    );
    assert_eq!(limits.idle, Some(Duration::from_millis(1500)));
    assert_eq!(limits.time, Some((Duration::from_secs(4), 14_000)));
}

#[test]
fn a_held_lease_given_back_after_a_cancel_ends_cancelled() {
    let mut job = alloc(None, None);
    job.cancel();
    let record = job.released(9).unwrap();
    assert_eq!(record.state, State::Cancelled);
}
