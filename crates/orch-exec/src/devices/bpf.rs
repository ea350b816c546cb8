//! The cgroup v2 device program (`BPF_PROG_TYPE_CGROUP_DEVICE`): a few hand-assembled eBPF
//! instructions, loaded and attached through the raw `bpf(2)` system call, as systemd
//! (`bpf-devices.c`), runc (`devicefilter.go`) and crun do it without a BPF library.
//!
//! The kernel runs the program on every device access (open, mknod) of a process in the cgroup or
//! below it, with `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`
//! (`access_type` is `(access << 16) | type`, type 1 block, 2 char); it returns 1 to allow and
//! 0 to deny (the open fails with EPERM). Ours denies character devices of major 195 whose minor
//! is in the rule's denied set and allows everything else:
//!
//! ```text
//!     r2 = *(u32 *)(r1 + 0)      access_type
//!     w2 &= 0xffff               its device type
//!     r3 = *(u32 *)(r1 + 4)      major
//!     r4 = *(u32 *)(r1 + 8)      minor
//!     if r2 != 2 goto allow      not a character device
//!     if r3 != 195 goto allow    not an NVIDIA node
//!     per denied range lo..=hi:  if r4 < lo goto next; if r4 <= hi goto deny
//! allow: r0 = 1; exit
//! deny:  r0 = 0; exit
//! ```

use super::DeviceRule;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction, as `struct bpf_insn` lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    /// `dst_reg` in the low four bits, `src_reg` in the high four.
    pub(crate) regs: u8,
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

// Opcodes: class | operation | source (BPF_K: the immediate).
pub(crate) const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
pub(crate) const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
pub(crate) const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
pub(crate) const JMP_JEQ_K: u8 = 0x15;
pub(crate) const JMP_JNE_K: u8 = 0x55;
pub(crate) const JMP_JLT_K: u8 = 0xa5;
pub(crate) const JMP_JLE_K: u8 = 0xb5;
pub(crate) const JMP_EXIT: u8 = 0x95;

/// `BPF_DEVCG_DEV_CHAR`.
const DEV_CHAR: i32 = 2;

// bpf(2) commands, the program type, the attach type and its flag (include/uapi/linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
/// Other programs may be attached above and below; all of them must allow an access.
const BPF_F_ALLOW_MULTI: u32 = 2;

pub(crate) const JMP_JA: u8 = 0x05;

/// Where a jump goes before offsets are known.
#[derive(Clone, Copy)]
enum Target {
    Allow,
    Deny,
    /// The first instruction of the block of another major (or `Allow` after the last).
    Block(usize),
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0x0f) | (src << 4),
        off,
        imm,
    }
}

