//! With `--live` on a build that inlines pymalloc (LTO): the block an
//! inlined pymalloc hands an API call, read from its state at the call's
//! entry and put in the table at once.

use aya_ebpf::helpers::{bpf_probe_read_user, generated::bpf_ktime_get_ns};
use tracer_common::{
    live::{
        ALIGNMENT_SHIFT, Frame, LiveEntry, LiveKey, POOL_FREEBLOCK, POOL_NEXTPOOL, POOL_SIZE, POOL_SZIDX, Pymalloc,
        Role, SMALL_REQUEST, UNKNOWN_BLOCK,
    },
    stats::Stat,
};

use super::{LIVE, PYMALLOC, add, put};


/// With `--live` on a build that inlines pymalloc: what pymalloc's
/// inline `pymalloc_realloc` (Objects/obmalloc.c, v3.11.0 to v3.14.0)
/// does with `frame`'s tracked block of its own and new size. A block
/// whose size class still fits the size, shrinking by no more than a
/// quarter, stays: the table gets its new size now, and it is the
/// prediction. Else the block moves to the one a malloc of the new size
/// gets ([`predict`]), put in the table now; the old one goes when the
/// frame is found stale, or with the free implementation it calls. A
/// realloc of NULL is a malloc. 0: nothing predicted (an untracked block,
/// one pymalloc does not own, a move to a block over 512 bytes or to a
/// new pool, where the implementations it calls give the block).
#[inline(always)]
pub(super) fn predict_realloc(tgid: u32, frame: &Frame) -> u64 {
    let Some(p) = PYMALLOC.get(0) else { return 0 };
    let old = frame.old;
    // The table is set whole (`PyMem_SetAllocator`): holding pymalloc's
    // realloc, it holds its malloc too, which a move or a realloc of NULL
    // runs.
    if p.usedpools == 0
        || p.realloc == 0
        || old == UNKNOWN_BLOCK
        || frame.size == 0
        || frame.domain > 1
        || !holds(p, frame.domain, 24, p.realloc)
    {
        return 0;
    }
    // A realloc of NULL is a malloc (`_PyObject_Realloc`).
    let malloc = Frame { role: Role::MALLOC, ..*frame };
    if old == 0 {
        return predict_pool(tgid, p, &malloc);
    }
    let key = LiveKey { tgid, reserved: 0, address: old };
    let Some(entry) = LIVE.get_ptr_mut(&key) else { return 0 };
    // SAFETY: a valid pointer to the entry, which only this thread's calls
    // write (the GIL serialises the allocator).
    let was = unsafe { *entry };
    // Only pymalloc serves a request of 1 to 512 bytes in these domains.
    if was.size == 0 || was.size > SMALL_REQUEST || was.domain != frame.domain {
        return 0;
    }
    // SAFETY: the helper reads the probed thread's memory and fails rather
    // than fault: the block's pool header, which pymalloc reads.
    let Ok(szidx) = (unsafe { bpf_probe_read_user(((old & !(POOL_SIZE - 1)) + POOL_SZIDX) as *const u32) }) else {
        return 0;
    };
    let class = (u64::from(szidx) + 1) << ALIGNMENT_SHIFT;
    if frame.size <= class && 4 * frame.size > 3 * class {
        // SAFETY: as above.
        let time_ns = unsafe { bpf_ktime_get_ns() };
        // SAFETY: as above.
        unsafe {
            *entry = LiveEntry { size: frame.size, time_ns, stack: frame.stack, domain: frame.domain, slot: frame.slot };
        }
        // As a realloc implementation's return counts it: the old block
        // freed, the new one tracked.
        add(frame.domain, field!(bytes), frame.size.wrapping_sub(was.size));
        add(frame.domain, field!(tracked), 1);
        add(frame.domain, field!(freed), 1);
        return old;
    }
    predict_pool(tgid, p, &malloc)
}

/// With `--live` on a build that inlines pymalloc: the block pymalloc's
/// inline fast path hands an allocation of `frame`'s size and domain,
/// put in the table now (0: none predicted; the implementation it calls
/// then gives it, or it is unseen). An allocation's code reads the same
/// words in the same order right after this entry, and nothing else runs
/// pymalloc in between: the GIL is held, and the thread is stopped here.
#[inline(always)]
pub(super) fn predict(tgid: u32, frame: &Frame) -> u64 {
    let Some(p) = PYMALLOC.get(0) else { return 0 };
    let (field, function) = if frame.role == Role::CALLOC { (16, p.calloc) } else { (8, p.malloc) };
    if p.usedpools == 0 || frame.domain > 1 || !holds(p, frame.domain, field, function) {
        return 0;
    }
    predict_pool(tgid, p, frame)
}

/// Whether domain `domain`'s allocator table holds pymalloc's `function`
/// at byte `field`, as the inlined code checks before it runs pymalloc
/// (`PYTHONMALLOC=debug` puts the debug hooks there, which are probed as
/// implementations). A table whose address is not known is taken to.
#[inline(always)]
fn holds(p: &Pymalloc, domain: u32, field: u64, function: u64) -> bool {
    let table = p.tables.get(domain as usize).copied().unwrap_or(0);
    // SAFETY: the helper reads the probed thread's memory and fails
    // rather than fault.
    table == 0 || unsafe { bpf_probe_read_user((table + field) as *const u64) } == Ok(function)
}

/// [`predict`] once the domain's table is known to hold pymalloc.
#[inline(always)]
fn predict_pool(tgid: u32, p: &Pymalloc, frame: &Frame) -> u64 {
    if frame.size == 0 || frame.size > SMALL_REQUEST {
        return 0;
    }
    let class = (frame.size - 1) >> ALIGNMENT_SHIFT;
    // SAFETY: the helper reads the probed thread's memory and fails rather
    // than fault.
    let Ok(pool) = (unsafe { bpf_probe_read_user((p.usedpools + 16 * class) as *const u64) }) else { return 0 };
    // SAFETY: as above: the pool header's first three words.
    let Ok(head) = (unsafe { bpf_probe_read_user(pool as *const [u64; 3]) }) else { return 0 };
    let (freeblock, nextpool) =
        (head[(POOL_FREEBLOCK / 8) as usize], head[(POOL_NEXTPOOL / 8) as usize]);
    if nextpool == pool || freeblock == 0 {
        // No used pool of its class: `allocate_from_new_pool` gives it.
        return 0;
    }
    // Its walk comes after this entry, in the same program or at the
    // counting probe's, and gives the block its site (`give_walk`): only
    // a block the table had no room for is no prediction, and its miss is
    // counted here, since the call goes on (`LiveNoStack` is no miss yet:
    // the walk is still to come).
    if matches!(put(tgid, freeblock, frame), Err(Stat::LiveFull)) {
        crate::common::tally(Stat::LiveFull);
        return 0;
    }
    freeblock
}

/// Takes a predicted block back out of the table: the call went to an
/// implementation, whose return gives its block.
#[inline(always)]
pub(super) fn unpredict(tgid: u32, frame: &Frame) {
    let key = LiveKey { tgid, reserved: 0, address: frame.predicted };
    if LIVE.remove(&key).is_ok() {
        add(frame.domain, field!(count), u64::MAX);
        add(frame.domain, field!(bytes), frame.size.wrapping_neg());
        add(frame.domain, field!(tracked), u64::MAX);
    }
}
