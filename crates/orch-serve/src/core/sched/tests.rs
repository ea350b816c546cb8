use super::*;

const DAY: f64 = 86400.0;

fn tenants(shares: &[f64]) -> Vec<TenantConf> {
    shares
        .iter()
        .enumerate()
        .map(|(i, &share)| TenantConf {
            name: format!("t{i}"),
            share,
            max_gpus: None,
        })
        .collect()
}

fn job(id: u64, tenant: usize, gpus: u32, priority: i64, submitted_s: f64) -> QueuedJob {
    QueuedJob {
        id,
        tenant,
        name: format!("j{id}"),
        tags: vec![],
        gpus,
        exclusive: true,
        priority,
        submitted_s,
        queued_s: submitted_s,
        runtime_s: None,
        preemptible: false,
    }
}

fn sched(shares: &[f64], policy: &str) -> Scheduler {
    Scheduler::new(
        tenants(shares),
        7.0 * DAY,
        Box::new(NativePolicy::new(policy).unwrap()),
    )
}

/// Runs one pass with `free` devices, starting whatever the pass lets start.
fn pass(s: &mut Scheduler, now: f64, free: u32) -> PassReport {
    s.pass(
        now,
        Machine {
            free_gpus: free,
            total_gpus: 8,
        },
        &mut |_| Attempt::Started,
    )
}

#[test]
fn usage_halves_every_half_life_and_charges_exactly() {
    let mut u = Usage::default();
    u.charge(2.0, 0.0, 10.0, 7.0 * DAY);
    assert!((u.gpu_s - 20.0).abs() < 1e-3, "{}", u.gpu_s);
    assert!((u.at(10.0 + 7.0 * DAY, 7.0 * DAY) - 10.0).abs() < 1e-3);
    // One long charge equals many short ones.
    let (mut long, mut short) = (Usage::default(), Usage::default());
    long.charge(1.0, 0.0, 3.0 * DAY, DAY);
    for k in 0..300 {
        let a = k as f64 * 0.01 * DAY;
        short.charge(1.0, a, a + 0.01 * DAY, DAY);
    }
    assert!((long.gpu_s - short.gpu_s).abs() / long.gpu_s < 1e-9);
    // Use that ended before the last charge decays from its own end.
    let mut late = Usage {
        gpu_s: 0.0,
        as_of_s: 2.0 * DAY,
    };
    late.charge(1.0, 0.0, DAY, DAY);
    let mut on_time = Usage::default();
    on_time.charge(1.0, 0.0, DAY, DAY);
    assert!((late.gpu_s - on_time.at(2.0 * DAY, DAY)).abs() < 1e-6);
}

#[test]
fn the_tenant_under_its_share_starts_first_and_limits_hold() {
    let mut s = sched(&[1.0, 1.0], "fair-share");
    s.set_usage(
        0,
        Usage {
            gpu_s: 1000.0,
            as_of_s: 0.0,
        },
    );
    s.enqueue(job(1, 0, 1, 0, 0.0));
    s.enqueue(job(2, 1, 1, 0, 5.0));
    let r = pass(&mut s, 10.0, 1);
    assert_eq!(r.started, vec![2]);
    let (id, reason) = &r.reasons[0];
    assert_eq!(*id, 1);
    assert!(
        reason.contains("waiting for 1 free device(s); 0 free")
            && reason.contains("tenant t0 is over its share: 100% used of 50%"),
        "{reason}"
    );
    // max_gpus: t1 may hold 1.
    let mut s = Scheduler::new(
        vec![
            TenantConf {
                name: "a".into(),
                share: 1.0,
                max_gpus: Some(1),
            },
            TenantConf {
                name: "b".into(),
                share: 1.0,
                max_gpus: None,
            },
        ],
        DAY,
        Box::new(NativePolicy::new("fifo").unwrap()),
    );
    s.enqueue(job(1, 0, 1, 0, 0.0));
    s.enqueue(job(2, 0, 1, 0, 1.0));
    s.enqueue(job(3, 1, 1, 0, 2.0));
    let r = pass(&mut s, 3.0, 8);
    assert_eq!(r.started, vec![1, 3]);
    assert!(
        r.reasons[0]
            .1
            .contains("holds 1 device(s) of its max_gpus = 1")
    );
}

