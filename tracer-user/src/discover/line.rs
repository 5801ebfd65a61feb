//! The straight line after the point an inlined copy is probed at: the
//! instructions every pass through that point runs exactly once, up to and
//! including the first branch, with where the copy's size and object are
//! at each of them.
//!
//! A copy's first point (its DWARF entry, or the read of its switch) is
//! most often an instruction the kernel single-steps, at 8–15 µs a hit
//! here against ~0.45 µs for one it emulates; its first basic block
//! usually ends in a `jcc`, which the kernel emulates. The line goes on
//! past an indirect call, which returns to the next instruction once per
//! pass (a compiler cannot know an indirect callee never returns, so code
//! after one is always its return's): an inlined `_Py_Dealloc` is `mov
//! 8(%rdi),%rax; call *0x30(%rax)`, nothing emulated, but the `jmp` after
//! the call often is. It stops at a direct call, whose callee may be one
//! that never returns (then the next instruction is other code's), and at
//! a call through an import slot (`.got`, `.got.plt`: an imported
//! function's, as `-fno-plt` builds call them), which may be the same. What a probe past a call counts,
//! it counts when the callee returns: a callee that never does (a thread
//! that exits inside a `tp_dealloc`) is not counted, and one in flight at
//! the detach is not either.
//!
//! A probe may move from the first point to any later instruction of the
//! line, and count the same calls, when nothing else leads into the line:
//! the line ends before any instruction that a direct branch anywhere in
//! the image lands on, that a code pointer in the image's data (a jump table, a computed
//! goto's table) or a `lea` of a table of offsets names, or that starts
//! with `endbr64` (an indirect branch's target, in the builds with
//! `-fcf-protection`). Those are the [`Landings`]: they cover the whole
//! image, so the function that holds the copy need not be known.
//!
//! Moving past instructions may move the values the probe's program reads.
//! A small data-flow pass follows each one (the size, a calloc's two
//! factors, the object or block) from the first point: a register stays its
//! home until written, a 64-bit `mov` to a register, a `push`, a 64-bit
//! store to a stack slot (by the stack pointer) and a load back from one
//! (or from the memory the DWARF puts it in) give it another home; a
//! stack slot is followed across `push`, `pop`, `sub`/`add`/`lea` of the
//! stack pointer, and dropped when the stack pointer changes otherwise or a
//! store may overlap it (a store through any register but the stack
//! pointer, or the slot's own base, might). A value with no home left is
//! `None` at that point, and the plan does not move a probe there if its
//! program reads it. A 32-bit `mov` is not a copy: it keeps only the low
//! half. An indirect call may overwrite the registers the ABI lets a
//! callee change (`rax`, `rcx`, `rdx`, `rsi`, `rdi`, `r8`–`r11`) and any
//! memory, the caller's stack slots included; and the object (what the
//! copy's program reads through, or the block a free gives back) is
//! dropped there whatever its home, since the callee may have freed it
//! (`tp_dealloc`) and a later probe would read freed memory or see a
//! block already reused.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use iced_x86::{FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};
use tracer_common::site::{self, CONSTANT, MEMORY, MEMORY_FIRST, MEMORY_LAST, NONE};

use super::InlineEntry;
use crate::hash::BuildIdentity;

/// How many instructions past the first point a line may go. Blocks of
/// the copies seen on Debian's builds are shorter.
pub const MAX_LINE: usize = 48;

/// DWARF x86-64 number of the stack pointer.
const RSP: u8 = 7;

/// The registers a callee may change (System V x86-64 ABI), by DWARF
/// number: rax, rdx, rcx, rsi, rdi, r8–r11.
const CALLER_SAVED: [u8; 9] = [0, 1, 2, 4, 5, 8, 9, 10, 11];

/// The bytes below the stack pointer that signal delivery leaves alone
/// (the System V x86-64 ABI's red zone).
const RED_ZONE: i64 = 128;

/// Why a line ends where it does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineEnd {
    /// At the block's branch, direct call or return, its last instruction
    /// (an indirect call does not end it).
    Branch,
    /// Before an instruction something else may land on (at this
    /// address).
    Landing(u64),
    /// After [`MAX_LINE`] instructions.
    Limit,
    /// Before code that does not decode.
    Undecodable,
    /// The line was not followed (the code was not read).
    #[default]
    NotFollowed,
}

