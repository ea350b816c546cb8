use super::*;

const GIB: u64 = 1 << 30;

fn gpu(index: u32, utilization: Option<u32>, memory_used: Option<u64>) -> orch_devices::Device {
    serde_json::from_value(serde_json::json!({
        "index": index,
        "uuid": format!("GPU-{index}"),
        "name": "NVIDIA H100 80GB HBM3",
        "backend": "sim",
        "memory_total_bytes": 80 * GIB,
        "memory_used_bytes": memory_used,
        "utilization_gpu_percent": utilization,
        "mig_devices": [],
    }))
    .unwrap()
}

fn every(seconds: u64, span: u64) -> Timeline {
    Timeline::new(Settings {
        interval: Duration::from_secs(seconds),
        span: Duration::from_secs(span),
    })
}

fn all(_: &str) -> bool {
    true
}

#[test]
fn a_sample_averages_utilization_and_keeps_the_highest_memory_of_its_interval() {
    let t = every(5, 60);
    let start = 1_000_000;
    // Five readings a second apart: utilization 10..50, memory up then down.
    for (i, (u, m)) in [(10, 1), (20, 4), (30, 2), (40, 2), (50, 1)]
        .into_iter()
        .enumerate()
    {
        t.note_devices(start + i as u64 * 1000, &[gpu(0, Some(u), Some(m * GIB))]);
    }
    assert!(t.view(0, None, all).times_ms.is_empty(), "still open");
    // The next reading ends the interval.
    t.note_devices(start + 5000, &[gpu(0, Some(90), Some(GIB))]);
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms, vec![start + 5000]);
    assert_eq!(v.devices.len(), 1);
    assert_eq!(v.devices[0].utilization_percent, vec![Some(30)]);
    assert_eq!(v.devices[0].memory_used_bytes, vec![Some(4 * GIB)]);
    assert_eq!(v.devices[0].memory_total_bytes, Some(80 * GIB));
    assert_eq!(v.interval_s, 5.0);
    assert_eq!(v.span_s, 60.0);
}

#[test]
fn the_ring_keeps_its_span_and_no_more() {
    // 10 s over 60 s: six samples.
    let t = every(10, 60);
    for s in 0..=200u64 {
        t.note_devices(s * 1000, &[gpu(0, Some((s % 100) as u32), Some(GIB))]);
    }
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms.len(), 6, "{:?}", v.times_ms);
    assert_eq!(*v.times_ms.last().unwrap(), 200_000);
    assert_eq!(v.times_ms[0], 150_000);
    assert_eq!(v.devices[0].utilization_percent.len(), 6);
    // The ring never grew past its size.
    let inner = lock(&t.inner);
    assert!(
        inner.times.capacity() < 6 * 2 + 8,
        "{}",
        inner.times.capacity()
    );
    assert!(inner.devices[0].utilization.capacity() < 6 * 2 + 8);
}

#[test]
fn a_gpu_that_comes_later_has_no_readings_before_and_one_gone_for_the_span_leaves() {
    let t = every(1, 5);
    t.note_devices(0, &[gpu(0, Some(10), Some(GIB))]);
    t.note_devices(1000, &[gpu(0, Some(10), Some(GIB))]);
    t.note_devices(
        2000,
        &[gpu(0, Some(20), None), gpu(1, Some(70), Some(2 * GIB))],
    );
    t.note_devices(3000, &[gpu(1, Some(80), Some(2 * GIB))]);
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms, vec![1000, 2000, 3000]);
    assert_eq!(v.devices[0].uuid, "GPU-0");
    assert_eq!(
        v.devices[0].utilization_percent,
        vec![Some(10), Some(10), Some(20)]
    );
    assert_eq!(
        v.devices[0].memory_used_bytes,
        vec![Some(GIB), Some(GIB), None],
        "no memory reading is no value, not zero"
    );
    assert_eq!(v.devices[1].utilization_percent, vec![None, None, Some(70)]);
    // GPU 0 is read no more: once the ring holds no sample of it, it leaves.
    for s in 4..=10 {
        t.note_devices(s * 1000, &[gpu(1, Some(80), Some(2 * GIB))]);
    }
    let v = t.view(0, None, all);
    assert_eq!(v.devices.len(), 1, "{:?}", v.devices);
    assert_eq!(v.devices[0].uuid, "GPU-1");
}