#[test]
fn backfill_lets_small_jobs_pass_a_big_one() {
    let mut s = sched(&[1.0], "fifo");
    s.enqueue(job(1, 0, 4, 0, 0.0));
    s.enqueue(job(2, 0, 1, 0, 1.0));
    let r = pass(&mut s, 2.0, 2);
    assert_eq!(r.started, vec![2]);
}

#[test]
fn a_failing_policy_leaves_the_pass_to_fifo() {
    struct Broken;
    impl QueuePolicy for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn order(
            &mut self,
            jobs: &[Job],
            _: &[Tenant],
            _: &Machine,
        ) -> Result<Vec<Ranked>, String> {
            Ok(jobs
                .iter()
                .chain(jobs)
                .map(|j| Ranked {
                    job: j.id,
                    reason: String::new(),
                })
                .collect())
        }
    }
    let mut s = Scheduler::new(tenants(&[1.0]), DAY, Box::new(Broken));
    s.enqueue(job(2, 0, 1, 0, 1.0));
    s.enqueue(job(1, 0, 1, 0, 0.0));
    let r = pass(&mut s, 2.0, 1);
    assert_eq!(r.started, vec![1]);
    let failure = r.policy_failure.unwrap();
    assert!(
        failure.contains("queue policy `broken` gave a wrong answer")
            && failure.contains("twice")
            && failure.ends_with("this pass used fifo"),
        "{failure}"
    );
}

#[test]
fn preemption_stops_preemptible_jobs_of_a_tenant_over_its_share_only() {
    let mut s = sched(&[1.0, 1.0], "fair-share");
    for (id, preemptible) in [(1, true), (2, false)] {
        let mut j = job(id, 0, 1, 0, 0.0);
        j.preemptible = preemptible;
        s.enqueue(j);
    }
    assert_eq!(pass(&mut s, 0.0, 2).started, vec![1, 2]);
    // An hour later tenant 1 (no usage) asks for two devices: only job 1 may go, which is not
    // enough, so nothing is preempted.
    s.enqueue(job(3, 1, 2, 0, 3600.0));
    let r = pass(&mut s, 3600.0, 0);
    assert!(r.preempt.is_empty(), "{r:?}");
    // One device is enough: job 1 goes, and its device is held for job 4.
    s.dequeue(3);
    s.enqueue(job(4, 1, 1, 0, 3600.0));
    let r = pass(&mut s, 3601.0, 0);
    assert_eq!(r.preempt.len(), 1);
    assert_eq!((r.preempt[0].victim, r.preempt[0].for_job), (1, 4));
    assert!(r.preempt[0].reason.contains("tenant t1 is under its share"));
    // Asked once: the next pass does not preempt again while it stops.
    assert!(pass(&mut s, 3602.0, 0).preempt.is_empty());
    // Job 1 ends and goes back to the queue; job 4 gets the device, not job 1.
    s.end(1, 3603.0);
    let mut again = job(1, 0, 1, 0, 0.0);
    again.preemptible = true;
    s.enqueue(again);
    assert_eq!(pass(&mut s, 3603.0, 1).started, vec![4]);
}

#[test]
fn the_lazy_order_is_the_built_ins_order() {
    // Random queues: the order a pass starts jobs in, with one device per job and enough
    // devices for all, is the built-in's order, computed lazily or in full.
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for policy in ["fair-share", "fifo", "priority"] {
        for _ in 0..50 {
            let shares: Vec<f64> = (0..1 + rand(5)).map(|_| 1.0 + rand(3) as f64).collect();
            let jobs: Vec<QueuedJob> = (0..rand(200))
                .map(|i| {
                    job(
                        i + 1,
                        rand(shares.len() as u64) as usize,
                        1,
                        rand(3) as i64 - 1,
                        rand(20) as f64,
                    )
                })
                .collect();
            let usage: Vec<f64> = shares.iter().map(|_| rand(1000) as f64).collect();
            let mut orders = Vec::new();
            for keep in [true, false] {
                let mut s = sched(&shares, policy);
                for (t, &gpu_s) in usage.iter().enumerate() {
                    s.set_usage(
                        t,
                        Usage {
                            gpu_s,
                            as_of_s: 0.0,
                        },
                    );
                }
                s.keep_reasons = keep;
                for j in &jobs {
                    s.enqueue(j.clone());
                }
                let r = s.pass(
                    100.0,
                    Machine {
                        free_gpus: 1000,
                        total_gpus: 1000,
                    },
                    &mut |_| Attempt::Started,
                );
                orders.push(r.started);
            }
            assert_eq!(orders[0], orders[1], "{policy}");
            assert_eq!(orders[0].len(), jobs.len());
        }
    }
}