impl std::fmt::Display for LineEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Branch => write!(f, "its straight line ends in a jump, a direct call or a return"),
            Self::Landing(_) => write!(f, "a branch may land in its first basic block before an emulated instruction"),
            Self::Limit => write!(f, "its first basic block is longer than {MAX_LINE} instructions"),
            Self::Undecodable => write!(f, "its code does not decode"),
            Self::NotFollowed => write!(f, "its code was not followed"),
        }
    }
}

/// The addresses control may reach other than by falling through: direct
/// branch and call targets, code pointers in data, entries of tables of
/// offsets. Shared, since the set is large and every copy consults it.
/// With them, the image's import slots (`.got`, `.got.plt`: start, end),
/// through which a call may be one of an imported function, and, by
/// address, the jumps that alone lead into it (see [`Gate`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Landings(pub Arc<HashSet<u64>>, pub Arc<Vec<(u64, u64)>>, pub Arc<HashMap<u64, Vec<Gate>>>);

/// One of the jumps that alone lead into an address: every way into it is
/// a direct jump (conditional or not) or the fall-through of a conditional
/// jump just before it (padding between them aside), and nothing else
/// lands on it: no call, no code address in data, no `endbr64`. A probe at
/// each such jump runs for every pass through it; its program counts the
/// hit only where `condition` (see [`tracer_common::site::gated`]) holds,
/// which is when control goes into the address (an unconditional jump
/// always does). A copy none of whose own instructions the kernel emulates
/// (`mov 8(%rbx),%rax; mov %rbx,%rdi; call *0x30(%rax)` after `subq
/// $1,(%rbx); jne`, an inlined `Py_DECREF`'s `_Py_Dealloc`, whose line ends
/// where the `jne` lands) is probed at its jumps: a jump changes no register
/// and no memory, so the copy's size and object are where they are at its
/// first point, and each pass into the copy passes one of them once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The jump's address.
    pub jump: u64,
    /// The x86 condition under which control goes into the address; `None`
    /// for an unconditional jump.
    pub condition: Option<u8>,
}

/// The most jumps a copy is probed at instead of its own code.
pub const MAX_GATES: usize = 4;

impl std::fmt::Debug for Landings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Landings({} addresses)", self.0.len())
    }
}

impl Landings {
    /// Whether control may land on `insn` other than from the instruction
    /// before it.
    #[must_use]
    pub fn lands_on(&self, insn: &Instruction) -> bool {
        insn.mnemonic() == Mnemonic::Endbr64 || self.0.contains(&insn.ip())
    }

    /// Whether `insn` calls through an import slot (`call
    /// *foo@GOTPCREL(%rip)`, as `-fno-plt` builds call imported
    /// functions), whose function may be one that never returns.
    #[must_use]
    pub fn calls_an_import(&self, insn: &Instruction) -> bool {
        insn.is_ip_rel_memory_operand() && {
            let slot = insn.ip_rel_memory_address();
            self.1.iter().any(|&(start, end)| (start..end).contains(&slot))
        }
    }
}

/// The jumps that alone lead into `start` (see [`Gate`]), each as a point
/// with `start`'s size and object, with the condition under which it goes
/// into `start`; none where something else leads there too.
#[must_use]
pub fn gate(start: &InlineEntry, landings: &Landings) -> Vec<(InlineEntry, Option<u8>)> {
    let gates = landings.2.get(&start.address).map_or(&[][..], Vec::as_slice);
    gates.iter().map(|g| (InlineEntry { address: g.jump, ..*start }, g.condition)).collect()
}

