//! Where pymalloc's footprint grows in `allocate_from_new_pool`: its carve
//! blocks, where a never used pool is cut from an arena.
//!
//! Objects/obmalloc.c (v3.10.13, v3.11.7, v3.12.1, v3.13.0, v3.14.8) carves
//! in one branch: `pool = (poolp)usable_arenas->pool_address; … ;
//! usable_arenas->pool_address += POOL_SIZE;`. A new arena's first pool is
//! carved there too (`new_arena` leaves `freepools` NULL). Compilers copy
//! the branch (pyenv's 3.10 and 3.11 have one copy after `new_arena` and
//! one for a usable arena; forky's LTO 3.13 and 3.14 one for an arena with
//! pools left after it and one for its last), but every copy is the same
//! three instructions, in straight-line code:
//!
//! ```text
//! mov 0x8(%rB),%rP          the pool: the arena's pool_address
//! lea 0x4000(%rP),%rQ       POOL_SIZE further
//! mov %rQ,0x8(%rB)          stored back
//! ```
//!
//! The rule: every `lea POOL_SIZE(%rP),%rQ` of the function must be such a
//! copy (an advance by `POOL_SIZE` written otherwise, `add $POOL_SIZE`, makes
//! the copies unknown: none is probed, and the plan falls back to every
//! take). In each copy the probe goes on the first instruction from the
//! load on that the kernel emulates, with `%rP` intact, where no branch
//! lands after the load (each of its hits is then this copy's carve), and
//! reads the pool in `%rP`; where there is none (forky's first copy runs
//! into the code that initialises any pool taken), on the load itself,
//! single-stepped, reading the pool where the load reads it,
//! `0x8(%rB)`.

use std::collections::HashSet;

use iced_x86::{FlowControl, InstructionInfoFactory, Mnemonic, OpKind, Register};
use tracer_common::{
    growth::{self, ARENA_POOL_ADDRESS},
    site,
};

use super::{Found, dwarf};
use crate::plan::placement::{self, KernelVersion, Step};

/// How many instructions a copy's load, add and store may be apart.
const SPREAD: usize = 16;

/// How many instructions past the load the probe may go.
const REACH: usize = 48;

/// The probes of every carve copy in the function whose code (from its
/// entry) is `code` at `address`, for pools of `pool_size` bytes; Err why
/// they cannot all be found.
pub(super) fn points(code: &[u8], address: u64, pool_size: u64, kernel: KernelVersion) -> Result<Vec<Found>, String> {
    let steps: Vec<Step> = placement::instructions(code, address).collect();
    let end = address + steps.last().map_or(0, |s| s.offset + s.bytes.len() as u64);
    let targets: HashSet<u64> = steps
        .iter()
        .filter(|s| {
            matches!(
                s.instr.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
            )
        })
        .map(|s| s.instr.near_branch_target())
        .filter(|t| (address..end).contains(t))
        .collect();
    let mut info = InstructionInfoFactory::new();
    let mut found = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match advance(s, pool_size) {
            Advance::None => {}
            Advance::Other => {
                return Err(format!(
                    "`{}` at +{:#x} advances by POOL_SIZE in no form of a carve (a load, lea and store of pool_address)",
                    s.shown, s.offset
                ));
            }
            Advance::Lea { from, to } => {
                let copy = copy_at(&steps, i, (from, to), &mut info).ok_or_else(|| {
                    format!(
                        "`{}` at +{:#x} is not between a load and a store of an arena's pool_address (+{ARENA_POOL_ADDRESS})",
                        s.shown, s.offset
                    )
                })?;
                // A branch into the copy, past its load and up to its
                // store, would carve with no hit of its probe.
                if let Some(s) = steps[copy.load + 1..=copy.store].iter().find(|s| targets.contains(&s.instr.ip())) {
                    return Err(format!(
                        "a branch lands at +{:#x}, inside the carve of pool_address loaded at +{:#x}: a carve through it would not be seen",
                        s.offset, steps[copy.load].offset
                    ));
                }
                found.push(probe(&steps, copy, &targets, &mut info, kernel)?);
            }
        }
    }
    if found.is_empty() {
        return Err(format!("no carve of a pool found (no `lea {pool_size:#x}(%r),%r` stored back to pool_address)"));
    }
    Ok(found)
}

