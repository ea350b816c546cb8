//! Compiled components are cached on disk by content hash; a damaged entry is compiled again,
//! never trusted.

use crate::common::{builtin, lab, request};
use orch_host::{Limits, PolicyHost};
use std::path::{Path, PathBuf};

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("components"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "cwasm"));
    files
}

fn decide_once(dir: &Path) {
    let mut host = PolicyHost::with_cache_dir(Limits::default(), Some(dir.to_path_buf())).unwrap();
    let id = host.load(&builtin("pack")).unwrap();
    let decision = host.decide(id, &request(2), &lab(), &[]).unwrap();
    assert_eq!(decision.devices, vec![6, 2]);
}

#[test]
fn a_second_host_reuses_the_compiled_component() {
    let dir = tempfile::tempdir().unwrap();
    decide_once(dir.path());
    let files = entries(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&files[0]).unwrap();
    let (inode, written) = (meta.ino(), meta.modified().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    decide_once(dir.path());
    assert_eq!(entries(dir.path()), files);
    let meta = std::fs::metadata(&files[0]).unwrap();
    // A rewrite is a new file renamed into place; a hit only marks the entry used.
    assert_eq!(meta.ino(), inode, "a good entry is read, not rewritten");
    assert!(
        meta.modified().unwrap() > written,
        "a hit marks the entry used"
    );
}

#[test]
fn damaged_entries_are_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    decide_once(dir.path());
    let file = entries(dir.path()).remove(0);
    let good = std::fs::read(&file).unwrap();

    // A flipped byte in the compiled code: the checksum catches it.
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    std::fs::write(&file, &flipped).unwrap();
    decide_once(dir.path());
    assert_eq!(std::fs::read(&file).unwrap(), good, "rewritten whole");

    // Truncated, and not ours at all.
    for damage in [good[..good.len() / 2].to_vec(), b"\0asm junk".to_vec()] {
        std::fs::write(&file, &damage).unwrap();
        decide_once(dir.path());
        assert_eq!(std::fs::read(&file).unwrap(), good);
    }

    // Whole and checksummed, but a compiled core module, not a component.
    let engine = wasmtime::Engine::default();
    let module = engine.precompile_module(b"\0asm\x01\0\0\0").unwrap();
    let magic_len = good.iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut wrong = good[..magic_len].to_vec();
    use sha2::Digest;
    wrong.extend_from_slice(&sha2::Sha256::digest(&module));
    wrong.extend_from_slice(&module);
    std::fs::write(&file, &wrong).unwrap();
    decide_once(dir.path());
    assert_eq!(std::fs::read(&file).unwrap(), good);
}

#[test]
fn an_unwritable_cache_only_costs_a_compile() {
    let dir = tempfile::tempdir().unwrap();
    let blocked = dir.path().join("not-a-folder");
    std::fs::write(&blocked, b"a file where the cache folder should be").unwrap();
    decide_once(&blocked);
}
