//! The frees that jump through the allocator's function pointers, probed
//! at the implementation the pointer holds.
//!
//! On pyenv's plain builds `PyObject_Free`, `PyMem_Free` and
//! `PyMem_RawFree` are each a tail jump through their domain's pointer:
//! `mov %rdi,%rsi; mov ctx(%rip),%rdi; jmp *free(%rip)` on 3.11
//! (Objects/obmalloc.c, v3.11.7: `_PyObject.free(_PyObject.ctx, ptr)`), and
//! on 3.12 and 3.13 a load of `&_PyRuntime` from the GOT into `%rax`, then
//! `jmp *off(%rax)` (v3.12.1, v3.13.0: `_PyObject.free` is
//! `_PyRuntime.allocators.standard.obj.free`). Nothing before the jump is
//! an instruction the kernel emulates, so each hit at the entry is
//! single-stepped (14–17 µs here against about 0.5 µs), and their
//! addresses escape, so their call sites cannot stand in for them.
//!
//! The implementations the pointers hold in a release build,
//! `_PyObject_Free` (the object and the mem domain's, pymalloc's) and
//! `_PyMem_RawFree`, start `test %rsi,%rsi; je` and `mov %rsi,%rdi; jmp
//! free@plt`: an emulated instruction that every call runs once, before
//! anything branches. So a free whose pointer holds its implementation in
//! the traced process (read from its memory at the attach, `--pid` only:
//! with `--exe` another process may hold a hook) is probed there. Where
//! two API functions share one implementation (`PyObject_Free` and
//! `PyMem_Free` share `_PyObject_Free`), the first keeps the
//! implementation's hits and the other stays at its entry, which marks
//! the thread before its jump; a direct call of the implementation in the
//! image (3.11's pymalloc realloc, freeing a moved block) marks it too.
//! The implementation's program counts a marked call apart, as nested
//! (see tracer-ebpf's `nested.rs`).
//!
//! Planning reads files: what the pointers hold comes from the caller
//! ([`apply`]), and the run checks them again every interval.

use std::{collections::HashMap, path::Path};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};
use object::{Object as _, ObjectSection as _};

use super::{
    Plan, PlannedProbe,
    placement::{self, KernelVersion, Placement},
};
use crate::{discover::elf::ElfImage, probe::Program};

/// The API frees that jump through a pointer, in the order that decides
/// which keeps a shared implementation's hits (the most called first).
pub const FREES: [&str; 3] = ["PyObject_Free", "PyMem_Free", "PyMem_RawFree"];

/// The implementations a release build's pointers hold (Objects/obmalloc.c,
/// v3.11.7 to v3.13.0: `PYOBJ_ALLOC`, `PYMEM_ALLOC` with pymalloc, and
/// `PYRAW_ALLOC`).
pub const IMPLEMENTATIONS: [&str; 2] = ["_PyObject_Free", "_PyMem_RawFree"];

/// Where a free's function pointer is, as its code reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointer {
    /// At this link-time address (3.11: `jmp *free(%rip)`).
    At(u64),
    /// `offset` past the address stored at link-time address `at` (3.12,
    /// 3.13: `mov got(%rip),%rax; …; jmp *offset(%rax)`).
    Through { at: u64, offset: u64 },
}

/// One API free and its pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Free {
    pub symbol: &'static str,
    pub pointer: Pointer,
    /// Its entry's file offset: where a sharer marks the thread.
    pub entry: u64,
}

/// One implementation: its entry, where its probe goes, and the direct
/// calls and jumps to it in the image (file offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Implementation {
    pub name: &'static str,
    pub file_offset: u64,
    pub placement: Placement,
    pub direct: Vec<u64>,
}

/// What the image's files say: the frees' pointers and the
/// implementations; or why none can move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    pub frees: Vec<Free>,
    pub implementations: Vec<Implementation>,
    /// Why a free or an implementation is left out.
    pub refused: Vec<String>,
}

/// What [`apply`] moved: each free's pointer and the implementation's file
/// offset it held at the attach, for the run to check again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    pub free: Free,
    pub implementation: &'static str,
    pub file_offset: u64,
}

