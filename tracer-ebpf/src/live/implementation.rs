//! The allocator implementations of the live step: an implementation's
//! entry pairs it with the API call that called it; its return puts the
//! block in the table.

use tracer_common::{
    live::{API_FRAME_ROOM, FRAME_DEPTH, Frame, Role, UNKNOWN_BLOCK, kind},
    stats::Stat,
};

use super::{FRAMES, add, frames_of, ids, prune, push, put, take};
use super::{native::native_result, predict::unpredict};


/// At the entry of the allocator implementation of slot `slot` (of role
/// `r`, requesting `size` or freeing or moving `old`, at stack pointer
/// `sp`): pairs it with the API call on top of its thread's stack (the
/// outer call), or marks it nested or an orphan; an outer free takes its
/// block out now.
#[inline(always)]
pub fn implementation(tgid: u32, slot: u32, r: Role, size: u64, old: u64, sp: u64) -> Result<(), Stat> {
    let (_, tid) = ids();
    let mut frame = Frame { size, old, sp, slot, kind: kind::ORPHAN, role: r, ..Frame::default() };
    let Some(frames) = frames_of(tid) else { return Err(Stat::LivePendingFull) };
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    prune(frames, sp);
    let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
    // Inside another implementation: an implementation frame below.
    let mut nested = false;
    for f in frames.frames.iter().take(depth) {
        nested |= matches!(f.kind, kind::OUTER | kind::NESTED);
    }
    let api = frames.frames.get(depth.wrapping_sub(1)).copied().unwrap_or_default();
    let mut result = Ok(());
    if nested {
        frame.kind = kind::NESTED;
        frame.domain = api.domain;
    } else if serves(&api, r, old) && api.sp.abs_diff(sp) <= API_FRAME_ROOM {
        frame.kind = kind::OUTER;
        frame.domain = api.domain;
        frame.slot = api.slot;
        frame.stack = api.stack;
        if r == Role::POOL {
            frame.size = api.size;
        }
        // The block it returns replaces the one predicted. A realloc
        // predicted to stay has its new size already, and the block's
        // return counts it again: as one realloc, once.
        if api.kind == kind::API && api.predicted != 0 {
            if api.predicted != api.old {
                unpredict(tgid, &api);
            } else if r == Role::REALLOC {
                add(api.domain, field!(tracked), u64::MAX);
                add(api.domain, field!(freed), u64::MAX);
            }
        }
        // A free whose API call knew its block took it already; a moving
        // realloc's old block is still in.
        if r == Role::FREE && old != 0 && (api.old == 0 || api.kind == kind::MOVED) {
            take(tgid, old, frame.domain);
        }
    } else {
        // Not called for this thread's last API call (or not from its
        // frame): its block has no domain, and is not tracked.
        result = Err(Stat::LiveUnmatched);
    }
    push(frames, frame)?;
    result
}

/// Whether an implementation of role `implementation` (freeing `old`)
/// serves the API call `api` on top of its thread's stack: one of its own
/// role, a malloc for a realloc (pymalloc's realloc of NULL or of a block
/// it moves calls `_PyObject_Malloc`), or a new pool for an allocation;
/// after a moving realloc's malloc, the free of its old block.
#[inline(always)]
fn serves(api: &Frame, implementation: Role, old: u64) -> bool {
    match api.kind {
        kind::API => {
            api.role == implementation
                || (api.role == Role::REALLOC && implementation == Role::MALLOC)
                || (implementation == Role::POOL && matches!(api.role, Role::MALLOC | Role::CALLOC | Role::REALLOC))
        }
        kind::MOVED => implementation == Role::FREE && (api.old == UNKNOWN_BLOCK || api.old == old),
        _ => false,
    }
}

/// An implementation (or a libc call) returns `address`, its entry's
/// stack pointer `sp`: pops its frame (and the API call's under an outer
/// one); an outer allocation puts the block in the live table.
#[inline(always)]
pub fn returned(tgid: u32, address: u64, sp: u64) -> Result<(), Stat> {
    let (_, tid) = ids();
    let frames = FRAMES.get_ptr_mut(&tid).ok_or(Stat::LiveUnmatched)?;
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    // The innermost implementation frame at this stack pointer; any frame
    // above it is a call whose return was lost (an unwind), dropped.
    let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
    let mut found = None;
    for (i, f) in frames.frames.iter().enumerate().take(depth) {
        if f.sp == sp && matches!(f.kind, kind::OUTER | kind::NESTED | kind::ORPHAN | kind::NATIVE | kind::NATIVE_NESTED)
        {
            found = Some((i, *f));
        }
    }
    let (at, frame) = found.ok_or(Stat::LiveUnmatched)?;
    // The API call that called it ends with it (a libc call has none),
    // but for a realloc that allocated a new block: it frees the old one
    // next.
    let native = matches!(frame.kind, kind::NATIVE | kind::NATIVE_NESTED);
    let mut below = false;
    if !native && let Some(api) = frames.frames.get_mut(at.wrapping_sub(1)) {
        // (A realloc of NULL is a malloc, and frees nothing.)
        if api.kind == kind::API
            && api.role == Role::REALLOC
            && api.old != 0
            && frame.kind == kind::OUTER
            && matches!(frame.role, Role::MALLOC | Role::POOL)
            && address != 0
        {
            // Its new block is the one returned, whatever was predicted.
            api.kind = kind::MOVED;
            api.predicted = 0;
        } else {
            below = matches!(api.kind, kind::API | kind::MOVED);
        }
    }
    frames.depth = (at - usize::from(below)) as u64;
    match frame.kind {
        kind::NESTED | kind::NATIVE_NESTED => {
            add(frame.domain, field!(nested), 1);
            return Ok(());
        }
        kind::OUTER | kind::NATIVE => {}
        _ => return Ok(()),
    }
    let (address, frame) = if native { native_result(frame, address)? } else { (address, frame) };
    if frame.role == Role::FREE || address == 0 {
        // A free took its block at its entry; a failed allocation is never
        // live, and a failed realloc keeps the old block.
        return Ok(());
    }
    if frame.old != 0 {
        take(tgid, frame.old, frame.domain);
    }
    put(tgid, address, &frame)
}
