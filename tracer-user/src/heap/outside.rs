//! Objects outside pymalloc's pools: those larger than its largest block
//! (512 bytes), which the C library's allocator holds.
//!
//! No table lists them, so they are found by what leads to them:
//! - GC objects from the collector's lists. Each list is circular through
//!   the GC heads, so every run of heads outside the pools is entered from
//!   a pool object or a generation's head: the classification collected
//!   those links ([`Leads::gc_links`]), and each is followed forward while it
//!   stays outside the pools. Links inside the pools are never followed:
//!   those objects were counted from the pools' copies. A neighbour that
//!   does not link back is counted, as the list changed while read.
//! - Objects that tuples, lists and dicts hold directly (large `str`,
//!   `bytes`, `int`, untracked tuples): collected from the pools' tuples,
//!   read from the item arrays of every list and the tables of every
//!   combined dict ([`super::dicts`]), and from those of the objects found
//!   here, a few rounds deep.
//!
//! Each is validated as an object (its type accepted, a live reference
//! count), and counted once, by address, at its size with its pre-header.

use std::collections::HashSet;

use super::{
    HeapError,
    bounds::{Found, Limits},
    classify::{Leads, is_address},
    memory::word,
    tally::{Reason, Tally},
    types::{Context, Shape, TypeTable},
};
use crate::hash::BuildIdentity;
use crate::python::{
    frames::UnicodeOffsets,
    heap::{GC_HEAD, GC_HEAD_SIZE, GC_LINK_FLAGS, LIST_OB_ITEM, OB_SIZE, tpflags},
};

/// Bytes read of an object outside the pools: its GC head and the start
/// of the object, enough for any size formula.
const HEAD_READ: usize = 16 + 64;
/// Item arrays are read this many items at a time.
const ITEMS_PER_RANGE: u64 = 8192;

/// What is still to read: item arrays (address, items) and dict tables
/// (keys object, the dict's type).
#[derive(Debug, Default)]
pub struct Queue {
    pub arrays: Vec<(u64, u64)>,
    pub dicts: Vec<(u64, u32)>,
}

/// Finds, validates and counts the objects outside the pools that `leads`
/// lead to; `heads` are the generation lists' heads.
#[allow(clippy::too_many_arguments, reason = "the census's state, passed apart so that each piece is borrowed once")]
pub fn census(
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    leads: &mut Leads,
    heads: &HashSet<u64, BuildIdentity>,
    limits: Limits,
    unicode: UnicodeOffsets,
    interrupted: &dyn Fn() -> bool,
) -> Result<Found, HeapError> {
    let mut found = Found::default();
    let mut counted: HashSet<u64, BuildIdentity> = HashSet::default();
    let mut queue = Queue { arrays: std::mem::take(&mut leads.lists), dicts: std::mem::take(&mut leads.dicts) };
    let starts: Vec<u64> = leads.gc_links.drain().chain(heads.iter().copied()).collect();
    let mut walk = Walk { heads, seen_heads: HashSet::default(), found: &mut found, counted: &mut counted, limits };
    for start in starts {
        if interrupted() {
            return Err(HeapError::Interrupted);
        }
        walk.run(start, types, cx, tally, &mut queue, unicode)?;
    }
    for _ in 0..limits.rounds {
        if interrupted() {
            return Err(HeapError::Interrupted);
        }
        read_items(&queue.arrays, cx, tally, &mut leads.referenced, &mut found, limits)?;
        let keys = types.layout().dict_keys;
        super::dicts::read(keys, &queue.dicts, cx, tally, &mut leads.referenced, &mut found, limits)?;
        queue.arrays.clear();
        queue.dicts.clear();
        let mut candidates: Vec<u64> = leads.referenced.drain().filter(|a| !counted.contains(a)).collect();
        if candidates.is_empty() {
            break;
        }
        candidates.sort_unstable();
        let room = usize::try_from(limits.referenced.saturating_sub(found.referenced_objects)).unwrap_or(usize::MAX);
        if candidates.len() > room {
            candidates.truncate(room);
            found.referenced_truncated = true;
        }
        referenced(&candidates, types, cx, tally, &mut queue, &mut found, &mut counted, unicode)?;
    }
    // What the last round's objects lead to, unread: counted, not dropped
    // silently.
    found.rounds_left = (queue.arrays.len() + queue.dicts.len()) as u64;
    Ok(found)
}

