//! Where `--growth`'s probes go (see [`tracer_common::growth`]), or why
//! they cannot: planning reads files only.
//!
//! `growth_carve` goes in each of `allocate_from_new_pool`'s carve blocks
//! ([`carve`]), where pymalloc's footprint grows: a reused pool is not
//! probed at all. Where the carve blocks cannot all be found, the plan
//! falls back to probing every take, and says so (`fallback`):
//!
//! `growth_take` goes in `allocate_from_new_pool` at an instruction each
//! call runs exactly once, where `usable_arenas` is at hand: the first
//! instruction the kernel emulates after the one that loads it into a
//! register, with no branch before it, none landing between the entry and
//! it, and that register intact (`je` 22 bytes in on Debian's 3.11, 24 on
//! forky's 3.13 and 3.14, past `sub $0x48,%rsp`). Moving the stack pointer
//! first does not matter here: the program reads that register and the
//! target's memory, never the stack (the exception [`super::placement`]
//! describes). Where no such instruction exists, the entry, reading
//! `usable_arenas` through the state argument (3.12+), single-stepped if
//! the kernel must, and said so.
//!
//! `growth_arena` goes on the one call of `arena_map_mark_used` in that
//! function (inlined `new_arena`), a direct `call` the kernel emulates,
//! where the new arena's address is an argument register. With the carve
//! probes it only counts the arena and ends its mapping's sample (the
//! carve probe takes its first pool).

mod carve;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Formatter as _, Instruction, InstructionInfoFactory, Mnemonic, OpKind,
    Register,
};
use serde::{Deserialize, Serialize};
use tracer_common::{growth, site};

use super::placement::{self, KernelVersion, Step};
use crate::{
    discover::{elf::ElfImage, growth::GrowthSymbols},
    python::growth::{GrowthKnowledge, RDI, TAKE_FUNCTION, Usable},
};

/// How far into `allocate_from_new_pool` the take's probe may go.
const MAX_PROLOGUE: u64 = 64;

/// Which of the two probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrowthRole {
    /// `growth_take`: every pool taken from a usable arena (where the carve
    /// blocks were not found).
    Take,
    /// `growth_carve`: a never used pool carved from an arena.
    Carve,
    /// `growth_arena`: a new arena's first pool.
    Arena,
}

/// One growth probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowthPoint {
    pub role: GrowthRole,
    /// The function probed, as its symbol table names it.
    pub function: String,
    /// The probed instruction's link-time address, and its offset in the
    /// image file (where the uprobe goes).
    pub address: u64,
    pub file_offset: u64,
    /// Bytes from the function's entry.
    pub offset: u64,
    /// The instruction there, AT&T syntax.
    pub instruction: String,
    /// Whether the kernel emulates it (else it single-steps it).
    pub emulated: bool,
    /// Why there.
    pub reason: String,
    /// What the program reads there.
    pub reads: String,
    /// The BPF cookie: where it reads it.
    #[serde(skip)]
    pub cookie: u64,
}

/// `--growth`'s part of a plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowthPlan {
    /// The take's probe, then the arena's where there is one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<GrowthPoint>,
    /// What is probed, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// What the samples miss, where they miss something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    /// Why every pool take is probed, not only the carves: the carve
    /// blocks were not found (a churny target's reuses then cost it a hit
    /// each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Why nothing is probed: growth is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// pymalloc's pool size on this build (4 KiB on 3.9, 16 KiB from
    /// 3.10): what one pool sampled stands for. 0 where unavailable.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pool_size: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
const fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl GrowthPlan {
    /// No growth probes, for `why`.
    #[must_use]
    pub fn unavailable(why: impl Into<String>) -> Self {
        Self { unavailable: Some(why.into()), ..Self::default() }
    }

    /// The take's probe, where growth is available and probes every take.
    #[must_use]
    pub fn take(&self) -> Option<&GrowthPoint> {
        self.points.iter().find(|p| p.role == GrowthRole::Take)
    }

    /// Whether only the carves are probed (no reuse of a pool is seen).
    #[must_use]
    pub fn carves(&self) -> bool {
        self.points.iter().any(|p| p.role == GrowthRole::Carve)
    }
}

