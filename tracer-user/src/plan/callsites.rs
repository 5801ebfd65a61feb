//! Probing a function at its call sites instead of inside it
//! (`--placement call-sites`).
//!
//! Some functions have no instruction the kernel emulates before control
//! leaves them: pyenv's `_Py_Dealloc` is `mov 8(%rdi),%rax; jmp *0x30(%rax)`,
//! so its probe is single-stepped, which costs a debug trap (about 15 µs on
//! the VM BENCHMARKS.md was measured on, against 0.45 µs emulated). The
//! direct `call`s and `jmp`s that reach it are emulated, though. A uprobe on
//! each counts the same calls as one on the entry, as long as every call
//! goes through one of them, which holds when the function's address never
//! escapes: no pointer to it in data, no instruction that loads it into a
//! register. Only then does tracer probe call sites; it scans every module
//! that can call the function (the image, the files the target, or with
//! `--exe` any process of the interpreter, has mapped, and the
//! interpreter's `lib-dynload` extension modules, which uprobes reach even
//! when they are imported later) and refuses the function if its address
//! escapes in any of them.
//!
//! What this cannot see, and docs/probes.md says so: calls through an address
//! found at run time (`dlsym`, ctypes), and calls from a module that is
//! neither mapped at attach time nor in `lib-dynload` (a third-party
//! extension imported later) until tracer has scanned it at the next
//! interval.

use std::{collections::HashMap, path::PathBuf};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};
use object::{
    Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _, RelocationFlags, RelocationTarget,
    SectionKind,
};

use super::{
    ImageRef, Plan, PlannedProbe,
    placement::{self, KernelVersion, Placement, emulated},
};
use crate::discover::modules::Module;

/// What one module holds for one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// File offsets of direct calls and jumps to it, or to its PLT stub.
    pub emulated: Vec<u64>,
    /// File offsets of calls and jumps to it through a GOT slot, which the
    /// kernel single-steps.
    pub stepped: Vec<u64>,
    /// How many places let its address escape.
    pub escapes: usize,
    /// The first of them, described.
    pub first_escape: Option<String>,
}

impl Found {
    fn escape(&mut self, why: impl FnOnce() -> String) {
        if self.escapes == 0 {
            self.first_escape = Some(why());
        }
        self.escapes += 1;
    }
}

// Relocation types from the x86-64 psABI.
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;
const R_X86_64_RELATIVE: u32 = 8;

/// A function address below this is not worth looking for as an immediate
/// (too likely to be some other constant).
const MIN_IMMEDIATE: u64 = 0x1_0000;

/// Scans one ELF image for the calls to each of `names`. `defined[i]` is
/// the link-time address of `names[i]` when this image defines it (the
/// probed interpreter image); other images reach it through their GOT.
pub fn scan(
    data: &[u8],
    names: &[&str],
    defined: &[Option<u64>],
    kernel: KernelVersion,
) -> Result<Vec<Found>, object::Error> {
    let file = object::File::parse(data)?;
    let defined_at: HashMap<u64, usize> = defined.iter().enumerate().filter_map(|(i, a)| a.map(|a| (a, i))).collect();
    let mut scan =
        Scan { found: vec![Found::default(); names.len()], targets: defined_at.clone(), got: HashMap::new() };
    scan.relocations(&file, names);
    if scan.targets.is_empty() && scan.got.is_empty() {
        return Ok(scan.found);
    }
    scan.data_pointers(&file);
    let code: Vec<Code<'_>> = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .filter_map(|s| {
            let bytes = s.data().ok()?;
            let (offset, _) = s.file_range()?;
            Some(Code { name: s.name().unwrap_or(""), address: s.address(), offset, bytes })
        })
        .collect();
    // PLT stubs first: calls go to them, not to the GOT.
    for section in code.iter().filter(|c| c.is_plt()) {
        scan.plt_stubs(section);
    }
    for section in code.iter().filter(|c| !c.is_plt()) {
        scan.calls(section, &defined_at, kernel);
    }
    Ok(scan.found)
}

/// One image's scan in progress.
struct Scan {
    found: Vec<Found>,
    /// Address → function: its entry, and its PLT stubs once found.
    targets: HashMap<u64, usize>,
    /// GOT slot → function.
    got: HashMap<u64, usize>,
}

