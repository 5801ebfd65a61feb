//! Which inlined copies of a function are probed: for each copy the
//! DWARF or the reads of its switch give, the first point that can take a
//! probe, or a later one the kernel emulates where the size and object are
//! still known there; and, for each copy left out, why.

use super::{ImageRef, InlineEntry, InlineSite, Inlining, placement};
use crate::discover::copies;

/// The inlined copies of `symbol` that can be probed, and why each of the
/// others cannot.
pub(super) fn inline_sites(
    image: ImageRef<'_>,
    symbol: &str,
    kernel: placement::KernelVersion,
) -> (Vec<InlineSite>, Vec<String>) {
    let mut sites: Vec<InlineSite> = Vec::new();
    let mut unprobed = Vec::new();
    // Each copy with the points it may be probed at, the first preferred
    // unless a later one is emulated.
    let copies: Vec<Vec<InlineEntry>> = match image.inlining {
        Some(Inlining::Known { entries, .. }) => entries.get(symbol).cloned().unwrap_or_default(),
        Some(Inlining::Guards { scan, .. }) => match scan.functions.get(symbol) {
            Some(Ok(found)) => found.sites.iter().map(copies::guard_points).collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
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
            })
        };
        // The first point that can be probed, or a later one the kernel
        // emulates where the size (if the first has one) is still known.
        let mut why = None;
        let mut probeable =
            points.iter().filter_map(|p| code(p).map_err(|e| why = why.take().or(Some((p.address, e)))).ok());
        let Some(first) = probeable.next() else {
            if let Some((address, why)) = why {
                unprobed.push(format!("{address:#x}: {why}"));
            }
            continue;
        };
        let better = if first.emulated {
            None
        } else {
            probeable.find(|p| {
                p.emulated
                    && (first.size.is_none() || p.size.is_some())
                    && (first.object.is_none() || p.object.is_some())
            })
        };
        sites.push(better.unwrap_or(first));
    }
    sites.sort_unstable_by_key(|s| s.offset);
    sites.dedup_by_key(|s| s.offset);
    (sites, unprobed)
}

/// Whether the kernel emulates the instruction that starts `code`.
fn emulated_at(code: &[u8], kernel: placement::KernelVersion) -> bool {
    use iced_x86::{Decoder, DecoderOptions};
    let len = Decoder::new(64, code, DecoderOptions::NONE).decode().len();
    code.get(..len).is_some_and(|insn| placement::emulated(insn, kernel).is_some())
}