/// What growth's probes see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probed {
    /// The carves of never used pools (the profile's default growth): the
    /// code that grew pymalloc's footprint, at a hit a carve, rare.
    Carves,
    /// Every pool take, reuses of emptied pools included (`--growth`): a
    /// pool counts for its latest taker, the code that holds it now, at a
    /// hit a take, which a churny target makes tens of thousands of times
    /// a second.
    Takes,
}

/// Plans the growth probes of `elf` (the image) from `symbols` (found in
/// its symbol table or its debug file's) and `knowledge` (its version's),
/// probing what `probed` says (the carves where they are found; else,
/// said as a fallback, every take).
#[must_use]
pub fn plan(
    elf: &ElfImage,
    symbols: &GrowthSymbols,
    knowledge: &GrowthKnowledge,
    kernel: KernelVersion,
    probed: Probed,
) -> GrowthPlan {
    let take = &symbols.take;
    // The take's probe reads it (the carves' do not).
    let usable = match (knowledge.usable, symbols.usable_arenas) {
        (Usable::Static(_), Some(address)) => Ok(UsableAt::Static(address)),
        (Usable::Static(name), None) => {
            Err(format!("{} has {TAKE_FUNCTION} but not the static {name} it reads", symbols.table))
        }
        (Usable::InState { offset }, _) => Ok(UsableAt::InState(offset)),
    };
    let code = match code_of(elf, take.address, take.size) {
        Ok(code) => code,
        Err(why) => return GrowthPlan::unavailable(format!("{}: {why}", take.name)),
    };
    let point = |role, found: Found| {
        let file_offset = elf.file_offset(take.address + found.offset)?;
        Some(GrowthPoint {
            role,
            function: take.name.clone(),
            address: take.address + found.offset,
            file_offset,
            offset: found.offset,
            instruction: found.instruction,
            emulated: found.emulated,
            reason: found.reason,
            reads: found.reads,
            cookie: found.cookie,
        })
    };
    let no_segment =
        || GrowthPlan::unavailable(format!("{} is in no file-backed segment of {}", take.name, elf.path().display()));
    let mut caveats = Vec::new();
    let carves = match probed {
        Probed::Carves => carve::points(&code, take.address, knowledge.pool_size, kernel),
        Probed::Takes => Err(String::new()),
    };
    let (mut points, fallback) = match carves {
        Ok(carves) => {
            let Some(points) = carves.into_iter().map(|f| point(GrowthRole::Carve, f)).collect::<Option<Vec<_>>>()
            else {
                return no_segment();
            };
            (points, None)
        }
        Err(why) => {
            let found = match usable.and_then(|usable| take_point(&code, take.address, usable, kernel)) {
                Ok(found) => found,
                Err(take_why) => {
                    // Asked for every take, there is no carve's reason
                    // to give.
                    let why = if why.is_empty() { take_why } else { format!("{why}; and {take_why}") };
                    return GrowthPlan::unavailable(format!("{}: {why}", take.name));
                }
            };
            let Some(take_point) = point(GrowthRole::Take, found) else { return no_segment() };
            if !take_point.emulated {
                caveats.push(format!(
                    "{}'s probe is single-stepped ({}), which costs each pool taken several times an emulated hit",
                    take.name, take_point.reason
                ));
            }
            // Asked for (`--growth`), every take is no fallback.
            let fallback = (probed == Probed::Carves).then(|| format!(
                "{why}: every pool take is probed instead, reuses of emptied pools included, which a churny target makes tens of thousands of times a second (its cost then stops the profile's growth)"
            ));
            (vec![take_point], fallback)
        }
    };
    let carves = points.iter().any(|p| p.role == GrowthRole::Carve);
    let arena = symbols
        .mark_used
        .as_ref()
        .ok_or_else(|| format!("{} has no arena_map_mark_used", symbols.table))
        .and_then(|f| arena_point(&code, take.address, f.address, knowledge.arena_register, (kernel, carves)));
    match arena.map(|found| point(GrowthRole::Arena, found)) {
        Ok(Some(p)) => points.push(p),
        Ok(None) => caveats.push("the call of arena_map_mark_used is in no file-backed segment".to_owned()),
        // The carves see every new arena's first pool; its mapping is then
        // the C library's heap's, sampled with it.
        Err(why) if carves => caveats.push(format!(
            "{why}: new arenas are not counted, and their mappings are sampled as the C library's heap as well as their pools"
        )),
        Err(why) => caveats.push(format!(
            "{why}: a new arena's first pool is not sampled (one pool of each new arena's {})",
            if knowledge.pool_size == crate::python::heap::POOL_SIZE { "63 or 64" } else { "64" }
        )),
    }
    let detail = detail(&take.name, &symbols.table, &points, (carves, fallback.is_some()));
    GrowthPlan {
        points,
        detail,
        caveat: (!caveats.is_empty()).then(|| caveats.join("; ")),
        fallback,
        unavailable: None,
        pool_size: knowledge.pool_size,
    }
}

