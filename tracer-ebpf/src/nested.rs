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

/// The slot each thread's nested call is about to enter, by thread id.
#[map]
static NESTED: HashMap<u32, u32> = HashMap::with_max_entries(DEFAULT_NESTED_ENTRIES, 0);

/// The calling thread's id (the low half of pid_tgid).
#[inline(always)]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the thread id")]
fn thread_id() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

/// Marks the calling thread's next entry of probe slot `slot` nested.
#[inline(always)]
pub fn mark(slot: u32) -> Result<(), Stat> {
    NESTED.insert(&thread_id(), &slot, 0).map_err(|_| Stat::NestedFull)
}

/// Whether this entry of probe slot `slot` is a nested call, taking its
/// mark.
#[inline(always)]
pub fn take(slot: u32) -> bool {
    let tid = thread_id();
    // SAFETY: a lookup whose value is copied out at once.
    let nested = unsafe { NESTED.get(&tid) }.is_some_and(|&marked| marked == slot);
    if nested {
        // The mark is this call's; a failed removal leaves an entry that
        // the thread's next nested site overwrites.
        let _ = NESTED.remove(&tid);
    }
    nested
}
