//! Live memory (`--live`, see [`tracer_common::live`]): the live step.
//! An allocator API call ([`api`]: at an out-of-line API function's entry,
//! or at its inlined copies) leaves its domain on its thread's frame
//! stack; the implementation it calls ([`implementation`], at its entry)
//! takes it, a free's takes its block out of [`LIVE`], and an allocation's
//! return ([`returned`]) puts the block in. With `--native`, libc's calls
//! push their own frames ([`native`]). Every block put in or taken out
//! moves its domain's count and bytes in [`LIVE_COUNTS`]; nothing goes to
//! userspace per event.
//!
//! Here: the maps, and the table's and frame stack's own operations;
//! [`api`] the API calls and their walks, [`predict`] the blocks an
//! inlined pymalloc hands out, [`implementation`] the implementations'
//! entries and returns, [`native`] libc's calls.

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use tracer_common::{
    live::{
        DEFAULT_LIVE_ENTRIES, DOMAIN_SLOTS, FRAME_DEPTH, FRAME_THREADS, Frame, Frames, LiveCounts, LiveEntry, LiveKey,
        Pymalloc, Role,
    },
    sizes::DEFAULT_SLOTS,
    stack::why,
    stats::Stat,
};


/// Whether `--live` is on; 0 makes the return probes' live code dead.
#[unsafe(no_mangle)]
static LIVE_ON: u32 = 0;

/// The outstanding blocks. Preallocated: an insert then takes no
/// allocation in the kernel, and a full table fails the insert, which is
/// counted (`dropped`). The loader sets the size (`--live-max`).
#[map]
static LIVE: HashMap<LiveKey, LiveEntry> = HashMap::with_max_entries(DEFAULT_LIVE_ENTRIES, 0);

/// Each thread's calls in flight.
#[map]
static FRAMES: LruHashMap<u32, Frames> = LruHashMap::with_max_entries(FRAME_THREADS, 0);

/// One empty [`Frames`], never written: the first value of a thread's
/// stack.
#[map]
static EMPTY_FRAMES: Array<Frames> = Array::with_max_entries(1, 0);

/// Per domain, what the table did.
#[map]
static LIVE_COUNTS: PerCpuArray<LiveCounts> = PerCpuArray::with_max_entries(DOMAIN_SLOTS, 0);

/// Where the target's pymalloc state is, for [`predict`]; the loader
/// fills it on builds that inline the allocator API.
#[map]
pub(super) static PYMALLOC: Array<Pymalloc> = Array::with_max_entries(1, 0);

/// Per probe slot, its [`Role`]; the loader fills it.
#[map]
static SLOT_LIVE: Array<Role> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// Whether probe slot `slot` is a realloc's, with `--live`.
#[inline(always)]
pub fn reallocates(slot: u32) -> bool {
    role_of(slot).api() == Role::REALLOC
}

/// Probe slot `slot`'s role ([`Role::NONE`] past the loader's slots).
#[inline(always)]
pub fn role_of(slot: u32) -> Role {
    SLOT_LIVE.get(slot).copied().unwrap_or(Role::NONE)
}

/// This thread's id and its process's.
#[inline(always)]
pub(super) fn ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    #[allow(clippy::cast_possible_truncation, reason = "the halves of pid_tgid")]
    ((id >> 32) as u32, id as u32)
}

/// Whether `--live` is on.
#[inline(always)]
pub fn on() -> bool {
    // SAFETY: a plain global the loader patches before load.
    unsafe { core::ptr::read_volatile(&raw const LIVE_ON) != 0 }
}

/// `field += value` in this CPU's counts of `domain`.
#[inline(always)]
pub(super) fn add(domain: u32, field: usize, value: u64) {
    if field >= FIELDS {
        return;
    }
    if let Some(counts) = LIVE_COUNTS.get_ptr_mut(domain) {
        // SAFETY: a valid pointer to this CPU's value, whose `field`-th
        // u64 (checked above) is in it; the add is atomic, as a preempted
        // program on this CPU may be updating it.
        unsafe { crate::common::atomic_add(counts.cast::<u64>().add(field), value) };
    }
}

/// The number of u64 fields of [`LiveCounts`].
const FIELDS: usize = core::mem::size_of::<LiveCounts>() / 8;

/// The index of a [`LiveCounts`] field, in its declaration order.
macro_rules! field {
    (count) => {
        0
    };
    (bytes) => {
        1
    };
    (tracked) => {
        2
    };
    (freed) => {
        3
    };
    (untracked_frees) => {
        4
    };
    (dropped) => {
        5
    };
    (unseen_allocs) => {
        6
    };
    (unseen_frees) => {
        7
    };
    (nested) => {
        8
    };
}

