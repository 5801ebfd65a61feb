//! Where LTO put the copies of a function. An LTO build inlines most calls
//! of `_Py_NewReference` or `PyObject_Malloc` into their callers, so a
//! uprobe on the symbol misses them; the DWARF records each copy as a
//! `DW_TAG_inlined_subroutine`. This module lists, per function, its
//! out-of-line definitions and inlined instances with their entry
//! addresses and where the requested parameters live there, so that a probe
//! at each copy can count it and read its arguments.
//!
//! Addresses are link-time virtual addresses; [`FileOffsets`] turns them
//! into the file offsets a uprobe takes, through the image's own `PT_LOAD`s.

use std::{borrow::Cow, collections::HashMap, ops::Range, path::Path, path::PathBuf};

use gimli::{AttributeValue, EndianSlice, Operation, RunTimeEndian, constants as dw};
use object::{Object as _, ObjectSection as _};
use thiserror::Error;

use crate::discover::{debuginfo::BAD_FILE_FIX, elf};

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;
type Attrs<'a> = [gimli::Attribute<Reader<'a>>];

/// Origin and specification chains longer than this are malformed.
const MAX_HOPS: usize = 8;

/// DWARF that cannot be read: a truncated or corrupt debug file.
#[derive(Debug, Error)]
pub enum InlineError {
    #[error("{path} is not a readable ELF file: {cause}")]
    Parse { path: PathBuf, cause: object::Error },
    #[error("{path}: cannot read its {section} section (truncated or corrupt?): {cause}; {BAD_FILE_FIX}")]
    Section { path: PathBuf, section: &'static str, cause: object::Error },
    #[error("{path}: malformed DWARF near .debug_info offset {offset:#x}: {cause}; {BAD_FILE_FIX}")]
    Dwarf { path: PathBuf, offset: u64, cause: gimli::Error },
}

/// One function to look for, and the parameters whose locations are wanted
/// (by their names in the source: `size` for `PyObject_Malloc`).
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub function: &'a str,
    pub parameters: &'a [&'a str],
}

/// Every copy of one function in the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSites {
    pub function: String,
    /// `DW_TAG_subprogram`s with code: the symbol, and the clones GCC makes
    /// (`.constprop`, `.isra`, `.part`), whose parameters may differ.
    pub out_of_line: Vec<Site>,
    /// `DW_TAG_inlined_subroutine`s, one per distinct entry address.
    pub inlined: Vec<Site>,
}

/// One copy of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Where the copy starts executing.
    pub entry: u64,
    pub entry_from: EntryFrom,
    /// Its code, in the order the DWARF lists it (the hot part first, then
    /// any `.cold` part).
    pub ranges: Vec<Range<u64>>,
    /// Its DIE's `.debug_info` offset, for checking by hand with
    /// `llvm-dwarfdump --debug-info=OFFSET`.
    pub die: u64,
    /// The wanted parameters, in the order asked for, at `entry`.
    pub parameters: Vec<Parameter>,
    /// Their locations at the start of each of `ranges`, where a path that
    /// skips the entry may come in (see discover/entries.rs).
    pub at_ranges: Vec<Vec<Location>>,
}

impl Site {
    /// This copy as entered at `address`, the start of one of its ranges,
    /// with its parameters there (unknown elsewhere).
    #[must_use]
    pub fn entered_at(&self, address: u64) -> Self {
        let at = self.ranges.iter().position(|r| r.start == address).and_then(|i| self.at_ranges.get(i));
        let parameters = (self.parameters.iter().enumerate())
            .map(|(i, p)| Parameter {
                name: p.name.clone(),
                location: at.and_then(|l| l.get(i)).copied().unwrap_or(Location::Unknown),
            })
            .collect();
        Self { entry: address, parameters, ..self.clone() }
    }
}

/// Which attribute gave a [`Site`]'s entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryFrom {
    EntryPc,
    LowPc,
    /// The start of the first listed range. Not the lowest start: GCC puts
    /// `.cold` parts below the hot code, and the listing starts with the
    /// hot part, as GDB also assumes.
    FirstRange,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    pub name: String,
    pub location: Location,
}

/// Where a parameter's value is at a site's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// In a register.
    Register(Register),
    /// In what the register held when the enclosing out-of-line function
    /// was entered (`DW_OP_entry_value`); for an inlined copy, that is not
    /// the register's value at the copy's entry.
    EntryValue(Register),
    /// In memory at the canonical frame address plus `offset`.
    Cfa { offset: i64 },
    /// In memory at a register plus `offset`.
    Memory { base: Register, offset: i64 },
    /// A constant the compiler propagated.
    Constant(u64),
    /// Optimised out, or an expression this module does not evaluate.
    Unknown,
}

impl Location {
    #[must_use]
    pub const fn is_known(&self) -> bool {
        !matches!(self, Self::Unknown)
    }
}