/// The program for `rule`. It has a deny block only when the rule denies something: the kernel's
/// verifier refuses a program with an instruction that cannot be reached.
pub(crate) fn program(rule: &DeviceRule) -> Vec<Insn> {
    let mut body: Vec<(Insn, Option<Target>)> = vec![
        (insn(LDX_MEM_W, 2, 1, 0, 0), None),
        (insn(ALU32_AND_K, 2, 0, 0, 0xffff), None),
        (insn(LDX_MEM_W, 3, 1, 4, 0), None),
        (insn(LDX_MEM_W, 4, 1, 8, 0), None),
    ];
    let blocks = rule.blocks();
    let denies = !blocks.is_empty();
    if denies {
        body.push((insn(JMP_JNE_K, 2, 0, 0, DEV_CHAR), Some(Target::Allow)));
    }
    // One block per major: not this major, on to the next block; a minor in a denied range,
    // deny; else allow (the last block falls through to it).
    let mut starts = Vec::with_capacity(blocks.len());
    let count = blocks.len();
    for (k, (major, ranges)) in blocks.into_iter().enumerate() {
        starts.push(body.len());
        let next = if k + 1 < count {
            Target::Block(k + 1)
        } else {
            Target::Allow
        };
        body.push((insn(JMP_JNE_K, 3, 0, 0, major as i32), Some(next)));
        for (lo, hi) in ranges {
            if lo == hi {
                body.push((insn(JMP_JEQ_K, 4, 0, 0, lo as i32), Some(Target::Deny)));
                continue;
            }
            if lo > 0 {
                // Below the range: skip its upper test.
                body.push((insn(JMP_JLT_K, 4, 0, 1, lo as i32), None));
            }
            body.push((insn(JMP_JLE_K, 4, 0, 0, hi as i32), Some(Target::Deny)));
        }
        if k + 1 < count {
            body.push((insn(JMP_JA, 0, 0, 0, 0), Some(Target::Allow)));
        }
    }
    let allow = body.len();
    let deny = allow + 2;
    let mut out: Vec<Insn> = body
        .into_iter()
        .enumerate()
        .map(|(at, (mut i, target))| {
            if let Some(target) = target {
                let to = match target {
                    Target::Allow => allow,
                    Target::Deny => deny,
                    Target::Block(k) => starts[k],
                };
                // A jump's offset counts from the instruction after it.
                i.off = (to - at - 1) as i16;
            }
            i
        })
        .collect();
    out.push(insn(ALU64_MOV_K, 0, 0, 0, 1));
    out.push(insn(JMP_EXIT, 0, 0, 0, 0));
    if denies {
        out.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
        out.push(insn(JMP_EXIT, 0, 0, 0, 0));
    }
    out
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// `bpf(cmd, attr, sizeof attr)`; the fd or value it returns, else the errno's text.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> Result<i64, std::io::Error> {
    // SAFETY: `attr` is a live, initialised `repr(C)` bpf_attr prefix of the size passed; the
    // kernel reads (and for PROG_LOAD writes the log through) only what it points to.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Loads the program; a verifier's refusal comes back with its log.
pub(crate) fn load(program: &[Insn]) -> Result<OwnedFd, String> {
    let license = c"Apache-2.0";
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"orch_devices");
    let attempt = |log: &mut [u8]| {
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: program.len() as u32,
            insns: program.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name: name,
            ..ProgLoadAttr::default()
        };
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    let fd = match attempt(&mut []) {
        Ok(fd) => fd,
        Err(first) => {
            let mut log = vec![0u8; 16 * 1024];
            let again = attempt(&mut log);
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            match again {
                Ok(fd) => fd,
                Err(_) if !text.is_empty() => {
                    return Err(format!(
                        "the kernel refused the device program ({first}): {text}"
                    ));
                }
                Err(_) => return Err(format!("cannot load a device program: {first}")),
            }
        }
    };
    // SAFETY: a successful BPF_PROG_LOAD returns a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A program attached to a cgroup; [`Attached::detach`] takes it off again.
#[derive(Debug)]
pub(crate) struct Attached {
    cgroup: OwnedFd,
    program: OwnedFd,
}

/// Loads the program for `rule` and attaches it to the v2 cgroup `dir` (beside any program
/// attached above it: every one of them must allow an access).
pub(crate) fn attach(dir: &Path, rule: &DeviceRule) -> Result<Attached, String> {
    let program = load(&program(rule))?;
    let cgroup: OwnedFd = std::fs::File::open(dir)
        .map_err(|e| format!("cannot open the cgroup {}: {e}", dir.display()))?
        .into();
    let mut attr = AttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: program.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map_err(|e| {
        format!(
            "cannot attach the device program to the cgroup {}: {e}",
            dir.display()
        )
    })?;
    Ok(Attached { cgroup, program })
}

impl Attached {
    /// Takes the program off its cgroup. A cgroup already removed took it along.
    pub(crate) fn detach(&self) {
        let mut attr = AttachAttr {
            target_fd: self.cgroup.as_raw_fd() as u32,
            attach_bpf_fd: self.program.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_DEVICE,
            attach_flags: 0,
        };
        if let Err(e) = bpf(BPF_PROG_DETACH, &mut attr) {
            tracing::debug!("detaching the device program: {e}");
        }
    }
}

/// Whether this kernel and these privileges let orch load a device program at all (seccomp,
/// a kernel without `CONFIG_CGROUP_BPF`, no `CAP_BPF`/`CAP_SYS_ADMIN`).
pub(crate) fn probe() -> Result<(), String> {
    load(&program(&DeviceRule::denying(&[0]))).map(drop)
}

#[cfg(test)]
mod tests;