/// Every address only jumps lead into (see [`Gate`]), at most
/// [`MAX_GATES`], from an image's `instructions` in address order, the
/// addresses other ways lead into (`data`: code pointers in data, function
/// starts, addresses taken in code), and the ranges where
/// the linear decoding may be out of step (`unsynced`), where nothing is
/// trusted.
#[must_use]
pub fn gates<T: std::hash::BuildHasher>(
    instructions: &[Instruction],
    data: &HashSet<u64, T>,
    unsynced: &[std::ops::Range<u64>],
) -> HashMap<u64, Vec<Gate>> {
    let synced = |a: u64| !unsynced.iter().any(|r| r.contains(&a));
    // iced numbers the conditions from 1, in the opcodes' order.
    let condition = |insn: &Instruction| (insn.condition_code() as u8).checked_sub(1);
    // Each direct target's jumps into it; `None` once anything else lands
    // there: a call, a jrcxz or loop, a jump to the next instruction (both
    // of its ways lead there), a jump where the decoding is not trusted.
    let mut into: HashMap<u64, Option<Vec<Gate>>, BuildIdentity> = HashMap::default();
    for insn in instructions {
        let flow = insn.flow_control();
        if !matches!(flow, FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call) {
            continue;
        }
        let target = insn.near_branch_target();
        let gate = match flow {
            _ if !synced(insn.ip()) || target == insn.next_ip() => None,
            FlowControl::ConditionalBranch if insn.is_jcc_short_or_near() => {
                condition(insn).map(|c| Gate { jump: insn.ip(), condition: Some(c) })
            }
            FlowControl::UnconditionalBranch if insn.is_jmp_short_or_near() => {
                Some(Gate { jump: insn.ip(), condition: None })
            }
            _ => None,
        };
        let entry = into.entry(target).or_insert_with(|| Some(Vec::new()));
        match (entry.as_mut(), gate) {
            (Some(jumps), Some(gate)) => jumps.push(gate),
            _ => *entry = None,
        }
    }
    let mut out = HashMap::new();
    for (j, at) in instructions.iter().enumerate() {
        // What falls in first: most instructions follow other code, and
        // are done with before any lookup (a sixth of the plan's time on
        // Debian's 3.11 went to looking up all 700,000 of them).
        let fall = match falls_into(instructions, j, &into, data) {
            Fall::Nothing => None,
            Fall::Jump(prev) if synced(prev.ip()) => match condition(prev) {
                Some(c) => Some(Gate { jump: prev.ip(), condition: Some(c ^ 1) }),
                None => continue,
            },
            Fall::Jump(_) | Fall::Code => continue,
        };
        let address = at.ip();
        if at.mnemonic() == Mnemonic::Endbr64 || data.contains(&address) || !synced(address) {
            continue;
        }
        let mut gates = match into.get(&address) {
            Some(None) => continue,
            Some(Some(jumps)) => jumps.clone(),
            None => Vec::new(),
        };
        gates.extend(fall);
        if !gates.is_empty() && gates.len() <= MAX_GATES {
            out.insert(address, gates);
        }
    }
    out
}

/// What falls into an instruction.
enum Fall<'a> {
    /// Nothing: the instruction before it (padding passed over) jumps
    /// away, returns or traps.
    Nothing,
    /// A conditional jump, where it is not taken.
    Jump(&'a Instruction),
    /// Other code, or what is not known (a gap in the decoding).
    Code,
}

/// What falls into `instructions[j]`: padding (a `nop` or `int3` that
/// nothing lands on) is passed over to the instruction before it.
fn falls_into<'a, S: std::hash::BuildHasher, T: std::hash::BuildHasher>(
    instructions: &'a [Instruction],
    j: usize,
    into: &HashMap<u64, Option<Vec<Gate>>, S>,
    data: &HashSet<u64, T>,
) -> Fall<'a> {
    let mut at = j;
    loop {
        let Some(prev) = at.checked_sub(1).and_then(|b| instructions.get(b)) else { return Fall::Nothing };
        if prev.next_ip() != instructions[at].ip() {
            return Fall::Code;
        }
        at -= 1;
        if matches!(prev.mnemonic(), Mnemonic::Nop | Mnemonic::Int3)
            && !(into.contains_key(&prev.ip()) || data.contains(&prev.ip()))
        {
            continue;
        }
        // Bytes that do not decode say the decoding may be out of step.
        if prev.is_invalid() {
            return Fall::Code;
        }
        return match prev.flow_control() {
            FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Return
            | FlowControl::Exception => Fall::Nothing,
            FlowControl::ConditionalBranch if prev.is_jcc_short_or_near() => Fall::Jump(prev),
            _ => Fall::Code,
        };
    }
}

