//! Telling the reads of a switch apart: the switch's address from the
//! exported function's code, which reads are inlined copies of the function
//! (not its own code, not a destruction), and, from each copy's slow path,
//! where its size and object are at the read and at the instructions a
//! probe may move to.

use std::collections::HashSet;

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use super::{
    Found, GuardSite, NotFound, ObjectArg, SizeArgs, Wanted,
    decode::Code,
    registers::{RDX, RSI, Value, called_through, clobber_call, indirect_target, reads, static_read, step},
};
use crate::{discover::InlineEntry, python::Guard};

/// Instructions one slow-path walk follows before it gives up.
const MAX_PATH: usize = 96;
/// Instructions all walks from one site follow together.
const MAX_WALK: usize = 600;

/// `PyRefTracer_CREATE` and `PyRefTracer_DESTROY`, the event the reference
/// tracer is passed (Include/cpython/object.h, `PyRefTracerEvent`, at
/// v3.13.0 and v3.14.0).
const REF_TRACER_CREATE: u64 = 0;
const REF_TRACER_DESTROY: u64 = 1;

impl Code<'_> {
    pub(super) fn find(&self, wanted: &Wanted<'_>) -> Result<Found, NotFound> {
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
            if (entry..entry.saturating_add(size.max(1))).contains(&at)
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
                        Some(offset) => {
                            (Some(first) != start.checked_add(offset)).then(|| format!("{within}+{offset}"))
                        }
                        None => (!(start..start.saturating_add(size.max(1))).contains(&first))
                            .then(|| format!("inside {within}")),
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
            returned: false,
        };
        let read = entry(read.ip(), &identity);
        // The instructions after the read, while each is reached from the
        // read alone, with the size and object followed there.
        let (later, end) = crate::discover::line::follow(&read, |a| self.at(a), &self.targets);
        let gate = crate::discover::line::gate(&read, &self.targets);
        GuardSite { read, later, end, gate }
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
