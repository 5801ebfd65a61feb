//! `--native`: libc's allocator functions as probes of the plan, in the
//! target's C library (see [`crate::discover::libc`]), after the
//! interpreter's probes; and the call sites inside them of one another,
//! which mark a call as nested so that it is not counted twice.
//!
//! glibc relays within its allocator: 2.36 (Debian 12) and 2.43 (forky)
//! both have `realloc` jump to `malloc` for `realloc(NULL, n)`, call
//! `free` for `realloc(p, 0)`, and call `malloc` (then `free`) when it
//! must move a block it cannot grow in place (an mmapped one, or when the
//! arena cannot); `malloc` jumps to itself once, after setting up on the
//! first call. `calloc`, `posix_memalign` and `aligned_alloc` call none
//! of the probed functions directly in either. Those calls are found here,
//! by decoding each probed function's code, rather than listed by version.
//! `mmap` and `munmap` are the layer below: malloc's own mappings (blocks
//! over `M_MMAP_THRESHOLD`, new arenas) and the interpreter's arenas are
//! counted there too, by design, since they are calls of libc's `mmap`
//! made from code other than the probed functions themselves.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};

use super::{ImageRef, Plan, PlanError, PlanOptions, PlannedProbe, ProbeFile};
use crate::{
    discover::{elf::ElfImage, libc::Libc},
    probe::{ProbeSpec, Program},
};

const fn native(symbol: &'static str, program: Program, required: bool) -> ProbeSpec {
    ProbeSpec::function(symbol, program, required, true)
}

/// The functions `--native` probes, with where each takes its size (C11
/// and POSIX): `malloc(size)`, `calloc(nelem, elsize)`, `realloc(ptr,
/// size)`, `free(ptr)`, `posix_memalign(&ptr, alignment, size)`,
/// `aligned_alloc(alignment, size)`, `mmap(addr, length, prot, flags, fd,
/// offset)` and `munmap(addr, length)`. Only `malloc` is required: a C
/// library without it is not one tracer knows.
pub const FUNCTIONS: [ProbeSpec; 8] = [
    native("malloc", Program::NativeSizeArg0, true),
    native("calloc", Program::NativeCalloc, false),
    native("realloc", Program::NativeSizeArg1, false),
    native("free", Program::NativeCall, false),
    native("posix_memalign", Program::NativeSizeArg2, false),
    native("aligned_alloc", Program::NativeSizeArg1, false),
    native("mmap", Program::NativeSizeArg1, false),
    native("munmap", Program::NativeReleaseArg1, false),
];

/// Adds libc's probes to `plan`, after its own, planned with `options`
/// (the interpreter's, made fit for libc: no call sites, no inlined copies,
/// no types, no API roles); with `live`, gives them their own roles in the
/// live table.
pub fn extend(plan: &mut Plan, libc: &Libc, options: PlanOptions, live: bool) -> Result<(), PlanError> {
    let image = ImageRef {
        elf: &libc.elf,
        display_path: &libc.display_path,
        attach_path: &libc.attach_path,
        modules: &[],
        inlining: None,
        implementations: &[],
    };
    let native = super::plan(image, &FUNCTIONS, options)?;
    let first = u32::try_from(plan.probes.len()).unwrap_or(u32::MAX);
    let file = ProbeFile { display_path: libc.display_path.clone(), attach_path: libc.attach_path.clone() };
    let mut probes = native.probes;
    for p in &mut probes {
        p.slot += first;
        p.file = Some(file.clone());
        // mmap's lengths are pages, not requests: no histogram.
        p.domain = (p.program.allocates() && p.symbol != "mmap").then_some(tracer_common::sizes::Domain::Native);
    }
    nested_sites(&libc.elf, &mut probes);
    if live {
        for p in &mut probes {
            live_role(&libc.elf, p, options.returns.as_ref());
        }
    }
    // With `--live`, the allocator implementations' slots follow the
    // probes': libc's functions are probes too.
    let added = u32::try_from(probes.len()).unwrap_or(u32::MAX);
    for i in &mut plan.live_impls {
        i.slot = i.slot.saturating_add(added);
    }
    plan.probes.extend(probes);
    plan.missing.extend(native.missing);
    Ok(())
}