#[test]
fn job_counts_keep_their_highest_per_tenant_and_a_caller_sees_its_tenants_only() {
    let t = every(5, 60);
    t.note_jobs(0, ["a", "a", "b"].into_iter(), ["b"].into_iter());
    // Within a second: not counted again.
    t.note_jobs(500, ["a"; 9].into_iter(), std::iter::empty());
    t.note_jobs(1000, ["a"].into_iter(), ["a", "b"].into_iter());
    t.note_jobs(5000, std::iter::empty(), std::iter::empty());
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms, vec![5000]);
    // Each tenant's highest of the interval: queued a 2 + b 1 (at 0 s), running a 1 (at 1 s)
    // + b 1.
    assert_eq!((v.queued.clone(), v.running.clone()), (vec![3], vec![2]));
    let only_a = t.view(0, None, |name| name == "a");
    assert_eq!((only_a.queued, only_a.running), (vec![2], vec![1]));
    let none = t.view(0, None, |_| false);
    assert_eq!((none.queued, none.running), (vec![0], vec![0]));
    // The next interval starts from the counts noted last (nothing) and the engine's next.
    t.note_jobs(10_000, std::iter::empty(), std::iter::empty());
    let v = t.view(0, None, all);
    assert_eq!((v.queued, v.running), (vec![3, 0], vec![2, 0]));
}

#[test]
fn the_queue_line_goes_on_without_device_readings_and_devices_without_jobs() {
    let t = every(1, 10);
    for s in 0..4u64 {
        t.note_jobs(s * 1000, ["a"].into_iter(), std::iter::empty());
    }
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms.len(), 3);
    assert!(v.devices.is_empty());
    assert_eq!(v.queued, vec![1, 1, 1]);
    let d = every(1, 10);
    for s in 0..4u64 {
        d.note_devices(s * 1000, &[gpu(0, Some(5), Some(GIB))]);
    }
    let v = d.view(0, None, all);
    assert_eq!((v.queued, v.running), (vec![0, 0, 0], vec![0, 0, 0]));
}

#[test]
fn since_and_points_thin_what_is_sent() {
    let t = every(1, 100);
    for s in 0..=20u64 {
        t.note_devices(s * 1000, &[gpu(0, Some(s as u32 * 5), Some(s * GIB))]);
    }
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms.len(), 20);
    let newer = t.view(15_000, None, all);
    assert_eq!(newer.times_ms, vec![16_000, 17_000, 18_000, 19_000, 20_000]);
    // 20 samples in at most 6 points: groups of 4 from the newest, averaged and highest.
    let thin = t.view(0, Some(6), all);
    assert_eq!(thin.times_ms, vec![4000, 8000, 12_000, 16_000, 20_000]);
    // The samples ending at 17..20 s read 16..19 s: utilization 80..95, memory 16..19 GiB.
    assert_eq!(thin.devices[0].utilization_percent.last(), Some(&Some(88)));
    assert_eq!(
        thin.devices[0].memory_used_bytes.last(),
        Some(&Some(19 * GIB))
    );
    assert_eq!(thin.queued.len(), 5);
}

#[test]
fn points_default_to_a_thousand_and_are_capped() {
    // 5,000 one-second samples.
    let t = every(1, 5000);
    for s in 0..=5000u64 {
        t.note_devices(s * 1000, &[gpu(0, Some(50), Some(GIB))]);
    }
    let newest = 5_000_000;
    let default = t.view(0, None, all);
    assert_eq!(default.times_ms.len(), DEFAULT_POINTS, "groups of 5");
    assert_eq!(default.times_ms.last(), Some(&newest));
    assert_eq!(default.devices[0].utilization_percent.len(), DEFAULT_POINTS);
    assert_eq!(default.queued.len(), DEFAULT_POINTS);
    let capped = t.view(0, Some(1_000_000), all);
    assert_eq!(capped.times_ms.len(), 1667, "groups of 3: within the cap");
    assert!(capped.times_ms.len() <= MAX_POINTS);
    assert_eq!(capped.times_ms.last(), Some(&newest));
    assert_eq!(t.view(0, Some(MAX_POINTS), all), capped);
    // A slice within the cap is every sample.
    let recent = t.view(newest - 10_000, None, all);
    assert_eq!(recent.times_ms.len(), 10);
    assert_eq!(recent.devices[0].memory_used_bytes, vec![Some(GIB); 10]);
}