#[test]
fn a_job_past_the_starvation_limit_holds_devices_until_it_fits() {
    let mut s = sched(&[1.0], "fifo");
    s.starvation_s = 3600.0;
    s.enqueue(job(1, 0, 4, 0, 0.0));
    s.enqueue(job(2, 0, 1, 0, 1.0));
    // Within the limit, the small job passes the big one.
    assert_eq!(pass(&mut s, 60.0, 2).started, vec![2]);
    s.enqueue(job(3, 0, 1, 0, 2.0));
    // Past it, the two free devices are held for the big job.
    let r = pass(&mut s, 4000.0, 2);
    assert!(r.started.is_empty(), "{r:?}");
    assert!(r.reasons[0].1.contains("holding the 2 free ones"), "{r:?}");
    assert_eq!(pass(&mut s, 4001.0, 4).started, vec![1]);
}

#[test]
fn devices_held_for_a_starving_job_count_towards_what_preemption_must_free() {
    let mut s = sched(&[1.0, 1.0], "fair-share");
    s.starvation_s = 60.0;
    // Tenant 0 runs four preemptible one-device jobs; two devices stay free.
    for id in 1..=4 {
        let mut j = job(id, 0, 1, 0, 0.0);
        j.preemptible = true;
        s.enqueue(j);
    }
    assert_eq!(pass(&mut s, 0.0, 6).started.len(), 4);
    // Tenant 1 (no usage) asks for four, and has waited past the starvation limit.
    s.enqueue(job(10, 1, 4, 0, 3600.0));
    let r = pass(&mut s, 3600.0 + 120.0, 2);
    assert!(r.started.is_empty());
    // Two free and held for it: two more are enough, not four.
    assert_eq!(r.preempt.len(), 2, "{r:?}");
}

/// Fair share forgets: a tenant that used every device in week one and was away in week two
/// comes back behind none. The tenant that used them in week two has more decayed usage now
/// (half-life one week), so the first device goes to the one that came back.
#[test]
fn a_tenant_back_from_an_absence_is_served_before_the_one_that_used_the_machine_meanwhile() {
    const WEEK: f64 = 7.0 * DAY;
    let mut s = sched(&[1.0, 1.0], "fair-share");
    let ran = |id, tenant, from| RunningJob {
        id,
        tenant,
        gpus: 8,
        exclusive: true,
        preemptible: false,
        started_s: from,
        charged_s: from,
        gpu_s: 0.0,
    };
    // Week one: t0 holds all eight devices; week two: t1 does, t0 is away.
    s.add_running(ran(1, 0, 0.0));
    // Charged as the daemon does, every sampling period.
    for hour in 1..=24 * 7 {
        s.charge(f64::from(hour) * 3600.0);
    }
    s.end(1, WEEK);
    s.add_running(ran(2, 1, WEEK));
    s.end(2, 2.0 * WEEK);
    let standing = s.standing(2.0 * WEEK);
    let (away, stayed) = (standing[0].usage_gpu_s, standing[1].usage_gpu_s);
    // Each used 8 devices for a week; t0's use decayed a week longer.
    let week_of_8 = 8.0 * WEEK;
    assert!((away / week_of_8 - 0.5 * 0.7213).abs() < 1e-3, "{away}");
    assert!((stayed / week_of_8 - 0.7213).abs() < 1e-3, "{stayed}");
    assert!(standing[0].fair_share > standing[1].fair_share);
    // Both submit at once, t1 first: one device frees, t0 gets it.
    s.enqueue(job(3, 1, 1, 0, 2.0 * WEEK));
    s.enqueue(job(4, 0, 1, 0, 2.0 * WEEK + 1.0));
    let report = pass(&mut s, 2.0 * WEEK + 2.0, 1);
    assert_eq!(report.started, vec![4]);
}