/// The walk of the GC lists outside the pools.
struct Walk<'a> {
    heads: &'a HashSet<u64, BuildIdentity>,
    seen_heads: HashSet<u64, BuildIdentity>,
    found: &'a mut Found,
    counted: &'a mut HashSet<u64, BuildIdentity>,
    limits: Limits,
}

impl Walk<'_> {
    /// Follows the GC list forward from the head `start` while it stays
    /// outside the pools.
    fn run(
        &mut self,
        start: u64,
        types: &mut TypeTable,
        cx: &mut Context<'_>,
        tally: &mut Tally,
        queue: &mut Queue,
        unicode: UnicodeOffsets,
    ) -> Result<(), HeapError> {
        let mut at = start;
        let mut previous: Option<u64> = None;
        loop {
            if self.heads.contains(&at) {
                if !self.seen_heads.insert(at) {
                    return Ok(());
                }
                let Some(next) = cx.memory.word(at)? else {
                    tally.reject(Reason::GcUnreadable);
                    return Ok(());
                };
                previous = Some(at);
                at = next & !GC_LINK_FLAGS;
                continue;
            }
            let object = at.wrapping_add(GC_HEAD_SIZE);
            if at == 0 {
                tally.reject(Reason::GcLinkNull);
                return Ok(());
            }
            if cx.pools.contains(at) || self.counted.contains(&object) {
                return Ok(());
            }
            if self.found.gc_objects >= self.limits.gc_objects {
                self.found.gc_truncated = true;
                return Ok(());
            }
            let Some(bytes) = cx.memory.read(at, HEAD_READ)? else {
                tally.reject(Reason::GcUnreadable);
                return Ok(());
            };
            let body = &bytes[GC_HEAD..];
            let index = match types.lookup(word(body, 8), cx)? {
                Some(i)
                    if types.info(i).flags & tpflags::HAVE_GC != 0
                        && types.layout().refcount.is_live(word(body, 0))
                        && !is_address(word(body, 0), cx)
                        && types.plausible(i, body, unicode) =>
                {
                    i
                }
                _ => {
                    tally.reject(Reason::NotGcObject);
                    return Ok(());
                }
            };
            if previous.is_some_and(|p| word(&bytes, 8) & !GC_LINK_FLAGS != p) {
                tally.reject(Reason::BrokenLink);
            }
            self.counted.insert(object);
            self.found.gc_objects += 1;
            count(index, object, body, types, cx, tally, queue, unicode);
            previous = Some(at);
            at = word(&bytes, 0) & !GC_LINK_FLAGS;
        }
    }
}

/// Counts the object at `object`, whose first bytes are `body`, and queues
/// the item arrays and dict tables it leads to.
#[allow(clippy::too_many_arguments, reason = "the census's state, passed apart so that each piece is borrowed once")]
fn count(
    index: u32,
    object: u64,
    body: &[u8],
    types: &TypeTable,
    cx: &Context<'_>,
    tally: &mut Tally,
    queue: &mut Queue,
    unicode: UnicodeOffsets,
) {
    let info = types.info(index);
    // The size comes from the target's words: it is bounded by what the
    // object's mapping can hold.
    let mut size = types.object_size(index, body, unicode);
    let room = cx.regions.room(object);
    if size > room {
        tally.reject(Reason::SizeBeyondMapping);
        size = room;
    }
    tally.count_outside(index, info.preheader.saturating_add(size));
    let items = word(body, OB_SIZE);
    match info.shape {
        Shape::Tuple if items > 0 => queue.arrays.push((object.wrapping_add(types.layout().tuple_items), items)),
        Shape::List => {
            let array = word(body, LIST_OB_ITEM);
            let allocated = word(body, LIST_OB_ITEM + 8);
            if items > 0 && array != 0 && items <= allocated {
                queue.arrays.push((array, items));
            } else if items > 0 {
                tally.reject(Reason::ListBadSize);
            }
            if array != 0 && !cx.pools.contains(array) {
                tally.add_buffer_within(index, allocated.saturating_mul(8), cx.regions.room(array));
            }
        }
        Shape::Dict => {
            if let Some(keys) = super::dicts::combined(body) {
                queue.dicts.push((keys, index));
            }
        }
        _ => {}
    }
}

