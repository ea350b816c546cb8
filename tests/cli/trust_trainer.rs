//! A `[train]` job whose checkpoint cannot be written: `orch run` exits 1 with the sentence, and
//! through the daemon the job's reason is that sentence, not "exit status 1".

use crate::serve::{Daemon, job_file};
use crate::*;

/// A digits job on `gpus` sim GPUs writing to `work/out`, a checkpoint every 3 steps, whose
/// checkpoint folder is a file: the first checkpoint (step 3) cannot be written.
fn job_with_a_file_for_its_checkpoints(work: &std::path::Path, gpus: u32) -> String {
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let out = work.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("checkpoints"), b"not a folder").unwrap();
    job_file(
        work,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\n[resources]\ngpus = {gpus}\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nseed = 5\ncheckpoint_every = 3\nout = \"{}\"\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
            out.display(),
            d = digits.display()
        ),
    )
}

/// Finding: the job's reason said "exit status 1"; the sentence was only in its stderr.
#[test]
fn a_train_job_whose_checkpoint_fails_ends_with_the_sentence() {
    let d = Daemon::start("ckpt-reason");
    for gpus in [1, 2] {
        let work = d.state.join(format!("work-{gpus}"));
        std::fs::create_dir_all(&work).unwrap();
        let file = job_with_a_file_for_its_checkpoints(&work, gpus);
        let sentence = format!(
            "could not write the checkpoint at {}: file exists; training stopped after step 3",
            work.join("out/checkpoints").display()
        );

        // `orch run`: exit 1, the sentence as its last line.
        let out = d.client(&["run", &file]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let last = stderr(&out)
            .trim_end()
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        assert!(
            last.starts_with(&format!("orch: {sentence}")),
            "{}",
            stderr(&out)
        );

        // Through the daemon: the job's reason, in `orch status` and `orch wait`.
        let id = d.submit(&[&file]);
        let out = d.client(&["wait", &id]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("failed: {sentence}")),
            "{}",
            stderr(&out)
        );
        let s = d.status(&id);
        let reason = s["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with(&sentence), "{s}");
        assert!(!reason.contains("exit status"), "{s}");
    }
}
