//! Components compiled once per process, and once per machine: compiled code is kept on disk
//! under a key made of the component's content hash and the engine's compatibility hash.
//!
//! Compiling a 80 KB policy costs ~75 ms; loading its compiled form costs ~0.3 ms. An entry is
//! never trusted blindly: its file carries a SHA-256 of the compiled bytes, wasmtime checks the
//! header (`Engine::detect_precompiled`) and its own version and settings; an entry that fails
//! any check is compiled again and rewritten.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::{Engine, Precompiled};

/// Overrides where compiled components are cached; empty turns the disk cache off.
pub const CACHE_DIR_ENV: &str = "ORCH_CACHE_DIR";

/// The first bytes of a cache file, before the digest and the compiled component.
const MAGIC: &[u8] = b"orch-cwasm-1\n";

/// `$ORCH_CACHE_DIR`, else `$XDG_CACHE_HOME/orch`, else `~/.cache/orch`; `None` when
/// `ORCH_CACHE_DIR` is empty or no home is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    if let Some(xdg) = non_empty("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("orch"));
    }
    non_empty("HOME").map(|home| PathBuf::from(home).join(".cache").join("orch"))
}

/// Compiled components by content, in memory and (when a folder is given) on disk.
#[derive(Debug)]
pub struct ComponentCache {
    dir: Option<PathBuf>,
    engine_hash: String,
    memory: HashMap<[u8; 32], Component>,
}

impl ComponentCache {
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> ComponentCache {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ComponentCache {
            dir: dir.map(|d| d.join("components")),
            engine_hash: format!("{:016x}", hasher.finish()),
            memory: HashMap::new(),
        }
    }

    /// The component for `wasm`, compiled at most once per process and, with a disk cache, once
    /// per machine.
    pub fn get(&mut self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
        let digest = Sha256::digest(wasm);
        let key: [u8; 32] = digest.into();
        if let Some(component) = self.memory.get(&key) {
            return Ok(component.clone());
        }
        let file = self
            .dir
            .as_ref()
            .map(|dir| dir.join(format!("{digest:x}-{}.cwasm", self.engine_hash)));
        let component = match file.as_deref().and_then(|f| load(engine, f)) {
            Some(component) => component,
            None => {
                let component = Component::new(engine, wasm)?;
                if let Some(file) = &file {
                    store(&component, file);
                }
                component
            }
        };
        self.memory.insert(key, component.clone());
        Ok(component)
    }
}

/// A cached component, or `None` (after removing the file) when the entry is absent, corrupt or
/// made for another engine.
fn load(engine: &Engine, file: &Path) -> Option<Component> {
    let bytes = std::fs::read(file).ok()?;
    match check(&bytes) {
        Ok(compiled) => {
            // SAFETY: `deserialize` runs the bytes as machine code. They are what this engine
            // wrote (the digest matches the bytes, the header says a component for this
            // wasmtime), in a folder only this user writes; an attacker who can write there can
            // already change the user's programs.
            match unsafe { Component::deserialize(engine, compiled) } {
                Ok(component) => {
                    tracing::debug!("loaded compiled component {}", file.display());
                    return Some(component);
                }
                Err(e) => tracing::debug!("recompiling {}: {e}", file.display()),
            }
        }
        Err(why) => tracing::debug!("recompiling {}: {why}", file.display()),
    }
    let _ = std::fs::remove_file(file);
    None
}

/// The compiled bytes of a cache file, when it is whole.
fn check(bytes: &[u8]) -> Result<&[u8], &'static str> {
    let rest = bytes.strip_prefix(MAGIC).ok_or("not an orch cache file")?;
    if rest.len() < 32 {
        return Err("truncated");
    }
    let (digest, compiled) = rest.split_at(32);
    if Sha256::digest(compiled).as_slice() != digest {
        return Err("its checksum does not match (corrupt)");
    }
    match Engine::detect_precompiled(compiled) {
        Some(Precompiled::Component) => Ok(compiled),
        _ => Err("not a compiled component"),
    }
}

/// Writes the cache entry (atomically: a temporary file renamed into place). Failing to cache
/// only costs the next run a compile, so errors are logged, not returned.
fn store(component: &Component, file: &Path) {
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let compiled = component.serialize()?;
        let dir = file.parent().ok_or("no parent folder")?;
        std::fs::create_dir_all(dir)?;
        let mut bytes = Vec::with_capacity(MAGIC.len() + 32 + compiled.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&Sha256::digest(&compiled));
        bytes.extend_from_slice(&compiled);
        let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), unique()));
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, file).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(())
    })();
    if let Err(e) = result {
        tracing::debug!(
            "cannot cache the compiled component at {}: {e}",
            file.display()
        );
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_entries_are_refused() {
        assert!(check(b"garbage").is_err());
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[0; 20]);
        assert_eq!(check(&bytes), Err("truncated"));
        let compiled = b"not really compiled";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&Sha256::digest(compiled));
        bytes.extend_from_slice(compiled);
        assert_eq!(check(&bytes), Err("not a compiled component"));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(check(&bytes).unwrap_err().contains("corrupt"));
    }
}
