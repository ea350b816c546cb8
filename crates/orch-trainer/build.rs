//! Tells the crate where the guest components are: `crates/orch-host/build.rs` builds the whole
//! guest workspace `plugins/` (the `trainer-mlp` built-in and the `trainer-fixtures/` included)
//! into `<target>/orch-plugins`, before this crate compiles (orch-host is a dependency), so the
//! built-in trainer can be embedded with `include_bytes!`.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let wasm_dir = guest_target_dir(&out_dir)
        .join("wasm32-wasip2")
        .join("release");
    println!(
        "cargo:rustc-env=ORCH_TRAINER_WASM_DIR={}",
        wasm_dir.display()
    );
}

/// `<target>/orch-plugins`, found from `OUT_DIR` exactly as orch-host's build script does.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map_or_else(|| out_dir.join("orch-plugins"), |t| t.join("orch-plugins"))
}