/// An x86-64 general-purpose register, by its DWARF number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Register(u16);

/// `struct pt_regs` field names in DWARF register order (the x86-64 psABI).
const PT_REGS: [&str; 16] =
    ["ax", "dx", "cx", "bx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];

impl Register {
    /// A general-purpose register; vector and other registers are not in
    /// `pt_regs`, where a BPF program reads arguments.
    #[must_use]
    pub fn from_dwarf(number: u16) -> Option<Self> {
        (usize::from(number) < PT_REGS.len()).then_some(Self(number))
    }

    #[must_use]
    pub const fn dwarf(self) -> u16 {
        self.0
    }

    /// Its field in `struct pt_regs`.
    #[must_use]
    pub fn pt_regs(self) -> &'static str {
        PT_REGS[usize::from(self.0)]
    }
}

/// Maps link-time addresses to file offsets through an image's `PT_LOAD`s.
/// It must be built from the image itself: a separate debug file's
/// `PT_LOAD`s have no file bytes, and it maps nothing.
#[derive(Clone, Debug)]
pub struct FileOffsets(Vec<(u64, u64, u64, u64)>);

impl FileOffsets {
    pub fn of_image(path: &Path, data: &[u8]) -> Result<Self, InlineError> {
        let file = object::File::parse(data).map_err(|cause| InlineError::Parse { path: path.to_owned(), cause })?;
        Ok(Self(elf::load_segments(&file)))
    }

    /// The file offset of `address`, if a segment's file bytes hold it.
    #[must_use]
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        elf::file_offset_of(&self.0, address)
    }
}

/// Every copy of each wanted function in the DWARF of `data` (a debug file,
/// or an image with its own DWARF), in the order of `wanted`. `path` is for
/// messages.
pub fn find(path: &Path, data: &[u8], wanted: &[Wanted<'_>]) -> Result<Vec<FunctionSites>, InlineError> {
    let file = object::File::parse(data).map_err(|cause| InlineError::Parse { path: path.to_owned(), cause })?;
    let endian = if file.is_little_endian() { RunTimeEndian::Little } else { RunTimeEndian::Big };
    let sections = gimli::DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, InlineError> {
        file.section_by_name(id.name()).map_or(Ok(Cow::Borrowed(&[][..])), |s| {
            s.uncompressed_data().map_err(|cause| InlineError::Section {
                path: path.to_owned(),
                section: id.name(),
                cause,
            })
        })
    })?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
    let err = |offset: u64| move |cause| InlineError::Dwarf { path: path.to_owned(), offset, cause };
    let mut units = Vec::new();
    let mut headers = dwarf.units();
    while let Some(header) = headers.next().map_err(err(0))? {
        let start = header.debug_info_offset().map_or(0, |o| o.0 as u64);
        units.push((start, dwarf.unit(header).map_err(err(start))?));
    }
    let mut walk = Walk {
        dwarf: &dwarf,
        units: &units,
        wanted,
        names: wanted.iter().enumerate().map(|(i, w)| (w.function.as_bytes(), i)).collect(),
        origins: HashMap::new(),
        found: wanted.iter().map(|w| (w.function.to_owned(), Vec::new(), Vec::new())).collect(),
    };
    for index in 0..units.len() {
        walk.unit(index).map_err(|(offset, cause)| InlineError::Dwarf { path: path.to_owned(), offset, cause })?;
    }
    Ok(walk
        .found
        .into_iter()
        .map(|(function, o, i)| FunctionSites { function, out_of_line: dedup(o), inlined: dedup(i) })
        .collect())
}

/// Sorts sites by entry and merges those at one address (the same copy
/// described twice), keeping any parameter location either knows.
fn dedup(mut sites: Vec<Site>) -> Vec<Site> {
    sites.sort_by_key(|s| (s.entry, s.die));
    let mut out: Vec<Site> = Vec::with_capacity(sites.len());
    for site in sites {
        match out.last_mut() {
            Some(last) if last.entry == site.entry => {
                for (mine, theirs) in last.parameters.iter_mut().zip(site.parameters) {
                    if !mine.location.is_known() {
                        mine.location = theirs.location;
                    }
                }
                if last.ranges == site.ranges {
                    for (mine, theirs) in last.at_ranges.iter_mut().flatten().zip(site.at_ranges.into_iter().flatten())
                    {
                        if !mine.is_known() {
                            *mine = theirs;
                        }
                    }
                }
            }
            _ => out.push(site),
        }
    }
    out
}

/// What `DW_OP_fbreg` is relative to in the enclosing function.
#[derive(Clone, Copy, Debug)]
enum FrameBase {
    Cfa,
    Register(Register, i64),
    Unknown,
}

