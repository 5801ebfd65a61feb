//! Which inlined copies of a function are probed, and where: for each copy
//! the DWARF or the reads of its switch give, its first point that can
//! take a probe, or, when the kernel would single-step that one, the first
//! later point on the straight line after it (see
//! [`line`](crate::discover::line)) that the kernel emulates and where
//! what the probe's program reads is still known; and, for each copy left
//! out, why. A copy that stays single-stepped says why.

use std::collections::HashSet;

use super::{ImageRef, InlineEntry, InlineSite, Inlining, placement};
use crate::discover::{Points, copies, line::LineEnd};

/// What a copy's program reads, which a moved probe must still find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// The size (a program that counts bytes).
    pub size: bool,
    /// The object or block (`--types`, `--live`'s frees and reallocs).
    pub object: bool,
    /// Whether the program must run before the copy's calls return: with
    /// `--live`, the API's probe marks the thread for the implementation's
    /// probe inside the call.
    pub before_calls: bool,
}

/// Why a copy is probed at an instruction the kernel single-steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stay {
    /// `--placement entry`.
    Entry,
    /// No instruction on its straight line is emulated; the line ends as
    /// said.
    NoneEmulated(LineEnd),
    /// The line's emulated instructions come after what the program reads
    /// is overwritten (or moved where tracer does not follow it).
    Lost,
    /// Another copy of the function starts on the line before any
    /// emulated instruction (the two would share a probe).
    OtherCopy,
    /// The line's emulated instructions come only after a call returns,
    /// and the program must run before the callee's probes (`--live`).
    Returned,
}

impl std::fmt::Display for Stay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Entry => write!(f, "--placement entry"),
            Self::NoneEmulated(LineEnd::Branch) => {
                write!(
                    f,
                    "its straight line has no emulated instruction (it ends in a jump, a direct call or a return)"
                )
            }
            Self::NoneEmulated(end) => write!(f, "no emulated instruction before the line ends: {end}"),
            Self::Lost => write!(
                f,
                "what its program reads is overwritten before the first emulated instruction (or kept where tracer does not follow it)"
            ),
            Self::OtherCopy => write!(f, "another copy starts on its line before an emulated instruction"),
            Self::Returned => write!(
                f,
                "its first emulated instruction comes after the allocator it calls has returned, and --live marks the call before it runs"
            ),
        }
    }
}