/// Reads the item arrays `arrays` and adds each item outside the pools to
/// `referenced`.
fn read_items(
    arrays: &[(u64, u64)],
    cx: &mut Context<'_>,
    tally: &mut Tally,
    referenced: &mut HashSet<u64, BuildIdentity>,
    found: &mut Found,
    limits: Limits,
) -> Result<(), HeapError> {
    let mut ranges: Vec<(u64, usize)> = Vec::new();
    for &(array, items) in arrays {
        let mut done = 0;
        while done < items {
            if found.items_read >= limits.items {
                found.items_truncated = true;
                break;
            }
            let n = (items - done).min(ITEMS_PER_RANGE).min(limits.items - found.items_read);
            ranges.push((array.wrapping_add(done * 8), usize::try_from(n * 8).unwrap_or(0)));
            found.items_read += n;
            done += n;
        }
    }
    let mut buf = Vec::new();
    let mut ok = Vec::new();
    for batch in ranges.chunks(64) {
        let len: usize = batch.iter().map(|r| r.1).sum();
        buf.resize(len, 0);
        cx.memory.read_ranges(batch, &mut buf, &mut ok)?;
        let mut at = 0;
        let mut last = 0;
        for (i, &(_, len)) in batch.iter().enumerate() {
            if ok[i] {
                for item in buf[at..at + len].chunks_exact(8).map(|w| word(w, 0)) {
                    if item != 0 && item != last && item.is_multiple_of(8) && !cx.pools.contains(item) {
                        referenced.insert(item);
                        last = item;
                    }
                }
            } else {
                tally.reject(Reason::ItemsUnreadable);
            }
            at += len;
        }
    }
    Ok(())
}

/// Reads, validates and counts the objects at `candidates`.
#[allow(clippy::too_many_arguments, reason = "the census's state, passed apart so that each piece is borrowed once")]
fn referenced(
    candidates: &[u64],
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    queue: &mut Queue,
    found: &mut Found,
    counted: &mut HashSet<u64, BuildIdentity>,
    unicode: UnicodeOffsets,
) -> Result<(), HeapError> {
    const READ: usize = HEAD_READ - GC_HEAD;
    let mut ranges = Vec::with_capacity(super::memory::MAX_RANGES);
    let mut buf = vec![0u8; super::memory::MAX_RANGES * READ];
    let mut ok = Vec::new();
    for batch in candidates.chunks(super::memory::MAX_RANGES) {
        ranges.clear();
        for &address in batch {
            if cx.regions.in_heap(address) {
                ranges.push((address, READ));
            } else {
                tally.reject(Reason::Static);
            }
        }
        cx.memory.read_ranges(&ranges, &mut buf, &mut ok)?;
        for (i, &(address, _)) in ranges.iter().enumerate() {
            let body = &buf[i * READ..(i + 1) * READ];
            if !ok[i] {
                tally.reject(Reason::NotAnObject);
                continue;
            }
            let index = match types.lookup(word(body, 8), cx)? {
                Some(index)
                    if types.layout().refcount.is_live(word(body, 0))
                        && !is_address(word(body, 0), cx)
                        && types.plausible(index, body, unicode) =>
                {
                    index
                }
                _ => {
                    tally.reject(Reason::NotAnObject);
                    continue;
                }
            };
            if counted.insert(address) {
                found.referenced_objects += 1;
                count(index, address, body, types, cx, tally, queue, unicode);
            }
        }
    }
    Ok(())
}