#[test]
fn a_job_whose_end_arrives_late_is_charged_to_its_end_and_no_further() {
    let half_life = DAY;
    let make = || {
        Scheduler::new(
            tenants(&[1.0]),
            half_life,
            Box::new(NativePolicy::new("fifo").unwrap()),
        )
    };
    let (mut s, mut on_time) = (make(), make());
    for s in [&mut s, &mut on_time] {
        for id in 1..=4 {
            s.add_running(RunningJob {
                id,
                tenant: 0,
                gpus: 1,
                exclusive: true,
                preemptible: false,
                started_s: 100.0,
                charged_s: 100.0,
                gpu_s: 0.0,
            });
        }
    }
    // The daemon looked at 112 s (a sample, a pass) though each job ended at 102 s: jobs ended
    // one by one, each after the others had been charged up to then.
    s.charge(112.0);
    let ended: Vec<RunningJob> = (1..=4).map(|id| s.end(id, 102.0).unwrap()).collect();
    let ended_on_time: Vec<RunningJob> =
        (1..=4).map(|id| on_time.end(id, 102.0).unwrap()).collect();
    for (late, timely) in ended.iter().zip(&ended_on_time) {
        assert!((late.gpu_s - 2.0).abs() < 1e-9, "{late:?}");
        assert_eq!(
            (late.charged_s, late.gpu_s),
            (timely.charged_s, timely.gpu_s)
        );
    }
    // The tenant's decayed usage is what it would be had the ends been seen on time.
    let (late, timely) = (
        s.usage(0).at(200.0, half_life),
        on_time.usage(0).at(200.0, half_life),
    );
    assert!((late - timely).abs() < 1e-9, "{late} against {timely}");
    assert!((late - 8.0).abs() < 0.01, "{late}");
}

/// Tasks `first..first + n` of one array (id `first`), all of tenant `tenant`, 1 GPU each.
fn array(s: &mut Scheduler, first: u64, n: u64, tenant: usize, max_parallel: Option<u32>) {
    for id in first..first + n {
        s.enqueue(job(id, tenant, 1, 0, id as f64));
        s.set_array(
            id,
            ArrayMember {
                array: first,
                max_parallel,
            },
        );
    }
}

#[test]
fn an_array_runs_at_most_max_parallel_tasks_and_the_rest_do_not_block_others() {
    for policy in ["fifo", "fair-share", "priority"] {
        for keep_reasons in [true, false] {
            let mut s = sched(&[1.0, 1.0], policy);
            s.keep_reasons = keep_reasons;
            array(&mut s, 10, 6, 0, Some(2));
            // A job behind the array, of the same tenant: the throttled tasks do not hold it.
            s.enqueue(job(20, 0, 1, 0, 100.0));
            let r = pass(&mut s, 200.0, 8);
            assert_eq!(r.started, vec![10, 11, 20], "{policy}");
            assert_eq!(s.array_running(10), 2);
            if keep_reasons {
                let why: HashMap<u64, String> = r.reasons.into_iter().collect();
                for id in 12..16 {
                    assert!(
                        why[&id].starts_with("array 10: 2 of 2 tasks running (max_parallel)"),
                        "{policy}: {}",
                        why[&id]
                    );
                }
            }
            // Nothing more starts while two run, however many devices are free.
            assert!(pass(&mut s, 210.0, 8).started.is_empty(), "{policy}");
            // One ends: the next task starts, and only one.
            s.end(10, 220.0);
            assert_eq!(pass(&mut s, 221.0, 8).started, vec![12], "{policy}");
            s.end(11, 230.0);
            s.end(12, 230.0);
            assert_eq!(pass(&mut s, 231.0, 8).started, vec![13, 14], "{policy}");
            // A task queued again (preempted) is a task again once it is made one.
            s.end(13, 240.0);
            s.enqueue(job(13, 0, 1, 0, 13.0));
            s.set_array(
                13,
                ArrayMember {
                    array: 10,
                    max_parallel: Some(2),
                },
            );
            assert_eq!(pass(&mut s, 241.0, 8).started, vec![13], "{policy}");
            assert_eq!(s.array_running(10), 2);
            assert!(pass(&mut s, 242.0, 8).started.is_empty(), "{policy}");
        }
    }
}

