//! The tables of combined dicts: the keys and values they hold that are
//! objects outside the pools (a cache of large strings), and the table's
//! own block where it is outside them (dict tables over 512 bytes).
//!
//! A combined dict (`ma_values` NULL) keeps its keys and values in one
//! `PyDictKeysObject` (`Include/internal/pycore_dict.h`, v3.11 to v3.14):
//! `dk_refcnt` (0), `dk_log2_size` (8), `dk_log2_index_bytes` (9),
//! `dk_kind` (10), `dk_nentries` (24), the indices (32), then the entries,
//! `(hash, key, value)` of 24 bytes for `DICT_KEYS_GENERAL` (0) or `(key,
//! value)` of 16 for `DICT_KEYS_UNICODE` (1); 3.10's is laid out as
//! [`DictKeys::Sized`] says. A split dict's keys are its class's, shared,
//! and its values are elsewhere: not read.

use std::collections::HashSet;

use super::{
    HeapError,
    bounds::{Found, Limits},
    memory::{MAX_RANGES, word},
    tally::{Reason, Tally},
    types::Context,
};
use crate::hash::BuildIdentity;
use crate::python::{MA_KEYS_OFFSET, MA_VALUES_OFFSET, heap::DictKeys};

/// Entries read a call.
const ENTRIES_PER_RANGE: u64 = 4096;

/// The keys object of the dict whose first bytes are `object`, where the
/// dict is combined.
#[must_use]
pub fn combined(object: &[u8]) -> Option<u64> {
    let at = |offset: u64| word(object, usize::try_from(offset).unwrap_or(usize::MAX));
    let keys = at(MA_KEYS_OFFSET);
    (at(MA_VALUES_OFFSET) == 0 && keys != 0 && keys.is_multiple_of(8)).then_some(keys)
}

