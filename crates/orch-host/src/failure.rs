//! Why a plugin call failed, read from the sandbox's state and the engine's error. The policy
//! host and the trainer host both turn it into their own error type, with the plugin's name and
//! what they were doing; the reading of the sandbox and the trap lives here, once.

use crate::sandbox::{PluginState, shortened};
use wasmtime::Trap;

/// Most characters of a trap's text an error quotes.
const MAX_TRAP_CHARS: usize = 2000;

/// What stopped a plugin call, as the sandbox saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The plugin asked for more linear memory (or tables, instances) than its limit allows.
    MemoryLimit,
    /// The plugin called something the sandbox does not grant.
    Denied(&'static str),
    /// The call ran past its deadline (epoch interruption).
    Timeout,
    /// The plugin trapped, or the engine failed: what happened, in printable text.
    Crashed(String),
}

/// Classifies `error`, returned by a call into the plugin whose store data is `state`. The
/// sandbox's own records come first: a refused memory grow or a denied call also ends in a trap,
/// and the trap alone would not say why.
pub fn classify(state: &PluginState, error: &wasmtime::Error) -> CallFailure {
    if state.limiter.memory_exceeded {
        return CallFailure::MemoryLimit;
    }
    if let Some(what) = state.denied {
        return CallFailure::Denied(what);
    }
    let trap = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => return CallFailure::Timeout,
        Some(Trap::StackOverflow) => "stack overflow".to_string(),
        // Rust guests keep their own stack in linear memory, below address 0 when overflowed:
        // the trap cannot tell the two apart, so the message names both.
        Some(Trap::MemoryOutOfBounds) => {
            "out-of-bounds memory access, as when a plugin overflows its own stack".to_string()
        }
        Some(trap) => trap.to_string(),
        None => format!("{error:#}"),
    };
    // A trap's text can carry the plugin's own function names (its backtrace): bounded.
    CallFailure::Crashed(shortened(&trap, MAX_TRAP_CHARS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;

    fn state() -> PluginState {
        PluginState::new("p", &Limits::default())
    }

    #[test]
    fn the_sandbox_records_come_before_the_trap() {
        let trap = wasmtime::Error::from(Trap::UnreachableCodeReached);
        let mut s = state();
        s.denied = Some("the clock");
        assert_eq!(classify(&s, &trap), CallFailure::Denied("the clock"));
        s.limiter.memory_exceeded = true;
        assert_eq!(classify(&s, &trap), CallFailure::MemoryLimit);
    }

    #[test]
    fn traps_are_named_in_words() {
        let s = state();
        let of = |trap: Trap| classify(&s, &wasmtime::Error::from(trap));
        assert_eq!(of(Trap::Interrupt), CallFailure::Timeout);
        assert_eq!(
            of(Trap::StackOverflow),
            CallFailure::Crashed("stack overflow".into())
        );
        let CallFailure::Crashed(text) = of(Trap::MemoryOutOfBounds) else {
            panic!("a crash");
        };
        assert!(text.contains("overflows its own stack"), "{text}");
        let other = wasmtime::Error::msg("engine said\u{1b}[31m no");
        assert_eq!(
            classify(&s, &other),
            CallFailure::Crashed("engine said [31m no".into()),
            "control characters are not passed on"
        );
    }
}
