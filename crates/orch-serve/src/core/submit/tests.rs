//! Submission without a socket: the rules on a parsed config, the transaction on a job database
//! in a temporary folder.

use super::*;
use crate::core::db::Db;
use std::path::{Path, PathBuf};

const SERVE: &str = "[[tenant]]\nname = \"a\"\nusers = [\"u\"]\nmax_queued = 4\nmax_priority = 5\n\n[[tenant]]\nname = \"b\"\nusers = [\"v\"]\n";

fn config() -> Config {
    Config::parse(Path::new("serve.toml"), SERVE).unwrap()
}

fn caller(name: &str, tenant: &str) -> Caller {
    Caller {
        identity: crate::core::users::Identity {
            uid: 1000,
            gid: 1000,
            name: name.into(),
            groups: Vec::new(),
        },
        tenants: vec![tenant.into()],
        admin: false,
        refused: None,
        remote: false,
        unauthenticated: false,
        metrics_only: false,
        pid: None,
    }
}

fn request(text: &str) -> Request {
    Request {
        job_text: text.into(),
        job_path: "/work/job.toml".into(),
        cwd: "/work".into(),
        env: vec![("HOME".into(), "/home/u".into())],
        ..Request::default()
    }
}

fn command(extra: &str) -> String {
    format!("[job]\nname = \"j\"\n{extra}\n[command]\nargv = [\"true\"]\n")
}

fn sweep(values: &str) -> String {
    format!(
        "[job]\nname = \"sw\"\n[sweep]\nk = [{values}]\nmax_parallel = 2\n[command]\nargv = [\"true\"]\n"
    )
}

fn refused(config: &Config, who: &Caller, request: Request) -> Refusal {
    let terms = Terms {
        config,
        placeable: 8,
        backend: orch_devices::Backend::Sim,
        devices: &[],
    };
    match admit(&terms, who, request) {
        Err(refusal) => refusal,
        Ok(a) => panic!("admitted {:?}", a.spec.name),
    }
}

fn admitted(who: &Caller, request: Request) -> Admitted {
    let config = config();
    let terms = Terms {
        config: &config,
        placeable: 8,
        backend: orch_devices::Backend::Sim,
        devices: &[],
    };
    admit(&terms, who, request).unwrap()
}

/// A job database in a folder of its own, removed when dropped.
struct TempDb {
    db: Option<Db>,
    dir: PathBuf,
}