impl Scan {
    /// GOT slots from `GLOB_DAT`/`JUMP_SLOT`; any other relocation that
    /// names a function, or that points at one this image defines, stores
    /// its address.
    fn relocations(&mut self, file: &object::File<'_>, names: &[&str]) {
        let Some(relocations) = file.dynamic_relocations() else { return };
        let index_of = |name: &str| {
            let bare = name.split('@').next().unwrap_or(name);
            names.iter().position(|n| *n == bare)
        };
        let dynsyms = file.dynamic_symbol_table();
        for (at, reloc) in relocations {
            let RelocationFlags::Elf { r_type } = reloc.flags() else { continue };
            let function = match reloc.target() {
                RelocationTarget::Symbol(index) => dynsyms
                    .as_ref()
                    .and_then(|t| t.symbol_by_index(index).ok())
                    .and_then(|s| s.name().ok())
                    .and_then(index_of),
                _ => None,
            };
            match (r_type, function) {
                (R_X86_64_GLOB_DAT | R_X86_64_JUMP_SLOT, Some(i)) => {
                    self.got.insert(at, i);
                }
                (_, Some(i)) => self.found[i].escape(|| format!("a pointer to it in data at {at:#x}")),
                (R_X86_64_RELATIVE, None) => {
                    let addend = u64::try_from(reloc.addend()).unwrap_or(0);
                    if let Some(&i) = self.targets.get(&addend) {
                        self.found[i].escape(|| format!("a pointer to it in data at {at:#x}"));
                    }
                }
                _ => {}
            }
        }
    }

    /// A non-PIE image stores function pointers without relocations.
    fn data_pointers(&mut self, file: &object::File<'_>) {
        for section in file.sections() {
            let data_kind = matches!(
                section.kind(),
                SectionKind::Data | SectionKind::ReadOnlyData | SectionKind::ReadOnlyDataWithRel
            );
            let Ok(bytes) = section.data() else { continue };
            if !data_kind || section.address() == 0 {
                continue;
            }
            for (k, word) in (0u64..).zip(bytes.chunks_exact(8)) {
                let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
                if let Some(&i) = self.targets.get(&value) {
                    let at = section.address() + 8 * k;
                    self.found[i].escape(|| format!("a pointer to it in data at {at:#x}"));
                }
            }
        }
    }

    /// The PLT stubs that jump through a GOT slot of a function.
    fn plt_stubs(&mut self, section: &Code<'_>) {
        let mut instr = Instruction::default();
        let mut decoder = Decoder::with_ip(64, section.bytes, section.address, DecoderOptions::NONE);
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            if instr.flow_control() == FlowControl::IndirectBranch
                && instr.is_ip_rel_memory_operand()
                && let Some(&i) = self.got.get(&instr.ip_rel_memory_address())
            {
                self.targets.insert(instr.ip(), i);
                // An IBT stub starts with endbr64; calls land on that.
                if section.at(instr.ip().wrapping_sub(4), 4) == Some(&ENDBR64[..]) {
                    self.targets.insert(instr.ip() - 4, i);
                }
            }
        }
    }

    /// Calls and jumps to a target, and every other use of its address.
    fn calls(&mut self, section: &Code<'_>, defined_at: &HashMap<u64, usize>, kernel: KernelVersion) {
        let mut instr = Instruction::default();
        let mut decoder = Decoder::with_ip(64, section.bytes, section.address, DecoderOptions::NONE);
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            if instr.is_invalid() {
                continue;
            }
            let ip = instr.ip();
            let file_offset = section.offset + (ip - section.address);
            let flow = instr.flow_control();
            let direct =
                matches!(flow, FlowControl::Call | FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch)
                    && matches!(instr.op0_kind(), OpKind::NearBranch64);
            if direct {
                if let Some(&i) = self.targets.get(&instr.near_branch_target()) {
                    let bytes = section.at(ip, instr.len()).unwrap_or(&[]);
                    if emulated(bytes, kernel).is_some() {
                        self.found[i].emulated.push(file_offset);
                    } else {
                        self.found[i].stepped.push(file_offset);
                    }
                }
                continue;
            }
            if instr.is_ip_rel_memory_operand() {
                let address = instr.ip_rel_memory_address();
                if let Some(&i) = self.got.get(&address) {
                    if matches!(flow, FlowControl::IndirectCall | FlowControl::IndirectBranch) {
                        self.found[i].stepped.push(file_offset);
                    } else {
                        self.found[i]
                            .escape(|| format!("its address loaded from its GOT slot {address:#x} at {ip:#x}"));
                    }
                } else if let Some(&i) = self.targets.get(&address) {
                    self.found[i].escape(|| format!("its address taken at {ip:#x}"));
                }
            }
            for op in 0..instr.op_count() {
                let value = match instr.op_kind(op) {
                    OpKind::Immediate32to64 => instr.immediate32to64().cast_unsigned(),
                    OpKind::Immediate32 => u64::from(instr.immediate32()),
                    OpKind::Immediate64 => instr.immediate64(),
                    _ => continue,
                };
                if value >= MIN_IMMEDIATE
                    && let Some(&i) = defined_at.get(&value)
                {
                    self.found[i].escape(|| format!("its address as an immediate at {ip:#x}"));
                }
            }
        }
    }
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// One executable section.
struct Code<'a> {
    name: &'a str,
    address: u64,
    offset: u64,
    bytes: &'a [u8],
}