/// The points after `start` on its straight line, each with where `start`'s
/// size and object are there, and why the line ends. `decode` gives the
/// instruction at an address.
#[must_use]
pub fn follow(
    start: &InlineEntry,
    decode: impl Fn(u64) -> Option<Instruction>,
    landings: &Landings,
) -> (Vec<InlineEntry>, LineEnd) {
    let Some(mut prev) = decode(start.address) else { return (Vec::new(), LineEnd::Undecodable) };
    let mut values = Values::of(start);
    let mut info = InstructionInfoFactory::new();
    let mut out = Vec::new();
    let mut returned = false;
    loop {
        match prev.flow_control() {
            FlowControl::Next => {}
            // The call of a function pointer (`tp_dealloc`, an
            // allocator's slot). A call through an import slot may be one
            // of an imported function (`-fno-plt`), which may never return
            // (`abort`).
            FlowControl::IndirectCall if !landings.calls_an_import(&prev) => {}
            _ => return (out, LineEnd::Branch),
        }
        if out.len() >= MAX_LINE {
            return (out, LineEnd::Limit);
        }
        if prev.flow_control() == FlowControl::IndirectCall {
            returned = true;
            values.call();
        } else {
            values.step(&prev, &mut info);
        }
        let Some(next) = decode(prev.next_ip()) else { return (out, LineEnd::Undecodable) };
        if landings.lands_on(&next) {
            return (out, LineEnd::Landing(next.ip()));
        }
        out.push(InlineEntry { address: next.ip(), size: values.size(), object: values.object(), returned });
        prev = next;
    }
}

/// Where a value is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Homes {
    /// Registers holding it, by DWARF number (bit n).
    regs: u16,
    /// The register it was first in, preferred while it still holds it.
    first: Option<u8>,
    /// Stack slots holding it, as offsets from the stack pointer at the
    /// first point.
    stack: Vec<i64>,
    /// Other memory holding it: (DWARF base register, offset), valid while
    /// the base is not written.
    based: Vec<(u8, i64)>,
}

/// One operand of a probe's program.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tracked {
    Constant(u16),
    Value(Homes),
}

impl Tracked {
    /// The operand `kind` with `constant`, as `tracer_common::site`
    /// encodes it; `None` for no operand or one it cannot follow.
    fn decode(kind: u8, constant: u16) -> Option<Self> {
        let mut homes = Homes::default();
        match kind {
            CONSTANT => return Some(Self::Constant(constant)),
            1..=16 => {
                homes.regs = 1 << (kind - 1);
                homes.first = Some(kind - 1);
            }
            MEMORY_FIRST..=MEMORY_LAST => {
                let base = kind - MEMORY - 1;
                let offset = site::offset(u64::from(constant));
                if base == RSP { homes.stack.push(offset) } else { homes.based.push((base, offset)) }
            }
            _ => return None,
        }
        Some(Self::Value(homes))
    }

    /// The operand and the constant it uses, with the stack pointer `sp`
    /// from the first point's (`None`: not known).
    fn encode(&self, sp: Option<i64>) -> Option<(u8, Option<u16>)> {
        let homes = match self {
            Self::Constant(c) => return Some((CONSTANT, Some(*c))),
            Self::Value(homes) => homes,
        };
        let held = |r: u8| homes.regs & (1 << r) != 0;
        if let Some(r) = homes.first.filter(|&r| held(r)).or_else(|| (0..16).find(|&r| held(r))) {
            return Some((r + 1, None));
        }
        let slot = sp.and_then(|sp| homes.stack.first().and_then(|s| site::memory(u16::from(RSP), s - sp)));
        let (kind, offset) = slot.or_else(|| homes.based.first().and_then(|&(b, o)| site::memory(u16::from(b), o)))?;
        Some((kind, Some(offset)))
    }
}

/// The values a probe's program may read, followed along a line.
struct Values {
    /// The size's first and second operands.
    size: Option<(Tracked, Option<Tracked>)>,
    object: Option<Tracked>,
    /// The stack pointer from the first point's; `None` once not known.
    sp: Option<i64>,
}

impl Values {
    fn of(start: &InlineEntry) -> Self {
        let size = start.size.and_then(|(first, second, constant)| {
            let first = Tracked::decode(first, constant)?;
            match second {
                NONE => Some((first, None)),
                kind => Some((first, Some(Tracked::decode(kind, constant)?))),
            }
        });
        Self { size, object: start.object.and_then(|(kind, c)| Tracked::decode(kind, c)), sp: Some(0) }
    }

    /// The size as `count_site`'s operands: a memory operand and a
    /// constant cannot both be, nor two memory operands at different
    /// offsets (the cookie has one constant).
    fn size(&self) -> Option<(u8, u8, u16)> {
        let (first, second) = self.size.as_ref()?;
        let (a, ca) = first.encode(self.sp)?;
        let Some(second) = second else { return Some((a, NONE, ca.unwrap_or(0))) };
        let (b, cb) = second.encode(self.sp)?;
        match (ca, cb) {
            (Some(x), Some(y)) if x != y => None,
            (x, y) => Some((a, b, x.or(y).unwrap_or(0))),
        }
    }

