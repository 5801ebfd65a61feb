//! The places in an image's code that control may reach by an indirect
//! branch, for [`line::Landings`](super::line::Landings): code addresses
//! stored in its data (the absolute jump tables and computed-goto tables of
//! a non-PIE executable, function pointers), the same given by relative
//! relocations (a shared library's or a PIE's), and the entries of the
//! tables of 32-bit offsets a position-independent `switch` uses, each
//! found from the `lea` of its start.

use object::{Object as _, ObjectSection as _, SectionKind};

/// Most entries read from one table of offsets.
const MAX_TABLE: usize = 4096;

/// The code addresses named in `file`'s data, where `code` holds the
/// (start, end) of each executable section and `leas` the rip-relative
/// `lea` targets of its code.
#[must_use]
pub fn in_data(file: &object::File<'_>, code: &[(u64, u64)], leas: &[u64]) -> Vec<u64> {
    let is_code = |a: u64| code.iter().any(|&(start, end)| (start..end).contains(&a));
    let mut out = Vec::new();
    let data: Vec<(u64, &[u8])> = file
        .sections()
        .filter(|s| {
            matches!(
                s.kind(),
                SectionKind::Data | SectionKind::ReadOnlyData | SectionKind::ReadOnlyDataWithRel | SectionKind::Tls
            )
        })
        .filter_map(|s| Some((s.address(), s.data().ok()?)))
        .filter(|(_, bytes)| !bytes.is_empty())
        .collect();
    // Absolute addresses, 8-byte aligned as GCC lays out pointer tables.
    for &(address, bytes) in &data {
        let skip = usize::try_from(address.next_multiple_of(8) - address).unwrap_or(0);
        for word in bytes.get(skip..).unwrap_or_default().chunks_exact(8) {
            let value = u64::from_le_bytes(word.try_into().unwrap_or_default());
            if is_code(value) {
                out.push(value);
            }
        }
    }
    // A position-independent image's pointers are in its relocations.
    if let Some(relocations) = file.dynamic_relocations() {
        for (_, relocation) in relocations {
            let object::RelocationFlags::Elf { r_type } = relocation.flags() else { continue };
            if r_type == object::elf::R_X86_64_RELATIVE
                && let Ok(value) = u64::try_from(relocation.addend())
                && is_code(value)
            {
                out.push(value);
            }
        }
    }
    // A `switch`'s table of offsets from its own start.
    for &base in leas {
        let Some(&(start, bytes)) = data.iter().find(|(a, b)| (*a..a.saturating_add(b.len() as u64)).contains(&base))
        else {
            continue;
        };
        let from = usize::try_from(base - start).unwrap_or(usize::MAX);
        for entry in bytes.get(from..).unwrap_or_default().chunks_exact(4).take(MAX_TABLE) {
            let offset = i64::from(i32::from_le_bytes(entry.try_into().unwrap_or_default()));
            match base.checked_add_signed(offset) {
                Some(target) if is_code(target) => out.push(target),
                _ => break,
            }
        }
    }
    out
}