/// What an instruction does with `POOL_SIZE`.
enum Advance {
    None,
    /// `lea POOL_SIZE(%from),%to`, 64-bit.
    Lea {
        from: Register,
        to: Register,
    },
    /// Another instruction that adds `POOL_SIZE` (`add $POOL_SIZE`).
    Other,
}

fn advance(s: &Step, pool_size: u64) -> Advance {
    let i = &s.instr;
    match i.mnemonic() {
        Mnemonic::Lea if i.memory_displacement64() == pool_size => {
            if i.op0_register().size() == 8
                && i.memory_index() == Register::None
                && i.memory_base().size() == 8
                && i.memory_base() != Register::RIP
            {
                Advance::Lea { from: i.memory_base(), to: i.op0_register() }
            } else {
                Advance::Other
            }
        }
        Mnemonic::Add | Mnemonic::Sub
            if (0..i.op_count()).any(|n| {
                matches!(i.op_kind(n), OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate32)
                    && (i.immediate(n) == pool_size || i.immediate(n) == pool_size.wrapping_neg())
            }) =>
        {
            Advance::Other
        }
        _ => Advance::None,
    }
}

/// A carve copy: the index of its load and its store, the pool's register
/// and the arena's.
#[derive(Clone, Copy)]
struct Copy {
    load: usize,
    store: usize,
    pool: Register,
    arena: Register,
}

/// Whether `s` is `mov DISP(%base),%into` (64-bit, no index): `Some(base)`.
fn loads_from(s: &Step, disp: u64, into: Register) -> Option<Register> {
    let i = &s.instr;
    (i.mnemonic() == Mnemonic::Mov
        && i.op_count() == 2
        && i.op0_kind() == OpKind::Register
        && i.op0_register() == into
        && i.op1_kind() == OpKind::Memory
        && i.memory_index() == Register::None
        && i.memory_base().size() == 8
        && i.memory_displacement64() == disp)
        .then(|| i.memory_base())
}

/// The copy around the `lea` at `at` (from `%from` to `%to`): its store
/// after it, and its load before it, in straight-line code with neither
/// register written between.
fn copy_at(
    steps: &[Step],
    at: usize,
    (from, to): (Register, Register),
    info: &mut InstructionInfoFactory,
) -> Option<Copy> {
    let mut arena = None;
    for (k, s) in steps.iter().enumerate().skip(at + 1).take(SPREAD) {
        let i = &s.instr;
        if i.mnemonic() == Mnemonic::Mov
            && i.op0_kind() == OpKind::Memory
            && i.op1_kind() == OpKind::Register
            && i.op1_register() == to
            && i.memory_index() == Register::None
            && i.memory_base().size() == 8
            && i.memory_displacement64() == ARENA_POOL_ADDRESS
        {
            arena = Some((i.memory_base(), k));
            break;
        }
        if i.flow_control() != FlowControl::Next || placement::written(info, i).contains(&to) {
            return None;
        }
    }
    let (arena, store) = arena?;
    // The arena's register is not written between the lea and the store.
    if steps[at + 1..store].iter().any(|s| placement::written(info, &s.instr).contains(&arena)) {
        return None;
    }
    for k in (at.saturating_sub(SPREAD)..at).rev() {
        let s = steps.get(k)?;
        if s.instr.flow_control() != FlowControl::Next {
            return None;
        }
        if loads_from(s, ARENA_POOL_ADDRESS, from) == Some(arena) && arena != from {
            return Some(Copy { load: k, store, pool: from, arena });
        }
        let written = placement::written(info, &s.instr);
        if written.contains(&from) || written.contains(&arena) {
            return None;
        }
    }
    None
}