impl Code<'_> {
    fn is_plt(&self) -> bool {
        self.name.starts_with(".plt")
    }

    fn at(&self, address: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(address.checked_sub(self.address)?).ok()?;
        self.bytes.get(start..start.checked_add(len)?)
    }
}

/// Where one function's call sites are, file by file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSites {
    pub files: Vec<SiteFile>,
    /// How many of the sites the kernel emulates.
    pub emulated: usize,
    /// How many it single-steps (calls through a GOT slot).
    pub stepped: usize,
}

/// The call sites in one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteFile {
    pub display_path: PathBuf,
    pub attach_path: PathBuf,
    /// File offsets of the calls.
    pub offsets: Vec<u64>,
}

impl SiteFile {
    /// The sites `found` in `module`, in file order.
    #[must_use]
    pub fn new(module: &Module, found: Found) -> Self {
        let mut offsets = found.emulated;
        offsets.extend(found.stepped);
        offsets.sort_unstable();
        Self { display_path: module.display_path.clone(), attach_path: module.attach_path.clone(), offsets }
    }
}

impl CallSites {
    /// One line for `tracer probes` and the attach header.
    #[must_use]
    pub fn describe(&self) -> String {
        let in_image = self.files.first().map_or(0, |f| f.offsets.len());
        let others: usize = self.files.iter().skip(1).map(|f| f.offsets.len()).sum();
        let stepped = if self.stepped == 0 {
            "all emulated".to_owned()
        } else {
            format!("{} through the GOT, single-stepped", self.stepped)
        };
        format!(
            "call sites: {in_image} in the image and {others} in {} other modules ({stepped}); its address never escapes, so they are all its calls",
            self.files.len().saturating_sub(1)
        )
    }
}

/// Plans call-site probes for `names`, which `image` defines at `defined`:
/// scans the image and every module. Per name, its call sites (the image's
/// first), or why the function must keep its own probe.
#[must_use]
pub fn plan(
    image: &Module,
    names: &[&str],
    defined: &[Option<u64>],
    modules: &[Module],
    kernel: KernelVersion,
) -> Vec<Result<CallSites, String>> {
    let mut sites: Vec<CallSites> =
        names.iter().map(|_| CallSites { files: Vec::new(), emulated: 0, stepped: 0 }).collect();
    let mut refused: Vec<Option<String>> = vec![None; names.len()];
    let none = vec![None; names.len()];
    for (k, module) in std::iter::once(image).chain(modules).enumerate() {
        let data = match std::fs::read(&module.attach_path) {
            Ok(data) => data,
            Err(e) => {
                let why = format!("cannot read {} to find its calls: {e}", module.display_path.display());
                return names.iter().map(|_| Err(why.clone())).collect();
            }
        };
        // A file that is not ELF (a locale archive, say) holds no calls.
        let Ok(found) = scan(&data, names, if k == 0 { defined } else { &none }, kernel) else { continue };
        for (i, f) in found.into_iter().enumerate() {
            if f.escapes > 0 && refused[i].is_none() {
                let first = f.first_escape.as_deref().unwrap_or_default();
                refused[i] = Some(format!(
                    "its address escapes in {} ({first}; {} places in all), so calls through pointers would be missed",
                    module.display_path.display(),
                    f.escapes
                ));
            }
            let site = &mut sites[i];
            site.emulated += f.emulated.len();
            site.stepped += f.stepped.len();
            if k == 0 || !f.emulated.is_empty() || !f.stepped.is_empty() {
                site.files.push(SiteFile::new(module, f));
            }
        }
    }
    sites
        .into_iter()
        .zip(refused)
        .map(|(s, why)| match why {
            Some(why) => Err(why),
            None if s.emulated + s.stepped == 0 => Err("no call to it was found".to_owned()),
            None => Ok(s),
        })
        .collect()
}