/// The inlined copies of `symbol` that can be probed, and why each of the
/// others cannot. With `moving` false (`--placement entry`), each at its
/// first probeable point; else moved as the module says, keeping what
/// `reads` says the program reads.
pub(super) fn inline_sites(
    image: ImageRef<'_>,
    symbol: &str,
    kernel: placement::KernelVersion,
    (moving, reads): (bool, Reads),
) -> (Vec<InlineSite>, Vec<String>) {
    let mut sites: Vec<InlineSite> = Vec::new();
    let mut unprobed = Vec::new();
    let mut copies: Vec<Points> = match image.inlining {
        Some(Inlining::Known { entries, .. }) => entries.get(symbol).cloned().unwrap_or_default(),
        Some(Inlining::Guards { scan, .. }) => match scan.functions.get(symbol) {
            Some(Ok(found)) => found.sites.iter().map(copies::guard_points).collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    // Copies found twice at one first point (a DWARF entry outside its
    // copy's ranges that is also a read of the switch in no DWARF copy, as
    // once in forky's 3.14) are one copy: probed once, with what either
    // shows of the size and object there.
    copies.sort_by_key(|p| p.at.first().map(|e| (e.address, e.size.is_none(), e.object.is_none())));
    copies.dedup_by_key(|p| p.at.first().map(|e| e.address));
    // Where each copy starts: another copy's line stops there, so that no
    // two copies share a probe.
    let origins: HashSet<u64> = copies.iter().filter_map(|p| p.at.first()).map(|p| p.address).collect();
    // The copies that no point of their own puts on an emulated
    // instruction, with the sites of the jumps into them, if any.
    let mut stepped: Vec<(InlineSite, Jumps)> = Vec::new();
    for points in copies {
        let code = |entry: &InlineEntry| {
            let offset = image.elf.file_offset(entry.address).ok_or("is in no file-backed segment".to_owned())?;
            let code = image.elf.read_at(offset, 16).map_err(|e| e.to_string())?;
            placement::probeable(&code)?;
            Ok::<_, String>(InlineSite {
                offset,
                size: entry.size,
                object: entry.object,
                emulated: emulated_at(&code, kernel),
                moved: false,
                stay: None,
                gate: None,
                jump: false,
                also: false,
            })
        };
        let mut why = None;
        let mut probeable = points.at.iter().filter_map(|p| {
            code(p)
                .map(|site| (p.address, p.returned, site))
                .map_err(|e| why = why.take().or(Some((p.address, e))))
                .ok()
        });
        let Some((start, returned, mut first)) = probeable.next() else {
            if let Some((address, why)) = why {
                unprobed.push(format!("{address:#x}: {why}"));
            }
            continue;
        };
        if returned {
            // No point before the copy's call could take a probe: one
            // after it would count the call only once the callee returns,
            // and read nothing the copy passed it.
            let at = points.at.first().map_or(start, |p| p.address);
            let why = why.map_or_else(String::new, |(_, why)| format!(" ({why})"));
            unprobed.push(format!("{at:#x}: no point before its call can take a probe{why}"));
            continue;
        }
        if first.emulated {
            sites.push(first);
            continue;
        }
        if !moving {
            sites.push(InlineSite { stay: Some(Stay::Entry), ..first });
            continue;
        }
        let keeps = |p: &InlineSite| {
            (!reads.size || first.size.is_none() || p.size.is_some())
                && (!reads.object || first.object.is_none() || p.object.is_some())
        };
        let mut stay = Stay::NoneEmulated(points.end);
        let mut better = None;
        for (address, returned, p) in probeable {
            if address != start && origins.contains(&address) {
                stay = Stay::OtherCopy;
                break;
            }
            if !p.emulated {
                continue;
            }
            let keeps = keeps(&p);
            if keeps && !(reads.before_calls && returned) {
                better = Some(p);
                break;
            }
            stay = if keeps { Stay::Returned } else { Stay::Lost };
        }
        // An operand the program does not read may be lost where a copy
        // moved: it is `None` then, never a wrong place.
        first.stay = Some(stay);
        if let Some(p) = better {
            sites.push(InlineSite { moved: true, ..p });
        } else {
            let gates: Option<Vec<_>> = points.gate.iter().map(|(at, c)| Some((code(at).ok()?, *c))).collect();
            stepped.push((first, gates.unwrap_or_default()));
        }
    }
    at_jumps(&mut sites, stepped);
    sites.sort_unstable_by_key(|s| s.offset);
    sites.dedup_by_key(|s| s.offset);
    (sites, unprobed)
}

/// The sites of the jumps that lead into a copy, each with the condition
/// under which it does (`None`: always).
type Jumps = Vec<(InlineSite, Option<u8>)>;

/// The copies that no point of their own puts on an emulated instruction
/// (`stepped`), each added to `sites`: at the jumps that alone lead into
/// it, where only jumps do and the kernel emulates each (a jump is
/// emulated where it can be probed at all), unless another copy starts or
/// is probed at one of them (one probe, one copy); else where it is.
fn at_jumps(sites: &mut Vec<InlineSite>, stepped: Vec<(InlineSite, Jumps)>) {
    let mut taken: HashSet<u64> = sites.iter().map(|s| s.offset).chain(stepped.iter().map(|(s, _)| s.offset)).collect();
    for (first, jumps) in stepped {
        let mut offsets: Vec<u64> = jumps.iter().map(|(s, _)| s.offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        let usable = !jumps.is_empty()
            && offsets.len() == jumps.len()
            && jumps.iter().all(|(s, _)| s.emulated && !taken.contains(&s.offset));
        if !usable {
            sites.push(first);
            continue;
        }
        taken.extend(offsets);
        for (i, (site, condition)) in jumps.into_iter().enumerate() {
            sites.push(InlineSite { moved: true, gate: condition, jump: true, also: i > 0, ..site });
        }
    }
}

/// Whether the kernel emulates the instruction that starts `code`.
fn emulated_at(code: &[u8], kernel: placement::KernelVersion) -> bool {
    use iced_x86::{Decoder, DecoderOptions};
    let len = Decoder::new(64, code, DecoderOptions::NONE).decode().len();
    code.get(..len).is_some_and(|insn| placement::emulated(insn, kernel).is_some())
}
