//! How policies write devices and sizes in their reasons, the same way the host does.
//!
//! Plain pushes onto a `String` with hand-rolled integer printing, no `format!`: in wasm the
//! formatting machinery costs more than the rest of a decision. This file depends on nothing
//! else in the kit, so the host's benchmark compiles the very same code natively as its
//! baseline.

/// Appends `n` in decimal.
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// Appends a size in binary units with one decimal (`2.1 GiB`, `512 B`), as orch prints sizes
/// everywhere.
pub fn push_size(out: &mut String, bytes: u64) {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit < UNITS.len() - 1 && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        push_u64(out, bytes);
        out.push_str(" B");
        return;
    }
    let scale = 1u128 << (10 * unit);
    let tenths = ((u128::from(bytes) * 10 + scale / 2) / scale) as u64;
    push_u64(out, tenths / 10);
    out.push('.');
    push_u64(out, tenths % 10);
    out.push(' ');
    out.push_str(UNITS[unit]);
}

/// A size as [`push_size`] writes it.
pub fn size(bytes: u64) -> String {
    let mut out = String::new();
    push_size(&mut out, bytes);
    out
}

/// Appends `GPU 3` (the physical number nvidia-smi shows), with the CUDA index when it differs.
pub fn push_label(out: &mut String, physical: u32, index: u32) {
    out.push_str("GPU ");
    push_u64(out, u64::from(physical));
    if index != physical {
        out.push_str(" (CUDA ");
        push_u64(out, u64::from(index));
        out.push(')');
    }
}

/// Appends `MIG 1g.10gb of GPU 0 (9.8 GiB free)`: what a reason says of a chosen MIG slice (it
/// has no CUDA index of its own, and NVML no utilization reading of it).
pub fn push_slice_summary(out: &mut String, profile: &str, parent: u32, free: Option<u64>) {
    out.push_str("MIG ");
    out.push_str(profile);
    out.push_str(" of GPU ");
    push_u64(out, u64::from(parent));
    match free {
        Some(free) => {
            out.push_str(" (");
            push_size(out, free);
            out.push_str(" free)");
        }
        None => out.push_str(" (free unknown)"),
    }
}

/// Appends `GPU 1 (0% busy, 79.5 GiB free)`: what a reason says of a chosen device.
pub fn push_summary(
    out: &mut String,
    physical: u32,
    index: u32,
    busy: Option<u32>,
    free: Option<u64>,
) {
    push_label(out, physical, index);
    out.push_str(" (");
    match busy {
        Some(busy) => {
            push_u64(out, u64::from(busy));
            out.push_str("% busy, ");
        }
        None => out.push_str("busy unknown, "),
    }
    match free {
        Some(free) => {
            push_size(out, free);
            out.push_str(" free)");
        }
        None => out.push_str("free unknown)"),
    }
}