    fn object(&self) -> Option<(u8, u16)> {
        let (kind, constant) = self.object.as_ref()?.encode(self.sp)?;
        Some((kind, constant.unwrap_or(0)))
    }

    fn each(&mut self) -> impl Iterator<Item = &mut Homes> {
        let size = self.size.as_mut().map(|(a, b)| [Some(a), b.as_mut()]).into_iter().flatten().flatten();
        size.chain(self.object.as_mut()).filter_map(|t| match t {
            Tracked::Value(h) => Some(h),
            Tracked::Constant(_) => None,
        })
    }

    /// Moves the values past an indirect call, which returns with the
    /// stack pointer it had. Only the registers a callee must keep still
    /// hold a value: a callee may write any memory, the caller's stack
    /// slots too (the area of its stack arguments is its own, and a slot
    /// whose address escaped is anyone's).
    fn call(&mut self) {
        self.object = None;
        for homes in self.each() {
            for r in CALLER_SAVED {
                homes.regs &= !(1 << r);
            }
            homes.based.clear();
            homes.stack.clear();
        }
    }

    /// Moves the values past `insn`.
    fn step(&mut self, insn: &Instruction, info: &mut InstructionInfoFactory) {
        let sp = self.sp;
        // Where each value gains a home, from what held it before.
        let reg = |i: u32| (insn.op_kind(i) == OpKind::Register).then(|| gpr64(insn.op_register(i))).flatten();
        let slot = |at: Option<Memory>| at.filter(|m| m.size == 8);
        let gain: Option<(Home, Home)> = match insn.mnemonic() {
            Mnemonic::Mov => match (reg(0), reg(1)) {
                (Some(d), Some(s)) => Some((Home::Reg(s), Home::Reg(d))),
                (Some(d), None) => slot(memory(insn, sp)).map(|m| (m.home, Home::Reg(d))),
                (None, Some(s)) => slot(memory(insn, sp)).map(|m| (Home::Reg(s), m.home)),
                (None, None) => None,
            },
            Mnemonic::Push => reg(0).zip(sp).map(|(s, sp)| (Home::Reg(s), Home::Stack(sp - 8))),
            Mnemonic::Pop => reg(0).zip(sp).map(|(d, sp)| (Home::Stack(sp), Home::Reg(d))),
            _ => None,
        };
        let gainers: Vec<bool> = self.each().map(|h| gain.as_ref().is_some_and(|(from, _)| from.holds(h))).collect();
        // What the instruction overwrites.
        let used = info.info(insn);
        let written: Vec<u8> = used
            .used_registers()
            .iter()
            .filter(|r| is_write(r.access()))
            .filter_map(|r| dwarf(r.register().full_register()))
            .collect();
        let mut stores: Vec<Option<Memory>> = used
            .used_memory()
            .iter()
            .filter(|m| is_write(m.access()))
            .filter(|m| m.base() != Register::RIP && !(m.base() == Register::None && m.index() == Register::None))
            .map(|m| Memory::of(m.base(), m.index(), m.displacement().cast_signed(), m.memory_size().size(), sp))
            .collect();
        // A push's store is the stack's, whatever iced calls it.
        if insn.mnemonic() == Mnemonic::Push {
            stores = vec![sp.map(|sp| Memory { home: Home::Stack(sp - 8), size: 8 })];
        }
        if insn.mnemonic() == Mnemonic::Pop {
            stores.clear();
        }
        let new_sp = match insn.mnemonic() {
            _ if !written.contains(&RSP) => sp,
            Mnemonic::Push => sp.map(|s| s - 8),
            Mnemonic::Pop => sp.map(|s| s + 8),
            Mnemonic::Sub | Mnemonic::Add if reg(0) == Some(RSP) && is_immediate(insn.op1_kind()) => {
                let n = insn.immediate(1).cast_signed();
                sp.map(|s| if insn.mnemonic() == Mnemonic::Sub { s - n } else { s + n })
            }
            Mnemonic::Lea if insn.memory_base() == Register::RSP && insn.memory_index() == Register::None => {
                sp.map(|s| s + insn.memory_displacement64().cast_signed())
            }
            _ => None,
        };
        for (homes, gains) in self.each().zip(gainers) {
            for &r in written.iter().filter(|&&r| r != RSP) {
                homes.regs &= !(1 << r);
                homes.based.retain(|&(b, _)| b != r);
            }
            for store in &stores {
                homes.overwritten(store.as_ref());
            }
            // A slot further below the stack pointer than the red zone
            // may be overwritten by a signal's frame at any time.
            match new_sp {
                None => homes.stack.clear(),
                Some(sp) => homes.stack.retain(|&s| s >= sp - RED_ZONE),
            }
            if gains && let Some((_, to)) = &gain {
                match *to {
                    Home::Reg(r) => homes.regs |= 1 << r,
                    Home::Stack(s) if new_sp.is_some() => homes.stack.push(s),
                    // A store through another register is to memory other
                    // threads or callees may share: not a home.
                    Home::Stack(_) | Home::Based(..) => {}
                }
            }
        }
        self.sp = new_sp;
    }
}