/// An entry on the walk's stack of open DIEs.
enum Open {
    /// A function with a frame base, for its children's `DW_OP_fbreg`.
    Frame(isize, FrameBase),
    /// Site `.3` of wanted function `.1` (inlined if `.2`), collecting its
    /// parameters.
    Site(isize, usize, bool, usize),
}

/// One pass over every unit's DIEs.
struct Walk<'w, 'a> {
    dwarf: &'w gimli::Dwarf<Reader<'a>>,
    /// Units by their `.debug_info` offset, ascending.
    units: &'w [(u64, gimli::Unit<Reader<'a>>)],
    wanted: &'w [Wanted<'w>],
    names: HashMap<&'w [u8], usize>,
    /// Which wanted function (if any) an origin or specification DIE, by
    /// `.debug_info` offset, names: many copies share one origin.
    origins: HashMap<u64, Option<usize>>,
    /// Per wanted function: name, out-of-line sites, inlined sites.
    found: Vec<(String, Vec<Site>, Vec<Site>)>,
}

type WalkError = (u64, gimli::Error);

/// A copy's entry, what gave it, and its ranges.
type Code = (u64, EntryFrom, Vec<Range<u64>>);

/// A DIE's `DW_AT_name` and `DW_AT_linkage_name`.
type Names<'a> = [Option<&'a [u8]>; 2];

