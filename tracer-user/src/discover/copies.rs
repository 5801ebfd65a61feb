//! Where the copies of each probed function are: the DWARF's inlined
//! copies and clones, and the reads of the switches that guard them.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use super::{
    DwarfLookup, InlineEntry, Inlining, Points, ResolveError, TargetSpec, debuginfo,
    elf::ElfImage,
    guards, inline,
    line::{self, LineEnd},
    process,
};
use crate::python::{self, Abi};

/// The probed functions' inlined copies: as the image's DWARF lists them,
/// found inside the target's root or in `--debug-dir`, and by the reads of
/// the switches that guard them (see [`guards`]), which find the copies
/// where there is no DWARF, and those the DWARF leaves out.
pub(super) fn find(
    spec: &TargetSpec,
    (image, elf): (&Path, &ElfImage),
    root: process::Root,
    abi: &dyn Abi,
    lookup: DwarfLookup<'_>,
) -> Result<Inlining, ResolveError> {
    let (in_root, root_dir) = in_root(spec, image);
    let guard_scan = |symbols: Option<(&Path, &[u8])>| {
        let wanted: Vec<guards::Wanted<'_>> = abi
            .probes()
            .iter()
            .map(|p| guards::Wanted {
                function: p.symbol,
                guard: abi.guard(p.symbol),
                size: guards::SizeArgs::of(p.program),
                object: guards::ObjectArg::of(p.symbol),
            })
            .collect();
        guards::scan(elf.path(), &wanted, symbols)
    };
    let Some(file) = debuginfo::locate(&in_root, &root_dir, lookup.debug_dir, Some(elf.path()))? else {
        return Ok(Inlining::Guards { fix: debug_fix(root, abi), scan: guard_scan(None)? });
    };
    let data = std::fs::read(&file.path)
        .map_err(|cause| debuginfo::DebugInfoError::Read { path: file.path.clone(), cause })?;
    let wanted: Vec<inline::Wanted<'_>> =
        abi.probes().iter().map(|p| inline::Wanted { function: p.symbol, parameters: parameters(p) }).collect();
    // Out-of-line clones that are whole functions (.constprop, .isra) are
    // entered like inlined copies, and probed beside the symbol; the parts
    // GCC split off a function (.part, .cold) are entered from it, within
    // the same call, and are not.
    let names = function_names(&data);
    let is_clone = |address: u64| {
        names.get(&address).is_some_and(|n| {
            (n.contains(".constprop.") || n.contains(".isra.")) && !n.contains(".part.") && !n.contains(".cold")
        })
    };
    let found = inline::find(&file.path, &data, &wanted)?;
    let scan = guard_scan(Some((&file.path, &data)))?;
    let (cross_check, mut guard_only) = compare(elf, abi, &found, &scan);
    let image =
        std::fs::read(elf.path()).map_err(|cause| super::elf::ElfError::Read { path: elf.path().to_owned(), cause })?;
    let mut cfa = Cfa::of(&image);
    let functions = Functions::of(&data);
    // The instruction at a link-time address of the image.
    let decode = |address: u64| {
        use iced_x86::{Decoder, DecoderOptions};
        let offset = usize::try_from(elf.file_offset(address)?).ok()?;
        let bytes = image.get(offset..image.len().min(offset.saturating_add(16)))?;
        let insn = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE).decode();
        (!insn.is_invalid()).then_some(insn)
    };
    let mut graphs = HashMap::new();
    let mut entered = HashMap::new();
    let entries = found
        .into_iter()
        // A function the DWARF has no DIE for is left out: its copies are
        // unknown, which coverage says.
        .filter(|f| !(f.out_of_line.is_empty() && f.inlined.is_empty()))
        .map(|f| {
            let symbol = elf.function(&f.function).map(|s| s.address);
            let clones = f.out_of_line.iter().filter(|s| Some(s.entry) != symbol && is_clone(s.entry));
            let copies: Vec<&inline::Site> = f.inlined.iter().chain(clones).collect();
            let reads = match scan.functions.get(&f.function) {
                Some(Ok(found)) => found.sites.as_slice(),
                _ => &[],
            };
            let mut points: Vec<Points> = copies.iter().map(|s| copy_points(s, &copies, reads, &mut cfa)).collect();
            // A copy probed at its entry may have other entries: each is
            // probed as a copy of its own (a call passes one of them).
            let mut other = super::Entered::default();
            let guarded: Vec<Points> =
                guard_only.remove(&f.function).unwrap_or_default().iter().map(guard_points).collect();
            // Where every copy is probed: a path through one is that copy's
            // call (the copies the DWARF leaves out pass their reads).
            let all: Vec<u64> = copies
                .iter()
                .map(|c| c.entry)
                .chain(points.iter().chain(&guarded).flat_map(|p| p.at.iter().map(|e| e.address)))
                .collect();
            // Copies probed elsewhere than their entry (at the read of a
            // switch) are passed there by every path into them.
            let at_entry: Vec<&inline::Site> = copies
                .iter()
                .zip(&points)
                .filter(|(site, p)| p.at.len() == 1 && p.at[0].address == site.entry)
                .map(|(site, _)| *site)
                .collect();
            let (found, unchecked) = other_entries(&at_entry, (&functions, &all), elf, &image, &mut graphs);
            other.unchecked = unchecked;
            for (site, found) in found {
                // Probed as a copy entered there, with the parameters'
                // locations at that range's start.
                for address in found.entries {
                    let there = site.entered_at(address);
                    let object = object_operand(&there, &mut cfa);
                    points.push(Points::one(InlineEntry {
                        address,
                        size: size_operands(&there, &mut cfa),
                        object,
                        returned: false,
                    }));
                    other.other += 1;
                }
                other.ambiguous.extend(found.ambiguous);
            }
            points.extend(guarded);
            // The copies probed at an entry, each with the straight line
            // after it (those probed at a read have theirs).
            for p in points.iter_mut().filter(|p| p.end == LineEnd::NotFollowed) {
                let (line, end) = line::follow(&p.at[0], decode, &scan.landings);
                p.gate = line::gate(&p.at[0], &scan.landings);
                p.at.extend(line);
                p.end = end;
            }
            if other != super::Entered::default() {
                entered.insert(f.function.clone(), other);
            }
            (f.function, points)
        })
        .collect();
    Ok(Inlining::Known { source: file.path.display().to_string(), entries, cross_check, entered })
}

