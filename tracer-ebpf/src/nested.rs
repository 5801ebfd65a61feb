//! With `--native`, which libc call is nested: glibc's `realloc` relays
//! `realloc(NULL, n)` to `malloc` and `realloc(p, 0)` to `free` by direct
//! calls and jumps to their entries, which the entry probes would count as
//! a second request. userspace finds those call sites in the probed
//! functions' code and attaches `native_nested` there: it marks, for the
//! thread, the slot of the function about to be entered ([`mark`]), and
//! the next instruction the thread runs is that function's probe, which
//! takes the mark ([`take`]) and counts the call apart. A jump leaves no
//! return address to tell such a call by, which is why the site marks it.
//!
//! The same marks tell apart the calls of a free probed at its
//! implementation (`count_claimed`, see `tracer_user::plan::slots`):
//! pyenv's `PyMem_Free` jumps through its function pointer to the
//! `_PyObject_Free` that `PyObject_Free` jumps to, with no call between,
//! and its entry marks the thread before the jump; so does pymalloc's
//! realloc at its direct call that frees a moved block.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::HashMap};
use tracer_common::{counter::DEFAULT_NESTED_ENTRIES, stats::Stat};

/// A thread's mark: the slot its nested call is about to enter, and its
/// stack pointer at the marking site.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Mark {
    slot: u32,
    _pad: u32,
    sp: u64,
}

/// Each thread's mark, by thread id.
#[map]
static NESTED: HashMap<u32, Mark> = HashMap::with_max_entries(DEFAULT_NESTED_ENTRIES, 0);

/// The calling thread's id (the low half of pid_tgid).
#[inline(always)]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the thread id")]
fn thread_id() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

/// Marks the calling thread's next entry of probe slot `slot` nested, from
/// a site whose stack pointer is `sp`.
#[inline(always)]
pub fn mark(slot: u32, sp: u64) -> Result<(), Stat> {
    NESTED.insert(&thread_id(), &Mark { slot, _pad: 0, sp }, 0).map_err(|_| Stat::NestedFull)
}

/// Whether this entry of probe slot `slot` is a nested call, taking its
/// mark.
#[inline(always)]
pub fn take(slot: u32) -> bool {
    take_where(slot, |_| true)
}

/// As [`take`], for a probe whose stack pointer is `sp`: only a mark left
/// by a jump to it (the same stack pointer) or a call of it (8 above) is
/// its call's; any other is stale (a call marked whose callee never came,
/// as where a hook returned early) and is dropped.
#[inline(always)]
pub fn take_at(slot: u32, sp: u64) -> bool {
    take_where(slot, |marked| marked == sp || marked == sp.wrapping_add(8))
}

#[inline(always)]
fn take_where(slot: u32, matches: impl Fn(u64) -> bool) -> bool {
    let tid = thread_id();
    // SAFETY: a lookup whose value is copied out at once.
    let Some(marked) = (unsafe { NESTED.get(&tid) }).copied() else { return false };
    if marked.slot != slot {
        return false;
    }
    // The mark is this call's, or stale: either way it goes; a failed
    // removal leaves an entry that the thread's next mark overwrites.
    let _ = NESTED.remove(&tid);
    matches(marked.sp)
}
