//! Components compiled once per process, and once per machine: compiled code is kept on disk
//! under a key made of the component's content hash and the engine's compatibility hash.
//!
//! Compiling a 80 KB policy costs ~75 ms; loading its compiled form costs ~0.3 ms. An entry is
//! never trusted blindly: its file carries a SHA-256 of the compiled bytes, wasmtime checks the
//! header (`Engine::detect_precompiled`) and its own version and settings; an entry that fails
//! any check is compiled again and rewritten.
//!
//! The folder stays bounded (`ORCH_CACHE_SIZE`, default 1 GiB): every hit marks its entry used
//! (the file's modification time), and every write evicts the least recently used entries past
//! the cap. A Python component compiles to tens of MB and every rebuild is a new entry, so
//! without a cap the folder would only grow. `orch plugin cache` lists and clears it.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use wasmtime::component::Component;
use wasmtime::{Engine, Precompiled};

/// Overrides where compiled components are cached; empty turns the disk cache off.
pub const CACHE_DIR_ENV: &str = "ORCH_CACHE_DIR";

/// Caps the disk cache (`512MiB`, `2GiB`); the least recently used entries go first.
pub const CACHE_SIZE_ENV: &str = "ORCH_CACHE_SIZE";

/// The cap when `ORCH_CACHE_SIZE` does not set one.
pub const DEFAULT_CACHE_SIZE: u64 = 1 << 30;

/// The first bytes of a cache file, before the plugin's name (a line), the digest and the
/// compiled component.
const MAGIC: &[u8] = b"orch-cwasm-2\n";

/// The cap of the disk cache: `ORCH_CACHE_SIZE`, else 1 GiB; an error names a malformed value.
pub fn cache_size_limit() -> Result<u64, String> {
    match std::env::var(CACHE_SIZE_ENV) {
        Ok(text) if !text.trim().is_empty() => text
            .parse::<orch_core::ByteSize>()
            .map(orch_core::ByteSize::bytes)
            .map_err(|e| format!("{CACHE_SIZE_ENV}={text:?}: {e}")),
        _ => Ok(DEFAULT_CACHE_SIZE),
    }
}

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
    /// Bytes the folder may hold.
    limit: u64,
    memory: HashMap<[u8; 32], Component>,
}

impl ComponentCache {
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> ComponentCache {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        // A malformed cap is the default's: the cache is an optimisation, and `orch plugin
        // cache` reports the malformed value.
        let limit = cache_size_limit().unwrap_or(DEFAULT_CACHE_SIZE);
        ComponentCache {
            dir: dir.map(|d| entries_dir(&d)),
            engine_hash: format!("{:016x}", hasher.finish()),
            limit,
            memory: HashMap::new(),
        }
    }

    /// Another cap than `ORCH_CACHE_SIZE`'s.
    pub fn with_limit(mut self, limit: u64) -> ComponentCache {
        self.limit = limit;
        self
    }

    /// The component for `wasm` (plugin `name`, as `orch plugin cache` lists it), compiled at
    /// most once per process and, with a disk cache, once per machine.
    pub fn get(&mut self, engine: &Engine, name: &str, wasm: &[u8]) -> wasmtime::Result<Component> {
        self.get_digested(engine, name, wasm)
            .map(|(component, _)| component)
    }

    /// [`ComponentCache::get`], with the SHA-256 of `wasm` it is kept by (what a trainer's
    /// checkpoint records of the build that wrote it).
    pub fn get_digested(
        &mut self,
        engine: &Engine,
        name: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<(Component, [u8; 32])> {
        let digest = Sha256::digest(wasm);
        let key: [u8; 32] = digest.into();
        if let Some(component) = self.memory.get(&key) {
            return Ok((component.clone(), key));
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
                    store(&component, name, file);
                    evict(file, self.limit);
                }
                component
            }
        };
        self.memory.insert(key, component.clone());
        Ok((component, key))
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
                    touch(file);
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

/// The plugin's name and the rest of a cache file (digest and compiled bytes).
fn split_header(bytes: &[u8]) -> Result<(&str, &[u8]), &'static str> {
    let rest = bytes.strip_prefix(MAGIC).ok_or("not an orch cache file")?;
    let end = rest.iter().position(|&b| b == b'\n').ok_or("truncated")?;
    let name = std::str::from_utf8(&rest[..end]).map_err(|_| "its name is not UTF-8")?;
    Ok((name, &rest[end + 1..]))
}

