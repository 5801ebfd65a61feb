//! One pass over the DIEs of every unit: the subprograms and inlined
//! subroutines that are copies of a wanted function (by name, or through
//! their abstract origin or specification), with their entries, ranges and
//! the wanted parameters' locations.

use std::{collections::HashMap, ops::Range};

use gimli::{AttributeValue, constants as dw};

use super::{
    EntryFrom, Parameter, Site, Wanted,
    location::{Attrs, FrameBase, Location, Reader, attr, frame_base, location},
};

/// Origin and specification chains longer than this are malformed.
const MAX_HOPS: usize = 8;

/// An entry on the walk's stack of open DIEs.
enum Open {
    /// A function with a frame base, for its children's `DW_OP_fbreg`.
    Frame(isize, FrameBase),
    /// Site `.3` of wanted function `.1` (inlined if `.2`), collecting its
    /// parameters.
    Site(isize, usize, bool, usize),
}

/// One pass over every unit's DIEs.
pub(super) struct Walk<'w, 'a> {
    pub(super) dwarf: &'w gimli::Dwarf<Reader<'a>>,
    /// Units by their `.debug_info` offset, ascending.
    pub(super) units: &'w [(u64, gimli::Unit<Reader<'a>>)],
    pub(super) wanted: &'w [Wanted<'w>],
    pub(super) names: HashMap<&'w [u8], usize>,
    /// Which wanted function (if any) an origin or specification DIE, by
    /// `.debug_info` offset, names: many copies share one origin.
    pub(super) origins: HashMap<u64, Option<usize>>,
    /// Per wanted function: name, out-of-line sites, inlined sites.
    pub(super) found: Vec<(String, Vec<Site>, Vec<Site>)>,
}

type WalkError = (u64, gimli::Error);

/// A copy's entry, what gave it, and its ranges.
type Code = (u64, EntryFrom, Vec<Range<u64>>);

/// A DIE's `DW_AT_name` and `DW_AT_linkage_name`.
type Names<'a> = [Option<&'a [u8]>; 2];

impl<'a> Walk<'_, 'a> {
    pub(super) fn unit(&mut self, index: usize) -> Result<(), WalkError> {
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
        let low_pc =
            entry.attr_value(dw::DW_AT_low_pc).map(|v| self.dwarf.attr_address(unit, v)).transpose()?.flatten();
        let ranges = self.ranges_of(unit, entry, low_pc)?;
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

    /// A DIE's code ranges: its `DW_AT_ranges`, else `low_pc` to its
    /// `high_pc` (an address, or a size from `low_pc`). Not gimli's
    /// `die_ranges`, which adds a size to `low_pc` unchecked: a corrupt
    /// size overflowed there (found by fuzzing), and such a range is none.
    fn ranges_of(
        &self,
        unit: &gimli::Unit<Reader<'a>>,
        entry: &gimli::DebuggingInformationEntry<Reader<'a>>,
        low_pc: Option<u64>,
    ) -> gimli::Result<Vec<std::ops::Range<u64>>> {
        let mut ranges = Vec::new();
        let mut keep = |begin: u64, end: u64| {
            if begin < end && !unit.header.is_tombstone_address(begin) {
                ranges.push(begin..end);
            }
        };
        if let Some(list) =
            entry.attr_value(dw::DW_AT_ranges).map(|v| self.dwarf.attr_ranges(unit, v)).transpose()?.flatten()
        {
            let mut list = list;
            while let Some(r) = list.next()? {
                keep(r.begin, r.end);
            }
            return Ok(ranges);
        }
        let high_pc = match entry.attr_value(dw::DW_AT_high_pc) {
            Some(AttributeValue::Udata(size)) => low_pc.and_then(|low| low.checked_add(size)),
            Some(v) => self.dwarf.attr_address(unit, v)?,
            None => None,
        };
        if let (Some(low), Some(high)) = (low_pc, high_pc) {
            keep(low, high);
        }
        Ok(ranges)
    }
}