#[test]
fn an_array_without_max_parallel_starts_what_fits_and_a_throttled_one_asks_no_preemption() {
    let mut s = sched(&[1.0], "fifo");
    array(&mut s, 1, 5, 0, None);
    assert_eq!(pass(&mut s, 10.0, 3).started, vec![1, 2, 3]);
    // A throttled task that waited past the starvation limit holds no devices back.
    let mut s = sched(&[1.0], "fifo");
    s.starvation_s = 1.0;
    array(&mut s, 1, 3, 0, Some(1));
    s.enqueue(job(9, 0, 1, 0, 50.0));
    assert_eq!(pass(&mut s, 100.0, 2).started, vec![1, 9]);
}

#[test]
fn each_task_of_an_array_is_charged_to_its_tenant_like_any_job() {
    let mut s = sched(&[1.0, 1.0], "fair-share");
    array(&mut s, 1, 4, 0, Some(2));
    assert_eq!(pass(&mut s, 0.0, 8).started, vec![1, 2]);
    s.end(1, 100.0);
    s.end(2, 100.0);
    assert_eq!(pass(&mut s, 100.0, 8).started, vec![3, 4]);
    s.end(3, 150.0);
    s.end(4, 150.0);
    // Two tasks of 100 s and two of 50 s, one device each: 300 GPU-seconds (decay is a week).
    let used = s.usage(0).at(150.0, s.half_life_s());
    assert!((used - 300.0).abs() < 0.1, "{used}");
    assert_eq!(s.usage(1).gpu_s, 0.0);
}

#[path = "deps_tests.rs"]
mod deps_tests;

#[test]
fn a_job_of_mig_slices_is_charged_its_share_of_the_gpus_compute() {
    let mut s = Scheduler::new(
        tenants(&[1.0, 1.0]),
        0.0,
        Box::new(NativePolicy::new("fair-share").unwrap()),
    );
    // Tenant 0: one 3g slice of a 7-slot GPU (3/7 of a GPU); tenant 1: one whole GPU.
    let mut slice = job(1, 0, 1, 0, 0.0);
    slice.exclusive = false;
    s.enqueue(slice);
    s.set_compute(1, 3.0 / 7.0);
    s.enqueue(job(2, 1, 1, 0, 0.0));
    let report = pass(&mut s, 0.0, 1);
    assert_eq!(report.started.len(), 2, "{report:?}");
    s.charge(70.0);
    assert!((s.usage(0).gpu_s - 30.0).abs() < 1e-9, "{:?}", s.usage(0));
    assert!((s.usage(1).gpu_s - 70.0).abs() < 1e-9, "{:?}", s.usage(1));
    // Its GPU-seconds (accounting's) are the same 3/7 per second.
    let ended = s.end(1, 70.0).unwrap();
    assert!((ended.gpu_s - 30.0).abs() < 1e-9, "{}", ended.gpu_s);
}

/// A queued job of `gpus` MIG slices of profile 1g.10gb, to itself.
fn slice_job(s: &mut Scheduler, id: u64, gpus: u32, submitted_s: f64) {
    s.enqueue(QueuedJob {
        exclusive: false,
        ..job(id, 0, gpus, 0, submitted_s)
    });
    s.set_slices(id, "1g.10gb");
}