/// With `--live`, probe `p`'s role in the live table and where its
/// return is read: its entry probe pushes the call's frame at the entry's
/// stack pointer, so a probe placed after an instruction that moves the
/// stack pointer has none, which its coverage says.
fn live_role(elf: &ElfImage, p: &mut PlannedProbe, costs: Option<&super::returns::ReturnCosts>) {
    use tracer_common::live::Role;
    let r = match p.symbol {
        "malloc" => Role::MALLOC,
        "calloc" => Role::CALLOC,
        "realloc" => Role::REALLOC,
        "free" => Role::FREE,
        "posix_memalign" => Role::MEMALIGN,
        "aligned_alloc" => Role::ALIGNED,
        "mmap" => Role::MMAP,
        "munmap" => Role::MUNMAP,
        _ => return,
    };
    let Some(sym) = elf.function(p.symbol) else { return };
    let len = usize::try_from(sym.size.min(super::MAX_FUNCTION)).unwrap_or(0);
    let code = elf.read_at(sym.file_offset, len);
    let moved = match &code {
        Ok(code) => moves_stack_before(code, sym.address, p.placement.offset),
        Err(e) => Some(format!("its code could not be read ({e})")),
    };
    let why = if let Some(moved) = moved {
        Some(format!(
            "live memory: not tracked, as its probe is placed after {moved}, where the entry's stack pointer is not known"
        ))
    } else if p.call_sites.is_some() {
        Some("live memory: not tracked, as it is probed at its call sites".to_owned())
    } else {
        None
    };
    let c = &mut p.coverage;
    if let Some(why) = why {
        c.live = Some(super::coverage::Completeness::Partial);
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
        return;
    }
    let returns = match (costs, code) {
        (Some(costs), Ok(code)) if sym.size <= super::MAX_FUNCTION => super::returns::plan(
            &code,
            sym.address,
            p.placement.offset,
            costs,
            (super::placement::running_kernel(), true),
        ),
        (None, _) => super::ReturnPlan::Uretprobe { reason: "no return costs measured".to_owned() },
        (_, Ok(_)) => {
            super::ReturnPlan::Uretprobe { reason: format!("the function is over {} bytes", super::MAX_FUNCTION) }
        }
        (_, Err(e)) => super::ReturnPlan::Uretprobe { reason: format!("the code could not be read ({e})") },
    };
    c.live = Some(super::coverage::Completeness::Complete);
    p.live = Some(r.native());
    p.live_returns = Some(returns);
}

