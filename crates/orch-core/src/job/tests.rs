use super::*;

fn parse_str(text: &str) -> Result<JobSpec, String> {
    parse(Path::new("jobs/j.toml"), text).map_err(|e| e.to_string())
}

const FULL_COMMAND: &str = r#"
[job]
name = "mnist-mlp"
tenant = "alice"
priority = 3

[resources]
gpus = 2
min_free_memory = "10GiB"
max_utilization = 20
memory_limit = "16GiB"
exclusive = false

[policy]
plugin = "least-loaded"
[policy.config]
prefer = "memory"
weight = 3
strict = true

[command]
argv = ["python", "train.py", "--epochs", "3"]
env = { WANDB_MODE = "offline" }
launch = "per-device"
"#;

#[test]
fn reads_a_command_job() {
    let job = parse_str(FULL_COMMAND).unwrap();
    assert_eq!(job.name, "mnist-mlp");
    assert_eq!(job.tenant.as_deref(), Some("alice"));
    assert_eq!(job.priority, 3);
    assert_eq!(job.dir, PathBuf::from("jobs"));
    let r = &job.resources;
    assert_eq!(r.gpus, 2);
    assert_eq!(r.gpus_at.to_string(), "jobs/j.toml:8:8");
    assert_eq!(r.min_free_memory, Some(ByteSize(10 << 30)));
    assert_eq!(r.max_utilization, Some(20));
    assert_eq!(r.memory_limit, Some(ByteSize(16 << 30)));
    assert!(!r.exclusive);
    assert_eq!(job.policy.plugin, PluginRef::Builtin("least-loaded".into()));
    assert_eq!(job.policy.plugin_at.to_string(), "jobs/j.toml:15:10");
    assert_eq!(
        job.policy.config,
        vec![
            ("prefer".to_string(), "memory".to_string()),
            ("strict".to_string(), "true".to_string()),
            ("weight".to_string(), "3".to_string()),
        ]
    );
    let Work::Command(command) = &job.work else {
        panic!("a command job");
    };
    assert_eq!(command.argv[1], "train.py");
    assert_eq!(command.env["WANDB_MODE"], "offline");
    assert_eq!(command.launch, Launch::PerDevice);
}

#[test]
fn defaults_and_a_train_job() {
    let job = parse_str(
        r#"
[job]
name = "t"
[policy]
plugin = "policies/mine.wasm"
[train]
plugin = "plugins/mlp.wasm"
epochs = 3
batch_size = 128
[train.data]
format = "mnist-idx"
train = "data/mnist"
[train.config]
hidden = "512,256"
lr = 0.05
"#,
    )
    .unwrap();
    assert_eq!(job.resources.gpus, 1);
    assert!(job.resources.exclusive);
    assert_eq!(
        job.policy.plugin,
        PluginRef::Path(PathBuf::from("jobs/policies/mine.wasm"))
    );
    let Work::Train(train) = &job.work else {
        panic!("a train job");
    };
    assert_eq!(
        train.plugin,
        PluginRef::Path(PathBuf::from("jobs/plugins/mlp.wasm"))
    );
    assert_eq!(train.limits, crate::LimitSettings::default());
    assert_eq!((train.checkpoint_every, train.replicas), (None, None));
    assert_eq!(train.out, PathBuf::from("jobs/runs/t"));
    assert_eq!(train.data.test, None);
    assert!(train.data.normalize);
    assert_eq!(train.data.train, PathBuf::from("jobs/data/mnist"));
    assert_eq!(train.data.format, DataFormat::MnistIdx);
    assert_eq!((train.epochs, train.batch_size, train.seed), (3, 128, 0));
    assert_eq!(train.config[1], ("lr".to_string(), "0.05".to_string()));

    let minimal = parse_str("[job]\nname = \"m\"\n[command]\nargv = [\"true\"]\n").unwrap();
    assert_eq!(
        minimal.policy.plugin,
        PluginRef::Builtin("least-loaded".into())
    );
    assert_eq!(minimal.resources.gpus, 1);
}

