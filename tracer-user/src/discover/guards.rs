//! Finding the copies LTO inlined without any debug info: every inlined copy
//! of a probed function still reads the runtime switch that guards it, so
//! each read of that switch in the code is one copy.
//!
//! - `_Py_NewReference` reads the tracemalloc flag (3.11, 3.12) or the
//!   reference tracer (3.13+), which it calls when set;
//! - every allocator function reads its slot in the allocator table
//!   (`PyMem_SetAllocator` can change it) and calls through it; that read
//!   is also where PGO compares the slot against pymalloc, to run an inlined
//!   pymalloc instead.
//!
//! The switch's address comes from the exported function's own code: the
//! first read of static memory in `_Py_NewReference`, the slot an allocator
//! function calls through. Reads are found by decoding every executable
//! section. A site's *slow path*, where the switch is set, shows what the
//! copy does: the event it passes to the reference tracer (creation or
//! destruction) and the size it passes to the allocator, whose register is
//! then read at the site.
//!
//! Limits, each reported rather than guessed: a copy that reached the switch
//! through a register rather than by address is not found; code whose
//! symbols are stripped may hold reads of the switch that are no call
//! (startup code that installs allocators), which the difference between
//! two readings cancels.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SectionFlags, SymbolKind};

use super::{InlineEntry, elf::ElfError};
use crate::python::Guard;

/// Instructions one slow-path walk follows before it gives up.
const MAX_PATH: usize = 96;
/// Instructions all walks from one site follow together.
const MAX_WALK: usize = 600;
/// How many instructions past a site a probe may move.
const MAX_LATER: usize = 4;

/// `PyRefTracer_CREATE` and `PyRefTracer_DESTROY`, the event the reference
/// tracer is passed (Include/cpython/object.h, `PyRefTracerEvent`, at
/// v3.13.0 and v3.14.0).
const REF_TRACER_CREATE: u64 = 0;
const REF_TRACER_DESTROY: u64 = 1;

/// What the scan found for one function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The switch, described for `tracer probes` ("the allocator slot at
    /// 0x954f48").
    pub guard: String,
    /// One per inlined copy: where to probe it, with the later instructions
    /// a probe may move to instead.
    pub sites: Vec<GuardSite>,
    /// Reads of the switch where objects are destroyed (3.13+), not counted.
    pub destroy: usize,
    /// Reads that could not be told creation or destruction: not counted,
    /// so the calls are partial.
    pub unclassified: Vec<u64>,
    /// Reads inside the function itself (its entry probe counts those) or
    /// in functions that only manage the switch.
    pub excluded: usize,
    /// Reads in a function whose start (from `.eh_frame`) the linear
    /// decoding did not land on: the decoding there may be out of step with
    /// the code, and a breakpoint inside an instruction would break the
    /// target. Not probed, so the calls are partial.
    pub undecodable: usize,
}

/// One copy found by its read of the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardSite {
    /// The read, and where the size is there.
    pub read: InlineEntry,
    /// Later instructions on the same straight line, which every pass
    /// through the read reaches exactly once and no branch enters, each with
    /// where the size is there: a probe may go to one the kernel emulates.
    pub later: Vec<InlineEntry>,
}

/// Where the two routes to a function's copies disagree: the DWARF's
/// inlined copies, and the reads of the switch that guards them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CrossCheck {
    /// The copies each route found.
    pub dwarf: usize,
    pub guard_reads: usize,
    /// Reads of the switch that lie in no copy the DWARF lists (link-time
    /// addresses).
    pub guard_only: Vec<u64>,
    /// Entries of the DWARF's copies that hold no read of the switch.
    pub dwarf_only: Vec<u64>,
}

impl CrossCheck {
    /// Compares the reads `found` with the DWARF's copies of the same
    /// function, each an entry and the ranges of its code.
    #[must_use]
    pub fn of(found: &Found, copies: &[(u64, &[std::ops::Range<u64>])]) -> Self {
        let reads: Vec<u64> = found.sites.iter().map(|s| s.read.address).collect();
        let inside = |read: u64| copies.iter().any(|(_, ranges)| ranges.iter().any(|r| r.contains(&read)));
        let holds_read = |ranges: &[std::ops::Range<u64>]| reads.iter().any(|a| ranges.iter().any(|r| r.contains(a)));
        Self {
            dwarf: copies.len(),
            guard_reads: reads.len(),
            guard_only: reads.iter().copied().filter(|&a| !inside(a)).collect(),
            dwarf_only: copies.iter().filter(|(_, ranges)| !holds_read(ranges)).map(|(entry, _)| *entry).collect(),
        }
    }
}

/// Why a function's copies were not found this way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotFound {
    /// The version module knows no switch that guards it.
    NoGuard,
    /// The image does not define it.
    NoSymbol,
    /// Its code does not show the switch, or shows one that disagrees with
    /// the cross-check.
    Unrecognised(String),
}