/// The probe of `copy`: the first emulated instruction from its load on
/// with the pool intact and no branch landing after the load, else the
/// load, single-stepped.
fn probe(
    steps: &[Step],
    copy: Copy,
    targets: &HashSet<u64>,
    info: &mut InstructionInfoFactory,
    kernel: KernelVersion,
) -> Result<Found, String> {
    let load = &steps[copy.load];
    let name = |r: Register| format!("%{}", format!("{r:?}").to_lowercase());
    let mut why = format!("none in the {REACH} instructions after it");
    for s in steps.iter().skip(copy.load + 1).take(REACH) {
        if targets.contains(&s.instr.ip()) {
            why = format!("a branch lands at +{:#x} first", s.offset);
            break;
        }
        if let Some(kind) = placement::emulated(s.bytes, kernel) {
            let number = dwarf(copy.pool).ok_or_else(|| format!("{:?} is no general-purpose register", copy.pool))?;
            return Ok(Found {
                offset: s.offset,
                instruction: s.shown.clone(),
                emulated: true,
                reason: format!(
                    "a carve: the first emulated instruction ({kind}) after its load of pool_address (`{}` at +{:#x}), with the pool still in {}",
                    load.shown,
                    load.offset,
                    name(copy.pool)
                ),
                reads: format!("the carved pool in {}", name(copy.pool)),
                cookie: growth::carve_cookie(site::register(number).unwrap_or(site::NONE), 0, false),
            });
        }
        if s.instr.flow_control() != FlowControl::Next {
            why = format!("`{}` at +{:#x} changes control flow first", s.shown, s.offset);
            break;
        }
        if placement::written(info, &s.instr).contains(&copy.pool) {
            why = format!("`{}` at +{:#x} overwrites the pool's {} first", s.shown, s.offset, name(copy.pool));
            break;
        }
    }
    let number = dwarf(copy.arena).ok_or_else(|| format!("{:?} is no general-purpose register", copy.arena))?;
    let (first, constant) = site::memory(number, i64::try_from(ARENA_POOL_ADDRESS).unwrap_or(i64::MAX))
        .ok_or_else(|| "pool_address is beyond the cookie's reach".to_owned())?;
    let emulated = placement::emulated(load.bytes, kernel);
    Ok(Found {
        offset: load.offset,
        instruction: load.shown.clone(),
        emulated: emulated.is_some(),
        reason: format!(
            "a carve: its load of pool_address, {} (no instruction the kernel emulates after it with the pool in {}: {why}; carves are rare, a pool each 16 KiB the heap grows)",
            emulated.map_or("single-stepped", |_| "emulated"),
            name(copy.pool),
        ),
        reads: format!("the carved pool at {ARENA_POOL_ADDRESS:#x}({}) (the arena's pool_address)", name(copy.arena)),
        cookie: growth::carve_cookie(first, constant, emulated.is_none()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const K618: KernelVersion = (6, 18);
    const POOL: u64 = 16384;

    /// `allocate_from_new_pool`'s code on each build here, and its link-time
    /// address (tests/data/growth/, cut from the files by the symbol
    /// tables' address and size).
    const BUILDS: [(&str, u64, &[u8]); 7] = [
        ("pyenv 3.10.13", 0x11_3eb0, include_bytes!("../../../tests/data/growth/pyenv-3.10.13-113eb0.bin")),
        ("pyenv 3.11.7", 0x1a_f3b0, include_bytes!("../../../tests/data/growth/pyenv-3.11.7-1af3b0.bin")),
        ("pyenv 3.12.1", 0x1c_f7f0, include_bytes!("../../../tests/data/growth/pyenv-3.12.1-1cf7f0.bin")),
        ("pyenv 3.13.0", 0x16_b0e0, include_bytes!("../../../tests/data/growth/pyenv-3.13.0-16b0e0.bin")),
        ("Debian's 3.11", 0x4d_0ce0, include_bytes!("../../../tests/data/growth/debian-3.11-4d0ce0.bin")),
        ("forky's 3.13", 0x57_18e0, include_bytes!("../../../tests/data/growth/forky-3.13-5718e0.bin")),
        ("forky's 3.14", 0x54_3320, include_bytes!("../../../tests/data/growth/forky-3.14-543320.bin")),
    ];

    /// Each build's carve copies as `(offset, instruction's start,
    /// emulated, what it reads)`.
    #[test]
    fn every_builds_carves_are_found() {
        let jump = |at, op: &'static str, register: &'static str| (at, op, true, register);
        let expected: [Vec<(u64, &str, bool, &str)>; 7] = [
            // After new_arena, whose jump back is preceded by a branch
            // target (where the other copy goes on): its load,
            // single-stepped, once an arena; and for a usable arena.
            vec![(0x231, "mov ", false, "at 0x8(%r12)"), jump(0x2da, "jne ", "in %rdx")],
            vec![(0x231, "mov ", false, "at 0x8(%r12)"), jump(0x2da, "jne ", "in %rdx")],
            vec![jump(0x28f, "je ", "in %rsi")],
            vec![jump(0x28f, "je ", "in %rsi")],
            vec![jump(0x95, "je ", "in %rax")],
            // An arena with pools left after it runs into the pools' init
            // (a branch target) first: its load, single-stepped.
            vec![(0x67, "mov ", false, "at 0x8(%rcx)"), jump(0x18c, "jne ", "in %rax")],
            vec![(0x67, "mov ", false, "at 0x8(%rcx)"), jump(0x18c, "jne ", "in %rax")],
        ];
        for ((build, address, code), expected) in BUILDS.iter().zip(expected) {
            let found = points(code, *address, POOL, K618).unwrap_or_else(|e| panic!("{build}: {e}"));
            let got: Vec<(u64, &str, bool, &str)> = found
                .iter()
                .map(|f| {
                    let op = expected.iter().map(|e| e.1).find(|op| f.instruction.starts_with(op)).unwrap_or("?");
                    let reads = expected.iter().map(|e| e.3).find(|r| f.reads.contains(r)).unwrap_or("?");
                    (f.offset, op, f.emulated, reads)
                })
                .collect();
            assert_eq!(got, expected, "{build}: {found:#?}");
            for f in &found {
                assert_eq!(site::slot(f.cookie) == growth::CARVE_STEPPED, !f.emulated, "{build}: {f:?}");
            }
        }
        // The single-stepped one reads pool_address at the arena's register.
        let forky = points(BUILDS[6].2, BUILDS[6].1, POOL, K618).unwrap();
        assert_eq!(forky[0].instruction, "mov 8(%rcx),%rax");
        assert_eq!(site::first(forky[0].cookie), site::MEMORY + 3, "{:?}", forky[0]);
        assert!(forky[0].reason.contains("a branch lands at +0x95 first"), "{:?}", forky[0]);
        assert_eq!(site::first(forky[1].cookie), site::register(0).unwrap());
    }

    fn bytes(hex: &str) -> Vec<u8> {
        let hex: String = hex.chars().filter(|c| !c.is_whitespace()).collect();
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn an_advance_in_another_form_leaves_the_carves_unknown() {
        // addq $0x4000,0x8(%rbx)
        let err = points(&bytes("48818308000000 00400000 c3"), 0x1000, POOL, K618).unwrap_err();
        assert!(err.contains("in no form of a carve"), "{err}");
        // No advance at all.
        let err = points(&bytes("c3"), 0x1000, POOL, K618).unwrap_err();
        assert!(err.starts_with("no carve of a pool found"), "{err}");
        // A lea with no load before it.
        let err = points(&bytes("488d8200400000 48894508 c3"), 0x1000, POOL, K618).unwrap_err();
        assert!(err.contains("is not between a load and a store"), "{err}");
    }
}
