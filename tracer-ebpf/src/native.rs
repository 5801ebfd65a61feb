//! libc's allocator (`--native`): `malloc`, `calloc`, `realloc`, `free`,
//! `posix_memalign`, `aligned_alloc`, `mmap` and `munmap`, each counted
//! as the Python allocators are (calls, bytes, the native size histogram),
//! and with calls one probed libc function makes of another kept apart.
//!
//! glibc's `realloc` relays `realloc(NULL, n)` to `malloc` and
//! `realloc(p, 0)` to `free` by direct calls and jumps to their entries,
//! which the entry probes would count as a second request. userspace finds
//! those call sites in the probed functions' code and attaches
//! `native_nested` there: it records, for the thread, the slot of the
//! function about to be entered, and the next instruction the thread runs
//! is that function's probe, which takes the mark and counts the call
//! under the slot with [`NESTED_SLOT`] set instead. A jump leaves no
//! return address to tell such a call by, which is why the site marks it.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::{map, uprobe},
    maps::HashMap,
    programs::ProbeContext,
};
use tracer_common::{
    counter::{CounterKey, DEFAULT_NESTED_ENTRIES, NESTED_SLOT},
    stats::Stat,
};

use crate::Size;

/// The slot each thread's nested call is about to enter, by thread id.
#[map]
static NESTED: HashMap<u32, u32> = HashMap::with_max_entries(DEFAULT_NESTED_ENTRIES, 0);

/// `malloc(size)`.
#[uprobe]
pub fn native_size_arg0(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::Arg(0))
}

/// `realloc(ptr, size)`, `aligned_alloc(alignment, size)`, `mmap(addr,
/// length, …)`.
#[uprobe]
pub fn native_size_arg1(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::Arg(1))
}

/// `posix_memalign(&ptr, alignment, size)`.
#[uprobe]
pub fn native_size_arg2(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::Arg(2))
}

/// `calloc(nelem, elsize)`.
#[uprobe]
pub fn native_calloc(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::Product(0, 1))
}

/// `free(ptr)`.
#[uprobe]
pub fn native_call(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::None)
}

/// `munmap(addr, length)`: the length is released, not requested; the
/// loader gives its slot no histogram domain.
#[uprobe]
pub fn native_release_arg1(ctx: ProbeContext) -> u32 {
    native(&ctx, Size::Arg(1))
}

/// A nested call site: the cookie is the slot of the function called.
#[uprobe]
pub fn native_nested(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_nested(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_nested(ctx: &ProbeContext) -> Result<(), Stat> {
    crate::check_target()?;
    // SAFETY: the helper only reads the cookie stored in the program's run
    // context; ctx is the context the kernel passed to this program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let slot = u32::try_from(cookie).map_err(|_| Stat::SlotOutOfRange)?;
    NESTED.insert(&thread_id(), &slot, 0).map_err(|_| Stat::NestedFull)
}

/// The calling thread's id (the low half of pid_tgid).
#[inline(always)]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the thread id")]
fn thread_id() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
fn native(ctx: &ProbeContext, size: Size) -> u32 {
    if let Err(stat) = try_native(ctx, size) {
        crate::bump(ctx, stat);
    }
    0
}

#[inline(always)]
fn try_native(ctx: &ProbeContext, size: Size) -> Result<(), Stat> {
    let tgid = crate::check_target()?;
    let bytes = crate::requested(ctx, size)?;
    // SAFETY: as in try_nested.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let slot = u32::try_from(cookie).map_err(|_| Stat::SlotOutOfRange)?;
    let tid = thread_id();
    // SAFETY: a lookup whose value is copied out at once.
    let nested = unsafe { NESTED.get(&tid) }.is_some_and(|&marked| marked == slot);
    if nested {
        // The mark is this call's; a failed removal leaves an entry that
        // the thread's next nested site overwrites.
        let _ = NESTED.remove(&tid);
        if crate::live::on()
            && let Err(stat) = crate::live::native(ctx, tgid, slot, true, 0)
        {
            crate::bump(ctx, stat);
        }
        return crate::count(ctx, CounterKey { tgid, slot: slot | NESTED_SLOT }, bytes);
    }
    crate::count(ctx, CounterKey { tgid, slot }, bytes)?;
    if !matches!(size, Size::None) {
        crate::add_size(slot, bytes);
    }
    let stack = crate::stacks(ctx, tgid, slot, bytes);
    if crate::live::on() {
        crate::live::native(ctx, tgid, slot, false, stack)?;
    }
    Ok(())
}