#[test]
fn a_job_of_slices_past_the_starvation_limit_holds_its_profiles_free_slices() {
    let mut s = sched(&[1.0], "fifo");
    s.starvation_s = 3600.0;
    let free = |n: u32| HashMap::from([("1g.10gb".to_string(), n)]);
    slice_job(&mut s, 1, 3, 0.0);
    slice_job(&mut s, 2, 1, 1.0);
    // Within the limit, the one-slice job passes the three-slice one (placement decides).
    s.set_free_slices(free(1));
    let mut tried = Vec::new();
    let r = s.pass(
        60.0,
        Machine {
            free_gpus: 0,
            total_gpus: 0,
        },
        &mut |j| {
            tried.push(j.id);
            if j.gpus <= 1 {
                Attempt::Started
            } else {
                Attempt::Waits("no fit".into())
            }
        },
    );
    assert_eq!(r.started, vec![2], "{r:?}");
    // Past it, the two free slices are held for the big job: the one-slice job behind it is not
    // even tried, and says why.
    slice_job(&mut s, 3, 1, 2.0);
    s.set_free_slices(free(2));
    let mut tried = Vec::new();
    let r = s.pass(
        4000.0,
        Machine {
            free_gpus: 0,
            total_gpus: 0,
        },
        &mut |j| {
            tried.push(j.id);
            Attempt::Started
        },
    );
    assert!(r.started.is_empty(), "{r:?}");
    assert!(tried.is_empty(), "{tried:?}");
    let why = |id: u64| r.reasons.iter().find(|(j, _)| *j == id).unwrap().1.clone();
    assert!(
        why(1).contains("waiting for 3 free 1g.10gb slice(s); holding the 2 free ones for it"),
        "{r:?}"
    );
    assert!(why(3).contains("the free ones are held for job 1"), "{r:?}");
    // Once three are free it starts, and the one-slice job after it takes what is left.
    s.set_free_slices(free(4));
    let r = s.pass(
        4001.0,
        Machine {
            free_gpus: 0,
            total_gpus: 0,
        },
        &mut |_| Attempt::Started,
    );
    assert_eq!(r.started, vec![1, 3], "{r:?}");
    // Slices of another profile are not held for it.
    slice_job(&mut s, 4, 2, 4002.0);
    s.enqueue(QueuedJob {
        exclusive: false,
        ..job(5, 0, 1, 0, 4003.0)
    });
    s.set_slices(5, "2g.20gb");
    s.set_free_slices(HashMap::from([
        ("1g.10gb".to_string(), 1),
        ("2g.20gb".to_string(), 1),
    ]));
    let r = s.pass(
        9000.0,
        Machine {
            free_gpus: 0,
            total_gpus: 0,
        },
        &mut |_| Attempt::Started,
    );
    assert_eq!(r.started, vec![5], "{r:?}");
}

#[test]
fn a_starving_job_of_slices_holds_nothing_beyond_its_tenants_max_gpus_nor_slices_that_do_not_suit_it()
 {
    let no_gpus = Machine {
        free_gpus: 0,
        total_gpus: 0,
    };
    let free = |n: u32| HashMap::from([("1g.10gb".to_string(), n)]);
    // A tenant of max_gpus = 2 asking for 3 slices could not start however long it waits: it
    // holds nothing back, and the one-slice job behind it starts.
    let mut s = Scheduler::new(
        vec![TenantConf {
            name: "t0".into(),
            share: 1.0,
            max_gpus: Some(2),
        }],
        7.0 * DAY,
        Box::new(NativePolicy::new("fifo").unwrap()),
    );
    s.starvation_s = 60.0;
    slice_job(&mut s, 1, 3, 0.0);
    slice_job(&mut s, 2, 1, 1.0);
    s.set_free_slices(free(2));
    let r = s.pass(1000.0, no_gpus, &mut |_| Attempt::Started);
    assert_eq!(r.started, vec![2], "{r:?}");
    // Enough slices are free for a starving job, but they do not suit it (placement refuses):
    // they are not held, or a job that never fits would block its profile for good.
    let mut s = sched(&[1.0], "fifo");
    s.starvation_s = 60.0;
    slice_job(&mut s, 1, 2, 0.0);
    slice_job(&mut s, 2, 1, 1.0);
    s.set_free_slices(free(2));
    let r = s.pass(1000.0, no_gpus, &mut |j| {
        if j.id == 1 {
            Attempt::Waits("no free slice has 20 GiB free".into())
        } else {
            Attempt::Started
        }
    });
    assert_eq!(r.started, vec![2], "{r:?}");
    let mut s = sched(&[1.0], "fifo");
    s.starvation_s = 60.0;
    slice_job(&mut s, 1, 2, 0.0);
    slice_job(&mut s, 2, 1, 1.0);
    // With none free, nothing is held: both are tried, and each says its own reason.
    s.set_free_slices(free(0));
    let mut tried = Vec::new();
    let r = s.pass(2000.0, no_gpus, &mut |j| {
        tried.push(j.id);
        Attempt::Waits("no slice free".into())
    });
    assert_eq!(tried, vec![1, 2], "{tried:?}");
    assert!(
        r.reasons
            .iter()
            .all(|(_, why)| why.starts_with("no slice free")),
        "{r:?}"
    );
}
