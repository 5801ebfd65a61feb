//! The API calls of the live step: each pushes its frame for the
//! implementation it calls (or predicts its block, where pymalloc is
//! inlined), and takes its walk ([`walked`], [`adopt`]).

use aya_ebpf::{bindings::BPF_ANY, macros::map, maps::LruHashMap};
use tracer_common::{
    live::{API_FRAME_ROOM, FRAME_DEPTH, FRAME_THREADS, Frame, LiveKey, Role, Stale, UNKNOWN_BLOCK, kind},
    stack::why,
    stats::Stat,
};

use super::{FRAMES, LIVE, add, frames_of, ids, prune, push, role_of, take};
use super::predict::{predict, predict_realloc};


/// An API call of slot `slot` (at its entry or at an inlined copy) by
/// process `tgid`, with its requested `size` (an allocation's; 0: unknown)
/// or the `block` it frees or reallocates (a free's or a realloc's;
/// [`UNKNOWN_BLOCK`]: unknown, and a free's 0 is nothing to take; a plain
/// value, not an `Option`, whose undefined payload the verifier refuses
/// once spilled) and the stack pointer `sp` at the call: pushes its frame,
/// for the implementation it calls, which takes the call's walk after it
/// ([`walked`]). A free takes its block out of
/// the table at once. An allocation that pymalloc serves inline puts the
/// block it will get in the table at once ([`predict`]). An API frame
/// already on top is stale: its call ran an inlined allocator and called
/// none (LTO's devirtualised pymalloc); its block is unseen, which is
/// counted, unless it was taken or predicted. A moving realloc's frame on
/// top freed its old block inline, which is taken out now where it is
/// known.
#[inline(always)]
pub fn api(tgid: u32, slot: u32, size: u64, block: u64, sp: u64) -> Result<(), Stat> {
    let role = role_of(slot);
    let r = role.api();
    let domain = match r {
        Role::MALLOC | Role::CALLOC | Role::REALLOC => crate::sizes::domain(slot).unwrap_or(0),
        Role::FREE => role.domain(),
        _ => return Ok(()),
    };
    let (_, tid) = ids();
    let mut frame = Frame { size, sp, domain, slot, kind: kind::API, role: r, ..Frame::default() };
    if r == Role::REALLOC {
        frame.old = block;
    }
    let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
    // SAFETY: a valid pointer to the value, which only this thread (so
    // only this program run) uses.
    let frames = unsafe { &mut *frames };
    prune(frames, sp);
    let top = usize::try_from(frames.depth).unwrap_or(0).wrapping_sub(1);
    let mut continued = false;
    if let Some(last) = frames.frames.get_mut(top)
        && matches!(last.kind, kind::API | kind::MOVED)
    {
        if continues(last, &frame, block) {
            // The outer call's allocator, inlined, passes it on to this
            // domain's (pymalloc's requests over 512 bytes, a block it
            // does not own): the same call, in the outer one's domain.
            continued = true;
            frame.domain = last.domain;
            frame.slot = last.slot;
            frame.stack = last.stack;
            frame.old = if r == Role::FREE { last.old } else { frame.old };
        } else {
            unseen(tgid, *last);
        }
        frames.depth -= 1;
    }
    // Inside an implementation's call (pymalloc handing a block it does
    // not own to the raw domain's PyMem_RawFree): the outer free took the
    // block at its own entry, and its implementation's frame counts this
    // call as nested.
    let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
    let mut nested = false;
    for f in frames.frames.iter().take(depth) {
        nested |= matches!(f.kind, kind::OUTER | kind::NESTED);
    }
    if r == Role::FREE && !nested && frame.old == 0 && block != 0 && block != UNKNOWN_BLOCK {
        take(tgid, block, frame.domain);
        frame.old = block;
    }
    if !continued {
        frame.predicted = match r {
            Role::MALLOC | Role::CALLOC => predict(tgid, &frame),
            Role::REALLOC => predict_realloc(tgid, &frame),
            _ => 0,
        };
    }
    push(frames, frame)
}

/// Whether the raw-domain API call `call` (freeing or reallocating
/// `block`, where known) is the one `last`, an unserved object- or
/// mem-domain API call on top of its thread's stack, passes on: pymalloc,
/// inlined into its caller (LTO), passes a request over 512 bytes or of 0
/// (which it never serves), and a free or realloc of a block it does not
/// own, to the raw domain's API, also inlined, with the same role, size
/// (or block) and stack frame. A size or block either probe does not know
/// is no match (a stale call of unknown size is not taken for the one
/// that goes on), but for a free whose outer copy does not show its
/// block where the raw one does.
#[inline(always)]
fn continues(last: &Frame, call: &Frame, block: u64) -> bool {
    let raw = tracer_common::sizes::Domain::Raw as u32;
    if last.kind != kind::API
        || call.domain != raw
        || last.domain >= raw
        || last.role != call.role
        || last.predicted != 0
        || last.sp.abs_diff(call.sp) > API_FRAME_ROOM
    {
        return false;
    }
    match call.role {
        Role::MALLOC | Role::CALLOC => last.size == call.size,
        Role::REALLOC => last.size == call.size && block != UNKNOWN_BLOCK && block == last.old,
        // The outer copy may not show its block where the raw one does:
        // the same free (the raw call takes it, in the outer's domain).
        // Not the other way: an outer free whose block is known and stale
        // would take over a raw free of its own whose block is not.
        Role::FREE => block != 0 && block != UNKNOWN_BLOCK && (block == last.old || last.old == 0),
        _ => false,
    }
}