/// Reads the tables `dicts` ((keys object, the dict's type)), laid out as
/// `layout` says: each one
/// outside the pools that only its dict uses (`dk_refcnt` 1) is added to
/// its type's buffers, and each key and value outside the pools to
/// `referenced`.
pub fn read(
    layout: DictKeys,
    dicts: &[(u64, u32)],
    cx: &mut Context<'_>,
    tally: &mut Tally,
    referenced: &mut HashSet<u64, BuildIdentity>,
    found: &mut Found,
    limits: Limits,
) -> Result<(), HeapError> {
    let header = layout.header();
    let mut buf = vec![0u8; MAX_RANGES * header];
    let mut ok = Vec::new();
    let mut ranges: Vec<(u64, usize)> = Vec::new();
    let mut entries: Vec<(u64, u64, u64, u64)> = Vec::new();
    for batch in dicts.chunks(MAX_RANGES) {
        let wanted: Vec<&(u64, u32)> = batch.iter().filter(|(keys, _)| cx.regions.in_heap(*keys)).collect();
        for _ in wanted.len()..batch.len() {
            tally.reject(Reason::DictNotInHeap);
        }
        let heads: Vec<(u64, usize)> = wanted.iter().map(|(keys, _)| (*keys, header)).collect();
        cx.memory.read_ranges(&heads, &mut buf, &mut ok)?;
        for (i, &&(keys, index)) in wanted.iter().enumerate() {
            if !ok[i] {
                tally.reject(Reason::DictUnreadable);
                continue;
            }
            let Some(table) = layout.parse(&buf[i * header..(i + 1) * header]) else {
                tally.reject(Reason::DictNotATable);
                continue;
            };
            if table.refcnt == 1 && !cx.pools.contains(keys) {
                tally.add_buffer_within(index, table.size, cx.regions.room(keys));
            }
            let mut done = 0;
            while done < table.nentries && found.items_read < limits.items {
                let n = (table.nentries - done).min(ENTRIES_PER_RANGE).min(limits.items - found.items_read);
                let at = keys.wrapping_add(table.entries).wrapping_add(done * table.entry_size);
                ranges.push((at, usize::try_from(n * table.entry_size).unwrap_or(0)));
                entries.push((at, n, table.entry_size, table.key_at));
                found.items_read += n;
                done += n;
            }
            found.items_truncated |= done < table.nentries;
        }
    }
    let mut data = Vec::new();
    for (batch, shapes) in ranges.chunks(64).zip(entries.chunks(64)) {
        data.resize(batch.iter().map(|r| r.1).sum(), 0);
        cx.memory.read_ranges(batch, &mut data, &mut ok)?;
        let mut at = 0;
        for (i, &(_, n, entry_size, key_at)) in shapes.iter().enumerate() {
            let len = batch[i].1;
            if ok[i] {
                let key_at = usize::try_from(key_at).unwrap_or(0);
                for entry in data[at..at + len]
                    .chunks_exact(usize::try_from(entry_size).unwrap_or(16))
                    .take(usize::try_from(n).unwrap_or(usize::MAX))
                {
                    for object in [word(entry, key_at), word(entry, key_at + 8)] {
                        if object != 0 && object.is_multiple_of(8) && !cx.pools.contains(object) {
                            referenced.insert(object);
                        }
                    }
                }
            } else {
                tally.reject(Reason::DictEntriesUnreadable);
            }
            at += len;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(log2_size: u8, log2_index_bytes: u8, kind: u8, nentries: u64) -> Vec<u8> {
        let mut h = vec![0u8; 32];
        h[0] = 1;
        h[8] = log2_size;
        h[9] = log2_index_bytes;
        h[10] = kind;
        h[24..32].copy_from_slice(&nentries.to_le_bytes());
        h
    }

    #[test]
    fn every_table_not_followed_is_counted() {
        use crate::heap::{maps::Regions, memory::Memory, pools::PoolSet};
        const PAGE: usize = 4096;
        // Two pages, the second unmapped again: a table whose header ends
        // the first page has its entries in the second.
        // SAFETY: a fresh private anonymous mapping, unmapped in part and
        // only read through `process_vm_readv` (which checks) and the
        // slice below, within the first page, which stays mapped.
        let first = unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            assert_eq!(libc::munmap(at.cast::<u8>().add(PAGE).cast(), PAGE), 0);
            std::slice::from_raw_parts_mut(at.cast::<u8>(), PAGE)
        };
        let base = first.as_ptr() as u64;
        first[PAGE - 32..].copy_from_slice(&head(3, 3, 1, 2));
        first[..32].copy_from_slice(&head(3, 9, 1, 2));
        // The tracer sees both pages as one anonymous mapping (as a
        // mapping that changed while read).
        let regions = Regions::parse(&format!("{base:x}-{:x} rw-p 00000000 00:00 0\n", base + 2 * PAGE as u64));
        let pools = PoolSet::new(&[], crate::python::heap::Geometry::LARGE);
        let mut memory = Memory::new(std::process::id());
        let mut cx = Context { memory: &mut memory, regions: &regions, pools: &pools };
        let mut tally = Tally::default();
        let mut found = Found::default();
        // A table in the C library's heap, which the regions do not list.
        let elsewhere = head(3, 3, 1, 2);
        let dicts =
            [(base + PAGE as u64 - 32, 0), (base, 0), (base + PAGE as u64 + 64, 0), (elsewhere.as_ptr() as u64, 0)];
        read(DictKeys::Log2, &dicts, &mut cx, &mut tally, &mut HashSet::default(), &mut found, Limits::default())
            .unwrap();
        let n = |r: Reason| tally.rejected[r as usize];
        assert_eq!(n(Reason::DictEntriesUnreadable), 1);
        assert_eq!(n(Reason::DictNotATable), 1);
        assert_eq!(n(Reason::DictUnreadable), 1);
        assert_eq!(n(Reason::DictNotInHeap), 1);
        // SAFETY: the first page, mapped above and no longer borrowed.
        assert_eq!(unsafe { libc::munmap(base as *mut libc::c_void, PAGE) }, 0);
    }

    #[test]
    fn tables_are_shaped_by_their_headers() {
        let parse = |h: &[u8]| DictKeys::Log2.parse(h);
        // 10,000 str keys: 2^14 slots, 2-byte indices (2^15 bytes).
        let t = parse(&head(14, 15, 1, 10_000)).expect("a table");
        assert_eq!(t.entries, 32 + (1 << 15));
        assert_eq!((t.nentries, t.entry_size, t.key_at, t.refcnt), (10_000, 16, 0, 1));
        assert_eq!(t.size, 32 + (1 << 15) + (2 << 14) / 3 * 16);
        // `{1: 1, 2: 2}`: general entries.
        assert_eq!(parse(&head(3, 3, 0, 2)).map(|t| (t.entry_size, t.key_at)), Some((24, 8)));
        assert!(parse(&head(2, 2, 1, 1)).is_none(), "below PyDict_MINSIZE");
        assert!(parse(&head(3, 7, 1, 1)).is_none(), "index bytes for another size");
        assert!(parse(&head(3, 3, 2, 1)).is_none(), "split keys");
        assert!(parse(&head(3, 3, 1, 6)).is_none(), "more entries than usable");
    }

    /// 3.9 and 3.10: `dk_size` slots, 1 to 8 index bytes each by size,
    /// general entries only.
    #[test]
    fn tables_before_3_11_are_shaped_by_dk_size() {
        let head = |size: u64, nentries: u64| {
            let mut h = vec![0u8; 40];
            h[0] = 1;
            h[8..16].copy_from_slice(&size.to_le_bytes());
            h[32..40].copy_from_slice(&nentries.to_le_bytes());
            h
        };
        let parse = |h: &[u8]| DictKeys::Sized.parse(h);
        let t = parse(&head(8, 5)).expect("a table");
        assert_eq!((t.entries, t.nentries, t.entry_size, t.key_at), (40 + 8, 5, 24, 8));
        assert_eq!(t.size, 40 + 8 + 5 * 24);
        // 2^16 slots: 4-byte indices.
        let t = parse(&head(1 << 16, 40_000)).expect("a table");
        assert_eq!(t.entries, 40 + (4 << 16));
        assert_eq!(parse(&head(256, 1)).map(|t| t.entries), Some(40 + 512));
        assert!(parse(&head(4, 1)).is_none(), "below PyDict_MINSIZE");
        assert!(parse(&head(12, 1)).is_none(), "not a power of two");
        assert!(parse(&head(8, 6)).is_none(), "more entries than usable");
        assert!(parse(&head(1 << 41, 1)).is_none(), "too large");
        assert!(parse(&head(8, 1)[..39]).is_none(), "a short header");
    }
}
