//! Where a `[train]` job's checkpoint lives in its output folder, for the crates that only need
//! to know whether one is there (the daemon's supervisor resumes a run queued again from it)
//! without depending on the trainer.

use std::path::{Path, PathBuf};

/// The run's checkpoint: a link to the newest checkpoint folder (`OUT/checkpoint`).
pub fn dir(out: &Path) -> PathBuf {
    out.join("checkpoint")
}

/// The file every complete checkpoint has (the step, the data position, the optimizers).
pub const STATE_FILE: &str = "state.json";

/// Whether the run writing to `out` left a checkpoint to resume from.
pub fn exists(out: &Path) -> bool {
    dir(out).join(STATE_FILE).is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_exists_once_its_state_file_does() {
        let out = std::env::temp_dir().join(format!("orch-checkpoint-{}", std::process::id()));
        assert!(!exists(&out));
        std::fs::create_dir_all(dir(&out)).unwrap();
        assert!(!exists(&out), "an empty folder is no checkpoint");
        std::fs::write(dir(&out).join(STATE_FILE), "{}").unwrap();
        assert!(exists(&out));
        std::fs::remove_dir_all(&out).unwrap();
    }
}