/// The result of scanning one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The scanned image.
    pub path: PathBuf,
    pub functions: HashMap<String, Result<Found, NotFound>>,
}

/// A probed function and how its copies can be found.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub function: &'a str,
    pub guard: Option<Guard>,
    /// Which slow-path registers hold the requested size, for an
    /// allocating function.
    pub size: SizeArgs,
    /// Which of the slow path's arguments is to be read at the site, if
    /// any.
    pub object: Option<ObjectArg>,
}

/// An argument of a guarded call that a probe reads besides the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectArg {
    /// The first (`%rdi`), the new object: `_PyTraceMalloc_NewReference(op)`
    /// (3.11, 3.12), the reference tracer's `tracer_func(op, event, data)`
    /// (3.13+).
    NewObject,
    /// The second (`%rsi`), a realloc's block, for `--live`: the allocator
    /// table's `realloc(ctx, ptr, new_size)` (Include/cpython/pymem.h,
    /// `PyMemAllocatorEx`, v3.11.0 to v3.14.0).
    Reallocated,
}

impl ObjectArg {
    /// What probe `symbol`'s sites read besides the size.
    #[must_use]
    pub fn of(symbol: &str) -> Option<Self> {
        if crate::python::object_parameter(symbol).is_some() {
            Some(Self::NewObject)
        } else {
            crate::python::reallocated_block_parameter(symbol).map(|_| Self::Reallocated)
        }
    }

    const fn register(self) -> usize {
        match self {
            Self::NewObject => RDI,
            Self::Reallocated => RSI,
        }
    }
}

/// Where the allocator function a slot points to is passed the size: it
/// takes the domain's context first, so each API argument moves one
/// register on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeArgs {
    None,
    /// `malloc(ctx, size)`: `%rsi`.
    Second,
    /// `realloc(ctx, ptr, size)`: `%rdx`.
    Third,
    /// `calloc(ctx, nelem, elsize)`: `%rsi` times `%rdx`.
    SecondTimesThird,
}

impl SizeArgs {
    /// Where the slow path passes the size for a function probed with
    /// `program`.
    #[must_use]
    pub const fn of(program: crate::probe::Program) -> Self {
        use crate::probe::Program;
        match program {
            Program::SizeArg0 => Self::Second,
            Program::SizeArg1 => Self::Third,
            Program::Calloc => Self::SecondTimesThird,
            Program::CountCall
            | Program::Empty
            | Program::MetaInsert
            | Program::MetaLookup
            | Program::MetaPool
            | Program::MetaChunk
            | Program::RetValue
            | Program::RetValueUret
            | Program::LiveAlloc
            | Program::LiveFree
            | Program::LiveImpl
            | Program::LiveRet
            | Program::LiveRetUret
            | Program::CountSite
            | Program::CountObject
            | Program::NativeSizeArg0
            | Program::NativeSizeArg1
            | Program::NativeSizeArg2
            | Program::NativeCalloc
            | Program::NativeCall
            | Program::NativeReleaseArg1
            | Program::NativeNested
            | Program::FreeObject => Self::None,
        }
    }
}