/// What is probed, in words, for `probes` and the attach header.
fn detail(name: &str, table: &str, points: &[GrowthPoint], (carves, fallback): (bool, bool)) -> String {
    let stepped = points.iter().filter(|p| p.role == GrowthRole::Carve && !p.emulated).count();
    let what = if carves {
        let n = points.iter().filter(|p| p.role == GrowthRole::Carve).count();
        format!(
            "the carve of a never used pool ({n} block{}{}), not the reuse of an emptied one",
            if n == 1 { "" } else { "s" },
            if stepped > 0 { format!(", {stepped} single-stepped: carves are rare") } else { String::new() }
        )
    } else if fallback {
        "every pool take (FALLBACK: the carve blocks were not found)".to_owned()
    } else {
        "every pool take, a reused pool counting for its latest taker (--growth)".to_owned()
    };
    format!(
        "{}, found in {}: {} probe{} ({what}); the C library's heap at the syscalls:{} tracepoints",
        name,
        table,
        points.len(),
        if points.len() == 1 { "" } else { "s" },
        tracer_common::names::programs::GROWTH_MAPPED.map(|(_, t)| t).join(",")
    )
}

/// The function's code, `size` bytes at `address` (its entry alone where
/// the table gives no size).
fn code_of(elf: &ElfImage, address: u64, size: u64) -> Result<Vec<u8>, String> {
    let offset = elf.file_offset(address).ok_or_else(|| "in no file-backed segment".to_owned())?;
    let len = usize::try_from(if size == 0 { MAX_PROLOGUE + 16 } else { size.min(1 << 20) }).unwrap_or(0);
    elf.read_at(offset, len).map_err(|e| e.to_string())
}

/// Where `usable_arenas` is, by link-time address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UsableAt {
    /// A static at this address (3.11).
    Static(u64),
    /// At this offset in the first argument's state (3.12+).
    InState(u64),
}

/// A place found in a function.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Found {
    offset: u64,
    instruction: String,
    emulated: bool,
    reason: String,
    reads: String,
    cookie: u64,
}

/// Whether `instr` loads `usable_arenas` whole into a register.
fn loads(instr: &Instruction, usable: UsableAt) -> bool {
    let into_register = instr.mnemonic() == Mnemonic::Mov
        && instr.op_count() == 2
        && instr.op0_kind() == OpKind::Register
        && instr.op0_register().size() == 8
        && instr.op1_kind() == OpKind::Memory;
    into_register
        && match usable {
            UsableAt::Static(address) => instr.is_ip_rel_memory_operand() && instr.ip_rel_memory_address() == address,
            UsableAt::InState(offset) => {
                instr.memory_base() == Register::RDI
                    && instr.memory_index() == Register::None
                    && instr.memory_displacement64() == offset
            }
        }
}

