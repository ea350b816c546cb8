//! `orch completions SHELL` and `orch man`: shell completions and manual pages generated from
//! the command line's own definition, so they follow every subcommand and flag.

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::failure::{CmdResult, Failure};
use clap::CommandFactory;
use std::io::Write;
use std::path::Path;

/// Writes the completion script for `args.shell` to stdout.
pub fn completions(args: &CompletionsArgs) -> CmdResult {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "orch", &mut out);
    out.flush()
        .map_err(|e| Failure::failed_msg(format!("writing the completions: {e}")))
}

/// `orch.1` to stdout, or with `--out DIR` one page per visible (sub)command in DIR.
pub fn man(args: &ManArgs) -> CmdResult {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    match &args.out {
        None => {
            let mut page = Vec::new();
            render(&cmd, &mut page).map_err(Failure::failed_msg)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&page)
                .and_then(|()| out.flush())
                .map_err(|e| Failure::failed_msg(format!("writing the manual page: {e}")))
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                Failure::bad_input_msg(format!(
                    "--out {}: cannot create the folder: {e}; name a folder you may write",
                    dir.display()
                ))
            })?;
            let mut written = Vec::new();
            write_pages(&cmd, dir, &mut written)?;
            for path in written {
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}

/// Every visible command's page under `dir`, parents after their subcommands.
fn write_pages(
    cmd: &clap::Command,
    dir: &Path,
    written: &mut Vec<std::path::PathBuf>,
) -> CmdResult {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    let man = page(cmd);
    let path = dir.join(man.get_filename());
    let mut text = Vec::new();
    man.render(&mut text)
        .map_err(|e| Failure::failed_msg(format!("rendering {}: {e}", path.display())))?;
    std::fs::write(&path, text).map_err(|e| {
        Failure::bad_input_msg(format!("--out: cannot write {}: {e}", path.display()))
    })?;
    written.push(path);
    Ok(())
}

fn page(cmd: &clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd.clone())
        .source(format!("orch {}", env!("CARGO_PKG_VERSION")))
        .manual("orch manual")
}

fn render(cmd: &clap::Command, out: &mut Vec<u8>) -> Result<(), String> {
    page(cmd)
        .render(out)
        .map_err(|e| format!("rendering the manual page: {e}"))
}