#[test]
fn errors_point_at_the_value_with_a_hint() {
    let job = |body: &str| format!("[job]\nname = \"x\"\n{body}");
    let cmd = "[command]\nargv = [\"true\"]\n";
    let cases: Vec<(String, &str, &str)> = vec![
        (
            job(&format!("[resources]\ngpu = 2\n{cmd}")),
            "j.toml:4:1",
            "unknown field `gpu`",
        ),
        (
            job(&format!("[resources]\ngpus = 0\n{cmd}")),
            "j.toml:4:8",
            "gpus = 0 is impossible",
        ),
        (
            job(&format!("[resources]\ngpus = -3\n{cmd}")),
            "j.toml:4:8",
            "impossible",
        ),
        (
            job(&format!("[resources]\ngpus = \"two\"\n{cmd}")),
            "j.toml:4:8",
            "invalid type",
        ),
        (
            job(&format!(
                "[resources]\nmin_free_memory = \"10 gigs\"\n{cmd}"
            )),
            "j.toml:4:19",
            "expected a size",
        ),
        (
            job(&format!("[resources]\nmax_utilization = 120\n{cmd}")),
            "j.toml:4:19",
            "not a percent",
        ),
        (
            job(&format!("[resources]\nmemory_limit = 0\n{cmd}")),
            "j.toml:4:16",
            "no memory",
        ),
        (
            job(&format!("[resources]\nexclusive = \"yes\"\n{cmd}")),
            "j.toml:4:13",
            "invalid type",
        ),
        (job(""), "j.toml:1:1", "neither [command] nor [train]"),
        (
            job(&format!(
                "{cmd}[train]\nplugin = \"p.wasm\"\nepochs = 1\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d.csv\"\n"
            )),
            "j.toml:5:",
            "both [command] and [train]",
        ),
        (
            job("[command]\nargv = []\n"),
            "j.toml:4:8",
            "names no program",
        ),
        (
            job("[command]\nargv = [\"a\"]\nlaunch = \"twice\"\n"),
            "j.toml:5:10",
            "unknown variant",
        ),
        (
            job(&format!("[policy]\nplugin = \"\"\n{cmd}")),
            "j.toml:4:10",
            "plugin is empty",
        ),
        (
            job(&format!("[policy.config]\ndevices = [0, 2]\n{cmd}")),
            "j.toml:4:11",
            "config key `devices` is array",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nepochs = 0\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\n",
            ),
            "j.toml:5:10",
            "epochs = 0",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nepochs = 1\nbatch_size = 1\n[train.data]\nformat = \"parquet\"\ntrain = \"d\"\n",
            ),
            "j.toml:8:10",
            "unknown variant",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nepochs = 1\nsteps = 5\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\n",
            ),
            "j.toml:5:10",
            "both epochs and steps",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\n",
            ),
            "j.toml:5:14",
            "neither epochs nor steps",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nepochs = 2\nbatch_size = 1\n[train.data]\nformat = \"text\"\ntrain = \"t.txt\"\nblock_size = 8\n",
            ),
            "j.toml:5:10",
            "text data is trained by steps",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nbatch_size = 1\n[train.data]\nformat = \"text\"\ntrain = \"t.txt\"\n",
            ),
            "j.toml:9:9",
            "needs block_size",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\nblock_size = 8\n",
            ),
            "j.toml:10:14",
            "block_size is for format = \"text\"",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nbatch_size = 1\n[train.data]\nformat = \"text\"\ntrain = \"t\"\nblock_size = 8\nvocab = \"words\"\n",
            ),
            "j.toml:11:9",
            "vocab = \"words\" is not known",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 0\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\n",
            ),
            "j.toml:5:9",
            "steps = 0",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nsample_tokens = 100\nbatch_size = 1\n[train.data]\nformat = \"csv\"\ntrain = \"d\"\n",
            ),
            "j.toml:6:17",
            "sample_tokens is for format = \"text\"",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nsample_tokens = -1\nbatch_size = 1\n[train.data]\nformat = \"text\"\ntrain = \"t\"\nblock_size = 8\n",
            ),
            "j.toml:6:17",
            "sample_tokens = -1 is impossible",
        ),
        (
            job(
                "[train]\nplugin = \"p.wasm\"\nsteps = 2\nsample_tokens = 100001\nbatch_size = 1\n[train.data]\nformat = \"text\"\ntrain = \"t\"\nblock_size = 8\n",
            ),
            "j.toml:6:17",
            "sample_tokens = 100001 is impossible",
        ),
        (
            format!("[jobs]\nname = \"x\"\n{cmd}"),
            "j.toml:1:",
            "unknown field `jobs`",
        ),
        (format!("[job]\n{cmd}"), "j.toml:1:", "missing field `name`"),
        (job(&format!("[job.extra]\n{cmd}")), "j.toml:", "extra"),
        ("[job\n".to_string(), "j.toml:1:5", "unclosed table"),
    ];
    for (text, location, words) in cases {
        let err = parse_str(&text).unwrap_err();
        assert!(
            err.contains(location),
            "{err:?} should point at {location}\n{text}"
        );
        assert!(err.contains(words), "{err:?} should say {words}\n{text}");
        assert!(err.contains(" ("), "{err:?} should carry a hint");
    }
}