/// A stale API call: its block is not in the table. A moving realloc
/// freed its old block inline: out it goes, where it is known.
#[inline(always)]
fn unseen(tgid: u32, frame: Frame) {
    match frame.stale() {
        Stale::Allocation => add(frame.domain, field!(unseen_allocs), 1),
        Stale::Free => add(frame.domain, field!(unseen_frees), 1),
        Stale::Take(old) => take(tgid, old, frame.domain),
        Stale::Seen => {}
    }
}

/// A walk that came before its API call's frame (an entry probe placed at
/// the call sites, or run before `live_alloc` at the same address), left
/// for that frame.
#[derive(Clone, Copy)]
#[repr(C)]
struct Walked {
    stack: u64,
    slot: u32,
    reserved: u32,
}

/// Per thread, the walk of its last API call not yet on a frame.
#[map]
static WALKED: LruHashMap<u32, Walked> = LruHashMap::with_max_entries(FRAME_THREADS, 0);

/// At an out-of-line API function's entry (`live_alloc`, `live_free`): its
/// call ([`api`]), which takes the walk its counting probe at the same
/// place left before it, where that one ran first ([`adopt`]).
#[inline(always)]
pub fn entry(tgid: u32, slot: u32, size: u64, block: u64, sp: u64) -> Result<(), Stat> {
    api(tgid, slot, size, block, sp)?;
    adopt(slot);
    Ok(())
}

/// With `--stacks`, the walk of an event of slot `slot` (its stack's hash,
/// or a [`why`] value): the API call's frame on top of the thread's stack
/// takes it, or, where the walk comes first (an out-of-line entry's, whose
/// `live_alloc` runs after its counting probe), [`adopt`] does.
#[inline(always)]
pub fn walked(slot: u32, stack: u64) {
    // Only an API call's frame takes it (a libc call's entry takes its
    // own walk).
    let r = role_of(slot);
    if r.is_none() || r.is_native() || r.is_implementation() {
        return;
    }
    let (_, tid) = ids();
    if give_walk(tid, slot, stack, true) {
        return;
    }
    // A thread pushed out of the LRU map loses only a site, which
    // `live_no_stack` counts where its block is put in the table.
    let _ = WALKED.insert(&tid, &Walked { stack, slot, reserved: 0 }, u64::from(BPF_ANY));
}

/// Gives the block at `address` in the table its call's walk.
#[inline(always)]
fn set_stack(address: u64, stack: u64) {
    let (tgid, _) = ids();
    let key = LiveKey { tgid, reserved: 0, address };
    if let Some(entry) = LIVE.get_ptr_mut(&key) {
        // SAFETY: a valid pointer to the entry, which only this thread's
        // calls write (the GIL serialises the allocator).
        unsafe { (*entry).stack = stack };
    }
}

/// At an out-of-line API call's entry, after its frame is pushed: takes
/// the walk its event left before it.
#[inline(always)]
fn adopt(slot: u32) {
    if !crate::stacks::at(slot) {
        return;
    }
    let (_, tid) = ids();
    // SAFETY: a copy is taken at once.
    let Some(w) = (unsafe { WALKED.get(&tid) }).copied() else { return };
    if w.slot != slot {
        return;
    }
    let _ = WALKED.remove(&tid);
    give_walk(tid, slot, w.stack, false);
}

/// Gives the walk `stack` to thread `tid`'s API call of slot `slot` on top
/// of its stack (`unwalked`: only if it has none yet), and to the block
/// predicted at its entry, which is in the table already; whether there
/// was such a call.
#[inline(always)]
fn give_walk(tid: u32, slot: u32, stack: u64, unwalked: bool) -> bool {
    let Some(frames) = FRAMES.get_ptr_mut(&tid) else { return false };
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    let top = usize::try_from(frames.depth).unwrap_or(0).wrapping_sub(1);
    let Some(last) = frames.frames.get_mut(top) else { return false };
    if last.kind != kind::API || last.slot != slot || (unwalked && last.stack != why::NOT_WALKED) {
        return false;
    }
    last.stack = stack;
    if last.predicted != 0 {
        set_stack(last.predicted, stack);
    }
    true
}