/// One home of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    Reg(u8),
    /// Offset from the first point's stack pointer.
    Stack(i64),
    Based(u8, i64),
}

impl Home {
    fn holds(self, homes: &Homes) -> bool {
        match self {
            Self::Reg(r) => homes.regs & (1 << r) != 0,
            Self::Stack(s) => homes.stack.contains(&s),
            Self::Based(b, o) => homes.based.contains(&(b, o)),
        }
    }
}

/// A memory operand: where, and how many bytes.
#[derive(Clone, Copy, Debug)]
struct Memory {
    home: Home,
    size: usize,
}

impl Memory {
    /// A memory operand at `base` + `index` + `displacement`, with the
    /// stack pointer `sp` from the first point's; `None` where the address
    /// is not one tracer follows.
    fn of(base: Register, index: Register, displacement: i64, size: usize, sp: Option<i64>) -> Option<Self> {
        if index != Register::None {
            return None;
        }
        let home = match dwarf(base)? {
            RSP => Home::Stack(sp? + displacement),
            b => Home::Based(b, displacement),
        };
        Some(Self { home, size })
    }
}

impl Homes {
    /// Drops the memory homes a store to `store` may overwrite (`None`:
    /// anywhere but static memory).
    fn overwritten(&mut self, store: Option<&Memory>) {
        let overlaps = |at: i64, size: usize, slot: i64| {
            let size = i64::try_from(size).unwrap_or(i64::MAX);
            at < slot.saturating_add(8) && slot < at.saturating_add(size)
        };
        match store {
            Some(&Memory { home: Home::Stack(at), size }) => {
                self.stack.retain(|&s| !overlaps(at, size, s));
                self.based.clear();
            }
            Some(&Memory { home: Home::Based(base, at), size }) => {
                self.stack.clear();
                self.based.retain(|&(b, o)| b == base && !overlaps(at, size, o));
            }
            _ => {
                self.stack.clear();
                self.based.clear();
            }
        }
    }
}

/// The memory operand of `insn`, where it has one tracer follows.
fn memory(insn: &Instruction, sp: Option<i64>) -> Option<Memory> {
    (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory)?;
    let displacement = insn.memory_displacement64().cast_signed();
    Memory::of(insn.memory_base(), insn.memory_index(), displacement, insn.memory_size().size(), sp)
}

const fn is_write(access: OpAccess) -> bool {
    matches!(access, OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
}

const fn is_immediate(kind: OpKind) -> bool {
    matches!(kind, OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 | OpKind::Immediate32)
}

/// A 64-bit general-purpose register's DWARF number.
fn gpr64(register: Register) -> Option<u8> {
    if register.is_gpr64() { dwarf(register) } else { None }
}

/// The DWARF x86-64 number of a general-purpose register (any width).
#[must_use]
pub fn dwarf(register: Register) -> Option<u8> {
    Some(match register.full_register() {
        Register::RAX => 0,
        Register::RDX => 1,
        Register::RCX => 2,
        Register::RBX => 3,
        Register::RSI => 4,
        Register::RDI => 5,
        Register::RBP => 6,
        Register::RSP => 7,
        Register::R8 => 8,
        Register::R9 => 9,
        Register::R10 => 10,
        Register::R11 => 11,
        Register::R12 => 12,
        Register::R13 => 13,
        Register::R14 => 14,
        Register::R15 => 15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