#[test]
fn text_jobs_train_by_steps_with_their_windows() {
    let text = "[job]\nname = \"g\"\n[train]\nplugin = \"gpt\"\nsteps = 2000\neval_every = 250\neval_batches = 20\nbatch_size = 12\n[train.data]\nformat = \"text\"\ntrain = \"data/train.txt.gz\"\nval = \"data/val.txt.gz\"\nblock_size = 64\nunknown = \"skip\"\n";
    let job = parse(Path::new("/jobs/g.toml"), text).unwrap();
    let Work::Train(train) = &job.work else {
        panic!("a [train] job");
    };
    assert_eq!(train.steps, Some(2000));
    assert_eq!(
        (train.eval_every, train.eval_batches),
        (Some(250), Some(20))
    );
    assert_eq!(train.epochs, 1);
    assert_eq!(train.data.format, DataFormat::Text);
    assert_eq!(train.data.block_size, Some(64));
    assert_eq!(
        train.data.test,
        Some(PathBuf::from("/jobs/data/val.txt.gz"))
    );
    assert!(train.data.skip_unknown && !train.data.bytes_vocab);
    assert!(!train.data.normalize, "text is never standardised");
    assert_eq!(train.sample_tokens, None, "the default: the trainer's say");
    for (line, tokens) in [
        ("sample_tokens = 0", Some(0)),
        ("sample_tokens = 500", Some(500)),
    ] {
        let job = parse(
            Path::new("/jobs/g.toml"),
            &text.replace("batch_size = 12", &format!("batch_size = 12\n{line}")),
        )
        .unwrap();
        let Work::Train(train) = &job.work else {
            panic!("a [train] job");
        };
        assert_eq!(train.sample_tokens, tokens, "{line}");
    }
}

#[test]
fn plugin_refs_tell_names_from_paths() {
    let base = Path::new("/jobs");
    assert_eq!(
        PluginRef::parse("pack", base),
        PluginRef::Builtin("pack".into())
    );
    assert_eq!(
        PluginRef::parse("my.wasm", base),
        PluginRef::Path("/jobs/my.wasm".into())
    );
    assert_eq!(
        PluginRef::parse("/abs/p", base),
        PluginRef::Path("/abs/p".into())
    );
}

