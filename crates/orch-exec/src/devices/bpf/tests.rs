use super::*;

/// Runs `program` as the kernel would on one access: the verdict (1 allow, 0 deny). Knows exactly
/// the instructions the builder emits; anything else fails the test.
fn run(program: &[Insn], access_type: u32, major: u32, minor: u32) -> u64 {
    let ctx = [access_type, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..10_000 {
        let i = program[pc];
        let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
        let imm = i.imm as u32 as u64;
        let mut next = pc + 1;
        let jump = |taken: bool| {
            if taken {
                (pc as isize + 1 + i.off as isize) as usize
            } else {
                pc + 1
            }
        };
        match i.code {
            LDX_MEM_W => {
                assert_eq!(src, 1, "loads read the context");
                r[dst] = u64::from(ctx[i.off as usize / 4]);
            }
            ALU32_AND_K => r[dst] = (r[dst] as u32 & i.imm as u32) as u64,
            ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
            JMP_JEQ_K => next = jump(r[dst] == imm),
            JMP_JNE_K => next = jump(r[dst] != imm),
            JMP_JLT_K => next = jump(r[dst] < imm),
            JMP_JLE_K => next = jump(r[dst] <= imm),
            JMP_JA => next = jump(true),
            JMP_EXIT => return r[0],
            other => panic!("unexpected opcode {other:#x} at {pc}"),
        }
        assert!(next < program.len(), "jump out of the program at {pc}");
        pc = next;
    }
    panic!("the program did not end");
}

const CHAR: u32 = 2;
const BLOCK: u32 = 1;
const READ_WRITE: u32 = (2 | 4) << 16;

/// Every instruction is reachable (the verifier refuses a program otherwise) and every jump lands
/// inside it.
fn assert_well_formed(program: &[Insn]) {
    let mut reached = vec![false; program.len()];
    let mut todo = vec![0usize];
    while let Some(pc) = todo.pop() {
        if std::mem::replace(&mut reached[pc], true) {
            continue;
        }
        let i = program[pc];
        match i.code {
            JMP_EXIT => {}
            JMP_JA => {
                let to = pc as isize + 1 + i.off as isize;
                assert!(to > pc as isize && (to as usize) < program.len());
                todo.push(to as usize);
            }
            JMP_JEQ_K | JMP_JNE_K | JMP_JLT_K | JMP_JLE_K => {
                let to = pc as isize + 1 + i.off as isize;
                assert!(to > pc as isize && (to as usize) < program.len());
                todo.extend([pc + 1, to as usize]);
            }
            _ => todo.push(pc + 1),
        }
    }
    assert!(reached.iter().all(|&r| r), "unreachable instructions");
}

#[test]
fn the_program_denies_exactly_the_rules_minors_of_char_major_195() {
    let rules = [
        DeviceRule::granting(&[1]),
        DeviceRule::granting(&[0]),
        DeviceRule::granting(&[253]),
        DeviceRule::granting(&[0, 2, 3, 7, 100]),
        DeviceRule::granting(&[]),
        DeviceRule::denying(&[5]),
        DeviceRule::denying(&[0, 1, 2, 9, 11]),
        DeviceRule::denying(&[]),
    ];
    for rule in &rules {
        let program = program(rule);
        assert_well_formed(&program);
        for minor in 0..=300 {
            let denied = rule.denied().contains(&minor);
            assert_eq!(
                run(&program, CHAR | READ_WRITE, 195, minor),
                u64::from(!denied),
                "{rule:?}: c 195:{minor}"
            );
            // Another major, or a block device with the same numbers: always allowed.
            assert_eq!(run(&program, CHAR | READ_WRITE, 1, minor), 1);
            assert_eq!(run(&program, CHAR | READ_WRITE, 511, minor), 1);
            assert_eq!(run(&program, BLOCK | READ_WRITE, 195, minor), 1);
        }
    }
}

#[test]
fn the_control_nodes_stay_open() {
    let program = program(&DeviceRule::granting(&[]));
    for minor in [254, 255] {
        assert_eq!(run(&program, CHAR | READ_WRITE, 195, minor), 1);
    }
    assert_eq!(run(&program, CHAR | READ_WRITE, 195, 253), 0);
}

#[test]
fn consecutive_minors_become_one_range() {
    let rule = DeviceRule::denying(&[7, 0, 1, 2, 4, 6, 253, 254, 2]);
    assert_eq!(rule.ranges(), vec![(0, 2), (4, 4), (6, 7), (253, 253)]);
    assert_eq!(rule.to_string(), "c 195:0-2,4,6-7,253");
    assert!(DeviceRule::denying(&[]).ranges().is_empty());
    // Granting one GPU of 254 possible: two ranges, a handful of instructions.
    assert!(program(&DeviceRule::granting(&[3])).len() <= 14);
}

/// The kernel's verifier accepts what the builder makes (where this process may load programs;
/// the end-to-end tests in tests/cli/constrain.rs attach them).
#[test]
fn the_kernel_accepts_the_programs() {
    if probe().is_err() {
        assert!(
            std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_none()
                || crate::devices::v1_available(),
            "ORCH_REQUIRE_DEVICE_CONSTRAINT is set but no device program loads: {:?}",
            probe()
        );
        return;
    }
    for rule in [
        DeviceRule::granting(&[1]),
        DeviceRule::granting(&[0, 2, 3, 7, 100]),
        DeviceRule::denying(&[]),
        DeviceRule::granting(&[1]).with_caps(234, &[3, 4, 9]),
        DeviceRule::denying(&[]).with_caps(234, &[3]),
    ] {
        load(&program(&rule)).unwrap_or_else(|e| panic!("{rule:?}: {e}"));
    }
}

#[test]
fn the_program_denies_other_slices_capability_nodes_of_their_own_major() {
    const CAPS: u32 = 234;
    for rule in [
        DeviceRule::granting(&[1]).with_caps(CAPS, &[3, 4, 9, 10, 11]),
        DeviceRule::denying(&[]).with_caps(CAPS, &[12]),
        DeviceRule::denying(&[0, 2]).with_caps(CAPS, &[0, 1]),
    ] {
        let program = program(&rule);
        assert_well_formed(&program);
        let (_, caps) = rule.caps().unwrap();
        for minor in 0..=300 {
            assert_eq!(
                run(&program, CHAR | READ_WRITE, 195, minor),
                u64::from(!rule.denied().contains(&minor)),
                "{rule:?}: c 195:{minor}"
            );
            assert_eq!(
                run(&program, CHAR | READ_WRITE, CAPS, minor),
                u64::from(!caps.contains(&minor)),
                "{rule:?}: c {CAPS}:{minor}"
            );
            assert_eq!(run(&program, CHAR | READ_WRITE, 1, minor), 1);
            assert_eq!(run(&program, BLOCK | READ_WRITE, CAPS, minor), 1);
        }
    }
    assert_eq!(
        DeviceRule::granting(&[1])
            .with_caps(CAPS, &[9, 3, 4])
            .to_string(),
        "c 195:0,2-253 and c 234:3-4,9"
    );
    assert_eq!(
        DeviceRule::denying(&[]).with_caps(CAPS, &[]).to_string(),
        "nothing"
    );
}
