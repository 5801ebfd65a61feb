//! Classifying the allocated blocks of a pool, from a copy of it.
//!
//! An object starts at its block, or after its pre-header: 16 bytes of GC
//! head, and 16 more of managed dict and weak references (3.12+; a managed
//! dict in 3.11). So each block is tried at +0, +16 and +32, in that order,
//! and the first candidate accepted ends the search: its `ob_type` must be
//! a type ([`TypeTable`]), whose pre-header is the candidate's offset, its
//! reference count that of a live object, and its size (with its
//! pre-header) must fit the block. Each candidate refused is counted by the
//! first test it failed; a block that holds no object is counted as such,
//! per size class: list item arrays, dict tables, string buffers, objects
//! on the interpreter's free lists.
//!
//! On the way, the census collects what leads out of the pools: a GC
//! object's links to heads outside them (large GC objects, the generation
//! lists' heads), the items of tuples that are objects outside them
//! (large `str`, `bytes`, `int`...), and the item arrays of lists and the
//! tables of dicts to read, for [`super::outside`].

use std::collections::HashSet;

use super::{
    HeapError,
    memory::word,
    pools::{Header, MAX_BLOCKS},
    tally::{Reason, Tally},
    types::{Context, Shape, TypeTable},
};
use crate::hash::BuildIdentity;
use crate::python::{
    frames::UnicodeOffsets,
    heap::{BYTEARRAY_OB_ALLOC, GC_HEAD, GC_HEAD_SIZE, GC_LINK_FLAGS, LIST_OB_ITEM, OB_SIZE, POOL_OVERHEAD, Refcount},
};

/// What leads out of the pools, collected while they are classified.
#[derive(Debug, Default)]
pub struct Leads {
    /// GC heads outside the pools that a pool's GC object links to.
    pub gc_links: HashSet<u64, BuildIdentity>,
    /// Objects outside the pools that a tuple or list holds.
    pub referenced: HashSet<u64, BuildIdentity>,
    /// Item arrays of lists still to read: (address, items).
    pub lists: Vec<(u64, u64)>,
    /// Tables of combined dicts still to read: (keys object, the dict's
    /// type).
    pub dicts: Vec<(u64, u32)>,
    /// The item added to `referenced` last: tuples hold the same object
    /// (`None`, a shared constant) again and again.
    pub last_referenced: u64,
}

/// Classifies every allocated block of the pool `header`, whose bytes are
/// `pool`, with `free` its free blocks (from [`Header::free_blocks`]).
#[allow(clippy::too_many_arguments, reason = "the census's state, passed apart so that each piece is borrowed once")]
pub fn pool(
    header: &Header,
    pool: &[u8],
    free: &[u64; MAX_BLOCKS.div_ceil(64)],
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    leads: &mut Leads,
    unicode: UnicodeOffsets,
) -> Result<(), HeapError> {
    let size = header.block_size();
    let class = header.size_class as usize;
    let carved = usize::try_from(header.carved()).unwrap_or(0);
    let refcount = types.layout().refcount;
    if header.count == 0 {
        tally.classes[class].empty_pools += 1;
        return Ok(());
    }
    let capacity = (types.layout().geometry.pool - POOL_OVERHEAD) / size;
    tally.classes[class].pools += 1;
    tally.classes[class].free_bytes += capacity.saturating_sub(u64::from(header.count)) * size;
    for block in 0..carved {
        if free[block / 64] & (1 << (block % 64)) != 0 {
            continue;
        }
        let start = usize::try_from(POOL_OVERHEAD + block as u64 * size).unwrap_or(usize::MAX);
        let Some(bytes) = pool.get(start..start.saturating_add(usize::try_from(size).unwrap_or(usize::MAX))) else {
            break;
        };
        let verdict = block_object(bytes, size, types, cx, tally, refcount, unicode)?;
        let counts = &mut tally.classes[class];
        counts.blocks += 1;
        match verdict {
            Block::Object { offset, index } => {
                counts.objects += 1;
                tally.count_in_pool(index, size);
                follow(bytes, offset, index, types, cx, tally, leads);
            }
            Block::FreeListed => counts.free_listed += 1,
            Block::Other => counts.other += 1,
        }
    }
    Ok(())
}

/// What a block holds.
enum Block {
    Object {
        offset: usize,
        index: u32,
    },
    /// An object the interpreter keeps on a free list.
    FreeListed,
    Other,
}