#[test]
fn train_options() {
    let job = parse_str(
        r#"
[job]
name = "digits"
[train]
plugin = "mlp"
epochs = 2
batch_size = 32
step_timeout = "90s"
checkpoint_every = 50
replicas = 1
out = "out/digits"
[train.data]
format = "csv"
train = "data/train.csv"
test = "data/test.csv"
label_column = 0
header = true
scale = 16
normalize = false
"#,
    )
    .unwrap();
    let Work::Train(train) = &job.work else {
        panic!("a train job");
    };
    assert_eq!(train.plugin, PluginRef::Builtin("mlp".into()));
    let deadline = train
        .limits
        .deadline
        .as_ref()
        .map(|(d, at)| (*d, at.to_string()));
    assert_eq!(
        deadline,
        Some((
            std::time::Duration::from_secs(90),
            "jobs/j.toml:8:16".to_string()
        ))
    );
    assert_eq!(
        (train.checkpoint_every, train.replicas),
        (Some(50), Some(1))
    );
    assert_eq!(train.out, PathBuf::from("jobs/out/digits"));
    let data = &train.data;
    assert_eq!(data.test, Some(PathBuf::from("jobs/data/test.csv")));
    assert_eq!(
        (data.label_column, data.header, data.scale, data.normalize),
        (0, true, 16.0, false)
    );

    let base = "[job]\nname = \"x\"\n[train]\nplugin = \"p.wasm\"\nepochs = 1\nbatch_size = 1\n";
    let data = "[train.data]\nformat = \"csv\"\ntrain = \"d\"\n";
    for (extra, at, message) in [
        ("step_timeout = \"soon\"\n", "j.toml:7:16", "not a duration"),
        ("step_timeout = 0\n", "j.toml:7:16", "not a duration"),
        (
            "deadline = \"2s\"\nstep_timeout = \"3s\"\n",
            "j.toml:8:16",
            "both deadline and step_timeout",
        ),
        (
            "memory = \"lots\"\n",
            "j.toml:7:10",
            "[train] memory is not a size",
        ),
        ("memory = \"8GiB\"\n", "j.toml:7:10", "above 4 GiB"),
        (
            "checkpoint_every = 0\n",
            "j.toml:7:20",
            "checkpoint_every = 0",
        ),
        ("replicas = 0\n", "j.toml:7:12", "replicas = 0"),
    ] {
        let err = parse_str(&format!("{base}{extra}{data}")).unwrap_err();
        assert!(err.contains(at) && err.contains(message), "{extra}: {err}");
    }
    let err = parse_str(&format!("{base}{data}scale = -1\n")).unwrap_err();
    assert!(err.contains("data.scale = -1"), "{err}");
}

#[test]
fn enforce_memory_limit_needs_a_limit() {
    let cmd = "[command]\nargv = [\"true\"]\n";
    let job = parse_str(&format!(
        "[job]\nname = \"j\"\n[resources]\nmemory_limit = \"8GiB\"\nenforce_memory_limit = true\n{cmd}"
    ))
    .unwrap();
    assert!(job.resources.enforce_memory_limit);
    let job = parse_str(&format!("[job]\nname = \"j\"\n{cmd}")).unwrap();
    assert!(!job.resources.enforce_memory_limit, "off by default");
    let err = parse_str(&format!(
        "[job]\nname = \"j\"\n[resources]\nenforce_memory_limit = true\n{cmd}"
    ))
    .unwrap_err();
    assert!(
        err.starts_with("jobs/j.toml:4:24: enforce_memory_limit = true needs a memory_limit"),
        "{err}"
    );
}

/// Found by the job-file fuzz target (crates/orch-fuzz): a quoted value or a key with a line
/// break made the refusal two lines.
#[test]
fn refusals_stay_on_one_line_whatever_they_quote() {
    let cmd = "[command]\nargv = [\"true\"]\n";
    let cases = [
        (
            format!("[job]\nname = \"j\"\nmax_runtime = \"\"\"\na\nb\"\"\"\n{cmd}"),
            "max_runtime = \"a\\nb\" is not a duration",
        ),
        (
            format!("[job]\nname = \"j\"\n[policy.config]\n\"a\\nb\" = [1]\n{cmd}"),
            "config key `a\\nb` is array",
        ),
        (
            format!("[job]\nname = \"j\"\n\"x\\ny\" = 1\n{cmd}"),
            "unknown field `x\\ny`",
        ),
    ];
    for (text, words) in cases {
        let err = parse_str(&text).unwrap_err();
        assert!(!err.contains(['\n', '\r']), "{err:?}");
        assert!(err.contains(words), "{err:?} should say {words:?}");
    }
}