#[test]
fn a_pause_longer_than_an_interval_starts_afresh() {
    let t = every(5, 3600);
    t.note_devices(0, &[gpu(0, Some(50), None)]);
    t.note_devices(60_000, &[gpu(0, Some(10), None)]);
    t.note_devices(65_000, &[gpu(0, Some(10), None)]);
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms, vec![5000, 65_000]);
    assert_eq!(v.devices[0].utilization_percent, vec![Some(50), Some(10)]);
}

#[test]
fn a_clock_set_back_does_not_stop_the_sampling() {
    let t = every(5, 3600);
    t.note_devices(100_000, &[gpu(0, Some(50), None)]);
    t.note_devices(105_000, &[gpu(0, Some(50), None)]);
    // Back to before every sample: the samples newer than the new time are dropped, the
    // interval open then closes now, and the next follows the new clock.
    t.note_devices(40_000, &[gpu(0, Some(20), None)]);
    t.note_devices(45_000, &[gpu(0, Some(30), None)]);
    let v = t.view(0, None, all);
    assert_eq!(v.times_ms, vec![40_000, 45_000]);
    assert_eq!(v.devices[0].utilization_percent, vec![Some(50), Some(20)]);
    assert_eq!(v.queued.len(), 2);
    assert_eq!(t.view(40_000, None, all).times_ms, vec![45_000]);
}

#[test]
fn a_clock_set_back_keeps_the_times_increasing_for_since() {
    let t = every(1, 3600);
    t.note_jobs(0, ["a"].into_iter(), std::iter::empty());
    for s in 0..=10u64 {
        t.note_devices(s * 1000, &[gpu(0, Some(s as u32), None)]);
    }
    // Samples at 1..10 s; the clock goes back to 6.5 s.
    t.note_devices(6_500, &[gpu(0, Some(99), None)]);
    t.note_devices(7_500, &[gpu(0, Some(99), None)]);
    let v = t.view(0, None, all);
    assert!(
        v.times_ms.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        v.times_ms
    );
    assert_eq!(
        v.times_ms,
        vec![1000, 2000, 3000, 4000, 5000, 6000, 6_500, 7_500]
    );
    assert_eq!(v.devices[0].utilization_percent.len(), 8);
    assert_eq!(v.queued, vec![1; 8]);
    assert_eq!(
        t.view(5_000, None, all).times_ms,
        vec![6000, 6_500, 7_500],
        "since finds its place"
    );
}

#[test]
fn the_engine_never_waits_for_a_reader() {
    let t = every(1, 60);
    let reader = lock(&t.inner);
    // Held elsewhere: the engine's call returns at once, counting nothing.
    t.note_jobs(0, ["a"].into_iter(), std::iter::empty());
    drop(reader);
    assert!(lock(&t.inner).jobs_now.is_empty());
    t.note_jobs(0, ["a"].into_iter(), std::iter::empty());
    assert_eq!(lock(&t.inner).jobs_now, vec![("a".to_string(), 1, 0)]);
}

#[test]
fn settings_say_what_is_wrong() {
    assert_eq!(Settings::default().samples(), 4320);
    assert!(Settings::default().problem().is_none());
    let short = Settings {
        interval: Duration::from_millis(200),
        span: DEFAULT_SPAN,
    };
    assert!(short.problem().unwrap().contains("timeline_interval"));
    let long = Settings {
        interval: Duration::from_secs(1),
        span: Duration::from_secs(86_400),
    };
    assert!(
        long.problem().unwrap().contains("43200"),
        "{:?}",
        long.problem()
    );
    let inverted = Settings {
        interval: Duration::from_secs(60),
        span: Duration::from_secs(10),
    };
    assert!(inverted.problem().unwrap().contains("shorter"));
}
