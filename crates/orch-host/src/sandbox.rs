//! What a plugin's store holds: a WASI context that grants nothing, the resource limiter, and
//! the pipe that turns the guest's stdout/stderr into host log lines under the plugin's name.
//!
//! Rust guests built with std import WASI (cli, io, filesystem, random, clocks) even when
//! unused, so the linker provides it, with nothing behind it: no preopened folder, no socket,
//! no environment, no arguments, no stdin. The clocks are not granted either: their functions
//! trap with a message saying so (a policy decides on what the host passes it, not on the time).
//! Random numbers are a fixed sequence from a fixed seed, restarted with every instance (Python
//! and JavaScript guests read it to start up): a plugin's answer depends on its arguments only,
//! and a fresh instance given the same arguments gives the same answer.

use crate::engine::CallClock;
use crate::limits::Limits;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// The seed of every plugin instance's random numbers (`wasi:random`).
const RANDOM_SEED: u64 = 0x6f72_6368; // "orch"

/// The data of one plugin store.
pub struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: Limiter,
    pub log: GuestLog,
    /// Set when the plugin called something the sandbox does not grant.
    pub denied: Option<&'static str>,
    /// The current call's deadline, in the plugin's running time (see [`CallClock`]).
    pub clock: CallClock,
}

impl std::fmt::Debug for PluginState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginState")
            .field("denied", &self.denied)
            .finish_non_exhaustive()
    }
}