#[test]
fn slurm_and_sweep_tables() {
    let text = "[job]\nname = \"sw\"\n[resources]\nnodes = 2\n[slurm]\npartition = \"gpu\"\ngpu_type = \"a100\"\n[sweep]\nlr = [0.1, 0.01]\nseed = [1, 2, 3]\n[command]\nargv = [\"python\", \"t.py\", \"--lr={lr}\"]\n";
    let job = parse(Path::new("j.toml"), text).unwrap();
    assert_eq!(job.resources.nodes, 2);
    assert_eq!(
        job.slurm.options,
        vec![("partition".to_string(), "gpu".to_string())]
    );
    assert_eq!(job.slurm.gpu_type.as_deref(), Some("a100"));
    assert_eq!(job.sweep.len(), 6);
    let t = job.sweep_task(4).unwrap();
    let Work::Command(c) = &t.work else { panic!() };
    assert_eq!(c.argv[2], "--lr=0.01");
    assert_eq!(
        (c.env["LR"].as_str(), c.env["SEED"].as_str()),
        ("0.01", "2")
    );
    assert_eq!(c.env["ORCH_SWEEP_TASK"], "4");
    assert_eq!(t.name, "sw-4");
    assert!(job.sweep_task(6).is_none());
    for (bad, needle) in [
        (
            "[slurm]\npartiton = \"gpu\"\n",
            "unknown [slurm] key `partiton`",
        ),
        ("[slurm]\npartition = \"gpu\\n#SBATCH --x\"\n", "line break"),
        ("[slurm]\npartition = \"gpu --export=ALL\"\n", "a space"),
        ("[sweep]\nlr = 0.1\n", "not a list"),
        ("[sweep]\nlr = []\n", "not a list"),
        ("[resources]\nnodes = 0\n", "nodes = 0"),
    ] {
        let text = format!("[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n{bad}");
        let e = parse(Path::new("j.toml"), &text).unwrap_err().to_string();
        assert!(e.contains(needle) && e.starts_with("j.toml:"), "{e}");
    }
    let e = parse(
        Path::new("j.toml"),
        "[job]\nname = \"t\"\n[resources]\nnodes = 2\n[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = 8\n[train.data]\nformat = \"csv\"\ntrain = \"d.csv\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("within one machine"), "{e}");
    // A sweep too large to count is refused, not wrapped around.
    let keys: String = (0..70).map(|i| format!("k{i} = [1, 2]\n")).collect();
    let text = format!("[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n[sweep]\n{keys}");
    let e = parse(Path::new("j.toml"), &text).unwrap_err().to_string();
    assert!(e.contains("combinations"), "{e}");
}

#[test]
fn sweep_max_parallel_bounds_the_array_and_is_checked_where_it_is_written() {
    let text = "[job]\nname = \"sw\"\n[sweep]\nlr = [1, 2, 3]\nmax_parallel = 2\n[command]\nargv = [\"true\"]\n";
    let job = parse(Path::new("j.toml"), text).unwrap();
    assert_eq!(job.sweep.max_parallel, Some(2));
    // Not a parameter: the sweep has 3 tasks, and no task sees it.
    assert_eq!(job.sweep.len(), 3);
    assert_eq!(job.sweep.params.len(), 1);
    let Work::Command(c) = &job.sweep_task(2).unwrap().work else {
        panic!()
    };
    assert!(!c.env.contains_key("MAX_PARALLEL"));
    for (bad, needle) in [
        (
            "lr = [1, 2]\nmax_parallel = 0\n",
            "j.toml:7:1: [sweep] max_parallel = 0 is impossible",
        ),
        (
            "lr = [1, 2]\nmax_parallel = [1, 2]\n",
            "j.toml:7:1: [sweep] max_parallel = [1, 2] is impossible",
        ),
        (
            "lr = [1, 2]\nmax_parallel = \"2\"\n",
            "j.toml:7:1: [sweep] max_parallel = \"2\" is impossible",
        ),
        (
            "max_parallel = 2\n",
            "j.toml:6:1: [sweep] sets max_parallel but no parameter",
        ),
    ] {
        let text = format!("[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n[sweep]\n{bad}");
        let e = parse(Path::new("j.toml"), &text).unwrap_err().to_string();
        assert!(e.starts_with(needle), "{e}");
    }
}

#[test]
fn a_policy_sets_its_own_deadline_and_memory() {
    let base = "[job]\nname = \"x\"\n[resources]\ngpus = 1\n[policy]\nplugin = \"p.wasm\"\n";
    let work = "[command]\nargv = [\"true\"]\n";
    let job = parse_str(&format!(
        "{base}deadline = \"250ms\"\nmemory = \"128MiB\"\n{work}"
    ))
    .unwrap();
    let limits = &job.policy.limits;
    assert_eq!(
        limits.deadline.as_ref().map(|(d, at)| (*d, at.to_string())),
        Some((
            std::time::Duration::from_millis(250),
            "jobs/j.toml:7:12".to_string()
        ))
    );
    assert_eq!(limits.memory.as_ref().map(|(m, _)| *m), Some(128 << 20));
    for (extra, words) in [
        (
            "deadline = \"soon\"\n",
            "j.toml:7:12: [policy] deadline is not a duration",
        ),
        (
            "memory = -1\n",
            "j.toml:7:10: [policy] memory is not a size",
        ),
        (
            "memory = \"5GiB\"\n",
            "more than a wasm32 plugin can address",
        ),
    ] {
        let e = parse_str(&format!("{base}{extra}{work}")).unwrap_err();
        assert!(e.contains(words), "{extra}: {e}");
    }
}

/// `orch jobs` and `orch status` print a job's name to every user of the machine: one that could
/// drive their terminal (ESC, BEL, CR, LF, NUL), reorder the line (U+202E) or pad every row is
/// refused where it is written, with the rule.
#[test]
fn a_job_name_is_printable_and_at_most_128_characters() {
    let cmd = "[command]\nargv = [\"true\"]\n";
    let long = "n".repeat(10_000);
    let cases = [
        ("\\u001b]0;owned\\u0007", "U+001B"),
        ("ring\\u0007", "U+0007"),
        ("a\\rb", "U+000D"),
        ("a\\nb", "U+000A"),
        ("a\\u0000b", "U+0000"),
        ("txt.\\u202Eexe", "U+202E"),
        ("x\\u2066y", "U+2066"),
        (long.as_str(), "is 10000 characters long"),
    ];
    for (name, words) in cases {
        let err = parse_str(&format!("[job]\nname = \"{name}\"\n{cmd}")).unwrap_err();
        assert!(
            err.starts_with("jobs/j.toml:2:8: [job] name ") && err.contains(words),
            "{name}: {err}"
        );
        assert!(err.contains("at most 128 printable characters"), "{err}");
        assert!(!err.contains(['\n', '\r', '\u{1b}', '\u{202e}']), "{err:?}");
        assert!(err.len() < 1500, "{}", err.len());
    }
    let fine = "n".repeat(128);
    for name in [fine.as_str(), "résumé 日本 (run 2) / \\\\ \\\" ok"] {
        let text = format!("[job]\nname = \"{name}\"\n{cmd}");
        assert!(parse_str(&text).is_ok(), "{name}");
    }
}

#[test]
fn reads_a_warning_signal_and_a_grace_period() {
    let job = parse_str(
        "[job]\nname = \"j\"\nmax_runtime = \"1h\"\nsignal = \"SIGUSR1@5m\"\ngrace = \"60s\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let signal = job.stopping.signal.unwrap();
    assert_eq!(signal.number, libc::SIGUSR1);
    assert_eq!(signal.before, std::time::Duration::from_secs(300));
    assert_eq!(job.stopping.grace, Some(std::time::Duration::from_secs(60)));
    let plain = parse_str("[job]\nname = \"j\"\n[command]\nargv = [\"true\"]\n").unwrap();
    assert_eq!(plain.stopping, Stopping::default());
    assert_eq!(plain.stopping.grace_or_default(), DEFAULT_GRACE);
}

#[test]
fn a_bad_signal_or_grace_is_one_sentence_at_its_place() {
    let cmd = "[command]\nargv = [\"true\"]\n";
    for (line, words) in [
        (
            "signal = \"KILL@5s\"",
            "jobs/j.toml:3:10: signal = SIGKILL cannot be a warning signal",
        ),
        (
            "signal = \"USR1\"",
            "jobs/j.toml:3:10: signal = \"USR1\" is not NAME@DURATION",
        ),
        (
            "signal = \"FOO@5s\"",
            "jobs/j.toml:3:10: signal = \"FOO\" is not a signal",
        ),
        (
            "grace = \"soon\"",
            "jobs/j.toml:3:9: grace = \"soon\" is not a duration",
        ),
    ] {
        let err = parse_str(&format!("[job]\nname = \"j\"\n{line}\n{cmd}")).unwrap_err();
        assert!(err.starts_with(words), "{err}");
    }
}

#[test]
fn reads_dependencies_and_singleton_from_the_job_table() {
    let job = parse_str(
        "[job]\nname = \"eval\"\nafter_ok = [12, 13, 12]\nafter_any = [4]\nafter_failed = [7]\nsingleton = true\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    assert_eq!(job.depends.after_ok, vec![12, 13]);
    assert_eq!(job.depends.after_any, vec![4]);
    assert_eq!(job.depends.after_failed, vec![7]);
    assert!(job.depends.singleton);
    let none = parse_str("[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n").unwrap();
    assert!(none.depends.is_empty());
    let more = Dependencies {
        after_ok: vec![13, 20],
        ..Dependencies::default()
    };
    assert_eq!(job.depends.merged(&more).after_ok, vec![12, 13, 20]);
}

#[test]
fn a_dependency_that_is_no_job_id_points_at_it() {
    let e = parse_str("[job]\nname = \"x\"\nafter_ok = [3, -1]\n[command]\nargv = [\"true\"]\n")
        .unwrap_err();
    assert!(e.contains("jobs/j.toml:3:16"), "{e}");
    assert!(e.contains("after_ok: -1 is not a job id"), "{e}");
    let e = parse_str("[job]\nname = \"x\"\nafter_any = 3\n[command]\nargv = [\"true\"]\n")
        .unwrap_err();
    assert!(e.contains("jobs/j.toml:3:"), "{e}");
    let e =
        parse_str("[job]\nname = \"x\"\nafter_failed = [\"a\"]\n[command]\nargv = [\"true\"]\n")
            .unwrap_err();
    assert!(e.contains("jobs/j.toml:3:"), "{e}");
}

#[test]
fn reads_cpu_bind_and_device_ids() {
    let job = parse_str(
        "[job]\nname = \"j\"\n[resources]\ncpu_bind = \"none\"\n[command]\nargv = [\"true\"]\ndevice_ids = \"index\"\n",
    )
    .unwrap();
    assert_eq!(job.resources.cpu_bind, Some(CpuBind::None));
    let Work::Command(command) = &job.work else {
        panic!("a command job")
    };
    assert_eq!(command.device_ids, Some(DeviceIds::Index));
    // Unsaid: the defaults decide later (the inventory, a tenant's default).
    let job =
        parse_str("[job]\nname = \"j\"\n[resources]\ngpus = 1\n[command]\nargv = [\"true\"]\n")
            .unwrap();
    assert_eq!(job.resources.cpu_bind, None);
    let Work::Command(command) = &job.work else {
        panic!("a command job")
    };
    assert_eq!(command.device_ids, None);
}

#[test]
fn a_bad_cpu_bind_or_device_ids_is_one_sentence_at_its_place() {
    let err = parse_str(
        "[job]\nname = \"j\"\n[resources]\ncpu_bind = \"socket\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap_err();
    assert!(
        err.starts_with("jobs/j.toml:4:12: cpu_bind = \"socket\" is not known"),
        "{err}"
    );
    assert!(err.contains("\"numa\""), "{err}");
    let err =
        parse_str("[job]\nname = \"j\"\n[command]\nargv = [\"true\"]\ndevice_ids = \"ordinal\"\n")
            .unwrap_err();
    assert!(
        err.starts_with("jobs/j.toml:5:14: device_ids = \"ordinal\" is not known"),
        "{err}"
    );
    assert!(err.contains("\"index\""), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
