//! Builds the guest workspace `plugins/` (built-in policies, queue policies and trainers, and the
//! test fixtures of every world) for `wasm32-wasip2` with cargo alone, and tells the crate where
//! the components are (`ORCH_PLUGIN_WASM_DIR`), so the built-ins are embedded with
//! `include_bytes!`. The one build script of every guest: orch-trainer finds its fixtures
//! through this crate (`PLUGIN_WASM_DIR`).
//!
//! The guests get their own target folder beside the host's (`<target>/orch-plugins`): a
//! separate folder means a separate cargo lock, so the nested build never waits on the outer one,
//! and debug, release and clippy builds of the host share one guest build.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir.join("../..");
    let plugins = root.join("plugins");
    for watched in [
        "Cargo.toml",
        "Cargo.lock",
        "kit",
        "policies",
        "fixtures",
        "queue-kit",
        "queue",
        "queue-fixtures",
        "trainer-kit",
        "trainer-mlp",
        "trainer-cnn",
        "trainer-gpt",
        "trainer-fixtures",
        "compat",
    ] {
        println!("cargo:rerun-if-changed={}", plugins.join(watched).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    // The built-in queue policies are wrappers around orch-queue: its source is theirs.
    // So are orch-topology's (the set rule) for the built-in placement policies.
    for krate in ["orch-queue", "orch-topology"] {
        for watched in ["Cargo.toml", "src"] {
            let path = root.join("crates").join(krate).join(watched);
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let target_dir = guest_target_dir(&out_dir);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(plugins.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    // What the outer build sets for the host must not leak into the guest build.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "__CARGO_FIX_PLUMBING",
    ] {
        command.env_remove(var);
    }
    let status = command.status().unwrap_or_else(|e| {
        panic!(
            "cannot run cargo to build the guest plugins in {}: {e}",
            plugins.display()
        )
    });
    if !status.success() {
        panic!(
            "building the guest plugins in {} for wasm32-wasip2 failed (see above); \
             is the target installed? `rustup target add wasm32-wasip2`",
            plugins.display()
        );
    }
    let wasm_dir = target_dir.join("wasm32-wasip2").join("release");
    println!(
        "cargo:rustc-env=ORCH_PLUGIN_WASM_DIR={}",
        wasm_dir.display()
    );
}

/// `<target>/orch-plugins`, found from `OUT_DIR` (`<target>[/<triple>]/<profile>/build/<pkg>/out`);
/// `OUT_DIR/orch-plugins` when the layout is not the usual one.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map_or_else(|| out_dir.join("orch-plugins"), |t| t.join("orch-plugins"))
}
