//! `orch plugin inspect FILE.wasm [--json]` (or a built-in's name): the world a component
//! implements and the version of the contract, its imports and exports, its size; what is not a plugin orch loads is
//! rejected in one sentence (exit 2). `orch plugin cache [--json] [--clear]`: the compile cache.

use super::plan::policy_host;
use crate::cli::{PluginAction, PluginArgs};
use crate::failure::{CmdResult, Failure};
use orch_host::{CacheEntry, Inspection, builtin_plugin};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
struct InspectionJson<'a> {
    file: &'a str,
    world: &'a str,
    /// The version of the contract (`0.2.0`), and a sentence when it is older than orch's.
    contract: &'a str,
    note: Option<String>,
    size_bytes: usize,
    imports: &'a [String],
    exports: &'a [String],
}

pub fn run(args: &PluginArgs) -> CmdResult {
    match &args.action {
        PluginAction::Inspect { file, json } => inspect(file, *json),
        PluginAction::Cache { json, clear } => cache(*json, *clear),
    }
}

fn inspect(file: &Path, json: bool) -> CmdResult {
    let shown = file.display().to_string();
    let (name, wasm) = match std::fs::read(file) {
        Ok(wasm) => (plugin_name(file), wasm),
        // A built-in of any world (a policy, a queue policy, a trainer) by its name.
        Err(e) => match builtin_plugin(&shown) {
            Some((_, wasm)) if !file.exists() => (shown.clone(), wasm.to_vec()),
            _ => {
                return Err(Failure::bad_input_msg(format!(
                    "cannot read {shown}: {e} (give a .wasm component, or the name of a built-in policy, queue policy or trainer)"
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
            world: &found.world,
            contract: found.version.as_str(),
            note: found.version_note(),
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
    if let Some(note) = found.version_note() {
        out.push_str(&format!("note: {note}\n"));
    }
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

#[derive(Debug, Serialize)]
struct CacheJson<'a> {
    dir: Option<String>,
    limit_bytes: u64,
    total_bytes: u64,
    entries: Vec<EntryJson<'a>>,
    /// With `--clear`: what was removed.
    cleared: Option<ClearedJson>,
}

#[derive(Debug, Serialize)]
struct EntryJson<'a> {
    plugin: &'a str,
    file: String,
    bytes: u64,
    /// Seconds since the Unix epoch.
    last_used: u64,
}

#[derive(Debug, Serialize)]
struct ClearedJson {
    entries: usize,
    bytes: u64,
}

fn cache(json: bool, clear: bool) -> CmdResult {
    let limit = orch_host::cache_size_limit().map_err(Failure::bad_input_msg)?;
    let Some(dir) = orch_host::default_cache_dir() else {
        let message = "no compile cache: ORCH_CACHE_DIR is empty (or no home folder is known), so plugins are compiled in memory each run";
        if json {
            let value = CacheJson {
                dir: None,
                limit_bytes: limit,
                total_bytes: 0,
                entries: Vec::new(),
                cleared: None,
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
        } else {
            println!("{message}");
        }
        return Ok(());
    };
    let unreadable = |e: std::io::Error| {
        Failure::failed_msg(format!(
            "cannot read the compile cache in {}: {e}",
            dir.display()
        ))
    };
    let cleared = if clear {
        Some(orch_host::clear_cache(&dir).map_err(|e| {
            Failure::failed_msg(format!(
                "cannot clear the compile cache in {}: {e}",
                dir.display()
            ))
        })?)
    } else {
        None
    };
    let entries = orch_host::cache_entries(&dir).map_err(unreadable)?;
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    if json {
        let value = CacheJson {
            dir: Some(dir.display().to_string()),
            limit_bytes: limit,
            total_bytes: total,
            entries: entries.iter().rev().map(entry_json).collect(),
            cleared: cleared.map(|(entries, bytes)| ClearedJson { entries, bytes }),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return Ok(());
    }
    if let Some((n, bytes)) = cleared {
        println!(
            "removed {n} compiled plugin(s), {} from {}",
            orch_core::limits::show_bytes(bytes),
            dir.display()
        );
    }
    println!(
        "{}: {} compiled plugin(s), {} of {} (ORCH_CACHE_SIZE); the least recently used go first",
        dir.display(),
        entries.len(),
        orch_core::limits::show_bytes(total),
        orch_core::limits::show_bytes(limit)
    );
    let mut rows = Vec::new();
    for entry in entries.iter().rev() {
        rows.push(vec![
            if entry.plugin.is_empty() {
                "?".to_string()
            } else {
                entry.plugin.clone()
            },
            orch_core::limits::show_bytes(entry.bytes),
            ago(entry),
            entry
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ]);
    }
    if entries.is_empty() {
        return Ok(());
    }
    print!(
        "{}",
        crate::table::render(&["PLUGIN", "SIZE", "LAST USED", "FILE"], &rows)
    );
    Ok(())
}

fn entry_json(entry: &CacheEntry) -> EntryJson<'_> {
    EntryJson {
        plugin: &entry.plugin,
        file: entry.path.display().to_string(),
        bytes: entry.bytes,
        last_used: entry
            .last_used
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// `3m ago`, `2h ago`, `5d ago`.
fn ago(entry: &CacheEntry) -> String {
    let secs = entry.last_used.elapsed().map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}
