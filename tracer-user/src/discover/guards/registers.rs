//! What x86-64 instructions leave in the general-purpose registers, as far
//! as the guard scan follows them (a constant, a load from static memory,
//! or a register as it was where a walk started), and the static memory an
//! instruction reads or calls through.

use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

/// What a register holds, in terms of the registers where a walk started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value {
    Unknown,
    /// Register `n` (DWARF numbering) at the start.
    Register(u8),
    Constant(u64),
    /// Loaded from static memory at this address.
    Loaded(u64),
}

impl Value {
    pub(super) fn constant(self) -> Option<u64> {
        match self {
            Self::Constant(c) => Some(c),
            _ => None,
        }
    }
}

/// DWARF numbers of the argument registers the slow path reads.
pub(super) const RSI: usize = 4;
pub(super) const RDX: usize = 1;
pub(super) const RDI: usize = 5;

/// The DWARF x86-64 number of a general-purpose register.
fn dwarf(register: Register) -> Option<usize> {
    crate::discover::line::dwarf(register).map(usize::from)
}

/// The static address `insn` reads, if it reads one (rip-relative, or an
/// absolute address).
pub(super) fn static_read(insn: &Instruction) -> Option<u64> {
    let address = memory_address(insn)?;
    let mut info = InstructionInfoFactory::new();
    let reads = info.info(insn).used_memory().iter().any(|m| {
        matches!(m.base(), Register::RIP | Register::None)
            && matches!(m.access(), OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
    });
    reads.then_some(address)
}

/// The static address of `insn`'s memory operand.
fn memory_address(insn: &Instruction) -> Option<u64> {
    if !(0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory) {
        return None;
    }
    if insn.is_ip_rel_memory_operand() {
        Some(insn.ip_rel_memory_address())
    } else if insn.memory_base() == Register::None && insn.memory_index() == Register::None {
        Some(insn.memory_displacement64())
    } else {
        None
    }
}

/// Whether `insn` reads the static address `address` (a write does not
/// count: the code that installs an allocator).
pub(super) fn reads(insn: &Instruction, address: u64) -> bool {
    memory_address(insn) == Some(address) && static_read(insn) == Some(address)
}

/// The slot `insn` calls (or jumps) through, given `state`.
pub(super) fn indirect_target(insn: &Instruction, state: &[Value; 16]) -> Option<u64> {
    match insn.flow_control() {
        FlowControl::IndirectCall | FlowControl::IndirectBranch => match insn.op0_kind() {
            OpKind::Register => match dwarf(insn.op0_register()).map(|r| state[r]) {
                Some(Value::Loaded(slot)) => Some(slot),
                _ => None,
            },
            OpKind::Memory => memory_address(insn),
            _ => None,
        },
        _ => None,
    }
}

/// The slot `insn` calls (or jumps) through, or compares against an
/// immediate (the devirtualised call's guard), given `state`.
pub(super) fn called_through(insn: &Instruction, state: &[Value; 16]) -> Option<u64> {
    match insn.flow_control() {
        FlowControl::IndirectCall | FlowControl::IndirectBranch => indirect_target(insn, state),
        FlowControl::Next if insn.mnemonic() == Mnemonic::Cmp && insn.op0_kind() == OpKind::Register => {
            let immediate = matches!(insn.op1_kind(), OpKind::Immediate32to64 | OpKind::Immediate32);
            match dwarf(insn.op0_register()).map(|r| state[r]) {
                Some(Value::Loaded(slot)) if immediate && insn.immediate(1) > 0x1000 => Some(slot),
                _ => None,
            }
        }
        _ => None,
    }
}

/// What a call leaves in the registers the ABI lets it change.
pub(super) fn clobber_call(state: &mut [Value; 16]) {
    for r in [0, 1, 2, 4, 5, 8, 9, 10, 11] {
        state[r] = Value::Unknown;
    }
}

/// Moves `state` past `insn`.
pub(super) fn step(insn: &Instruction, state: &mut [Value; 16]) {
    let dest = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
        .then(|| insn.op0_register())
        .filter(|r| r.is_gpr32() || r.is_gpr64());
    let value = match (insn.mnemonic(), dest) {
        (Mnemonic::Mov, Some(_)) => match insn.op1_kind() {
            OpKind::Register => dwarf(insn.op1_register()).map(|r| state[r]),
            OpKind::Immediate32 | OpKind::Immediate64 | OpKind::Immediate32to64 => {
                Some(Value::Constant(insn.immediate(1)))
            }
            OpKind::Memory => Some(memory_address(insn).map_or(Value::Unknown, Value::Loaded)),
            _ => None,
        },
        (Mnemonic::Xor, Some(d)) if insn.op1_kind() == OpKind::Register && insn.op1_register() == d => {
            Some(Value::Constant(0))
        }
        _ => None,
    };
    let mut info = InstructionInfoFactory::new();
    for used in info.info(insn).used_registers() {
        if matches!(
            used.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) && let Some(r) = dwarf(used.register())
        {
            state[r] = Value::Unknown;
        }
    }
    if let (Some(d), Some(v)) = (dest.and_then(dwarf), value) {
        state[d] = v;
    }
}