/// The first instruction before `offset` in `code` (at `address`) that
/// moves the stack pointer, if any.
fn moves_stack_before(code: &[u8], address: u64, offset: u64) -> Option<String> {
    use iced_x86::{InstructionInfoFactory, OpAccess, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    for insn in &mut decoder {
        if insn.ip() >= address + offset {
            return None;
        }
        let writes = info.info(&insn).used_registers().iter().any(|u| {
            u.register().full_register() == Register::RSP
                && !matches!(u.access(), OpAccess::Read | OpAccess::NoMemAccess)
        });
        if writes || insn.is_invalid() {
            return Some(format!("`{:?}` at +{}", insn.mnemonic(), insn.ip() - address).to_lowercase());
        }
    }
    None
}

/// Finds, in each probed function's code, its direct calls and jumps to
/// a probed function's entry, and gives them to the callee's probe as
/// nested sites. A conditional jump there is not one (the mark would stay
/// when it is not taken): its calls are counted twice, which the callee's
/// coverage says.
fn nested_sites(elf: &ElfImage, probes: &mut [PlannedProbe]) {
    let entries: Vec<(usize, u64)> =
        probes.iter().enumerate().filter_map(|(i, p)| elf.function(p.symbol).map(|s| (i, s.address))).collect();
    let mut found: Vec<(usize, u64)> = Vec::new();
    let mut conditional: Vec<(usize, String)> = Vec::new();
    for p in probes.iter() {
        let Some(sym) = elf.function(p.symbol) else { continue };
        let Ok(code) = elf.read_at(sym.file_offset, usize::try_from(sym.size).unwrap_or(0)) else { continue };
        let mut decoder = Decoder::with_ip(64, &code, sym.address, DecoderOptions::NONE);
        for insn in &mut decoder {
            let kind = insn.flow_control();
            if !matches!(kind, FlowControl::Call | FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch) {
                continue;
            }
            let target = insn.near_branch_target();
            let Some(&(callee, _)) = entries.iter().find(|(_, entry)| *entry == target) else { continue };
            if kind == FlowControl::ConditionalBranch || insn.mnemonic() == Mnemonic::Jrcxz {
                conditional.push((callee, format!("{:#x} in {}", insn.ip(), p.symbol)));
                continue;
            }
            if let Some(offset) = elf.file_offset(insn.ip()) {
                found.push((callee, offset));
            }
        }
    }
    for (callee, offset) in found {
        probes[callee].nested_sites.push(offset);
    }
    for (callee, at) in conditional {
        let c = &mut probes[callee].coverage;
        c.calls = super::coverage::Completeness::Partial;
        if c.bytes == super::coverage::Completeness::Complete {
            c.bytes = super::coverage::Completeness::Partial;
        }
        let why = format!("a conditional jump to it at {at} is not told apart: those calls are counted twice");
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tracer's own libc is found, and has the functions `--native` probes.
    #[test]
    fn finds_its_own_libc() {
        let libc = crate::discover::libc::find(std::process::id()).expect("tracer's libc");
        for name in FUNCTIONS.iter().map(|p| p.symbol) {
            assert!(libc.elf.function(name).is_some(), "{name} in {}", libc.display_path.display());
        }
    }

    /// On tracer's own glibc, `realloc`'s relays to `malloc` and `free`
    /// are found as nested sites, every function gets a slot after the
    /// interpreter's, and the allocating ones the native domain.
    #[test]
    fn realloc_relays_are_nested_sites() {
        let libc = crate::discover::libc::find(std::process::id()).expect("tracer's libc");
        let mut plan = Plan {
            probes: Vec::new(),
            missing: Vec::new(),
            display_path: "/python".into(),
            attach_path: "/python".into(),
            live_impls: Vec::new(),
            live_fix: String::new(),
            moved_frees: Vec::new(),
        };
        extend(&mut plan, &libc, PlanOptions::default(), false).expect("a plan");
        let names: Vec<&str> = plan.probes.iter().map(|p| p.symbol).collect();
        assert_eq!(names, FUNCTIONS.map(|f| f.symbol));
        assert_eq!(plan.probes.iter().map(|p| p.slot).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        let by = |name: &str| plan.probes.iter().find(|p| p.symbol == name).expect(name);
        let realloc = libc.elf.function("realloc").expect("realloc");
        let inside = |p: &PlannedProbe| {
            p.nested_sites
                .iter()
                .filter(|&&o| (realloc.file_offset..realloc.file_offset + realloc.size).contains(&o))
                .count()
        };
        assert!(inside(by("malloc")) >= 1, "{:?}", by("malloc").nested_sites);
        assert!(inside(by("free")) >= 1, "{:?}", by("free").nested_sites);
        for p in &plan.probes {
            assert_eq!(p.domain.is_some(), !matches!(p.symbol, "free" | "mmap" | "munmap"), "{}", p.symbol);
            assert!(p.file.is_some());
        }
    }
}