/// The take's place in the function whose code (from its entry) is `code`
/// at `address` (see the module's comment).
fn take_point(code: &[u8], address: u64, usable: UsableAt, kernel: KernelVersion) -> Result<Found, String> {
    let mut info = InstructionInfoFactory::new();
    let mut held: Option<Register> = None;
    let mut skipped: Vec<String> = Vec::new();
    let mut why = "the code could not be decoded".to_owned();
    for Step { offset, bytes, instr, shown } in placement::instructions(code, address) {
        if let (Some(register), Some(kind)) = (held, placement::emulated(bytes, kernel)) {
            if let Some(branch) = placement::branch_into(code, address, offset) {
                why = branch;
                break;
            }
            let number = dwarf(register).ok_or_else(|| format!("{register:?} is no general-purpose register"))?;
            return Ok(Found {
                offset,
                instruction: shown,
                emulated: true,
                reason: format!(
                    "first emulated instruction ({kind}) with usable_arenas in a register; before it: {} (the program reads no stack, so moving the stack pointer does not matter)",
                    skipped.join("; ")
                ),
                reads: format!("usable_arenas in %{}", format!("{register:?}").to_lowercase()),
                cookie: growth::take_cookie(site::register(number).unwrap_or(site::NONE), 0),
            });
        }
        if offset >= MAX_PROLOGUE {
            why = format!("no emulated instruction with usable_arenas in a register in the first {MAX_PROLOGUE} bytes");
            break;
        }
        if instr.flow_control() != FlowControl::Next {
            why = format!("`{shown}` at +{offset} changes control flow first");
            break;
        }
        if held.is_none() && loads(&instr, usable) {
            held = Some(instr.op0_register().full_register());
            skipped.push(shown);
            continue;
        }
        let read = held.or(matches!(usable, UsableAt::InState(_)).then_some(Register::RDI));
        let overwrites = placement::written(&mut info, &instr).into_iter().find(|full| Some(*full) == read);
        if let Some(register) = overwrites {
            why = format!("`{shown}` at +{offset} overwrites {register:?}, which the probe reads");
            break;
        }
        skipped.push(shown);
    }
    // The entry, reading usable_arenas through the state, where it is an
    // argument.
    let UsableAt::InState(offset) = usable else {
        return Err(format!("no place to read usable_arenas at: {why}"));
    };
    let entry = placement::at_entry_of(code, address, kernel, &format!("entry: {why}"));
    let (first, constant) = site::memory(RDI, i64::try_from(offset).unwrap_or(i64::MAX))
        .ok_or_else(|| format!("usable_arenas at {offset} in the state is beyond the cookie's reach"))?;
    Ok(Found {
        offset: 0,
        instruction: entry.instruction,
        emulated: entry.emulated,
        reason: entry.reason,
        reads: format!("usable_arenas at {offset:#x}(%rdi)"),
        cookie: growth::take_cookie(first, constant),
    })
}

/// The arena's place: the one direct call of `mark_used` in the function
/// at `address` whose code is `code`, where the arena's address is in
/// argument register `register` (DWARF number).
fn arena_point(
    code: &[u8],
    address: u64,
    mark_used: u64,
    register: u16,
    (kernel, carves): (KernelVersion, bool),
) -> Result<Found, String> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut formatter = placement::formatter();
    let mut instr = Instruction::default();
    let mut calls = Vec::new();
    while decoder.can_decode() {
        let at = decoder.ip();
        decoder.decode_out(&mut instr);
        if instr.flow_control() == FlowControl::Call && instr.near_branch_target() == mark_used {
            let start = usize::try_from(at - address).unwrap_or(usize::MAX);
            let bytes = code.get(start..start + instr.len()).unwrap_or(&[]).to_vec();
            let mut shown = String::new();
            formatter.format(&instr, &mut shown);
            calls.push((at - address, bytes, shown));
        }
    }
    let [(offset, bytes, shown)] = calls.as_slice() else {
        return Err(format!("{TAKE_FUNCTION} calls arena_map_mark_used {} times, not once", calls.len()));
    };
    let kind = placement::emulated(bytes, kernel);
    let name = ["rax", "rdx", "rcx", "rbx", "rsi", "rdi"].get(usize::from(register)).copied().unwrap_or("?");
    Ok(Found {
        offset: *offset,
        instruction: shown.clone(),
        emulated: kind.is_some(),
        reason: format!("the call that marks a new arena used ({})", kind.unwrap_or("single-stepped")),
        reads: format!("the new arena's address in %{name}"),
        cookie: growth::arena_cookie(site::register(register).unwrap_or(site::NONE), carves),
    })
}