/// Scans the image at `path` for the copies of each of `wanted`; with
/// `symbols`, a debug file's, also names its static functions.
pub fn scan(path: &Path, wanted: &[Wanted<'_>], symbols: Option<(&Path, &[u8])>) -> Result<Scan, ElfError> {
    let data = std::fs::read(path).map_err(|cause| ElfError::Read { path: path.to_owned(), cause })?;
    let mut code = Code::parse(path, &data)?;
    if let Some((debug_path, debug)) = symbols {
        let file =
            object::File::parse(debug).map_err(|cause| ElfError::Parse { path: debug_path.to_owned(), cause })?;
        code.add_symbols(&file);
    }
    let functions = wanted.iter().map(|w| (w.function.to_owned(), code.find(w))).collect();
    Ok(Scan { path: path.to_owned(), functions })
}

/// The executable sections of an image, decoded once.
struct Code<'a> {
    /// (address, bytes) of each executable section.
    sections: Vec<(u64, &'a [u8])>,
    /// Every decoded instruction, by address.
    instructions: Vec<Instruction>,
    /// Every address a direct branch or call lands on.
    targets: HashSet<u64>,
    /// Defined functions by name: (address, size).
    symbols: HashMap<String, (u64, u64)>,
    /// Their ranges, sorted by start.
    ranges: Vec<(u64, u64, String)>,
    /// Defined data symbols by name: (address, size).
    data: HashMap<String, (u64, u64)>,
    /// The functions (`.eh_frame`'s ranges) whose start the linear decoding
    /// did not land on.
    unsynced: Vec<std::ops::Range<u64>>,
}

impl<'a> Code<'a> {
    fn parse(path: &Path, data: &'a [u8]) -> Result<Self, ElfError> {
        let file = object::File::parse(data).map_err(|cause| ElfError::Parse { path: path.to_owned(), cause })?;
        let mut sections = Vec::new();
        for section in file.sections() {
            let executable = match section.flags() {
                SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0,
                _ => false,
            };
            if !executable || section.kind() == object::SectionKind::UninitializedData {
                continue;
            }
            // A section without file bytes (a debug file's) has no code.
            if let Ok(bytes) = section.data()
                && !bytes.is_empty()
            {
                sections.push((section.address(), bytes));
            }
        }
        let mut code = Self::decode(sections);
        code.add_symbols(&file);
        code.unsynced = code.unsynced_functions(&file);
        Ok(code)
    }

    /// The ranges of the functions `.eh_frame` lists whose start is no
    /// instruction of the linear decoding. An unreadable `.eh_frame` proves
    /// nothing either way and is passed over: the linear decoding of GCC's
    /// code, which embeds no data in `.text`, stays in step (on Debian's
    /// 3.11, 3.13 and 3.14 it lands on all of their 9,810 to 12,403
    /// function starts).
    fn unsynced_functions(&self, file: &object::File<'_>) -> Vec<std::ops::Range<u64>> {
        use gimli::UnwindSection as _;
        let Some(section) = file.section_by_name(".eh_frame") else { return Vec::new() };
        let Ok(data) = section.data() else { return Vec::new() };
        let mut frame = gimli::EhFrame::new(data, gimli::LittleEndian);
        frame.set_address_size(8);
        let bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
        let mut entries = frame.entries(&bases);
        let mut out = Vec::new();
        while let Ok(Some(entry)) = entries.next() {
            let gimli::CieOrFde::Fde(partial) = entry else { continue };
            let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else { continue };
            let start = fde.initial_address();
            let on_boundary = self.instructions.binary_search_by_key(&start, Instruction::ip).is_ok();
            if !on_boundary && self.at(start).is_some() {
                out.push(start..start + fde.len());
            }
        }
        out
    }

    /// Decodes `sections`, each (address, bytes).
    fn decode(sections: Vec<(u64, &'a [u8])>) -> Self {
        let mut instructions = Vec::new();
        let mut targets = HashSet::new();
        for &(address, bytes) in &sections {
            let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
            let mut insn = Instruction::default();
            while decoder.can_decode() {
                decoder.decode_out(&mut insn);
                if matches!(
                    insn.flow_control(),
                    FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
                ) {
                    targets.insert(insn.near_branch_target());
                }
                instructions.push(insn);
            }
        }
        Self {
            sections,
            instructions,
            targets,
            symbols: HashMap::new(),
            ranges: Vec::new(),
            data: HashMap::new(),
            unsynced: Vec::new(),
        }
    }

    /// Adds the functions and data `file` names.
    fn add_symbols(&mut self, file: &object::File<'_>) {
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.is_undefined() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let name = name.split('@').next().unwrap_or(name).to_owned();
            match sym.kind() {
                SymbolKind::Text => {
                    self.symbols.entry(name).or_insert((sym.address(), sym.size()));
                }
                SymbolKind::Data => {
                    self.data.entry(name).or_insert((sym.address(), sym.size()));
                }
                _ => {}
            }
        }
        self.index_ranges();
    }

    /// Sorts the named functions' ranges, for [`Code::containing`].
    fn index_ranges(&mut self) {
        self.ranges =
            self.symbols.iter().filter(|(_, (_, size))| *size > 0).map(|(n, &(a, s))| (a, a + s, n.clone())).collect();
        self.ranges.sort_unstable();
    }

    /// The instruction at `address`, decoded from the section that holds it.
    fn at(&self, address: u64) -> Option<Instruction> {
        if let Ok(i) = self.instructions.binary_search_by_key(&address, Instruction::ip) {
            return Some(self.instructions[i]);
        }
        let &(start, bytes) = self.sections.iter().find(|(s, b)| (*s..*s + b.len() as u64).contains(&address))?;
        let offset = usize::try_from(address - start).ok()?;
        let mut decoder = Decoder::with_ip(64, &bytes[offset..], address, DecoderOptions::NONE);
        let insn = decoder.decode();
        (!insn.is_invalid()).then_some(insn)
    }

    /// The functions whose code holds `address`.
    fn containing(&self, address: u64) -> impl Iterator<Item = &str> {
        let end = self.ranges.partition_point(|(start, _, _)| *start <= address);
        self.ranges[..end].iter().rev().take(64).filter(move |(_, e, _)| address < *e).map(|(_, _, n)| n.as_str())
    }

    fn find(&self, wanted: &Wanted<'_>) -> Result<Found, NotFound> {
        let guard = wanted.guard.ok_or(NotFound::NoGuard)?;
        let &(entry, size) = self.symbols.get(wanted.function).ok_or(NotFound::NoSymbol)?;
        let address = self.switch(guard, entry)?;
        let mut found = Found {
            guard: format!("{} at {address:#x}", guard.describe()),
            sites: Vec::new(),
            destroy: 0,
            unclassified: Vec::new(),
            excluded: 0,
            undecodable: 0,
        };
        // The function's own reads, cold parts included, are its entry
        // probe's.
        // Only tracemalloc's flag guards a direct call; a direct call on an
        // allocator's fast path may be another copy, passed other arguments.
        let direct = matches!(guard, Guard::TracemallocFlag { .. });
        let walked = self.walk(entry, address, None, direct);
        let own = walked.reads;
        // What the slow path calls (tracemalloc's `_PyTraceMalloc_NewReference`,
        // static and so nameless in a stripped image) tests the switch
        // again at its start: no copy either.
        let callees: HashSet<u64> = walked
            .callees
            .iter()
            .flat_map(|&c| self.straight_line(c, 8))
            .filter(|i| reads(i, address))
            .map(|i| i.ip())
            .collect();
        for (i, insn) in self.instructions.iter().enumerate() {
            if !reads(insn, address) {
                continue;
            }
            let at = insn.ip();
            // Outside every named function, or in a part GCC split off
            // this one (`PyObject_Malloc.cold`).
            let own_part =
                self.containing(at).all(|f| f.strip_prefix(wanted.function).is_some_and(|r| r.starts_with('.')));
            if (entry..entry + size.max(1)).contains(&at)
                || (own_part && own.contains(&at))
                || callees.contains(&at)
                || self.containing(at).any(|f| guard.manages(f))
            {
                found.excluded += 1;
                continue;
            }
            if self.unsynced.iter().any(|r| r.contains(&at)) {
                found.undecodable += 1;
                continue;
            }
            let walk = self.walk(at, address, Some(insn), direct);
            match guard {
                Guard::RefTracer => match walk.call.and_then(|s| s[RSI].constant()) {
                    Some(REF_TRACER_CREATE) => {}
                    Some(REF_TRACER_DESTROY) => {
                        found.destroy += 1;
                        continue;
                    }
                    _ if self.sets_refcount_to_one(i) => {}
                    _ => {
                        found.unclassified.push(at);
                        continue;
                    }
                },
                Guard::TracemallocFlag { .. } | Guard::AllocatorSlot => {}
            }
            found.sites.push(self.site(i, walk.call.as_ref(), wanted));
        }
        Ok(found)
    }

    /// The address of the switch `guard`, from the code of the function at
    /// `entry`.
    fn switch(&self, guard: Guard, entry: u64) -> Result<u64, NotFound> {
        let unrecognised = |why: String| NotFound::Unrecognised(why);
        match guard {
            Guard::TracemallocFlag { .. } | Guard::RefTracer => {
                let first = self
                    .straight_line(entry, 8)
                    .into_iter()
                    .find_map(|i| static_read(&i))
                    .ok_or_else(|| unrecognised("its first instructions read no static memory".to_owned()))?;
                if let Guard::TracemallocFlag { within, offset } = guard
                    && let Some(&(start, size)) = self.data.get(within)
                {
                    let expected = match offset {
                        Some(offset) => (first != start + offset).then(|| format!("{within}+{offset}")),
                        None => (!(start..start + size.max(1)).contains(&first)).then(|| format!("inside {within}")),
                    };
                    if let Some(expected) = expected {
                        return Err(unrecognised(format!("its first read ({first:#x}) is not {expected}")));
                    }
                }
                if guard == Guard::RefTracer
                    && let Some(&(getter, _)) = self.symbols.get("PyRefTracer_GetTracer")
                {
                    // PyRefTracer_GetTracer returns the tracer: its last
                    // read into %rax before it returns.
                    let returned = self
                        .straight_line_to_return(getter, 16)
                        .iter()
                        .rev()
                        .find(|i| static_read(i).is_some() && i.op0_register().full_register() == Register::RAX)
                        .and_then(static_read);
                    if returned.is_some_and(|r| r != first) {
                        return Err(unrecognised(format!(
                            "its first read ({first:#x}) is not the tracer PyRefTracer_GetTracer returns ({:#x})",
                            returned.unwrap_or_default()
                        )));
                    }
                }
                Ok(first)
            }
            Guard::AllocatorSlot => self.called_slot(entry).ok_or_else(|| {
                unrecognised("its code calls through no slot of static memory that tracer can see".to_owned())
            }),
        }
    }

    /// Up to `n` instructions from `address`, stopping after the first
    /// branch.
    fn straight_line(&self, address: u64, n: usize) -> Vec<Instruction> {
        let mut out = Vec::new();
        let mut at = address;
        while out.len() < n {
            let Some(insn) = self.at(at) else { break };
            out.push(insn);
            if insn.flow_control() != FlowControl::Next {
                break;
            }
            at = insn.next_ip();
        }
        out
    }

    /// The instructions from `address` to its first return, following
    /// conditional branches' fall-through and direct jumps.
    fn straight_line_to_return(&self, address: u64, n: usize) -> Vec<Instruction> {
        let mut out = Vec::new();
        let mut at = address;
        while out.len() < n {
            let Some(insn) = self.at(at) else { break };
            out.push(insn);
            at = match insn.flow_control() {
                FlowControl::Next | FlowControl::ConditionalBranch => insn.next_ip(),
                FlowControl::UnconditionalBranch => insn.near_branch_target(),
                _ => break,
            };
        }
        out
    }

    /// The static slot the function at `entry` calls through (or compares
    /// against a function, where PGO devirtualised the call).
    fn called_slot(&self, entry: u64) -> Option<u64> {
        let mut stack = vec![(entry, [Value::Unknown; 16], 0usize)];
        let mut seen = HashSet::new();
        while let Some((mut at, mut state, mut steps)) = stack.pop() {
            while steps < MAX_PATH && seen.insert(at) {
                steps += 1;
                let insn = self.at(at)?;
                if let Some(slot) = called_through(&insn, &state) {
                    return Some(slot);
                }
                match insn.flow_control() {
                    FlowControl::ConditionalBranch => {
                        stack.push((insn.near_branch_target(), state, steps));
                        at = insn.next_ip();
                    }
                    FlowControl::UnconditionalBranch => at = insn.near_branch_target(),
                    FlowControl::Next => at = insn.next_ip(),
                    FlowControl::Call | FlowControl::IndirectCall => {
                        clobber_call(&mut state);
                        at = insn.next_ip();
                    }
                    _ => break,
                }
                step(&insn, &mut state);
            }
        }
        None
    }

    /// Follows the paths from the read at `start` (with `site` its
    /// instruction; `None` from a function's entry) to the call the switch
    /// guards, with the registers at `start` as the origin.
    fn walk(&self, start: u64, switch: u64, site: Option<&Instruction>, direct: bool) -> Walk {
        let identity: [Value; 16] = std::array::from_fn(|r| Value::Register(u8::try_from(r).unwrap_or(0)));
        let mut walk = Walk::default();
        // Breadth first, by branches taken: a slow path is a branch or two
        // away, and the fall-through runs on into the rest of the caller.
        let mut queue = std::collections::VecDeque::from([(start, identity, 0usize)]);
        let mut seen = HashSet::new();
        let mut total = 0;
        while let Some((mut at, mut state, mut steps)) = queue.pop_front() {
            while steps < MAX_PATH && total < MAX_WALK && seen.insert(at) {
                steps += 1;
                total += 1;
                let Some(insn) = self.at(at) else { break };
                if reads(&insn, switch) {
                    walk.reads.insert(at);
                    // Another copy's read: this path left the site's copy.
                    if site.is_some() && at != start {
                        break;
                    }
                }
                // The guarded call: through the switch (the reference
                // tracer, an allocator slot), or of a function that tests
                // the switch again first (tracemalloc's
                // `_PyTraceMalloc_NewReference`).
                let guarded = indirect_target(&insn, &state) == Some(switch)
                    || (direct
                        && insn.flow_control() == FlowControl::Call
                        && self.straight_line(insn.near_branch_target(), 8).iter().any(|i| reads(i, switch)));
                if site.is_some() && guarded {
                    // Where two slow paths disagree on a register, nothing
                    // is known of it.
                    let merged = walk.call.map_or(state, |c| {
                        std::array::from_fn(|r| if c[r] == state[r] { c[r] } else { Value::Unknown })
                    });
                    walk.call = Some(merged);
                    break;
                }
                match insn.flow_control() {
                    FlowControl::ConditionalBranch => {
                        step(&insn, &mut state);
                        queue.push_back((insn.near_branch_target(), state, steps));
                        queue.push_back((insn.next_ip(), state, steps));
                        break;
                    }
                    FlowControl::UnconditionalBranch => at = insn.near_branch_target(),
                    FlowControl::Next => at = insn.next_ip(),
                    FlowControl::Call | FlowControl::IndirectCall => {
                        if insn.flow_control() == FlowControl::Call {
                            walk.callees.push(insn.near_branch_target());
                        }
                        clobber_call(&mut state);
                        at = insn.next_ip();
                        continue;
                    }
                    _ => break,
                }
                step(&insn, &mut state);
            }
        }
        walk
    }

    /// Whether `movq $1,(reg)` (a new object's reference count) is within
    /// two instructions of the read at index `i`.
    fn sets_refcount_to_one(&self, i: usize) -> bool {
        let near = self.instructions.get(i.saturating_sub(2)..(i + 3).min(self.instructions.len())).unwrap_or(&[]);
        near.iter().any(|insn| {
            insn.mnemonic() == Mnemonic::Mov
                && insn.op0_kind() == OpKind::Memory
                && insn.memory_displacement64() == 0
                && insn.memory_index() == Register::None
                && insn.memory_size().size() == 8
                && matches!(insn.op1_kind(), OpKind::Immediate32to64)
                && insn.immediate(1) == 1
        })
    }

    /// The site at instruction `i`, with the size read where `call` (the
    /// registers at the guarded call, in terms of those at the read) says.
    fn site(&self, i: usize, call: Option<&[Value; 16]>, wanted: &Wanted<'_>) -> GuardSite {
        let read = self.instructions[i];
        let identity: [Value; 16] = std::array::from_fn(|r| Value::Register(u8::try_from(r).unwrap_or(0)));
        let entry = |address: u64, at: &[Value; 16]| InlineEntry {
            address,
            size: call.and_then(|c| size_operands(c, at, wanted.size)),
            object: call.zip(wanted.object).and_then(|(c, arg)| object_operand(c, at, arg)),
        };
        let mut found = GuardSite { read: entry(read.ip(), &identity), later: Vec::new() };
        // The instructions after the read, while each is reached from the
        // read alone: none is a branch target, none before is a branch.
        let mut state = identity;
        let mut prev = read;
        for later in self.instructions.iter().skip(i + 1).take(MAX_LATER) {
            if prev.flow_control() != FlowControl::Next || self.targets.contains(&later.ip()) {
                break;
            }
            step(&prev, &mut state);
            found.later.push(entry(later.ip(), &state));
            prev = *later;
        }
        found
    }
}

#[derive(Default)]
struct Walk {
    /// The registers at the guarded call, if a path reached it.
    call: Option<[Value; 16]>,
    /// The reads of the switch the walk passed.
    reads: HashSet<u64>,
    /// The functions it passed calls of.
    callees: Vec<u64>,
}

/// What a register holds, in terms of the registers where a walk started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Unknown,
    /// Register `n` (DWARF numbering) at the start.
    Register(u8),
    Constant(u64),
    /// Loaded from static memory at this address.
    Loaded(u64),
}