mod api;
mod implementation;
mod native;
mod predict;

pub use self::{
    api::{api, entry, walked},
    implementation::{implementation, returned},
    native::native,
};

/// This thread's calls in flight, an empty stack on its first call. The
/// empty value comes from a map, as a stack of frames does not fit in a
/// BPF program's stack beside the rest.
#[inline(always)]
pub(super) fn frames_of(tid: u32) -> Option<*mut Frames> {
    if let Some(frames) = FRAMES.get_ptr_mut(&tid) {
        return Some(frames);
    }
    let empty = EMPTY_FRAMES.get(0)?;
    let _ = FRAMES.insert(&tid, empty, u64::from(BPF_ANY));
    FRAMES.get_ptr_mut(&tid)
}

/// Drops the implementation frames on top of `frames` that a call at
/// stack pointer `sp` is not inside: a call's frame is at or above the
/// stack pointer of every call it makes (a tail call's is at it), so one
/// below `sp` returned unseen (it was in flight when its return probe was
/// attached, or left by a longjmp). Each is counted as unmatched; an API
/// frame on top is the caller's to judge.
#[inline(always)]
pub(super) fn prune(frames: &mut Frames, sp: u64) {
    for _ in 0..FRAME_DEPTH {
        let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
        let Some(top) = frames.frames.get(depth.wrapping_sub(1)) else { return };
        let implementation = matches!(
            top.kind,
            tracer_common::live::kind::OUTER
                | tracer_common::live::kind::NESTED
                | tracer_common::live::kind::ORPHAN
                | tracer_common::live::kind::NATIVE
                | tracer_common::live::kind::NATIVE_NESTED
        );
        if !implementation || top.sp >= sp {
            return;
        }
        frames.depth = (depth - 1) as u64;
        crate::common::tally(Stat::LiveUnmatched);
    }
}

/// Pushes `frame`; a full stack loses its outermost call (one whose
/// return was never seen), which is counted.
#[inline(always)]
pub(super) fn push(frames: &mut Frames, frame: Frame) -> Result<(), Stat> {
    frames.pushes = frames.pushes.wrapping_add(1);
    let at = usize::try_from(frames.depth).unwrap_or(FRAME_DEPTH);
    if let Some(slot) = frames.frames.get_mut(at) {
        *slot = frame;
        frames.depth += 1;
        return Ok(());
    }
    frames.frames.copy_within(1.., 0);
    if let Some(last) = frames.frames.last_mut() {
        *last = frame;
    }
    frames.depth = FRAME_DEPTH as u64;
    Err(Stat::LivePendingFull)
}

/// Puts `address`, allocated by `frame`'s call, in the live table.
#[inline(always)]
pub(super) fn put(tgid: u32, address: u64, frame: &Frame) -> Result<(), Stat> {
    let live = LiveKey { tgid, reserved: 0, address };
    // SAFETY: the helper has no arguments.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    let entry = LiveEntry { size: frame.size, time_ns, stack: frame.stack, domain: frame.domain, slot: frame.slot };
    // A walk expected and not come: the block is kept without its site.
    let no_stack = frame.stack == why::NOT_WALKED && crate::stacks::at(frame.slot);
    // A block already in the table was freed by a call the table did not
    // see (an inlined free): its old entry is replaced.
    // SAFETY: a copy is taken at once.
    if let Some(stale) = unsafe { LIVE.get(&live) }.copied() {
        add(stale.domain, field!(count), u64::MAX);
        add(stale.domain, field!(bytes), stale.size.wrapping_neg());
        add(stale.domain, field!(freed), 1);
    }
    if LIVE.insert(&live, &entry, u64::from(BPF_ANY)).is_err() {
        add(frame.domain, field!(dropped), 1);
        return Err(Stat::LiveFull);
    }
    add(frame.domain, field!(count), 1);
    add(frame.domain, field!(bytes), frame.size);
    add(frame.domain, field!(tracked), 1);
    if no_stack {
        return Err(Stat::LiveNoStack);
    }
    Ok(())
}

/// Takes `address` out of the live table, for a free (or a realloc); a
/// block not there is counted as untracked, under `domain`, the freeing
/// family's.
#[inline(always)]
pub(super) fn take(tgid: u32, address: u64, domain: u32) {
    let key = LiveKey { tgid, reserved: 0, address };
    // SAFETY: a copy is taken at once.
    if let Some(entry) = unsafe { LIVE.get(&key) }.copied()
        && LIVE.remove(&key).is_ok()
    {
        add(entry.domain, field!(count), u64::MAX);
        add(entry.domain, field!(bytes), entry.size.wrapping_neg());
        add(entry.domain, field!(freed), 1);
        return;
    }
    add(domain, field!(untracked_frees), 1);
}