impl<'a> Walk<'_, 'a> {
    fn unit(&mut self, index: usize) -> Result<(), WalkError> {
        let units = self.units;
        let (start, unit) = &units[index];
        let at = |offset: gimli::UnitOffset| start + offset.0 as u64;
        let mut raw = unit.entries_raw(None).map_err(|e| (*start, e))?;
        let mut attrs = Vec::new();
        let mut open: Vec<Open> = Vec::new();
        while !raw.is_empty() {
            let (depth, offset) = (raw.next_depth(), raw.next_offset());
            let Some(abbrev) = raw.read_abbreviation().map_err(|e| (at(offset), e))? else { continue };
            while open.last().is_some_and(|o| match o {
                Open::Frame(d, _) | Open::Site(d, ..) => *d >= depth,
            }) {
                open.pop();
            }
            let tag = abbrev.tag();
            let parent_site = match open.last() {
                Some(&Open::Site(d, function, inlined, site)) if d + 1 == depth => Some((function, inlined, site)),
                _ => None,
            };
            let wanted_tag = matches!(tag, dw::DW_TAG_subprogram | dw::DW_TAG_inlined_subroutine)
                || (tag == dw::DW_TAG_formal_parameter && parent_site.is_some());
            if !wanted_tag {
                raw.skip_attributes(abbrev.attributes()).map_err(|e| (at(offset), e))?;
                continue;
            }
            raw.read_attributes(abbrev.attributes(), &mut attrs).map_err(|e| (at(offset), e))?;
            let e = |e| (at(offset), e);
            if let Some((function, inlined, site)) = parent_site {
                let frame = open.iter().rev().find_map(|o| match o {
                    Open::Frame(_, f) => Some(*f),
                    Open::Site(..) => None,
                });
                let frame = frame.unwrap_or(FrameBase::Unknown);
                self.parameter(index, &attrs, (function, inlined, site), frame).map_err(e)?;
                continue;
            }
            let subprogram = tag == dw::DW_TAG_subprogram;
            if subprogram && let Some(AttributeValue::Exprloc(expr)) = attr(&attrs, dw::DW_AT_frame_base) {
                open.push(Open::Frame(depth, frame_base(expr, unit.encoding())));
            }
            let Some(function) = self.function_of(index, &attrs).map_err(e)? else { continue };
            let entry = gimli::DebuggingInformationEntry::new(tag, abbrev.has_children(), attrs.clone(), offset);
            let Some((entry, entry_from, ranges)) = self.entry_of(unit, &entry).map_err(e)? else { continue };
            let parameters = (self.wanted[function].parameters.iter())
                .map(|&name| Parameter { name: name.to_owned(), location: Location::Unknown })
                .collect();
            let at_ranges = vec![vec![Location::Unknown; self.wanted[function].parameters.len()]; ranges.len()];
            let site = Site { entry, entry_from, ranges, die: at(offset), parameters, at_ranges };
            let (_, out_of_line, inlined) = &mut self.found[function];
            let sites = if subprogram { out_of_line } else { inlined };
            sites.push(site);
            if abbrev.has_children() {
                open.push(Open::Site(depth, function, !subprogram, sites.len() - 1));
            }
        }
        Ok(())
    }

    /// Records a `DW_TAG_formal_parameter` of a site (wanted function,
    /// whether inlined, index) when it is a wanted parameter.
    fn parameter(
        &mut self,
        unit: usize,
        attrs: &Attrs<'a>,
        (function, inlined, index): (usize, bool, usize),
        frame: FrameBase,
    ) -> gimli::Result<()> {
        let wanted = self.wanted[function].parameters;
        let Some(which) = self.resolve(unit, attrs, &|n| wanted.iter().position(|w| w.as_bytes() == n))? else {
            return Ok(());
        };
        let (_, out_of_line, inlined_sites) = &mut self.found[function];
        let site = &mut (if inlined { inlined_sites } else { out_of_line })[index];
        for (r, at) in site.ranges.iter().zip(&mut site.at_ranges) {
            if !at[which].is_known() {
                // A range start's location is extra knowledge: a list that
                // cannot be read there leaves it unknown, and the entry's
                // location below still decides whether the walk fails.
                at[which] =
                    location(self.dwarf, &self.units[unit].1, attrs, r.start, frame).unwrap_or(Location::Unknown);
            }
        }
        if site.parameters[which].location.is_known() {
            return Ok(());
        }
        let mut location = location(self.dwarf, &self.units[unit].1, attrs, site.entry, frame)?;
        if let (Location::EntryValue(r), false) = (location, inlined) {
            // At an out-of-line function's own entry, the entry value is
            // the register.
            location = Location::Register(r);
        }
        site.parameters[which].location = location;
        Ok(())
    }

    /// The wanted function a subprogram or inlined subroutine is a copy of.
    fn function_of(&mut self, unit: usize, attrs: &Attrs<'a>) -> gimli::Result<Option<usize>> {
        let names = &self.names;
        let lookup = |n: &[u8]| names.get(n).copied();
        let (own, next) = self.names_and_origin(unit, attrs)?;
        // A clone (`PyObject_Malloc.constprop.0`) has a name of its own that
        // matches nothing, and its origin says whose clone it is.
        if let Some(hit) = own.into_iter().flatten().find_map(lookup) {
            return Ok(Some(hit));
        }
        let Some(target) = next else { return Ok(None) };
        if let Some(&hit) = self.origins.get(&target) {
            return Ok(hit);
        }
        let hit = self.follow(target, &lookup)?;
        self.origins.insert(target, hit);
        Ok(hit)
    }

    /// The first of `lookup`'s answers for the names of the DIE or, when it
    /// has none, of what it is an instance or definition of.
    fn resolve(
        &self,
        unit: usize,
        attrs: &Attrs<'a>,
        lookup: &dyn Fn(&[u8]) -> Option<usize>,
    ) -> gimli::Result<Option<usize>> {
        let (own, next) = self.names_and_origin(unit, attrs)?;
        if own.iter().any(Option::is_some) {
            return Ok(own.into_iter().flatten().find_map(lookup));
        }
        next.map_or(Ok(None), |target| self.follow(target, lookup))
    }

    fn follow(&self, mut target: u64, lookup: &dyn Fn(&[u8]) -> Option<usize>) -> gimli::Result<Option<usize>> {
        for _ in 0..MAX_HOPS {
            // A reference outside every unit: nothing to name it by.
            let Some(index) = self.units.partition_point(|(start, _)| *start <= target).checked_sub(1) else {
                return Ok(None);
            };
            let unit = &self.units[index].1;
            let Some(offset) =
                usize::try_from(target).ok().and_then(|o| gimli::DebugInfoOffset(o).to_unit_offset(&unit.header))
            else {
                return Ok(None);
            };
            let entry = unit.entry(offset)?;
            let (own, next) = self.names_and_origin(index, entry.attrs())?;
            if own.iter().any(Option::is_some) {
                return Ok(own.into_iter().flatten().find_map(lookup));
            }
            let Some(next) = next else { return Ok(None) };
            target = next;
        }
        Ok(None)
    }

    /// A DIE's name and linkage name, and the `.debug_info` offset of its
    /// abstract origin or specification.
    fn names_and_origin(&self, unit: usize, attrs: &Attrs<'a>) -> gimli::Result<(Names<'a>, Option<u64>)> {
        let (start, unit) = &self.units[unit];
        let (mut names, mut next) = ([None, None], None);
        for a in attrs {
            match a.name() {
                dw::DW_AT_name => names[0] = Some(self.dwarf.attr_string(unit, a.value())?.slice()),
                dw::DW_AT_linkage_name | dw::DW_AT_MIPS_linkage_name => {
                    names[1] = Some(self.dwarf.attr_string(unit, a.value())?.slice());
                }
                dw::DW_AT_abstract_origin | dw::DW_AT_specification => {
                    next = match a.value() {
                        // Checked: a corrupt reference may point past any
                        // offset, and then names nothing.
                        AttributeValue::UnitRef(o) => start.checked_add(o.0 as u64),
                        AttributeValue::DebugInfoRef(o) => Some(o.0 as u64),
                        _ => next,
                    };
                }
                _ => {}
            }
        }
        Ok((names, next))
    }

    /// A copy's entry address, how it was found, and its ranges; `None` for
    /// a DIE without code (a declaration, an abstract instance) or one whose
    /// code the linker discarded.
    fn entry_of(
        &self,
        unit: &gimli::Unit<Reader<'a>>,
        entry: &gimli::DebuggingInformationEntry<Reader<'a>>,
    ) -> gimli::Result<Option<Code>> {
        let mut ranges = Vec::new();
        let mut iter = self.dwarf.die_ranges(unit, entry)?;
        while let Some(r) = iter.next()? {
            if r.begin < r.end && !unit.header.is_tombstone_address(r.begin) {
                ranges.push(r.begin..r.end);
            }
        }
        let low_pc =
            entry.attr_value(dw::DW_AT_low_pc).map(|v| self.dwarf.attr_address(unit, v)).transpose()?.flatten();
        let base = low_pc.or_else(|| ranges.first().map(|r| r.start));
        let entry_pc = match entry.attr_value(dw::DW_AT_entry_pc) {
            Some(v @ (AttributeValue::Addr(_) | AttributeValue::DebugAddrIndex(_))) => {
                self.dwarf.attr_address(unit, v)?
            }
            // DWARF 5: a constant is an offset from the copy's base address.
            Some(v) => v.udata_value().zip(base).and_then(|(off, base)| base.checked_add(off)),
            None => None,
        };
        let found = (entry_pc.map(|a| (a, EntryFrom::EntryPc)))
            .or(low_pc.map(|a| (a, EntryFrom::LowPc)))
            .or(ranges.first().map(|r| (r.start, EntryFrom::FirstRange)));
        Ok(found.filter(|&(a, _)| a != 0 && !unit.header.is_tombstone_address(a)).map(|(a, from)| (a, from, ranges)))
    }
}