/// The object in the block `bytes`, trying each start.
fn block_object(
    bytes: &[u8],
    size: u64,
    types: &mut TypeTable,
    cx: &mut Context<'_>,
    tally: &mut Tally,
    refcount: Refcount,
    unicode: UnicodeOffsets,
) -> Result<Block, HeapError> {
    for offset in [0usize, 16, 32] {
        if offset as u64 + 16 > size {
            break;
        }
        let object = &bytes[offset..];
        let Some(index) = types.lookup(word(object, 8), cx)? else {
            tally.reject(Reason::NotAType);
            continue;
        };
        if types.info(index).preheader != offset as u64 {
            tally.reject(Reason::PreHeader);
            continue;
        }
        if offset > 0 && !gc_head_plausible(&bytes[offset - GC_HEAD..offset], cx) {
            tally.reject(Reason::GcHead);
            continue;
        }
        let rc = word(object, 0);
        if !refcount.is_live(rc) {
            if rc == 0 {
                tally.reject(Reason::Freed);
                return Ok(Block::FreeListed);
            }
            if refcount == Refcount::Split && cx.pools.contains(rc) {
                tally.reject(Reason::FreeListLink);
                return Ok(Block::FreeListed);
            }
            tally.reject(Reason::Refcount);
            continue;
        }
        if is_address(rc, cx) {
            tally.reject(Reason::Refcount);
            continue;
        }
        if !types.plausible(index, object, unicode) {
            tally.reject(Reason::Contents);
            continue;
        }
        // The size comes from the block's words, and saturates.
        if (offset as u64).saturating_add(types.object_size(index, object, unicode)) > size {
            tally.reject(Reason::TooLarge);
            continue;
        }
        return Ok(Block::Object { offset, index });
    }
    Ok(Block::Other)
}

/// Whether `head` is a GC head: an untracked object's (`_gc_next` NULL,
/// `_gc_prev` no pointer), or a tracked one's, whose `_gc_next` leads to a
/// head, which in a pool is at a 16-byte boundary (its block's, or 16
/// bytes into it). `_gc_prev` is not checked: a collection keeps reference
/// counts there.
fn gc_head_plausible(head: &[u8], cx: &Context<'_>) -> bool {
    let next = word(head, 0) & !GC_LINK_FLAGS;
    if next == 0 {
        return word(head, 8) & !GC_LINK_FLAGS == 0;
    }
    !cx.pools.contains(next) || next.is_multiple_of(16)
}

/// Whether `word`, which passes for a reference count, is rather the
/// address of something: a non-PIE image maps its data and the C library's
/// `brk` heap below 4 GiB, where a pointer is a plausible count, and item
/// arrays hold such pointers next to type pointers (a list of classes).
/// Counts this large, word-aligned and inside a mapping are not.
#[must_use]
pub fn is_address(word: u64, cx: &Context<'_>) -> bool {
    word >= 1 << 16 && word.is_multiple_of(8) && cx.regions.readable(word, 8)
}

/// Collects what the object at `offset` in the block `bytes` leads to
/// outside the pools.
fn follow(
    bytes: &[u8],
    offset: usize,
    index: u32,
    types: &TypeTable,
    cx: &Context<'_>,
    tally: &mut Tally,
    leads: &mut Leads,
) {
    let info = types.info(index);
    let object = &bytes[offset..];
    if info.preheader >= GC_HEAD_SIZE {
        // The GC head is just before the object, whatever else the
        // pre-header holds (`_Py_AS_GC`, Include/internal/pycore_gc.h).
        let head = offset - GC_HEAD;
        for link in [word(bytes, head), word(bytes, head + 8)] {
            let link = link & !GC_LINK_FLAGS;
            if link != 0 && !cx.pools.contains(link) {
                leads.gc_links.insert(link);
            }
        }
    }
    match info.shape {
        Shape::Tuple => {
            let first = usize::try_from(types.layout().tuple_items).unwrap_or(usize::MAX);
            let room = object.len().saturating_sub(first) / 8;
            let items = usize::try_from(word(object, OB_SIZE)).unwrap_or(usize::MAX).min(room);
            for i in 0..items {
                let item = word(object, first + 8 * i);
                if item != 0 && item != leads.last_referenced && item.is_multiple_of(8) && !cx.pools.contains(item) {
                    leads.referenced.insert(item);
                    leads.last_referenced = item;
                }
            }
        }
        Shape::List => {
            let (items, array) = (word(object, OB_SIZE), word(object, LIST_OB_ITEM));
            let allocated = word(object, LIST_OB_ITEM + 8);
            if items > 0 && array != 0 && items <= allocated {
                leads.lists.push((array, items));
            } else if items > 0 {
                tally.reject(Reason::ListBadSize);
            }
            if array != 0 && !cx.pools.contains(array) {
                tally.add_buffer_within(index, allocated.saturating_mul(8), cx.regions.room(array));
            }
        }
        Shape::ByteArray => {
            let alloc = word(object, BYTEARRAY_OB_ALLOC);
            let buffer = word(object, BYTEARRAY_OB_ALLOC + 8);
            if buffer != 0 && !cx.pools.contains(buffer) {
                tally.add_buffer_within(index, alloc, cx.regions.room(buffer));
            }
        }
        Shape::Dict => {
            if let Some(keys) = super::dicts::combined(object) {
                leads.dicts.push((keys, index));
            }
        }
        Shape::Fixed | Shape::Var | Shape::Str | Shape::Long | Shape::Bytes => {}
    }
}