impl Value {
    fn constant(self) -> Option<u64> {
        match self {
            Self::Constant(c) => Some(c),
            _ => None,
        }
    }
}

/// DWARF numbers of the argument registers the slow path reads.
const RSI: usize = 4;
const RDX: usize = 1;
const RDI: usize = 5;

/// The DWARF x86-64 number of a general-purpose register.
fn dwarf(register: Register) -> Option<usize> {
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

/// The static address `insn` reads, if it reads one (rip-relative, or an
/// absolute address).
fn static_read(insn: &Instruction) -> Option<u64> {
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
fn reads(insn: &Instruction, address: u64) -> bool {
    memory_address(insn) == Some(address) && static_read(insn) == Some(address)
}

/// The slot `insn` calls (or jumps) through, given `state`.
fn indirect_target(insn: &Instruction, state: &[Value; 16]) -> Option<u64> {
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
fn called_through(insn: &Instruction, state: &[Value; 16]) -> Option<u64> {
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
fn clobber_call(state: &mut [Value; 16]) {
    for r in [0, 1, 2, 4, 5, 8, 9, 10, 11] {
        state[r] = Value::Unknown;
    }
}

/// Moves `state` past `insn`.
fn step(insn: &Instruction, state: &mut [Value; 16]) {
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

/// Where argument `arg` (the new object, a realloc's block) is at a probe
/// whose registers are `at` (in terms of the read's), given the registers
/// at the guarded call `call`: its operand, or `None` where it is in no
/// register there.
fn object_operand(call: &[Value; 16], at: &[Value; 16], arg: ObjectArg) -> Option<(u8, u16)> {
    let value = call[arg.register()];
    let Value::Register(_) = value else { return None };
    let r = at.iter().position(|x| *x == value)?;
    tracer_common::site::register(u16::try_from(r).ok()?).map(|r| (r, 0))
}

/// Where the size is at a probe whose registers are `at` (in terms of the
/// read's), given the registers at the guarded call `call`: `count_site`'s
/// operands, or `None` where a value is at no register there.
fn size_operands(call: &[Value; 16], at: &[Value; 16], size: SizeArgs) -> Option<(u8, u8, u16)> {
    use tracer_common::site::{CONSTANT, NONE, register};
    let operand = |v: Value| -> Option<(u8, Option<u16>)> {
        match v {
            Value::Constant(c) => u16::try_from(c).ok().map(|c| (CONSTANT, Some(c))),
            Value::Register(_) => {
                let r = at.iter().position(|x| *x == v)?;
                register(u16::try_from(r).ok()?).map(|r| (r, None))
            }
            Value::Unknown | Value::Loaded(_) => None,
        }
    };
    match size {
        SizeArgs::None => None,
        SizeArgs::Second | SizeArgs::Third => {
            let (first, constant) = operand(call[if size == SizeArgs::Second { RSI } else { RDX }])?;
            Some((first, NONE, constant.unwrap_or(0)))
        }
        SizeArgs::SecondTimesThird => {
            let ((first, ca), (second, cb)) = (operand(call[RSI])?, operand(call[RDX])?);
            match (ca, cb) {
                (Some(x), Some(y)) => u16::try_from(u32::from(x) * u32::from(y)).ok().map(|c| (CONSTANT, NONE, c)),
                (Some(c), None) => Some((second, CONSTANT, c)),
                (None, Some(c)) => Some((first, CONSTANT, c)),
                (None, None) => Some((first, second, 0)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan of the machine's LTO builds (Debian's 3.11, the forky
    /// root's 3.13 and 3.14, which `cargo xtask setup` installs) agrees with
    /// what CPython's source says of them: each domain's four slots are
    /// consecutive pointers of one `PyMemAllocatorEx` (Include/cpython/pymem.h
    /// at v3.11.0 to v3.14.0: `ctx`, `malloc`, `calloc`, `realloc`, `free`),
    /// every function a switch guards has copies, and every read of the
    /// reference tracer is told creation or destruction.
    #[test]
    fn the_lto_builds_scan_as_their_source_says() {
        use crate::python::{PythonVersion, abi_for};
        for (path, hex) in [
            ("/usr/bin/python3.11", 0x030B_02F0),
            ("/var/lib/tracer/forky/usr/bin/python3.13", 0x030D_00F0),
            ("/var/lib/tracer/forky/usr/bin/python3.14", 0x030E_00F0),
        ] {
            assert!(Path::new(path).is_file(), "{path} is missing: run `cargo xtask setup`");
            let abi = abi_for(0, PythonVersion::from_hex(hex)).expect("supported");
            let wanted: Vec<Wanted<'_>> = abi
                .probes()
                .iter()
                .map(|p| Wanted {
                    function: p.symbol,
                    guard: abi.guard(p.symbol),
                    size: SizeArgs::of(p.program),
                    object: ObjectArg::of(p.symbol),
                })
                .collect();
            let scan = scan(Path::new(path), &wanted, None).expect("scan");
            let slot = |f: &str| {
                let found = scan.functions[f].as_ref().unwrap_or_else(|e| panic!("{path}: {f}: {e:?}"));
                let at = found
                    .guard
                    .rsplit(' ')
                    .next()
                    .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
                at.unwrap_or_else(|| panic!("{path}: {f}: {}", found.guard))
            };
            for domain in ["PyObject_", "PyMem_", "PyMem_Raw"] {
                let malloc = slot(&format!("{domain}Malloc"));
                for (i, kind) in ["Calloc", "Realloc", "Free"].iter().enumerate() {
                    assert_eq!(slot(&format!("{domain}{kind}")), malloc + 8 * (i as u64 + 1), "{path}: {domain}{kind}");
                }
            }
            for w in &wanted {
                let Some(guard) = w.guard else { continue };
                let found = scan.functions[w.function].as_ref().expect("found");
                assert!(found.undecodable == 0 && found.unclassified.is_empty(), "{path}: {}: {found:?}", w.function);
                if w.function == "_Py_NewReference" {
                    assert!(found.sites.len() > 100, "{path}: {} copies", found.sites.len());
                    assert_eq!(found.destroy > 0, guard == Guard::RefTracer, "{path}: {found:?}");
                }
            }
        }
    }
}

#[cfg(test)]
mod code_tests {
    use super::*;

    /// The reference tracer's switch and an allocator slot and its context,
    /// in the hand-assembled code below.
    const TRACER: u64 = 0x9000;
    const SLOT: u64 = 0x9100;

    /// `mov disp(%rip),%rax` (or `%rdi` with `reg` 0x3d) at `at`, reading
    /// `target`.
    fn rip_load(reg: u8, at: u64, target: u64) -> Vec<u8> {
        let disp = i32::try_from(i64::try_from(target).unwrap() - i64::try_from(at + 7).unwrap()).unwrap();
        let mut b = vec![0x48, 0x8b, reg];
        b.extend_from_slice(&disp.to_le_bytes());
        b
    }

    /// Code at 0x1000: an exported `_Py_NewReference` of 3.13's shape, a
    /// creation copy, a destruction copy, and a store to the switch; at
    /// 0x2000 an exported `PyObject_Malloc` and one copy, its size in %rbx.
    fn code(bytes: &mut Vec<u8>) -> Code<'_> {
        let mut at = |addr: u64, b: &[u8]| {
            let offset = usize::try_from(addr - 0x1000).unwrap();
            if bytes.len() < offset {
                bytes.resize(offset, 0xcc);
            }
            bytes.extend_from_slice(b);
        };
        // _Py_NewReference: load, refcount = 1, test, jne slow; ret; slow:
        // xor %esi,%esi (PyRefTracer_CREATE); jmp *%rax.
        at(0x1000, &rip_load(0x05, 0x1000, TRACER));
        at(0x1007, &[0x48, 0xc7, 0x07, 1, 0, 0, 0, 0x48, 0x85, 0xc0, 0x75, 0x01, 0xc3, 0x31, 0xf6, 0xff, 0xe0]);
        // A creation copy: load, test, jne; ret; xor %esi,%esi; mov
        // %rbx,%rdi; call *%rax; ret.
        at(0x1100, &rip_load(0x05, 0x1100, TRACER));
        at(0x1107, &[0x48, 0x85, 0xc0, 0x75, 0x01, 0xc3, 0x31, 0xf6, 0x48, 0x89, 0xdf, 0xff, 0xd0, 0xc3]);
        // A destruction copy: as above with mov $1,%esi.
        at(0x1200, &rip_load(0x05, 0x1200, TRACER));
        at(0x1207, &[0x48, 0x85, 0xc0, 0x75, 0x01, 0xc3, 0xbe, 1, 0, 0, 0, 0xff, 0xd0, 0xc3]);
        // mov %rax,disp(%rip): a store, no copy.
        let mut store = rip_load(0x05, 0x1300, TRACER);
        store[1] = 0x89;
        at(0x1300, &store);
        at(0x1307, &[0xc3]);
        // PyObject_Malloc: load the slot, mov %rdi,%rsi, load the context,
        // jmp *%rax.
        at(0x2000, &rip_load(0x05, 0x2000, SLOT));
        at(0x2007, &[0x48, 0x89, 0xfe]);
        at(0x200a, &rip_load(0x3d, 0x200a, SLOT - 8));
        at(0x2011, &[0xff, 0xe0]);
        // A copy: load, cmp $0x3000,%rax (PGO's pymalloc test), jne; ret;
        // load the context, mov %rbx,%rsi, call *%rax; ret.
        at(0x2100, &rip_load(0x05, 0x2100, SLOT));
        at(0x2107, &[0x48, 0x3d, 0x00, 0x30, 0x00, 0x00, 0x75, 0x01, 0xc3]);
        at(0x2110, &rip_load(0x3d, 0x2110, SLOT - 8));
        at(0x2117, &[0x48, 0x89, 0xde, 0xff, 0xd0, 0xc3]);
        let mut code = Code::decode(vec![(0x1000, bytes.as_slice())]);
        code.symbols.insert("_Py_NewReference".to_owned(), (0x1000, 0x18));
        code.symbols.insert("PyObject_Malloc".to_owned(), (0x2000, 0x13));
        code.index_ranges();
        code
    }

    #[test]
    fn tells_creation_from_destruction_and_skips_stores() {
        let mut bytes = Vec::new();
        let code = code(&mut bytes);
        let found = code
            .find(&Wanted {
                function: "_Py_NewReference",
                guard: Some(Guard::RefTracer),
                size: SizeArgs::None,
                object: Some(ObjectArg::NewObject),
            })
            .expect("found");
        assert_eq!(found.guard, format!("the reference tracer at {TRACER:#x}"));
        let reads: Vec<u64> = found.sites.iter().map(|s| s.read.address).collect();
        assert_eq!((reads, found.destroy, found.excluded), (vec![0x1100], 1, 1));
        // The test and the jne follow on the straight line, which the jne
        // ends.
        let later: Vec<u64> = found.sites[0].later.iter().map(|p| p.address).collect();
        assert_eq!(later, [0x1107, 0x110a]);
        // The object the slow path passes the tracer (mov %rbx,%rdi) is
        // in %rbx at the read and after it.
        let rbx = tracer_common::site::register(3).map(|r| (r, 0));
        assert_eq!(found.sites[0].read.object, rbx);
        assert!(found.sites[0].later.iter().all(|p| p.object == rbx && p.size.is_none()), "{:?}", found.sites[0]);
    }

    #[test]
    fn finds_the_slot_called_and_the_size_its_slow_path_passes() {
        use tracer_common::site::{NONE, register};
        let mut bytes = Vec::new();
        let code = code(&mut bytes);
        let found = code
            .find(&Wanted {
                function: "PyObject_Malloc",
                guard: Some(Guard::AllocatorSlot),
                size: SizeArgs::Second,
                object: None,
            })
            .expect("found");
        // The slot, not the context the function loads after it.
        assert_eq!(found.guard, format!("the allocator slot at {SLOT:#x}"));
        assert_eq!(found.sites.len(), 1, "{found:?}");
        let rbx = (register(3).expect("rbx"), NONE, 0);
        let site = &found.sites[0];
        assert_eq!((site.read.address, site.read.size), (0x2100, Some(rbx)));
        assert!(site.later.iter().all(|p| p.size == Some(rbx)), "{site:?}");
    }
}