/// Reads the image's frees and their implementations.
#[must_use]
pub fn find(elf: &ElfImage, kernel: KernelVersion) -> Slots {
    let mut slots = Slots::default();
    for symbol in FREES {
        let Some(sym) = elf.function(symbol) else { continue };
        let code = elf.read_at(sym.file_offset, 64).unwrap_or_default();
        match pointer(&code, sym.address) {
            Some(pointer) => slots.frees.push(Free { symbol, pointer, entry: sym.file_offset }),
            None => slots.refused.push(format!("{symbol} does not jump through a pointer tracer can read")),
        }
    }
    let defined: Vec<(&'static str, u64, u64)> = IMPLEMENTATIONS
        .iter()
        .filter_map(|&name| elf.function(name).map(|s| (name, s.address, s.file_offset)))
        .collect();
    let direct = match direct_branches(elf.path(), &defined) {
        Ok(direct) => direct,
        Err(why) => {
            slots.refused.push(why);
            return slots;
        }
    };
    for (name, address, file_offset) in defined {
        let code = elf.read_at(file_offset, 64).unwrap_or_default();
        let placement = placement::place_off_stack(&code, address, Program::CountClaimed, kernel);
        match direct.get(name) {
            Some(Err(why)) => slots.refused.push(why.clone()),
            _ if !placement.emulated => slots.refused.push(format!("{name}: {}", placement.reason)),
            found => slots.implementations.push(Implementation {
                name,
                file_offset,
                placement,
                direct: found.and_then(|f| f.as_ref().ok()).cloned().unwrap_or_default(),
            }),
        }
    }
    slots
}

/// Where the pointer a function's code jumps through is: the straight line
/// from its entry to its first branch, which must be an indirect `jmp`
/// through memory at a rip-relative address, or at an offset from a
/// register last loaded from one.
fn pointer(code: &[u8], address: u64) -> Option<Pointer> {
    let mut loaded: HashMap<Register, u64> = HashMap::new();
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        match instr.flow_control() {
            FlowControl::Next => {}
            FlowControl::IndirectBranch if instr.op0_kind() == OpKind::Memory => {
                if instr.is_ip_rel_memory_operand() {
                    return Some(Pointer::At(instr.ip_rel_memory_address()));
                }
                let base = instr.memory_base();
                if instr.memory_index() != Register::None {
                    return None;
                }
                return loaded.get(&base).map(|&at| Pointer::Through { at, offset: instr.memory_displacement64() });
            }
            _ => return None,
        }
        // A 64-bit load from a rip-relative address is a pointer's base;
        // any other write of a register forgets it.
        let written = instr.op0_register().full_register();
        if instr.op_count() == 2
            && instr.op0_kind() == OpKind::Register
            && instr.op1_kind() == OpKind::Memory
            && instr.is_ip_rel_memory_operand()
            && instr.op0_register().size() == 8
            && instr.mnemonic() == iced_x86::Mnemonic::Mov
        {
            loaded.insert(written, instr.ip_rel_memory_address());
        } else if instr.op0_kind() == OpKind::Register {
            loaded.remove(&written);
        }
    }
    None
}

/// The direct calls and unconditional jumps to each of `defined` (name,
/// link-time address) in the image's executable sections, by file offset;
/// a conditional jump to one is an error for it (its mark would stay where
/// the jump is not taken).
fn direct_branches(
    path: &Path,
    defined: &[(&'static str, u64, u64)],
) -> Result<HashMap<&'static str, Result<Vec<u64>, String>>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
    let mut found: HashMap<&'static str, Result<Vec<u64>, String>> =
        defined.iter().map(|&(name, _, _)| (name, Ok(Vec::new()))).collect();
    let by_address: HashMap<u64, &'static str> = defined.iter().map(|&(name, address, _)| (address, name)).collect();
    for section in file.sections().filter(|s| s.kind() == object::SectionKind::Text) {
        let (Ok(bytes), Some((offset, _))) = (section.data(), section.file_range()) else { continue };
        let mut decoder = Decoder::with_ip(64, bytes, section.address(), DecoderOptions::NONE);
        let mut instr = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            if instr.op0_kind() != OpKind::NearBranch64 {
                continue;
            }
            let Some(&name) = by_address.get(&instr.near_branch_target()) else { continue };
            let at = offset + (instr.ip() - section.address());
            let entry = found.entry(name).or_insert_with(|| Ok(Vec::new()));
            match (instr.flow_control(), entry) {
                (FlowControl::Call | FlowControl::UnconditionalBranch, Ok(sites)) => sites.push(at),
                (_, entry @ Ok(_)) => {
                    *entry = Err(format!("{name} is the target of a conditional jump at {:#x}", instr.ip()));
                }
                (_, Err(_)) => {}
            }
        }
    }
    Ok(found)
}

