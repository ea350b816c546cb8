//! `orch completions` and `orch man`: generated from the command line, so they name every
//! visible subcommand and flag, and they load in the shells and `man` that users run.

use crate::{orch, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        Scratch(crate::scratch_dir(tag))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn man_writes_a_page_per_visible_subcommand_that_man_renders() {
    let dir = Scratch::new("man");
    let out = orch(&["man", "--out", dir.path().to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for page in [
        "orch.1",
        "orch-run.1",
        "orch-serve.1",
        "orch-submit.1",
        "orch-man.1",
    ] {
        assert!(names.iter().any(|n| n == page), "{page} among {names:?}");
    }
    // The daemon's own helpers are not for people.
    assert!(!names.iter().any(|n| n.contains("__")), "{names:?}");
    // Every file printed is one written.
    assert_eq!(
        stdout(&out).lines().count(),
        names.len(),
        "{}",
        stdout(&out)
    );

    // `orch man` alone is orch.1, the same page.
    let top = orch(&["man"], &[]);
    assert!(top.status.success(), "{}", stderr(&top));
    assert_eq!(
        top.stdout,
        std::fs::read(dir.path().join("orch.1")).unwrap()
    );

    if Command::new("man").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("ORCH_REQUIRE_MAN").is_none(),
            "no `man` on this machine (Debian's man-db) and ORCH_REQUIRE_MAN is set"
        );
        eprintln!("no `man` on this machine: the pages were written, not rendered");
        return;
    }
    let rendered = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("orch-run.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(rendered.status.success(), "{}", stderr(&rendered));
    let text = stdout(&rendered);
    assert!(text.contains("orch-run"), "{text}");
    assert!(
        text.contains("--gpus"),
        "the run page lists its flags: {text}"
    );
}

#[test]
fn bash_completion_loads_and_completes_subcommands() {
    let out = orch(&["completions", "bash"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = Scratch::new("completions");
    let script = dir.path().join("orch.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // Load it in bash and ask it what `orch su<TAB>` completes to.
    let probe = format!(
        "source {}; COMP_WORDS=(orch su); COMP_CWORD=1; COMP_LINE='orch su'; COMP_POINT=7; \
         $(complete -p orch | sed -E 's/.*-F ([^ ]+).*/\\1/') orch su orch; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let done = Command::new("bash").arg("-c").arg(&probe).output().unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    let words = stdout(&done);
    assert!(
        words.lines().any(|w| w == "submit"),
        "completions: {words:?}"
    );
}

#[test]
fn each_shell_gets_a_script_and_an_unknown_shell_a_sentence() {
    for (shell, mark) in [("zsh", "#compdef orch"), ("fish", "complete -c orch")] {
        let out = orch(&["completions", shell], &[]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        assert!(stdout(&out).contains(mark), "{shell}: {}", stdout(&out));
    }
    let out = orch(&["completions", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("tcsh"), "{}", stderr(&out));
}