impl PluginState {
    pub fn new(plugin: &str, limits: &Limits) -> PluginState {
        let log = GuestLog::new(plugin, limits.log_bytes_per_call);
        let mut wasi = WasiCtx::builder();
        wasi.stdout(log.clone())
            .stderr(log.clone())
            .secure_random(StdRng::seed_from_u64(RANDOM_SEED))
            .insecure_random(StdRng::seed_from_u64(RANDOM_SEED ^ 1))
            .insecure_random_seed(u128::from(RANDOM_SEED));
        PluginState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: Limiter::new(limits),
            log,
            denied: None,
            clock: CallClock::start(limits.deadline),
        }
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Store data holding a [`PluginState`]: what [`add_wasi`] needs, so another host (the trainer
/// host) can keep the same sandbox inside its own store data.
pub trait HasPluginState: WasiView + 'static {
    fn plugin_state(&mut self) -> &mut PluginState;
}

impl HasPluginState for PluginState {
    fn plugin_state(&mut self) -> &mut PluginState {
        self
    }
}

/// Adds deny-all WASI to `linker`, with the clock functions replaced by traps.
pub fn add_wasi<T: HasPluginState>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let clocks: [(&str, &[&str]); 2] = [
        ("wasi:clocks/wall-clock@0.2.12", &["now", "resolution"]),
        (
            "wasi:clocks/monotonic-clock@0.2.12",
            &[
                "now",
                "resolution",
                "subscribe-instant",
                "subscribe-duration",
            ],
        ),
    ];
    for (interface, functions) in clocks {
        let mut instance = linker.instance(interface)?;
        for &function in functions {
            instance.func_new(function, move |mut store, _ty, _params, _results| {
                store.data_mut().plugin_state().denied = Some("the clock");
                Err(wasmtime::format_err!(
                    "plugins have no clock: called {interface}.{function}"
                ))
            })?;
        }
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// wasmtime's [`StoreLimits`] for tables and instances, and the memory cap over all of the
/// plugin's linear memories together (a component of several core modules has several; wasmtime's
/// own limit applies to each alone), remembering whether the cap was what stopped the plugin.
#[derive(Debug)]
pub struct Limiter {
    inner: StoreLimits,
    memory_cap: usize,
    /// Bytes of linear memory the store's memories hold together.
    memory_total: usize,
    pub memory_exceeded: bool,
}

impl Limiter {
    fn new(limits: &Limits) -> Limiter {
        Limiter {
            inner: StoreLimitsBuilder::new()
                .table_elements(limits.table_elements)
                .instances(limits.instances)
                .tables(limits.tables)
                .memories(limits.memories)
                .trap_on_grow_failure(true)
                .build(),
            memory_cap: limits.memory_bytes,
            memory_total: 0,
            memory_exceeded: false,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A new memory comes in as a grow from 0, so the total counts every memory from its
        // creation. (A grow refused after this approves it stays counted: the plugin is then
        // failing anyway.)
        let total = self
            .memory_total
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_cap {
            self.memory_exceeded = true;
            return Err(wasmtime::format_err!(
                "growing a memory to {desired} bytes would take the plugin's memories to {total} bytes together, past its cap of {}",
                self.memory_cap
            ));
        }
        if !self.inner.memory_growing(current, desired, maximum)? {
            return Ok(false);
        }
        self.memory_total = total;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// The guest's stdout and stderr: each line goes to the host log (`tracing`, target
/// `orch::plugin`, level debug) as `[plugin NAME] LINE`; the last lines are kept for error messages. A call
/// may log `budget` bytes; the rest is dropped (a plugin cannot flood the log).
#[derive(Clone)]
pub struct GuestLog {
    inner: Arc<Mutex<LogState>>,
}

impl std::fmt::Debug for GuestLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestLog").finish_non_exhaustive()
    }
}

struct LogState {
    plugin: String,
    budget: usize,
    left: usize,
    partial: Vec<u8>,
    recent: VecDeque<String>,
    dropped: bool,
}

/// Lines of guest output kept for an error message.
const RECENT_LINES: usize = 6;

impl GuestLog {
    fn new(plugin: &str, budget: usize) -> GuestLog {
        GuestLog {
            inner: Arc::new(Mutex::new(LogState {
                plugin: plugin.to_string(),
                budget,
                left: budget,
                partial: Vec::new(),
                recent: VecDeque::new(),
                dropped: false,
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, LogState> {
        orch_core::sync::lock(&self.inner)
    }

    /// Starts a call: a fresh byte budget, no remembered lines.
    pub fn begin_call(&self) {
        let mut state = self.state();
        state.left = state.budget;
        state.recent.clear();
        state.dropped = false;
    }

    /// Ends a call: logs a last unterminated line, returns the last lines the guest wrote.
    pub fn end_call(&self) -> Vec<String> {
        let mut state = self.state();
        if !state.partial.is_empty() {
            state.emit_partial();
        }
        state.recent.iter().cloned().collect()
    }

    fn write(&self, bytes: &[u8]) {
        let mut state = self.state();
        let take = bytes.len().min(state.left);
        state.left -= take;
        for &byte in &bytes[..take] {
            if byte == b'\n' {
                state.emit_partial();
            } else {
                state.partial.push(byte);
            }
        }
        if take < bytes.len() && !state.dropped {
            state.dropped = true;
            tracing::warn!(
                target: "orch::plugin",
                "[plugin {}] wrote more than {} bytes in one call; the rest is dropped",
                state.plugin,
                state.budget
            );
        }
    }
}

impl LogState {
    fn emit_partial(&mut self) {
        let line = printable(&String::from_utf8_lossy(&self.partial));
        self.partial.clear();
        // Debug: the lines that matter when a plugin fails are in the error already.
        tracing::debug!(target: "orch::plugin", "[plugin {}] {line}", self.plugin);
        // Keep what explains a failure: not blank lines, not Rust's backtrace advice.
        if line.is_empty() || line.starts_with("note: run with `RUST_BACKTRACE") {
            return;
        }
        if self.recent.len() == RECENT_LINES {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }
}

/// `text` with unprintable characters ([`orch_core::text::is_unprintable`]: terminal escapes,
/// line breaks, bidirectional overrides) replaced by spaces, and no trailing blanks: how text
/// from a plugin (its output, a trap's message) is shown.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if orch_core::text::is_unprintable(c) {
                ' '
            } else {
                c
            }
        })
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// At most `max_chars` characters of `text`, made [`printable`], with `... (N bytes)` after
/// them when `text` was longer: how an error quotes a value a plugin supplied (a name, a
/// message). Only the quoted prefix is read and copied, so a value of any size costs the host
/// no more than the prefix.
pub fn shortened(text: &str, max_chars: usize) -> String {
    let end = text
        .char_indices()
        .nth(max_chars)
        .map_or(text.len(), |(at, _)| at);
    let mut out = printable(&text[..end]);
    if end < text.len() {
        out.push_str(&format!("... ({} bytes)", text.len()));
    }
    out
}

impl IsTerminal for GuestLog {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestLog {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestLog {
    async fn ready(&mut self) {}
}

impl OutputStream for GuestLog {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        GuestLog::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

impl tokio::io::AsyncWrite for GuestLog {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_value_is_a_short_printable_prefix_with_its_size() {
        assert_eq!(shortened("conv.weight", 64), "conv.weight");
        assert_eq!(shortened("a\u{1b}[2Jb", 64), "a [2Jb");
        let huge = "é".repeat(10 << 20);
        let quoted = shortened(&huge, 64);
        assert_eq!(
            quoted,
            format!("{}... ({} bytes)", "é".repeat(64), 20 << 20)
        );
    }

    #[test]
    fn the_memory_cap_holds_for_all_memories_together() {
        let limits = Limits {
            memory_bytes: 64 << 20,
            ..Limits::default()
        };
        let mut limiter = Limiter::new(&limits);
        // Two memories of 40 MiB: each under the cap, both over it.
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
        assert!(!limiter.memory_exceeded);
        assert!(limiter.memory_growing(0, 40 << 20, None).is_err());
        assert!(limiter.memory_exceeded);
        // Growing the first within what is left is fine.
        let mut limiter = Limiter::new(&limits);
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 16 << 20, None).unwrap());
        assert!(limiter.memory_growing(40 << 20, 48 << 20, None).unwrap());
        assert!(limiter.memory_growing(48 << 20, 49 << 20, None).is_err());
    }

    #[test]
    fn lines_are_kept_and_the_budget_holds() {
        let log = GuestLog::new("p", 12);
        log.begin_call();
        log.write(b"first\nsecond\nthird is cut");
        assert_eq!(log.end_call(), vec!["first", "second"]);
        log.begin_call();
        log.write(b"\x1b[31mred\n");
        assert_eq!(log.end_call(), vec![" [31mred"]);
    }
}