/// A parameter's location at `pc`, from its `DW_AT_const_value` or its
/// `DW_AT_location` (an expression or a location list).
fn location<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    attrs: &Attrs<'a>,
    pc: u64,
    frame: FrameBase,
) -> gimli::Result<Location> {
    if let Some(v) = attr(attrs, dw::DW_AT_const_value) {
        return Ok(v
            .udata_value()
            .or(v.sdata_value().map(i64::cast_unsigned))
            .map_or(Location::Unknown, Location::Constant));
    }
    let Some(value) = attr(attrs, dw::DW_AT_location) else { return Ok(Location::Unknown) };
    if let AttributeValue::Exprloc(expr) = value {
        return Ok(evaluate(expr, unit.encoding(), frame));
    }
    let Some(mut list) = dwarf.attr_locations(unit, value)? else { return Ok(Location::Unknown) };
    while let Some(entry) = list.next()? {
        if (entry.range.begin..entry.range.end).contains(&pc) {
            return Ok(evaluate(entry.data, unit.encoding(), frame));
        }
    }
    Ok(Location::Unknown)
}

fn attr<'a>(attrs: &Attrs<'a>, name: gimli::DwAt) -> Option<AttributeValue<Reader<'a>>> {
    attrs.iter().find(|a| a.name() == name).map(gimli::Attribute::value)
}

/// The operations of a short expression; `None` when it is longer than
/// any form [`evaluate`] knows, or malformed.
fn operations(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding) -> Option<Vec<Operation<Reader<'_>>>> {
    let mut ops = Vec::new();
    let mut iter = expr.operations(encoding);
    while let Some(op) = iter.next().ok()? {
        if ops.len() == 3 {
            return None;
        }
        ops.push(op);
    }
    Some(ops)
}

/// The location of the simple expressions compilers emit for a parameter
/// at a function's entry; anything else is [`Location::Unknown`].
fn evaluate(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding, frame: FrameBase) -> Location {
    let reg = |r: gimli::Register| Register::from_dwarf(r.0);
    let Some(ops) = operations(expr, encoding) else { return Location::Unknown };
    let known = match ops.as_slice() {
        [Operation::Register { register }]
        | [Operation::RegisterOffset { register, offset: 0, .. }, Operation::StackValue] => {
            reg(*register).map(Location::Register)
        }
        [Operation::RegisterOffset { register, offset, base_type }] if base_type.0 == 0 => {
            reg(*register).map(|base| Location::Memory { base, offset: *offset })
        }
        [Operation::FrameOffset { offset }] => match frame {
            FrameBase::Cfa => Some(Location::Cfa { offset: *offset }),
            FrameBase::Register(base, off) => off.checked_add(*offset).map(|offset| Location::Memory { base, offset }),
            FrameBase::Unknown => None,
        },
        [Operation::UnsignedConstant { value }, Operation::StackValue] => Some(Location::Constant(*value)),
        [Operation::SignedConstant { value }, Operation::StackValue] => Some(Location::Constant(value.cast_unsigned())),
        [Operation::EntryValue { expression }, Operation::StackValue] => {
            match operations(gimli::Expression(*expression), encoding).as_deref() {
                Some([Operation::Register { register }]) => reg(*register).map(Location::EntryValue),
                _ => None,
            }
        }
        _ => None,
    };
    known.unwrap_or(Location::Unknown)
}

