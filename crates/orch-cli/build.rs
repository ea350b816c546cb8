//! Links the `orch` binary position-dependent (not PIE) on Linux.
//!
//! Every job starts `orch` twice (the `orch submit` or `orch run` that asks for it, and the
//! daemon's per-job supervisor), so the binary's start-up is paid per job. As a PIE its 24 MB
//! carry some 57,000 relative relocations that the dynamic loader applies at every start,
//! writing (and so copying) every page of its relocated data: about 1 ms of CPU and 180 page
//! faults of the 2 ms an `orch --version` took. Linked position-dependent, nothing is relocated.
//! What that costs is the randomised address of the binary's own code and data; the libraries,
//! heap and stacks are still placed at random. `ORCH_PIE=1` at build time links a PIE instead.

fn main() {
    println!("cargo:rerun-if-env-changed=ORCH_PIE");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let pie = std::env::var_os("ORCH_PIE").is_some_and(|v| v != "0" && !v.is_empty());
    if linux && !pie {
        println!("cargo:rustc-link-arg-bin=orch=-no-pie");
    }
}