/// Moves each free of `plan` whose pointer holds an implementation (`held`:
/// each free's symbol and the file offset of what its pointer holds, in
/// the image, or why it could not be read) to that implementation, and
/// returns what moved. A free moves only where its probe counts calls and
/// nothing else (no `--types`, no `--live`), is single-stepped
/// at its entry, and every free's pointer holds an implementation tracer
/// knows (a hook may call any of them), and none has inlined copies
/// (`copies` says how many a free not in the plan has, where known).
pub fn apply(
    plan: &mut Plan,
    slots: &Slots,
    held: &[(&'static str, Result<u64, String>)],
    copies: impl Fn(&str) -> Option<usize>,
) -> Vec<Moved> {
    let mut why_not = slots.refused.clone();
    // A copy inlined elsewhere jumps through the pointer without passing
    // the entry that marks it: where any may exist, nothing moves.
    for free in &slots.frees {
        let known = plan.probes.iter().find(|p| p.symbol == free.symbol).map_or_else(
            || copies(free.symbol),
            |p| if p.inline_sites.is_empty() { p.coverage.inlined } else { Some(p.inline_sites.len()) },
        );
        match known {
            Some(0) => {}
            Some(n) => why_not.push(format!("{} has {n} inlined copies, whose calls pass no entry", free.symbol)),
            None => why_not.push(format!("nothing tells whether {} was inlined elsewhere", free.symbol)),
        }
    }
    let mut holds: Vec<(&Free, &Implementation)> = Vec::new();
    for free in &slots.frees {
        match held.iter().find(|(s, _)| *s == free.symbol).map(|(_, h)| h) {
            Some(Ok(offset)) => match slots.implementations.iter().find(|i| i.file_offset == *offset) {
                Some(i) => holds.push((free, i)),
                None => why_not.push(format!(
                    "{}'s pointer holds a function tracer does not know (at file offset {offset:#x}: a hook, PYTHONMALLOC or PyMem_SetAllocator)",
                    free.symbol
                )),
            },
            Some(Err(why)) => why_not.push(format!("{}'s pointer could not be read: {why}", free.symbol)),
            None => why_not.push(format!("{}'s pointer was not read", free.symbol)),
        }
    }
    if !why_not.is_empty() {
        let why = why_not.join("; ");
        for p in plan.probes.iter_mut().filter(|p| FREES.contains(&p.symbol) && !p.placement.emulated) {
            p.placement.reason = format!("{}; not at its allocator's implementation: {why}", p.placement.reason);
        }
        return Vec::new();
    }
    let mut moved = Vec::new();
    for implementation in &slots.implementations {
        let sharing: Vec<&Free> =
            holds.iter().filter(|(_, i)| i.name == implementation.name).map(|(f, _)| *f).collect();
        let Some(first) = sharing.first() else { continue };
        let Some(probe) = plan.probes.iter_mut().find(|p| p.symbol == first.symbol) else { continue };
        if !movable(probe) {
            continue;
        }
        let marks: Vec<u64> =
            sharing[1..].iter().map(|f| f.entry).chain(implementation.direct.iter().copied()).collect();
        let at = &implementation.placement;
        probe.placement = Placement {
            offset: at.offset,
            instruction: at.instruction.clone(),
            emulated: true,
            reason: format!(
                "at {}+{} ({}), the implementation its pointer holds in the target (read at the attach and every interval): its own entry is single-stepped ({}){}",
                implementation.name,
                at.offset,
                at.instruction,
                probe.placement.reason,
                marked(&sharing[1..], implementation.direct.len()),
            ),
            function: Some(implementation.name.to_owned()),
        };
        probe.file_offset = implementation.file_offset;
        // A benchmarks' program stays, at the implementation and the marks
        // alike: the floor at these very sites.
        if !probe.attach_program.is_bench() {
            probe.attach_program = if marks.is_empty() { Program::CountCall } else { Program::CountClaimed };
        }
        probe.nested_sites = marks;
        for sharer in &sharing[1..] {
            if let Some(p) = plan.probes.iter_mut().find(|p| p.symbol == sharer.symbol) {
                p.placement.reason = format!(
                    "{}; it also marks the thread, so that its call of {} is not counted as {}'s there",
                    p.placement.reason, implementation.name, first.symbol
                );
            }
        }
        moved.extend(sharing.iter().map(|f| Moved {
            free: (*f).clone(),
            implementation: implementation.name,
            file_offset: implementation.file_offset,
        }));
    }
    moved
}

/// Whether `p` counts calls and nothing else (or runs a benchmarks'
/// program), single-stepped at its entry.
fn movable(p: &PlannedProbe) -> bool {
    (p.attach_program == Program::CountCall || p.attach_program.is_bench())
        && p.program == Program::CountCall
        && !p.placement.emulated
        && p.placement.offset == 0
        && p.inline_sites.is_empty()
        && p.call_sites.is_none()
        && p.live.is_none()
        && p.returns.is_none()
        && p.file.is_none()
        && p.nested_sites.is_empty()
}

/// What marks the calls the implementation does not count as this free's.
fn marked(sharers: &[&Free], direct: usize) -> String {
    let mut parts: Vec<String> = sharers.iter().map(|f| format!("{}'s entry", f.symbol)).collect();
    if direct > 0 {
        parts.push(format!("{direct} direct call{} in the image", if direct == 1 { "" } else { "s" }));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; calls marked at {} are counted apart", parts.join(" and "))
    }
}

/// What `free`'s pointer holds, as a file offset of the image: `read`
/// gives the 8 bytes at a link-time address of the image, or at an
/// address of the target; `offset_of` maps a target's address to the
/// image's file offset.
pub fn holds(
    free: &Free,
    read_image: impl Fn(u64) -> Result<u64, String>,
    read_target: impl Fn(u64) -> Result<u64, String>,
    offset_of: impl Fn(u64) -> Option<u64>,
) -> Result<u64, String> {
    let value = match free.pointer {
        Pointer::At(at) => read_image(at)?,
        Pointer::Through { at, offset } => read_target(read_image(at)?.wrapping_add(offset))?,
    };
    offset_of(value).ok_or_else(|| format!("it holds {value:#x}, outside the image"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_is_read_from_a_free_s_straight_line() {
        // pyenv 3.11.7's PyObject_Free at 0x1af270.
        let code = [
            0x48, 0x89, 0xfe, // mov %rdi,%rsi
            0x48, 0x8b, 0x3d, 0xe6, 0xcf, 0x2a, 0x00, // mov 0x2acfe6(%rip),%rdi
            0xff, 0x25, 0x00, 0xd0, 0x2a, 0x00, // jmp *0x2ad000(%rip)
        ];
        assert_eq!(pointer(&code, 0x1a_f270), Some(Pointer::At(0x45_c280)));
        // pyenv 3.12.1's at 0x1cf4e0.
        let code = [
            0x48, 0x8b, 0x05, 0x19, 0x48, 0x37, 0x00, // mov 0x374819(%rip),%rax
            0x48, 0x89, 0xfe, // mov %rdi,%rsi
            0x48, 0x8b, 0xb8, 0xb0, 0x00, 0x00, 0x00, // mov 0xb0(%rax),%rdi
            0xff, 0xa0, 0xd0, 0x00, 0x00, 0x00, // jmp *0xd0(%rax)
        ];
        assert_eq!(pointer(&code, 0x1c_f4e0), Some(Pointer::Through { at: 0x54_3d00, offset: 0xd0 }));
        // The base register written after its load: not the GOT's.
        let code = [
            0x48, 0x8b, 0x05, 0x19, 0x48, 0x37, 0x00, // mov 0x374819(%rip),%rax
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0xff, 0xa0, 0xd0, 0x00, 0x00, 0x00, // jmp *0xd0(%rax)
        ];
        assert_eq!(pointer(&code, 0x1c_f4e0), None);
        // A branch before the jump.
        let code = [0x48, 0x85, 0xff, 0x74, 0x06, 0xff, 0x25, 0x00, 0xd0, 0x2a, 0x00];
        assert_eq!(pointer(&code, 0x1000), None);
    }
}