/// The compiled bytes of a cache file, when it is whole.
fn check(bytes: &[u8]) -> Result<&[u8], &'static str> {
    let (_, rest) = split_header(bytes)?;
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
fn store(component: &Component, name: &str, file: &Path) {
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let compiled = component.serialize()?;
        let dir = file.parent().ok_or("no parent folder")?;
        std::fs::create_dir_all(dir)?;
        let name: String = name
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(200)
            .collect();
        let mut bytes = Vec::with_capacity(MAGIC.len() + name.len() + 33 + compiled.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(b'\n');
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

/// Marks a cache file used now, for the least-recently-used order.
fn touch(file: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(file) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Removes the least recently used entries of `just_written`'s folder until the entries total
/// at most `limit` bytes; the entry just written stays, whatever its size.
fn evict(just_written: &Path, limit: u64) {
    let Some(dir) = just_written.parent() else {
        return;
    };
    let Ok(mut entries) = list_entries(dir) else {
        return;
    };
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    entries.sort_by_key(|e| e.last_used);
    for entry in entries {
        if total <= limit {
            break;
        }
        if entry.path == just_written {
            continue;
        }
        if std::fs::remove_file(&entry.path).is_ok() {
            tracing::debug!(
                "evicted {} ({} bytes) from the compile cache",
                entry.path.display(),
                entry.bytes
            );
            total = total.saturating_sub(entry.bytes);
        }
    }
}

/// Where a cache folder keeps its entries.
fn entries_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("components")
}

/// One compiled component on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub path: PathBuf,
    /// The plugin it was compiled from (a built-in's name, a file's name); empty when unknown.
    pub plugin: String,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// The entries of the cache folder `cache_dir` (what [`default_cache_dir`] names), least
/// recently used first; none when the folder does not exist.
pub fn cache_entries(cache_dir: &Path) -> std::io::Result<Vec<CacheEntry>> {
    let mut entries = list_entries(&entries_dir(cache_dir))?;
    entries.sort_by_key(|e| e.last_used);
    for entry in &mut entries {
        entry.plugin = entry_name(&entry.path);
    }
    Ok(entries)
}

/// Removes every entry of the cache folder `cache_dir`: how many, and their bytes.
pub fn clear_cache(cache_dir: &Path) -> std::io::Result<(usize, u64)> {
    let mut removed = (0, 0);
    for entry in list_entries(&entries_dir(cache_dir))? {
        match std::fs::remove_file(&entry.path) {
            Ok(()) => {
                removed.0 += 1;
                removed.1 += entry.bytes;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

fn list_entries(dir: &Path) -> std::io::Result<Vec<CacheEntry>> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut entries = Vec::new();
    for item in read {
        let item = item?;
        let path = item.path();
        if path.extension().is_none_or(|x| x != "cwasm") {
            continue;
        }
        let Ok(meta) = item.metadata() else { continue };
        // The plugin's name is read from the file only where it is shown ([`cache_entries`]),
        // not on every eviction.
        entries.push(CacheEntry {
            plugin: String::new(),
            bytes: meta.len(),
            last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            path,
        });
    }
    Ok(entries)
}

/// The plugin name in a cache file's header (read from its first bytes only).
fn entry_name(path: &Path) -> String {
    use std::io::Read;
    let mut head = [0u8; 256];
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let n = file.read(&mut head).unwrap_or(0);
    split_header(&head[..n])
        .map(|(name, _)| name.to_string())
        .unwrap_or_default()
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
        bytes.extend_from_slice(b"p\n");
        bytes.extend_from_slice(&[0; 20]);
        assert_eq!(check(&bytes), Err("truncated"));
        let compiled = b"not really compiled";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(b"least-loaded\n");
        bytes.extend_from_slice(&Sha256::digest(compiled));
        bytes.extend_from_slice(compiled);
        assert_eq!(check(&bytes), Err("not a compiled component"));
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(check(&bytes).unwrap_err().contains("corrupt"));
        assert_eq!(split_header(&bytes).unwrap().0, "least-loaded");
    }

    #[test]
    fn eviction_keeps_the_most_recently_used_within_the_cap() {
        let dir = std::env::temp_dir().join(format!("orch-evict-{}", std::process::id()));
        let entries = entries_dir(&dir);
        std::fs::create_dir_all(&entries).unwrap();
        let now = SystemTime::now();
        let mut paths = Vec::new();
        for (i, age_s) in [(0, 30), (1, 10), (2, 20), (3, 0)] {
            let path = entries.join(format!("{i}.cwasm"));
            std::fs::write(&path, vec![0u8; 1000]).unwrap();
            let f = std::fs::File::options().append(true).open(&path).unwrap();
            f.set_modified(now - std::time::Duration::from_secs(age_s))
                .unwrap();
            paths.push(path);
        }
        // 4000 bytes, a cap of 2500: the two oldest (0, then 2) go; 3 was just written.
        evict(&paths[3], 2500);
        let left: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(left, vec![false, true, false, true]);
        // A hit makes an entry the newest.
        touch(&paths[1]);
        let listed = cache_entries(&dir).unwrap();
        assert_eq!(
            listed.last().map(|e| e.path.clone()),
            Some(paths[1].clone())
        );
        assert_eq!(clear_cache(&dir).unwrap(), (2, 2000));
        assert!(cache_entries(&dir).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