/// The DWARF x86-64 number of a general-purpose register.
fn dwarf(register: Register) -> Option<u16> {
    const ORDER: [Register; 16] = [
        Register::RAX,
        Register::RDX,
        Register::RCX,
        Register::RBX,
        Register::RSI,
        Register::RDI,
        Register::RBP,
        Register::RSP,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];
    ORDER.iter().position(|r| *r == register.full_register()).and_then(|i| u16::try_from(i).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const K618: KernelVersion = (6, 18);

    /// The forky root's python3.14 `allocate_from_new_pool.lto_priv.0`
    /// (0x543320), its first 30 bytes: `endbr64; sub $0x48,%rsp; mov
    /// 0x218(%rdi),%rcx; mov %rdi,%r9; mov %esi,%r8d; test %rcx,%rcx; je`.
    const F14: &[u8] = &[
        0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x48, 0x48, 0x8b, 0x8f, 0x18, 0x02, 0x00, 0x00, 0x49, 0x89, 0xf9,
        0x41, 0x89, 0xf0, 0x48, 0x85, 0xc9, 0x0f, 0x84, 0x93, 0x01, 0x00, 0x00,
    ];

    #[test]
    fn the_take_goes_past_the_stack_pointer_move_to_the_je() {
        let found = take_point(F14, 0x0054_3320, UsableAt::InState(0x218), K618).unwrap();
        assert_eq!((found.offset, found.emulated), (0x18, true), "{found:?}");
        assert!(found.instruction.starts_with("je "), "{found:?}");
        assert_eq!(found.reads, "usable_arenas in %rcx");
        assert_eq!(site::first(found.cookie), site::register(2).unwrap());
        // placement's own rule stays at the entry, single-stepped.
        let own = placement::place(F14, 0x0054_3320, crate::probe::Program::CountCall, K618);
        assert_eq!((own.offset, own.emulated), (0, false));
        assert!(own.reason.contains("moves the stack pointer"), "{own:?}");
    }

    #[test]
    fn a_register_overwritten_first_leaves_the_entry() {
        // endbr64; mov 0x218(%rdi),%rcx; xor %ecx,%ecx; je
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x8f, 0x18, 0x02, 0, 0, 0x31, 0xc9, 0x74, 0x00];
        let found = take_point(&code, 0x1000, UsableAt::InState(0x218), K618).unwrap();
        assert_eq!((found.offset, found.emulated), (0, false), "{found:?}");
        assert!(found.reason.contains("overwrites RCX"), "{found:?}");
        assert_eq!(found.reads, "usable_arenas at 0x218(%rdi)");
        // 3.11 has no state to read at the entry.
        let err = take_point(&code, 0x1000, UsableAt::Static(0x5000), K618).unwrap_err();
        assert!(err.starts_with("no place to read usable_arenas at:"), "{err}");
    }

    #[test]
    fn a_branch_into_the_prologue_leaves_the_entry() {
        // 0: mov 0x218(%rdi),%rcx (7)  7: test %rcx,%rcx (3)  10: je -> 7
        let code = [0x48, 0x8b, 0x8f, 0x18, 0x02, 0, 0, 0x48, 0x85, 0xc9, 0x74, 0xfb];
        let found = take_point(&code, 0x100, UsableAt::InState(0x218), K618).unwrap();
        assert_eq!(found.offset, 0, "{found:?}");
        assert!(found.reason.contains("lands at +7"), "{found:?}");
    }

    #[test]
    fn the_arena_is_the_one_call_of_mark_used() {
        // 0: mov %rax,%rsi  3: call 0x1108
        let one = [0x48, 0x89, 0xc6, 0xe8, 0x00, 0x01, 0x00, 0x00];
        let found = arena_point(&one, 0x1000, 0x1108, 4, (K618, true)).unwrap();
        assert_eq!(site::slot(found.cookie), growth::ARENA_CARVED);
        assert_eq!((found.offset, found.emulated), (3, true));
        assert_eq!(found.reads, "the new arena's address in %rsi");
        let none = arena_point(&one, 0x1000, 0x2000, 4, (K618, false)).unwrap_err();
        assert_eq!(none, "allocate_from_new_pool calls arena_map_mark_used 0 times, not once");
    }
}