impl TempDb {
    fn new(name: &str) -> TempDb {
        let dir = std::env::temp_dir().join(format!("orch-submit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDb {
            db: Some(Db::open(&dir).unwrap()),
            dir,
        }
    }

    fn db(&self) -> &Db {
        self.db.as_ref().unwrap()
    }

    /// [`enqueue`] in one write transaction, as [`submit`] runs it.
    fn enqueue(&self, admitted: &Admitted, who: &Caller) -> Result<Vec<i64>, Refusal> {
        let (answer, got) = std::sync::mpsc::channel();
        let (admitted, who) = (admitted.clone(), who.clone());
        let tasks = match admitted.tasks {
            Some(_) => admitted.submissions(),
            None => Vec::new(),
        };
        self.db()
            .write_blocking(move |tx| {
                answer.send(enqueue(tx, &admitted, &tasks, &who)?).unwrap();
                Ok(0)
            })
            .unwrap();
        got.recv().unwrap()
    }

    fn all(&self) -> Vec<JobRow> {
        self.db().jobs(&[], u32::MAX).unwrap()
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.db.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn each_rule_before_the_queue_refuses_with_its_kind_and_sentence() {
    let config = config();
    let u = caller("u", "a");
    let invalid = |r: Refusal| match r {
        Refusal::Invalid(why) => why,
        other => panic!("{other:?}"),
    };
    let why = invalid(refused(&config, &u, request("[job\n")));
    assert!(why.starts_with("/work/job.toml:1:"), "{why}");
    assert_eq!(
        invalid(refused(
            &config,
            &u,
            request(&command("[resources]\ngpus = 9"))
        )),
        "/work/job.toml:4:8: gpus = 9 is more than the 8 device(s) this daemon places on"
    );
    assert_eq!(
        refused(&config, &u, request(&command("tenant = \"b\""))),
        Refusal::Forbidden("/work/job.toml: user u is not in tenant \"b\"".into())
    );
    let nobody = Caller {
        tenants: Vec::new(),
        ..caller("w", "")
    };
    assert_eq!(
        refused(&config, &nobody, request(&command(""))),
        Refusal::Forbidden(
            "user w is in no tenant of this daemon; ask its admin to add them".into()
        )
    );
    assert_eq!(
        invalid(refused(
            &config,
            &u,
            request(&command("[resources]\nnodes = 2"))
        )),
        "/work/job.toml: nodes = 2 is for Slurm: this daemon serves one machine; submit it with `orch submit --slurm`"
    );
    let lease = Request {
        holder: orch_leases::Holder::of_pid(std::process::id()),
        ..request(&sweep("1, 2"))
    };
    assert!(lease.holder.is_some());
    assert_eq!(
        invalid(refused(&config, &u, lease)),
        "/work/job.toml: a lease is one job, not a [sweep]: leave out [sweep], or submit the sweep with `orch submit`"
    );
    assert_eq!(
        refused(&config, &u, request(&command("priority = 6"))),
        Refusal::Forbidden(
            "/work/job.toml: priority = 6 is above tenant a's max_priority = 5; ask for 5 or less"
                .into()
        )
    );
    let nul = Request {
        cwd: "/wo\0rk".into(),
        ..request(&command(""))
    };
    let why = invalid(refused(&config, &u, nul));
    assert!(
        why.starts_with("/work/job.toml: the working folder") && why.contains("NUL"),
        "{why}"
    );
    // A lease (`orch alloc`'s too) is one job, its holder and allocation kept for the engine.
    let alloc = Request {
        holder: orch_leases::Holder::of_pid(std::process::id()),
        alloc: Some(Alloc {
            idle_ms: Some(60_000),
        }),
        ..request(&command(""))
    };
    let lease = admitted(&u, alloc);
    assert_eq!(lease.tasks, None);
    assert_eq!(
        lease.submission.holder.map(|h| h.pid),
        Some(std::process::id())
    );
    assert_eq!(lease.submission.alloc.and_then(|a| a.idle_ms), Some(60_000));
    // A job of the tenant's own, within its limits, passes; its tenant is the caller's first.
    let ok = admitted(&u, request(&command("priority = 5")));
    assert_eq!(
        (ok.row.tenant.as_str(), ok.row.user.as_str(), ok.tasks),
        ("a", "u", None)
    );
}

#[test]
fn an_arrays_tasks_are_inserted_in_one_transaction_each_with_its_combination() {
    let t = TempDb::new("array");
    let u = caller("u", "a");
    let array = admitted(&u, request(&sweep("1, 2, 3")));
    assert_eq!(array.tasks, Some(3));
    let ids = t.enqueue(&array, &u).unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[1..], [ids[0] + 1, ids[0] + 2]);
    let tasks = t.db().array_tasks(ids[0]).unwrap();
    assert_eq!(tasks.iter().map(|r| r.id).collect::<Vec<_>>(), ids);
    for (i, task) in tasks.iter().enumerate() {
        let a = task.array.unwrap();
        assert_eq!((a.id, a.task, a.max_parallel), (ids[0], i as u32, Some(2)));
        let (submission, _) = t.db().submission(task.id).unwrap().unwrap();
        assert_eq!(submission.sweep_task, Some(i as u32));
    }
    // Three of four queued: an array of two is refused whole, and nothing of it is written.
    let two = admitted(&u, request(&sweep("1, 2")));
    let Err(Refusal::OverLimit(why)) = t.enqueue(&two, &u) else {
        panic!("past max_queued")
    };
    assert!(
        why.starts_with(
            "tenant a has 3 job(s) queued and this [sweep] adds 2, past its max_queued = 4"
        ),
        "{why}"
    );
    assert_eq!(t.all().len(), 3);
    // One job still fits; the fifth does not.
    t.enqueue(&admitted(&u, request(&command(""))), &u).unwrap();
    assert_eq!(
        t.enqueue(&admitted(&u, request(&command(""))), &u),
        Err(Refusal::OverLimit(
            "tenant a has 4 jobs queued, its max_queued = 4: wait for some to start".into()
        ))
    );
    assert_eq!(t.all().len(), 4);
}

#[test]
fn a_submission_sent_again_with_its_key_is_the_job_already_taken() {
    let t = TempDb::new("key");
    let u = caller("u", "a");
    let keyed = |text: &str, key: &str| Request {
        key: Some(key.into()),
        ..request(text)
    };
    let first = t.enqueue(&admitted(&u, keyed(&command(""), "k1")), &u);
    let again = t.enqueue(&admitted(&u, keyed(&command(""), "k1")), &u);
    assert_eq!(first, again);
    assert_eq!(t.all().len(), 1);
    // An array sent again answers its id alone, and queues no task twice.
    let array = t.enqueue(&admitted(&u, keyed(&sweep("1, 2"), "k2")), &u);
    let array = array.unwrap();
    assert_eq!(array.len(), 2);
    let again = t.enqueue(&admitted(&u, keyed(&sweep("1, 2"), "k2")), &u);
    assert_eq!(again, Ok(vec![array[0]]));
    assert_eq!(t.all().len(), 3);
    // Sent again even with the queue full, it is still the job taken, not a refusal.
    t.enqueue(&admitted(&u, request(&command(""))), &u).unwrap();
    assert_eq!(t.all().len(), 4);
    assert_eq!(
        t.enqueue(&admitted(&u, keyed(&command(""), "k1")), &u),
        first
    );
    // No usable key: an empty one, or one over 128 bytes, is none.
    assert_eq!(admitted(&u, keyed(&command(""), "")).key, None);
    assert_eq!(
        admitted(&u, keyed(&command(""), &"x".repeat(129))).key,
        None
    );
}

#[test]
fn a_job_waited_on_must_be_one_the_caller_sees_and_an_array_stands_for_its_tasks() {
    let t = TempDb::new("deps");
    let (u, v) = (caller("u", "a"), caller("v", "b"));
    let theirs = t.enqueue(&admitted(&v, request(&command(""))), &v).unwrap()[0];
    let after = |on: i64, kind: &str| request(&command(&format!("{kind} = [{on}]")));
    // Another tenant's job reads as no job at all, and nothing is written.
    assert_eq!(
        t.enqueue(&admitted(&u, after(theirs, "after_ok")), &u),
        Err(Refusal::NotFound(format!(
            "/work/job.toml: after_ok names job {theirs}, and there is no job {theirs} you may see (orch jobs --all lists yours)"
        )))
    );
    assert_eq!(
        t.enqueue(&admitted(&u, after(99, "after_any")), &u),
        Err(Refusal::NotFound(
            "/work/job.toml: after_any names job 99, and there is no job 99 you may see (orch jobs --all lists yours)".into()
        ))
    );
    assert_eq!(t.all().len(), 1);
    let array = t
        .enqueue(&admitted(&u, request(&sweep("1, 2"))), &u)
        .unwrap();
    let Err(Refusal::Invalid(why)) = t.enqueue(&admitted(&u, after(array[0], "after_failed")), &u)
    else {
        panic!("after_failed on an array")
    };
    assert!(
        why.starts_with(&format!(
            "/work/job.toml: after_failed names job array {}, whose tasks may end",
            array[0]
        )),
        "{why}"
    );
    // after_ok on the array waits for each task; the request's flags add to the file's.
    let waiting = Request {
        depends: Dependencies {
            after_ok: vec![array[1]],
            singleton: true,
            ..Dependencies::default()
        },
        ..after(array[0], "after_ok")
    };
    let id = t.enqueue(&admitted(&u, waiting), &u).unwrap()[0];
    let waits = t.db().dependencies(id).unwrap();
    assert_eq!(waits.after_ok, array);
    assert!(waits.singleton);
}

#[test]
fn a_trace_line_takes_the_daemons_steps_in_the_daemons_order() {
    let config = config();
    let a = config.tenant("a").unwrap();
    let ticket = |gpus: u32, priority: i64| Ticket {
        asked: Asked {
            place: "trace job 1",
            gpus_at: "trace job 1",
            gpus,
            priority,
        },
        tasks: None,
    };
    assert_eq!(ticket(1, 5).admit(a, 8, 3), Ok(()));
    // Too many devices wins over a priority too high and a full queue, as in the daemon.
    assert!(matches!(
        ticket(9, 6).admit(a, 8, 4),
        Err(Refusal::Invalid(_))
    ));
    assert!(matches!(
        ticket(1, 6).admit(a, 8, 4),
        Err(Refusal::Forbidden(_))
    ));
    assert!(matches!(
        ticket(1, 5).admit(a, 8, 4),
        Err(Refusal::OverLimit(_))
    ));
    // A tenant the config does not list has no limits.
    assert_eq!(ticket(1, 100).within_tenant(None), Ok(()));
    assert_eq!(ticket(1, 100).fits_queue(None, 1_000), Ok(()));
}