/// A function's `DW_AT_frame_base` expression, as `DW_OP_fbreg` uses it.
fn frame_base(expr: gimli::Expression<Reader<'_>>, encoding: gimli::Encoding) -> FrameBase {
    let reg = |r: gimli::Register| Register::from_dwarf(r.0);
    match operations(expr, encoding).as_deref() {
        Some([Operation::CallFrameCFA]) => FrameBase::Cfa,
        Some([Operation::Register { register }]) => {
            reg(*register).map_or(FrameBase::Unknown, |r| FrameBase::Register(r, 0))
        }
        Some([Operation::RegisterOffset { register, offset, .. }]) => {
            reg(*register).map_or(FrameBase::Unknown, |r| FrameBase::Register(r, *offset))
        }
        _ => FrameBase::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::{
        debuginfo::tests::{DEBIAN_PYTHON, debian_debug_file, pyenv_libpython},
        elf::ElfImage,
    };

    const ENCODING: gimli::Encoding = gimli::Encoding { format: gimli::Format::Dwarf32, version: 5, address_size: 8 };

    fn eval(bytes: &[u8], frame: FrameBase) -> Location {
        evaluate(gimli::Expression(EndianSlice::new(bytes, RunTimeEndian::Little)), ENCODING, frame)
    }

    fn reg(n: u16) -> Register {
        Register::from_dwarf(n).unwrap()
    }

    #[test]
    fn simple_expressions_evaluate_and_the_rest_are_unknown() {
        use Location::{Cfa, Constant, EntryValue, Memory, Unknown};
        let cfa = FrameBase::Cfa;
        assert_eq!(eval(&[0x55], cfa), Location::Register(reg(5))); // DW_OP_reg5
        assert_eq!(eval(&[0x77, 0x08], cfa), Memory { base: reg(7), offset: 8 }); // DW_OP_breg7 8
        assert_eq!(eval(&[0x75, 0x00, 0x9f], cfa), Location::Register(reg(5))); // breg5 0, stack_value
        assert_eq!(eval(&[0x91, 0x70], cfa), Cfa { offset: -16 }); // DW_OP_fbreg -16
        assert_eq!(eval(&[0x91, 0x70], FrameBase::Register(reg(6), 16)), Memory { base: reg(6), offset: 0 });
        assert_eq!(eval(&[0x91, 0x70], FrameBase::Unknown), Unknown);
        assert_eq!(eval(&[0x33, 0x9f], cfa), Constant(3)); // DW_OP_lit3, stack_value
        assert_eq!(eval(&[0x10, 0xac, 0x02, 0x9f], cfa), Constant(300)); // DW_OP_constu 300
        assert_eq!(eval(&[0x11, 0x7f, 0x9f], cfa), Constant(u64::MAX)); // DW_OP_consts -1
        assert_eq!(eval(&[0x08, 0x30, 0x9f], cfa), Constant(0x30)); // DW_OP_const1u 0x30
        assert_eq!(eval(&[0xa3, 0x01, 0x55, 0x9f], cfa), EntryValue(reg(5))); // DW_OP_entry_value(reg5)
        assert_eq!(eval(&[0xf3, 0x01, 0x54, 0x9f], cfa), EntryValue(reg(4))); // DW_OP_GNU_entry_value(reg4)
        assert_eq!(eval(&[0x61], cfa), Unknown); // DW_OP_reg17: xmm0, not in pt_regs
        assert_eq!(eval(&[0x33], cfa), Unknown); // a constant without stack_value is an address
        assert_eq!(eval(&[0x50, 0x93, 0x08], cfa), Unknown); // DW_OP_reg0, DW_OP_piece 8
        assert_eq!(eval(&[0x03, 1, 2, 3, 4, 5, 6, 7, 8], cfa), Unknown); // DW_OP_addr
        assert_eq!(eval(&[0x77], cfa), Unknown); // truncated
        assert_eq!(eval(&[], cfa), Unknown);
    }

    /// A corrupt frame offset that overflows is no location, not a panic.
    #[test]
    fn an_overflowing_frame_offset_is_unknown() {
        let frame = FrameBase::Register(reg(6), i64::MAX);
        assert_eq!(eval(&[0x91, 0x01], frame), Location::Unknown); // DW_OP_fbreg 1
        assert_eq!(eval(&[0x91, 0x7f], frame), Location::Memory { base: reg(6), offset: i64::MAX - 1 });
    }

    #[test]
    fn registers_have_their_pt_regs_names() {
        let names: Vec<&str> = (0..16).map(|n| reg(n).pt_regs()).collect();
        assert_eq!(&names[..8], ["ax", "dx", "cx", "bx", "si", "di", "bp", "sp"]);
        assert_eq!(names[15], "r15");
        assert_eq!(Register::from_dwarf(16), None); // the return address column
    }

    #[test]
    fn duplicate_entries_merge_their_known_locations() {
        let site = |die, location| Site {
            entry: 0x10,
            entry_from: EntryFrom::EntryPc,
            ranges: vec![0x10..0x20, 0x30..0x38],
            die,
            parameters: vec![Parameter { name: "op".into(), location }],
            at_ranges: vec![vec![location]; 2],
        };
        let merged =
            dedup(vec![site(2, Location::Unknown), site(1, Location::Unknown), site(3, Location::Constant(1))]);
        assert_eq!(merged, vec![Site { die: 1, ..site(1, Location::Constant(1)) }]);
    }

    fn debian_python_sites() -> Vec<FunctionSites> {
        let path = debian_debug_file();
        let data = std::fs::read(&path).unwrap();
        let wanted = [
            Wanted { function: "_Py_NewReference", parameters: &["op"] },
            Wanted { function: "PyObject_Malloc", parameters: &["size"] },
            Wanted { function: "PyObject_Calloc", parameters: &["nelem", "elsize"] },
        ];
        find(&path, &data, &wanted).unwrap()
    }

    /// How many of `sites` know each wanted parameter's location.
    fn known(sites: &[Site]) -> Vec<usize> {
        let params = sites.first().map_or(0, |s| s.parameters.len());
        (0..params).map(|i| sites.iter().filter(|s| s.parameters[i].location.is_known()).count()).collect()
    }

    /// The expected numbers were checked independently of gimli, on the
    /// text of `llvm-dwarfdump-22 --debug-info` of the debug file, with a
    /// short script: every `DW_TAG_inlined_subroutine` whose
    /// `DW_AT_abstract_origin` is the function's DIE (one each:
    /// `_Py_NewReference` 0x6c2716, `PyObject_Malloc` 0x6c52fc), counted by
    /// distinct entry (`DW_AT_entry_pc`, else `DW_AT_low_pc`, else the first
    /// range: all distinct), and for each the location list entry of the
    /// parameter's `DW_TAG_formal_parameter` child that covers the entry,
    /// matched against the forms [`evaluate`] knows. `_Py_NewReference`:
    /// 209 instances, `op` known in all (in a register in 207, `DW_OP_fbreg`
    /// in 2). `PyObject_Malloc`: 137, `size` known in 82 (40 constants, 42
    /// registers); of the 55 others, 44 are sums of two registers
    /// (`DW_OP_bregX, DW_OP_bregY, DW_OP_plus`), 3 other arithmetic, and 8
    /// have no location there. `PyObject_Calloc`: 11, both parameters constant in 10.
    #[test]
    fn debian_python_has_209_inlined_new_references() {
        let found = debian_python_sites();
        let image = ElfImage::open(Path::new(DEBIAN_PYTHON)).unwrap();
        let offsets = FileOffsets::of_image(Path::new(DEBIAN_PYTHON), &std::fs::read(DEBIAN_PYTHON).unwrap()).unwrap();
        let [new_ref, malloc, calloc] = &found[..] else { panic!("{found:?}") };
        assert_eq!(new_ref.function, "_Py_NewReference");
        let symbol = image.function("_Py_NewReference").unwrap();
        let out_of_line: Vec<u64> = new_ref.out_of_line.iter().map(|s| s.entry).collect();
        assert_eq!(out_of_line, [symbol.address]);
        assert_eq!(new_ref.out_of_line[0].parameters[0].location, Location::Register(reg(5)));
        assert_eq!(offsets.file_offset(symbol.address), Some(symbol.file_offset));
        assert_eq!((new_ref.inlined.len(), known(&new_ref.inlined)), (209, vec![209]));

        let malloc_symbol = image.function("PyObject_Malloc").unwrap();
        let [out_of_line] = &malloc.out_of_line[..] else { panic!("{:#x?}", malloc.out_of_line) };
        // The symbol's copy: size in rdi, and its hot code listed before
        // the .cold part, which lies lower.
        assert_eq!((out_of_line.entry, out_of_line.entry_from), (malloc_symbol.address, EntryFrom::FirstRange));
        assert_eq!(out_of_line.parameters[0].location, Location::Register(reg(5)));
        assert!(out_of_line.ranges[1].start < out_of_line.entry, "{out_of_line:#x?}");
        assert_eq!((malloc.inlined.len(), known(&malloc.inlined)), (137, vec![82]));
        assert_eq!((calloc.inlined.len(), known(&calloc.inlined)), (11, vec![10, 10]));

        for site in found.iter().flat_map(|f| f.inlined.iter().chain(&f.out_of_line)) {
            assert!(offsets.file_offset(site.entry).is_some(), "{site:#x?}");
        }
        // GCC may put an entry_pc where the inlined body starts in a later
        // location view, in an empty range: twice for PyObject_Malloc.
        let outside = malloc.inlined.iter().filter(|s| !s.ranges.iter().any(|r| r.contains(&s.entry))).count();
        assert_eq!(outside, 2);
        // A debug file's PT_LOADs have no bytes: no offsets from it.
        let debug = FileOffsets::of_image(&debian_debug_file(), &std::fs::read(debian_debug_file()).unwrap()).unwrap();
        assert_eq!(debug.file_offset(symbol.address), None);
    }

    /// pyenv's build is not LTO: `_Py_NewReference` is one out-of-line
    /// function, found in the image's own DWARF by its `DW_AT_name`, and
    /// inlined nowhere (`llvm-dwarfdump-22 --debug-info` lists no
    /// `DW_TAG_inlined_subroutine` of it).
    #[test]
    fn pyenv_libpython_has_one_new_reference_in_its_own_dwarf() {
        let lib = pyenv_libpython();
        let data = std::fs::read(&lib).unwrap();
        let found = find(&lib, &data, &[Wanted { function: "_Py_NewReference", parameters: &["op"] }]).unwrap();
        let symbol = ElfImage::parse(&lib, &data).unwrap().function("_Py_NewReference").unwrap().address;
        let [sites] = &found[..] else { panic!("{found:?}") };
        assert_eq!(
            sites.out_of_line.iter().map(|s| (s.entry, s.entry_from)).collect::<Vec<_>>(),
            [(symbol, EntryFrom::LowPc)]
        );
        assert_eq!(sites.out_of_line[0].parameters[0].location, Location::Register(reg(5)));
        assert!(sites.inlined.is_empty(), "{sites:#x?}");
    }

    /// A C program where GCC 12 -O2 inlines `bump(7)` and splits the
    /// out-of-line `bump` into hot and `.cold` parts, with DWARF 4's
    /// `.debug_ranges` and `.debug_loc` (python3.11's DWARF is version 5).
    const DWARF4_PROGRAM: &str = r"
        volatile long sink;
        __attribute__((cold, noinline)) void complain(long n) { sink = -n; }
        long bump(long n) {
            if (n < 0) complain(n);
            sink += n;
            return sink;
        }
        int main(int argc, char **argv) { (void)argc; bump((long)argv); bump(7); return 0; }
    ";

    #[test]
    fn dwarf4_ranges_and_location_lists() {
        let dir = std::env::temp_dir().join(format!("tracer-inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.c"), DWARF4_PROGRAM).unwrap();
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-gdwarf-4", "-o"])
            .arg(dir.join("t"))
            .arg(dir.join("t.c"))
            .status()
            .expect("gcc runs (apt-get install gcc)");
        assert!(status.success());
        let data = std::fs::read(dir.join("t")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert!(file.section_by_name(".debug_ranges").is_some() && file.section_by_name(".debug_loc").is_some());
        let image = ElfImage::parse(Path::new("t"), &data).unwrap();
        let bump = image.function("bump").unwrap().address;
        let found = find(Path::new("t"), &data, &[Wanted { function: "bump", parameters: &["n"] }]).unwrap();
        let [sites] = &found[..] else { panic!("{found:?}") };
        let [out_of_line] = &sites.out_of_line[..] else { panic!("{sites:#x?}") };
        assert_eq!((out_of_line.entry, out_of_line.entry_from), (bump, EntryFrom::FirstRange));
        assert_eq!(out_of_line.ranges.len(), 2);
        assert!(out_of_line.ranges[1].start < bump, "the .cold part lies lower: {out_of_line:#x?}");
        assert_eq!(out_of_line.parameters[0].location, Location::Register(reg(5)));
        let [inlined] = &sites.inlined[..] else { panic!("{sites:#x?}") };
        assert_eq!(inlined.parameters[0].location, Location::Constant(7));
        assert_eq!(inlined.entry_from, EntryFrom::EntryPc);
    }

    #[test]
    fn a_truncated_or_corrupt_debug_file_is_an_error() {
        let path = debian_debug_file();
        let mut data = std::fs::read(&path).unwrap();
        let wanted = [Wanted { function: "_Py_NewReference", parameters: &["op"] }];
        let err = find(&path, &data[..data.len() / 2], &wanted).unwrap_err();
        assert!(matches!(err, InlineError::Parse { .. }), "{err}");
        // Garble the middle of the compressed .debug_info.
        let file = object::File::parse(&*data).unwrap();
        let (offset, size) = file
            .section_by_name(".debug_info")
            .unwrap()
            .compressed_file_range()
            .map(|r| (r.offset, r.compressed_size))
            .unwrap();
        let middle = usize::try_from(offset + size / 2).unwrap();
        data[middle..middle + 4096].fill(0xa5);
        let err = find(&path, &data, &wanted).unwrap_err();
        assert!(matches!(err, InlineError::Section { section: ".debug_info", .. }), "{err}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
}