/// The other entries of inlined copies, decoded in the function that
/// holds each one's entry, with the parts GCC split off it (`functions`;
/// `all`: where every copy of the same function is probed), each
/// function's graph kept in `graphs` for the next function's copies in it;
/// and the entries of the copies in no function, which are not decoded.
fn other_entries<'s>(
    copies: &[&'s inline::Site],
    (functions, all): (&Functions, &[u64]),
    elf: &ElfImage,
    image: &[u8],
    graphs: &mut HashMap<u64, super::entries::Graph>,
) -> (Vec<(&'s inline::Site, super::entries::OtherEntries)>, Vec<u64>) {
    let mut held: std::collections::BTreeMap<u64, Vec<&'s inline::Site>> = std::collections::BTreeMap::new();
    let mut unchecked = Vec::new();
    for &site in copies {
        match functions.holding(site.entry) {
            Some(start) => held.entry(start).or_default().push(site),
            None => unchecked.push(site.entry),
        }
    }
    let mut out = Vec::new();
    for (start, copies) in held {
        let parts = functions.parts(start);
        let graph = graphs.entry(start).or_insert_with(|| {
            let code: Vec<(u64, &[u8])> = parts
                .iter()
                .map(|&(at, end)| {
                    let offset = elf.file_offset(at).and_then(|o| usize::try_from(o).ok()).unwrap_or(usize::MAX);
                    let len = usize::try_from(end - at).unwrap_or(0);
                    (at, image.get(offset..offset.saturating_add(len)).unwrap_or_default())
                })
                .collect();
            super::entries::Graph::decode_parts(&code)
        });
        let probed: Vec<u64> =
            all.iter().copied().filter(|e| parts.iter().any(|&(at, end)| (at..end).contains(e))).collect();
        let each: Vec<super::entries::Copy<'_>> =
            copies.iter().map(|s| super::entries::Copy { entry: s.entry, ranges: &s.ranges }).collect();
        out.extend(copies.iter().copied().zip(super::entries::other_entries(graph, &probed, &each)));
    }
    (out, unchecked)
}

/// The functions of an ELF file's symbol table, and the parts GCC split
/// off them (`foo.cold`, entered from `foo` within the same call).
struct Functions {
    /// (start, end) of each, sorted.
    bounds: Vec<(u64, u64)>,
    /// For the start of a function or of a part of one: the function's
    /// start.
    owner: HashMap<u64, u64>,
    /// For a function's start: its parts, its own code first.
    parts: HashMap<u64, Vec<(u64, u64)>>,
}

impl Functions {
    fn of(data: &[u8]) -> Self {
        use object::{Object as _, ObjectSymbol as _};
        let mut symbols: Vec<(u64, u64, String)> = object::File::parse(data)
            .map(|file| {
                file.symbols()
                    .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
                    .filter_map(|s| Some((s.address(), s.address() + s.size(), s.name().ok()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        symbols.sort_unstable();
        let mut bounds: Vec<(u64, u64)> = symbols.iter().map(|s| (s.0, s.1)).collect();
        bounds.dedup_by_key(|b| b.0);
        // A name more than one function has (statics of different units)
        // names no part surely.
        let mut by_name: HashMap<&str, Option<(u64, u64)>> = HashMap::new();
        for (start, end, name) in &symbols {
            by_name.entry(name).and_modify(|b| *b = None).or_insert(Some((*start, *end)));
        }
        let mut owner = HashMap::new();
        let mut parts: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (start, end, name) in &symbols {
            let Some(hot) = name.strip_suffix(".cold") else { continue };
            if let (Some(Some(function)), Some(Some(_))) = (by_name.get(hot), by_name.get(name.as_str())) {
                owner.insert(*start, function.0);
                parts.entry(function.0).or_insert_with(|| vec![*function]).push((*start, *end));
            }
        }
        Self { bounds, owner, parts }
    }

    /// The start of the function whose code (or a part of it) holds
    /// `address`.
    fn holding(&self, address: u64) -> Option<u64> {
        let at = self.bounds.partition_point(|b| b.0 <= address).checked_sub(1)?;
        let &(start, _) = self.bounds.get(at).filter(|b| address < b.1)?;
        Some(self.owner.get(&start).copied().unwrap_or(start))
    }

    /// The parts of the function at `start`, its own code first.
    fn parts(&self, start: u64) -> Vec<(u64, u64)> {
        self.parts.get(&start).cloned().unwrap_or_else(|| {
            let at = self.bounds.partition_point(|b| b.0 < start);
            self.bounds.get(at).filter(|b| b.0 == start).map(|&b| vec![b]).unwrap_or_default()
        })
    }
}

/// Where a copy the DWARF lists may be probed. Its entry is most often an
/// instruction the kernel single-steps; the read of its switch is followed
/// by a conditional jump, which the kernel emulates at a fraction of the
/// cost. Where the copy holds exactly one read, which no other copy holds,
/// every call of the copy passes that read once (the switch is tested
/// first thing), so the copy is probed there instead, unless only the
/// entry shows the size.
fn copy_points(
    site: &inline::Site,
    copies: &[&inline::Site],
    reads: &[guards::GuardSite],
    cfa: &mut Cfa<'_>,
) -> Points {
    let entry = InlineEntry {
        address: site.entry,
        size: size_operands(site, cfa),
        object: object_operand(site, cfa),
        returned: false,
    };
    let inside = |s: &inline::Site, a: u64| s.ranges.iter().any(|r| r.contains(&a));
    let mut held = reads.iter().filter(|r| inside(site, r.read.address));
    let (Some(read), None) = (held.next(), held.next()) else { return Points::one(entry) };
    let shared = copies.iter().any(|c| !std::ptr::eq(*c, site) && inside(c, read.read.address));
    // The read is taken unless it loses what the entry shows.
    let loses =
        (read.read.size.is_none() && entry.size.is_some()) || (read.read.object.is_none() && entry.object.is_some());
    if shared || loses {
        return Points::one(entry);
    }
    // The entry stays the last resort, should no read point be probeable.
    let mut points = guard_points(read);
    points.at.push(entry);
    points
}

/// The points a copy found by its read of a switch may be probed at: the
/// read, then the instructions on the straight line after it.
#[must_use]
pub fn guard_points(site: &guards::GuardSite) -> Points {
    Points {
        at: std::iter::once(site.read).chain(site.later.iter().copied()).collect(),
        end: site.end,
        gate: site.gate.clone(),
    }
}

/// The names of the functions in an ELF file's symbol table, by address.
fn function_names(data: &[u8]) -> std::collections::HashMap<u64, String> {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(file) = object::File::parse(data) else { return std::collections::HashMap::new() };
    file.symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some((s.address(), s.name().ok()?.to_owned())))
        .collect()
}

/// The parameters whose DWARF locations are wanted for probe `p`: its size
/// or sizes, the new object, a free's block, or a realloc's new size and
/// block.
fn parameters(p: &crate::probe::ProbeSpec) -> &'static [&'static str] {
    match (python::object_parameter(p.symbol), python::freed_block_parameter(p.symbol)) {
        (Some(_), _) => &["op"],
        (None, Some(_)) => &["ptr"],
        (None, None) if python::reallocated_block_parameter(p.symbol).is_some() => &["new_size", "ptr"],
        (None, None) => python::size_parameters(p.program),
    }
}

/// Whether a parameter is a block or an object rather than a size.
fn is_block(p: &inline::Parameter) -> bool {
    p.name == "op" || p.name == "ptr"
}

/// Where a copy's new object (or a free's or a realloc's block) is, as
/// `count_object`'s (`free_object`'s, `count_site`'s second) operand: in a
/// register or a stack slot. `None` for any other function, or where the
/// DWARF does not say.
fn object_operand(site: &inline::Site, cfa: &mut Cfa<'_>) -> Option<(u8, u16)> {
    let op = site.parameters.iter().find(|p| is_block(p))?;
    location_operand(site.entry, &op.location, cfa)
}

/// A register or stack-slot location as an operand and its constant.
fn location_operand(entry: u64, location: &inline::Location, cfa: &mut Cfa<'_>) -> Option<(u8, u16)> {
    use tracer_common::site::{memory, register};
    match *location {
        inline::Location::Register(r) => register(r.dwarf()).map(|r| (r, 0)),
        inline::Location::Memory { base, offset } => memory(base.dwarf(), offset),
        inline::Location::Cfa { offset } => {
            let (base, cfa_offset) = cfa.at(entry)?;
            memory(base, cfa_offset.checked_add(offset)?)
        }
        _ => None,
    }
}

/// Where a copy's requested size is, as `count_site`'s operands: one
/// parameter (a malloc's size, a realloc's new size) or two multiplied (a
/// calloc's), each in a register or a constant. `None` where any is
/// elsewhere (on the stack, an expression, optimised out), or when the
/// function requests no size.
fn size_operands(site: &inline::Site, cfa: &mut Cfa<'_>) -> Option<(u8, u8, u16)> {
    use tracer_common::site::{CONSTANT, NONE, register};
    let operand = |l: &inline::Location| match *l {
        inline::Location::Register(r) => register(r.dwarf()).map(|r| (r, None)),
        inline::Location::Constant(c) => u16::try_from(c).ok().map(|c| (CONSTANT, Some(c))),
        _ => None,
    };
    let sizes: Vec<&inline::Parameter> = site.parameters.iter().filter(|p| !is_block(p)).collect();
    match sizes.as_slice() {
        // A size in a stack slot: read from the thread's memory there.
        [one] if matches!(one.location, inline::Location::Memory { .. } | inline::Location::Cfa { .. }) => {
            let (first, constant) = location_operand(site.entry, &one.location, cfa)?;
            Some((first, NONE, constant))
        }
        [one] => {
            let (first, constant) = operand(&one.location)?;
            Some((first, NONE, constant.unwrap_or(0)))
        }
        [a, b] => {
            let ((first, ca), (second, cb)) = (operand(&a.location)?, operand(&b.location)?);
            match (ca, cb) {
                (Some(x), Some(y)) => u16::try_from(u32::from(x) * u32::from(y)).ok().map(|c| (CONSTANT, NONE, c)),
                (Some(c), None) => Some((second, CONSTANT, c)),
                (None, Some(c)) => Some((first, CONSTANT, c)),
                (None, None) => Some((first, second, 0)),
            }
        }
        _ => None,
    }
}

/// The canonical frame address at each point of an image's code, from its
/// `.eh_frame`: where a size the DWARF puts relative to the CFA is.
pub struct Cfa<'a> {
    frame: Option<(gimli::EhFrame<gimli::EndianSlice<'a, gimli::LittleEndian>>, gimli::BaseAddresses)>,
    context: gimli::UnwindContext<usize>,
}

impl<'a> Cfa<'a> {
    /// The rules of the image `data`; none where it has no `.eh_frame`.
    #[must_use]
    pub fn of(data: &'a [u8]) -> Self {
        use object::{Object as _, ObjectSection as _};
        let frame = object::File::parse(data).ok().and_then(|file| {
            let section = file.section_by_name(".eh_frame")?;
            let bytes = section.data().ok()?;
            let mut frame = gimli::EhFrame::new(bytes, gimli::LittleEndian);
            frame.set_address_size(8);
            Some((frame, gimli::BaseAddresses::default().set_eh_frame(section.address())))
        });
        Self { frame, context: gimli::UnwindContext::new() }
    }

    /// The CFA at `address` as (DWARF register, offset), where it is a
    /// register plus an offset there.
    pub fn at(&mut self, address: u64) -> Option<(u16, i64)> {
        use gimli::UnwindSection as _;
        let (frame, bases) = self.frame.as_ref()?;
        let row =
            frame.unwind_info_for_address(bases, &mut self.context, address, gimli::EhFrame::cie_from_offset).ok()?;
        match *row.cfa() {
            gimli::CfaRule::RegisterAndOffset { register, offset } => Some((register.0, offset)),
            gimli::CfaRule::Expression(_) => None,
        }
    }
}

/// The image as the target names it, and its root as tracer reaches it:
/// a chroot's maps show the host path, below the chroot's directory.
pub(super) fn in_root(spec: &TargetSpec, image: &Path) -> (PathBuf, PathBuf) {
    match spec {
        TargetSpec::Pid(pid) => {
            let root_dir = process::proc_root(*pid);
            let host_root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_else(|_| PathBuf::from("/"));
            let inside = image.strip_prefix(&host_root).map_or_else(|_| image.to_owned(), |p| Path::new("/").join(p));
            (inside, root_dir)
        }
        TargetSpec::Exe(_) => (image.to_owned(), PathBuf::from("/")),
    }
}

/// What to install for the debug info of the interpreter, from the
/// target's own `/etc/os-release`.
pub(super) fn debug_fix(root: process::Root, abi: &dyn Abi) -> String {
    let release = root.reach(Path::new("/etc/os-release"), None).and_then(|p| std::fs::read_to_string(p).ok());
    debuginfo::debug_package(&release.unwrap_or_default(), (3, abi.minor()))
}

/// Per function, where the DWARF's copies `found` and the reads of the
/// switches `scan` disagree, and the reads in no DWARF copy to probe too:
/// not those in copies of a function no switch guards, whose reads are
/// its own (`_Py_NewReferenceNoTotal` reads `_Py_NewReference`'s switch).
fn compare(
    elf: &ElfImage,
    abi: &dyn Abi,
    found: &[inline::FunctionSites],
    scan: &guards::Scan,
) -> (HashMap<String, guards::CrossCheck>, HashMap<String, Vec<guards::GuardSite>>) {
    let unguarded: Vec<&std::ops::Range<u64>> = found
        .iter()
        .filter(|f| abi.guard(&f.function).is_none())
        .flat_map(|f| f.inlined.iter().chain(&f.out_of_line))
        .flat_map(|s| &s.ranges)
        .collect();
    let mut cross_check = HashMap::new();
    let mut guard_only = HashMap::new();
    for f in found {
        let Some(Ok(reads)) = scan.functions.get(&f.function) else { continue };
        // The symbol's own reads are its entry probe's, on both routes.
        let symbol = elf.function(&f.function).map(|s| s.address);
        let copies: Vec<(u64, &[std::ops::Range<u64>])> = f
            .inlined
            .iter()
            .chain(&f.out_of_line)
            .filter(|s| Some(s.entry) != symbol)
            .map(|s| (s.entry, s.ranges.as_slice()))
            .collect();
        let mut check = guards::CrossCheck::of(reads, &copies);
        check.guard_only.retain(|a| !unguarded.iter().any(|r| r.contains(a)));
        let extra: Vec<guards::GuardSite> =
            reads.sites.iter().filter(|s| check.guard_only.contains(&s.read.address)).cloned().collect();
        guard_only.insert(f.function.clone(), extra);
        cross_check.insert(f.function.clone(), check);
    }
    (cross_check, guard_only)
}
