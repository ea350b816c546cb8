//! `orch plugin inspect FILE.wasm [--json]`: the world a component implements, its imports and
//! exports, its size; what is not a policy component is rejected in one sentence (exit 2).

use super::plan::policy_host;
use crate::cli::{PluginAction, PluginArgs};
use crate::failure::{CmdResult, Failure};
use orch_host::{Inspection, builtin};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
struct InspectionJson<'a> {
    file: &'a str,
    world: &'a str,
    size_bytes: usize,
    imports: &'a [String],
    exports: &'a [String],
}

pub fn run(args: &PluginArgs) -> CmdResult {
    match &args.action {
        PluginAction::Inspect { file, json } => inspect(file, *json),
    }
}

fn inspect(file: &Path, json: bool) -> CmdResult {
    let shown = file.display().to_string();
    let (name, wasm) = match std::fs::read(file) {
        Ok(wasm) => (plugin_name(file), wasm),
        Err(e) => match builtin(&shown) {
            Some(b) if !file.exists() => (b.name.to_string(), b.wasm.to_vec()),
            _ => {
                return Err(Failure::bad_input_msg(format!(
                    "cannot read {shown}: {e} (give a .wasm component, or a built-in policy's name)"
                )));
            }
        },
    };
    let mut host = policy_host()?;
    let found = orch_host::inspect(&mut host, &name, &wasm).map_err(|e| {
        if e.is_bad_input() {
            Failure::bad_input(e)
        } else {
            Failure::failed_msg(e)
        }
    })?;
    if json {
        let value = InspectionJson {
            file: &shown,
            world: found.world,
            size_bytes: found.size_bytes,
            imports: &found.imports,
            exports: &found.exports,
        };
        // Serialising plain data cannot fail.
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        print!("{}", human(&shown, &found));
    }
    Ok(())
}

fn plugin_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn human(file: &str, found: &Inspection) -> String {
    let mut out = format!(
        "{file}: a component of world {}, {} bytes\n",
        found.world, found.size_bytes
    );
    for (title, items) in [("imports", &found.imports), ("exports", &found.exports)] {
        out.push_str(&format!("{title}:\n"));
        if items.is_empty() {
            out.push_str("  (none)\n");
        }
        for item in items {
            out.push_str(&format!("  {item}\n"));
        }
    }
    out
}
