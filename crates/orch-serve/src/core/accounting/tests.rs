use super::*;
use crate::core::db::tests::test_submission;
use crate::core::db::{Change, Db, JobRow, Submission, apply, insert_job};

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("orch-acct-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A job of `user` in `tenant`, queued at `at`; its id.
fn queued(db: &Db, tenant: &str, user: &str, at: u64) -> i64 {
    let row = JobRow {
        name: "j".into(),
        tenant: tenant.into(),
        user: user.into(),
        gpus: 2,
        ..JobRow::queued(at)
    };
    db.write_blocking(move |tx| insert_job(tx, &row, &test_submission(None), None))
        .unwrap()
}

/// A record of job `id` as it would end at `ended`, with `gpu_s` and `util`.
fn record(db: &Db, id: i64, ended: u64, gpu_s: f64, util: Option<f64>) -> Record {
    let row = db.job(id).unwrap().unwrap();
    let mut gpu = GpuWatch::default();
    if let Some(u) = util {
        gpu.look(&[Some(u as u32)], &[1 << 30]);
    }
    let mut r = Record::of(
        &row,
        State::Succeeded,
        ended,
        Some(0),
        None,
        &Measured {
            process: ProcessUse::default(),
            gpu,
        },
    );
    r.gpu_seconds = gpu_s;
    r
}

/// Ends job `id` with `record` as the engine does: one change, `only_if` running-or-queued.
fn end(db: &Db, id: i64, only_if: State, record: Record) -> i64 {
    let change = Change {
        state: Some(record.state),
        ended_at_ms: Some(record.ended_at_ms),
        only_if: Some(only_if),
        accounting: Some(Box::new(record)),
        ..Change::default()
    };
    db.write_blocking(move |tx| apply(tx, id, &change)).unwrap()
}

#[test]
fn gpu_looks_give_the_mean_utilization_and_the_peak_memory_of_any_one_device() {
    let mut w = GpuWatch::default();
    assert_eq!((w.mean_utilization(), w.peak_memory()), (None, None));
    w.look(&[Some(20), Some(40)], &[1, 5]);
    w.look(&[Some(80), None], &[7, 2]);
    // A look with nothing readable counts for neither.
    w.look(&[None, None], &[]);
    assert_eq!(w.mean_utilization(), Some((30.0 + 80.0) / 2.0));
    assert_eq!(w.peak_memory(), Some(7));
}

#[test]
fn a_records_wall_time_and_queue_wait_come_from_the_run_that_ended() {
    let row = JobRow {
        id: 4,
        state: State::Running,
        started_at_ms: Some(10_000),
        devices: vec!["a".into(), "b".into()],
        gpu_seconds: 3.0,
        ..JobRow::queued(4_000)
    };
    let r = Record::of(
        &row,
        State::Failed,
        11_500,
        Some(3),
        Some("exit status 3".into()),
        &Measured::default(),
    );
    assert_eq!((r.wall_s, r.queue_wait_s, r.gpu_seconds), (1.5, 6.0, 3.0));
    assert_eq!((r.exit_code, r.state), (Some(3), State::Failed));
    // Never started: no wall time; it waited until it ended.
    let never = Record::of(
        &JobRow::queued(4_000),
        State::Cancelled,
        9_000,
        None,
        None,
        &Measured::default(),
    );
    assert_eq!((never.wall_s, never.queue_wait_s), (0.0, 5.0));
}

#[test]
fn a_record_is_written_with_the_end_it_belongs_to_and_never_twice() {
    let dir = scratch("once");
    let db = Db::open(&dir).unwrap();
    let id = queued(&db, "lab", "ann", 1_000);
    // The end applies only to a running job: this one is queued, so no record either.
    assert_eq!(
        end(&db, id, State::Running, record(&db, id, 5_000, 2.0, None)),
        0
    );
    assert!(db.history(&Filter::default(), 10).unwrap().is_empty());
    assert_eq!(
        end(&db, id, State::Queued, record(&db, id, 5_000, 2.0, None)),
        1
    );
    let mut again = record(&db, id, 6_000, 9.0, None);
    again.state = State::Failed;
    end(&db, id, State::Succeeded, again);
    let all = db.history(&Filter::default(), 10).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].ended_at_ms, all[0].gpu_seconds), (5_000, 2.0));
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn history_filters_by_time_user_tenant_and_state_and_sums_per_tenant_weighted_by_gpu_time() {
    let dir = scratch("filter");
    let db = Db::open(&dir).unwrap();
    let jobs = [
        ("nlp", "ann", 10_000, 3600.0, Some(90.0)),
        ("nlp", "bob", 20_000, 1800.0, Some(30.0)),
        ("nlp", "bob", 30_000, 0.0, None),
        ("vision", "cy", 40_000, 7200.0, None),
    ];
    for (tenant, user, ended, gpu_s, util) in jobs {
        let id = queued(&db, tenant, user, 1_000);
        end(&db, id, State::Queued, record(&db, id, ended, gpu_s, util));
    }
    let ended = |f: &Filter| -> Vec<u64> {
        db.history(f, 100)
            .unwrap()
            .iter()
            .map(|r| r.ended_at_ms)
            .collect()
    };
    assert_eq!(ended(&Filter::default()), [10_000, 20_000, 30_000, 40_000]);
    let window = Filter {
        since_ms: Some(20_000),
        until_ms: Some(40_000),
        ..Filter::default()
    };
    assert_eq!(ended(&window), [20_000, 30_000]);
    let bob = Filter {
        user: Some("bob".into()),
        ..Filter::default()
    };
    assert_eq!(ended(&bob), [20_000, 30_000]);
    let mine = Filter {
        tenants: Some(vec!["vision".into()]),
        ..Filter::default()
    };
    assert_eq!(ended(&mine), [40_000]);
    let failed = Filter {
        states: vec![State::Failed],
        ..Filter::default()
    };
    assert!(ended(&failed).is_empty());
    // The newest `limit`, oldest first.
    let newest: Vec<u64> = db
        .history(&Filter::default(), 2)
        .unwrap()
        .iter()
        .map(|r| r.ended_at_ms)
        .collect();
    assert_eq!(newest, [30_000, 40_000]);
    let sums = db.history_summary(&Filter::default(), By::Tenant).unwrap();
    assert_eq!(sums.len(), 2);
    assert_eq!((sums[0].key.as_str(), sums[0].jobs), ("nlp", 3));
    assert_eq!(sums[0].gpu_hours, 1.5);
    // (90 x 3600 + 30 x 1800) / 5400: the job with no reading counts for neither side.
    assert!((sums[0].mean_gpu_utilization.unwrap() - 70.0).abs() < 1e-9);
    assert_eq!(sums[1].mean_gpu_utilization, None);
    let users = db.history_summary(&Filter::default(), By::User).unwrap();
    let keys: Vec<&str> = users.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["ann", "bob", "cy"]);
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn records_outlive_their_jobs_purge_and_go_after_their_own_retention() {
    let dir = scratch("purge");
    let db = Db::open(&dir).unwrap();
    for ended in [1_000u64, 2_000, 3_000] {
        let id = queued(&db, "lab", "ann", 500);
        end(&db, id, State::Queued, record(&db, id, ended, 1.0, None));
    }
    let ids: Vec<i64> = db
        .finished_before(i64::MAX as u64)
        .unwrap()
        .iter()
        .map(|(id, _)| *id)
        .collect();
    db.write_blocking(move |tx| crate::core::db::purge_jobs(tx, &ids))
        .unwrap();
    assert!(db.jobs(&[], 100).unwrap().is_empty(), "the job rows went");
    assert_eq!(db.history(&Filter::default(), 100).unwrap().len(), 3);
    assert_eq!(db.write_blocking(|tx| purge(tx, 2_500, 1)).unwrap(), 1);
    assert_eq!(db.write_blocking(|tx| purge(tx, 2_500, 100)).unwrap(), 1);
    let left = db.history(&Filter::default(), 100).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].ended_at_ms, 3_000);
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_older_database_gets_the_table_and_gives_pages_back_in_steps_after_a_purge() {
    let dir = scratch("vacuum");
    // A database of the schema before accounting: no auto_vacuum, version 4.
    {
        let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
        conn.execute_batch(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT,
                name TEXT NOT NULL, tenant TEXT NOT NULL, user TEXT NOT NULL,
                uid INTEGER NOT NULL, state TEXT NOT NULL, gpus INTEGER NOT NULL,
                priority INTEGER NOT NULL, requeue INTEGER NOT NULL,
                submitted_at_ms INTEGER NOT NULL, started_at_ms INTEGER,
                ended_at_ms INTEGER, exit_code INTEGER, reason TEXT, lease_id TEXT,
                devices TEXT NOT NULL DEFAULT '[]', attempt INTEGER NOT NULL DEFAULT 0,
                supervisor TEXT, submission TEXT NOT NULL, submit_key TEXT,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                gpu_seconds REAL NOT NULL DEFAULT 0, charged_ms INTEGER,
                array_id INTEGER, array_task INTEGER, array_max_parallel INTEGER);
             CREATE TABLE usage (tenant TEXT PRIMARY KEY, gpu_seconds REAL NOT NULL,
                as_of_ms INTEGER NOT NULL);
             CREATE TABLE events (job_id INTEGER NOT NULL, at_ms INTEGER NOT NULL,
                kind TEXT NOT NULL, message TEXT NOT NULL);
             CREATE TABLE dependencies (job_id INTEGER NOT NULL, kind TEXT NOT NULL,
                on_id INTEGER);
             PRAGMA user_version = 4;",
        )
        .unwrap();
        let auto: i64 = conn
            .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .unwrap();
        assert_eq!(auto, 0);
    }
    let db = Db::open(&dir).unwrap();
    {
        let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
        let read =
            |pragma: &str| -> i64 { conn.pragma_query_value(None, pragma, |r| r.get(0)).unwrap() };
        assert_eq!((read("user_version"), read("auto_vacuum")), (5, 2));
    }
    // Jobs with a few KiB of text each, then purged: their pages are free.
    let text = "x".repeat(4000);
    for i in 0..400 {
        let row = JobRow {
            name: format!("j{i}"),
            tenant: "lab".into(),
            user: "ann".into(),
            state: State::Queued,
            ..JobRow::queued(1)
        };
        let sub = Submission {
            job_text: text.clone(),
            ..test_submission(None)
        };
        db.write_blocking(move |tx| insert_job(tx, &row, &sub, None))
            .unwrap();
    }
    db.write_blocking(|tx| {
        exec(
            tx,
            "UPDATE jobs SET state = 'succeeded', ended_at_ms = 1",
            [],
        )
        .map_err(super::db("test"))?;
        let ids: Vec<i64> = (1..=400).collect();
        crate::core::db::purge_jobs(tx, &ids)
    })
    .unwrap();
    let free = db.free_pages().unwrap();
    assert!(free > u64::from(VACUUM_STEP_PAGES) * 3, "{free} free pages");
    // Another writer at work while the vacuum runs: no write of it waits long.
    let db = std::sync::Arc::new(db);
    let vacuum = {
        let db = std::sync::Arc::clone(&db);
        std::thread::spawn(move || vacuum_in_steps(&db, std::time::Duration::from_millis(1)))
    };
    let mut slowest = std::time::Duration::ZERO;
    for i in 0..200 {
        let at = std::time::Instant::now();
        db.write_blocking(move |tx| {
            exec(
                tx,
                "INSERT OR REPLACE INTO usage (tenant, gpu_seconds, as_of_ms) VALUES ('t', ?1, 1)",
                [i],
            )
            .map_err(super::db("test"))?;
            Ok(0)
        })
        .unwrap();
        slowest = slowest.max(at.elapsed());
        if vacuum.is_finished() {
            break;
        }
    }
    let freed = vacuum.join().unwrap().unwrap();
    assert!(freed >= free - 1, "freed {freed} of {free}");
    assert!(db.free_pages().unwrap() <= 1);
    // A write's fsync dominates; a step of the vacuum adds little to it.
    assert!(
        slowest < std::time::Duration::from_millis(500),
        "a write waited {slowest:?}"
    );
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_database_at_version_5_without_incremental_vacuum_is_converted_on_open() {
    let dir = scratch("vacuum-off");
    drop(Db::open(&dir).unwrap());
    let read = |pragma: &str| -> i64 {
        let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
        conn.pragma_query_value(None, pragma, |r| r.get(0)).unwrap()
    };
    // As a conversion cut short leaves it: the schema's version, no auto_vacuum.
    {
        let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;")
            .unwrap();
    }
    assert_eq!((read("user_version"), read("auto_vacuum")), (5, 0));
    let db = Db::open(&dir).unwrap();
    assert!(db.incremental_vacuum().unwrap());
    assert_eq!(read("auto_vacuum"), 2);
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_listings_lookup_reads_the_records_of_its_ids_alone_in_chunks() {
    let dir = scratch("records-of");
    let db = Db::open(&dir).unwrap();
    let mut ids = Vec::new();
    for ended in 0..600u64 {
        let id = queued(&db, "lab", "ann", 500);
        end(
            &db,
            id,
            State::Queued,
            record(&db, id, 1_000 + ended, 1.0, None),
        );
        ids.push(id);
    }
    let first_and_last = [ids[0], ids[599]];
    let got: Vec<i64> = db
        .accounting_of(&first_and_last)
        .unwrap()
        .iter()
        .map(|r| r.job_id)
        .collect();
    assert_eq!(got, first_and_last);
    // More ids than one query binds; one without a record is left out.
    let mut asked: Vec<i64> = ids.iter().copied().step_by(2).collect();
    asked.extend_from_slice(&ids[1..550]);
    asked.push(999_999);
    let mut got: Vec<i64> = db
        .accounting_of(&asked)
        .unwrap()
        .iter()
        .map(|r| r.job_id)
        .collect();
    got.sort_unstable();
    asked.pop();
    asked.sort_unstable();
    asked.dedup();
    got.dedup();
    assert_eq!(got, asked);
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}
