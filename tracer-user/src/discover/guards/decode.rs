//! The x86-64 code of an image, decoded once for the scan: every
//! instruction of its executable sections in address order, the addresses
//! branches land on, its named functions and data, where `.eh_frame` says
//! a function starts off the linear decoding, and the straight lines of
//! code from an address.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SectionFlags, SymbolKind};

use crate::discover::{elf::ElfError, line::Landings};

/// The executable sections of an image, decoded once.
pub(super) struct Code<'a> {
    /// (address, bytes) of each executable section.
    sections: Vec<(u64, &'a [u8])>,
    /// Every decoded instruction, by address.
    pub(super) instructions: Vec<Instruction>,
    /// Every address a direct branch or call lands on, and, from a
    /// parsed file, every code address its data names (see
    /// [`landings`](crate::discover::landings)).
    pub(super) targets: Landings,
    /// Defined functions by name: (address, size).
    pub(super) symbols: HashMap<String, (u64, u64)>,
    /// Their ranges, sorted by start.
    ranges: Vec<(u64, u64, String)>,
    /// Defined data symbols by name: (address, size).
    pub(super) data: HashMap<String, (u64, u64)>,
    /// The functions (`.eh_frame`'s ranges) whose start the linear decoding
    /// did not land on.
    pub(super) unsynced: Vec<std::ops::Range<u64>>,
}

impl<'a> Code<'a> {
    pub(super) fn parse(path: &Path, data: &'a [u8]) -> Result<Self, ElfError> {
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
        let functions = eh_frame_functions(&file);
        code.unsynced = code.unsynced_functions(&functions);
        let ranges: Vec<(u64, u64)> =
            code.sections.iter().map(|&(a, b)| (a, a.saturating_add(b.len() as u64))).collect();
        let leas: Vec<u64> = code
            .instructions
            .iter()
            .filter(|i| i.mnemonic() == iced_x86::Mnemonic::Lea && i.is_ip_rel_memory_operand())
            .map(Instruction::ip_rel_memory_address)
            .collect();
        let mut targets = std::mem::take(&mut code.targets.0);
        let data: HashSet<u64> = crate::discover::landings::in_data(&file, &ranges, &leas).into_iter().collect();
        // A copy is probed at the jumps into it only where nothing else
        // may land: not at a function's start (other files call exported
        // ones, and addresses taken in code or named by a symbol's
        // relocation reach others) nor at any address a `lea` takes.
        let mut entries: HashSet<u64, crate::hash::BuildIdentity> = data.iter().copied().collect();
        entries.extend(code.symbols.values().map(|&(address, _)| address));
        entries.extend(functions.iter().map(|f| f.start));
        entries.extend(leas.iter().copied());
        let gates = crate::discover::line::gates(&code.instructions, &entries, &code.unsynced);
        Arc::make_mut(&mut targets).extend(data);
        let imports: Vec<(u64, u64)> = [".got", ".got.plt"]
            .iter()
            .filter_map(|name| file.section_by_name(name))
            .map(|s| (s.address(), s.address().saturating_add(s.size())))
            .collect();
        code.targets = Landings(targets, Arc::new(imports), Arc::new(gates));
        Ok(code)
    }

    /// Of the functions `.eh_frame` lists (`functions`), those whose start
    /// is no instruction of the linear decoding. An unreadable `.eh_frame`
    /// proves nothing either way and is passed over: the linear decoding
    /// of GCC's code, which embeds no data in `.text`, stays in step (on
    /// Debian's 3.11, 3.13 and 3.14 it lands on all of their 9,810 to
    /// 12,403 function starts).
    fn unsynced_functions(&self, functions: &[std::ops::Range<u64>]) -> Vec<std::ops::Range<u64>> {
        functions
            .iter()
            .filter(|f| {
                let on_boundary = self.instructions.binary_search_by_key(&f.start, Instruction::ip).is_ok();
                !on_boundary && self.at(f.start).is_some()
            })
            .cloned()
            .collect()
    }

    /// Decodes `sections`, each (address, bytes).
    pub(super) fn decode(sections: Vec<(u64, &'a [u8])>) -> Self {
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
            targets: Landings(Arc::new(targets), Arc::default(), Arc::default()),
            symbols: HashMap::new(),
            ranges: Vec::new(),
            data: HashMap::new(),
            unsynced: Vec::new(),
        }
    }

    /// Adds the functions and data `file` names.
    pub(super) fn add_symbols(&mut self, file: &object::File<'_>) {
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
    pub(super) fn index_ranges(&mut self) {
        // Addresses and sizes come from the image: one that runs past the
        // address space ends at its end.
        self.ranges = (self.symbols.iter().filter(|(_, (_, size))| *size > 0))
            .map(|(n, &(a, s))| (a, a.saturating_add(s), n.clone()))
            .collect();
        self.ranges.sort_unstable();
    }

    /// The instruction at `address`, decoded from the section that holds it.
    pub(super) fn at(&self, address: u64) -> Option<Instruction> {
        if let Ok(i) = self.instructions.binary_search_by_key(&address, Instruction::ip) {
            return Some(self.instructions[i]);
        }
        let &(start, bytes) =
            self.sections.iter().find(|(s, b)| (*s..s.saturating_add(b.len() as u64)).contains(&address))?;
        let offset = usize::try_from(address - start).ok()?;
        let mut decoder = Decoder::with_ip(64, &bytes[offset..], address, DecoderOptions::NONE);
        let insn = decoder.decode();
        (!insn.is_invalid()).then_some(insn)
    }

    /// The functions whose code holds `address`.
    pub(super) fn containing(&self, address: u64) -> impl Iterator<Item = &str> {
        let end = self.ranges.partition_point(|(start, _, _)| *start <= address);
        self.ranges[..end].iter().rev().take(64).filter(move |(_, e, _)| address < *e).map(|(_, _, n)| n.as_str())
    }

    /// Up to `n` instructions from `address`, stopping after the first
    /// branch.
    pub(super) fn straight_line(&self, address: u64, n: usize) -> Vec<Instruction> {
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
    pub(super) fn straight_line_to_return(&self, address: u64, n: usize) -> Vec<Instruction> {
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
}

/// The range of each function `.eh_frame` lists (none where it does not
/// parse).
fn eh_frame_functions(file: &object::File<'_>) -> Vec<std::ops::Range<u64>> {
    use gimli::UnwindSection as _;
    let Some(section) = file.section_by_name(".eh_frame") else { return Vec::new() };
    let Ok(data) = section.data() else { return Vec::new() };
    let mut frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    frame.set_address_size(8);
    let bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    let mut entries = frame.entries(&bases);
    let mut out = Vec::new();
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset)
        {
            let start = fde.initial_address();
            out.push(start..start.saturating_add(fde.len()));
        }
    }
    out
}