/// Moves each probe that would be single-stepped to its function's call
/// sites, where those see every call; the rest keep their placement, with
/// the reason added.
pub(super) fn place_at_call_sites(image: ImageRef<'_>, probes: &mut [PlannedProbe], kernel: placement::KernelVersion) {
    let stepped: Vec<usize> = (0..probes.len()).filter(|&i| !probes[i].placement.emulated).collect();
    if stepped.is_empty() {
        return;
    }
    let names: Vec<&str> = stepped.iter().map(|&i| probes[i].symbol).collect();
    let defined: Vec<Option<u64>> = names.iter().map(|n| image.elf.function(n).map(|s| s.address)).collect();
    let own = Module { display_path: image.display_path.to_owned(), attach_path: image.attach_path.to_owned() };
    let plans = plan(&own, &names, &defined, image.modules, kernel);
    for (&i, plan) in stepped.iter().zip(plans) {
        let probe = &mut probes[i];
        match plan {
            Ok(sites) => {
                probe.placement = Placement {
                    offset: 0,
                    instruction: format!("{} calls", sites.emulated + sites.stepped),
                    emulated: sites.stepped == 0,
                    reason: sites.describe(),
                    function: None,
                };
                probe.call_sites = Some(sites);
            }
            Err(why) => probe.placement.reason = format!("{}; not at its call sites: {why}", probe.placement.reason),
        }
    }
}

/// The call sites a module mapped after the attach holds for the probes at
/// their call sites: per such probe's slot, what was found there. A file
/// that is not ELF holds none.
#[must_use]
pub fn late_call_sites(plan: &Plan, data: &[u8]) -> Vec<(u32, Found)> {
    let moved: Vec<&PlannedProbe> = plan.probes.iter().filter(|p| p.call_sites.is_some()).collect();
    let names: Vec<&str> = moved.iter().map(|p| p.symbol).collect();
    let kernel = placement::running_kernel();
    let Ok(found) = scan(data, &names, &vec![None; names.len()], kernel) else { return Vec::new() };
    moved
        .iter()
        .zip(found)
        .filter(|(_, f)| !(f.emulated.is_empty() && f.stepped.is_empty() && f.escapes == 0))
        .map(|(p, f)| (p.slot, f))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K618: KernelVersion = (6, 18);

    // SAFETY (the three naked functions below): none is ever called; the
    // tests only read their bytes from the test binary. Their names are
    // this test's own, so no_mangle clashes with nothing.

    /// Reached only by the direct `call` and `jmp` in [`tracer_callsite_callers`].
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    extern "C" fn tracer_callsite_called() {
        core::arch::naked_asm!("ret")
    }

    /// Called directly too, but its address is also loaded (`lea`).
    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    extern "C" fn tracer_callsite_taken() {
        core::arch::naked_asm!("ret")
    }

    #[unsafe(naked)]
    #[unsafe(no_mangle)]
    extern "C" fn tracer_callsite_callers() {
        core::arch::naked_asm!(
            "call {called}",
            "call {taken}",
            "lea rax, [rip + {taken}]",
            "jmp {called}",
            called = sym tracer_callsite_called,
            taken = sym tracer_callsite_taken,
        )
    }

    #[test]
    fn finds_direct_calls_and_refuses_escaping_addresses() {
        // The test binary itself: `callsite_target` is called directly by
        // `calls_target` and has its address taken by `takes_target`.
        // Keeps the three functions in the binary.
        std::hint::black_box(tracer_callsite_callers as extern "C" fn());
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let elf = crate::discover::elf::ElfImage::parse(&exe, &data).unwrap();
        let called = elf.function("tracer_callsite_called").unwrap().address;
        let taken = elf.function("tracer_callsite_taken").unwrap().address;
        let found =
            scan(&data, &["tracer_callsite_called", "tracer_callsite_taken"], &[Some(called), Some(taken)], K618)
                .unwrap();
        assert_eq!(found[0].emulated.len(), 2, "{:?}", found[0]);
        assert_eq!(found[0].escapes, 0, "{:?}", found[0]);
        assert_eq!(found[1].emulated.len(), 1, "{:?}", found[1]);
        assert_eq!(found[1].escapes, 1, "{:?}", found[1]);
        assert!(found[1].first_escape.as_ref().unwrap().starts_with("its address taken at"), "{:?}", found[1]);
    }
}
