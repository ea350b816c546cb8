//! A trainer loads through orch-host's generic host, as a policy does: the same built-in
//! table, the same compile cache and the same errors ([`PluginError`], kind `trainer`), each
//! refusal before any device is needed.

use crate::common::*;
use orch_host::{PluginError, PluginKind, PolicyHost};
use orch_trainer::{Prepared, RunOptions, TrainError, TrainJob};
use std::path::Path;

/// [`Prepared::new`] for a job whose `[train] plugin` is `plugin`, with `options`.
fn prepare(dir: &Path, plugin: &str, options: &RunOptions) -> Result<String, TrainError> {
    let job = job(
        dir,
        &format!("plugin = \"{plugin}\"\nepochs = 1\nbatch_size = 32"),
    );
    let train_job = TrainJob {
        name: &job.name,
        spec: spec(&job),
        memory_limit: None,
    };
    Prepared::new(&train_job, options).map(|p| format!("{p:?}"))
}

#[test]
fn a_trainer_that_cannot_load_fails_with_the_plugin_errors_of_every_world() {
    let dir = tempfile::tempdir().unwrap();
    let err = prepare(dir.path(), "nope", &options()).unwrap_err();
    assert!(
        matches!(
            &err,
            TrainError::Plugin(PluginError::UnknownBuiltin {
                kind: PluginKind::Trainer,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_bad_input());
    assert_eq!(
        err.to_string(),
        "unknown built-in trainer `nope`: the built-ins are mlp, cnn, gpt; or give a path to a .wasm component"
    );

    let missing = dir.path().join("missing.wasm");
    let err = prepare(dir.path(), &missing.display().to_string(), &options()).unwrap_err();
    assert!(
        matches!(
            &err,
            TrainError::Plugin(PluginError::Read {
                kind: PluginKind::Trainer,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(&format!(
            "cannot read trainer plugin {}: ",
            missing.display()
        )),
        "{err}"
    );

    // A core module is refused by the shared host's check, in the trainer's words.
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let err = prepare(dir.path(), &core.display().to_string(), &options()).unwrap_err();
    assert!(err.is_bad_input(), "{err}");
    assert_eq!(
        err.to_string(),
        "`core` is not a trainer component: a core WebAssembly module, not a component; build one against orch's wit/ (world `trainer`), as docs/TRAINERS.md shows"
    );
}

#[test]
fn trainers_and_policies_share_one_compile_cache() {
    let cache = tempfile::tempdir().unwrap();
    let options = RunOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RunOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    prepare(dir.path(), "mlp", &options).unwrap();
    let mut policies =
        PolicyHost::with_cache_dir(orch_host::Limits::default(), Some(cache.path().into()))
            .unwrap();
    policies
        .load(&orch_host::PluginRef::Builtin("pack".into()))
        .unwrap();
    let mut names: Vec<String> = orch_host::cache_entries(cache.path())
        .unwrap()
        .into_iter()
        .map(|e| e.plugin)
        .collect();
    names.sort();
    assert_eq!(names, vec!["mlp", "pack"]);
}
