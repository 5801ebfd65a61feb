//! The C library's heap growth by Python stack (with growth; see
//! [`tracer_common::growth::MappedKey`]): programs on the mapping
//! syscalls' tracepoints. malloc's main arena grows by these (large
//! chunks are mappings of their own; the rest is the break; its other
//! arenas grow inside a reservation by `mprotect`, not seen), so a growth
//! is seen whichever allocator path took it, without a trap: a syscall
//! tracepoint runs its program for that syscall only (though while one is
//! enabled, the kernel takes every task's syscalls through its slower
//! tracing path).
//!
//! A program runs for every process's call: it returns at once unless the
//! caller is the target (a loader-set tgid, never 0 here). An entry keeps
//! the arguments its exit needs for the thread; the exit reads the
//! outcome.

use aya_ebpf::{
    helpers::generated::bpf_get_prandom_u32,
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap},
    programs::TracePointContext,
};
use tracer_common::growth::{
    ARENA_SIZE, DEFAULT_MAPPED_ENTRIES, GrowthCounts, MAP_ANONYMOUS, MAP_STACK, MAPPED_BRK, MAPPED_LOW, MAPPED_MMAP,
    MAPPED_SAMPLE_BYTES, MAPPING_THREADS, MappedKey, MappedSample, PROT_NONE,
};

use crate::sampled::{GROWTH_COUNTS, count, now_ns, walk};

/// Each sampled growth, by where it begins, until unmapped or replaced.
#[map]
static GROWTH_MAPPED: HashMap<MappedKey, MappedSample> =
    HashMap::with_max_entries(DEFAULT_MAPPED_ENTRIES, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Each target's break as its last `brk` left it (seeded by the loader).
#[map]
static GROWTH_BRK: HashMap<u32, u64> = HashMap::with_max_entries(64, 0);

/// Whether `growth_arena` ends the sample of each new arena's mapping
/// (set by the loader where it is attached): else the programs leave
/// mappings of pymalloc's arena size alone.
#[map]
pub static GROWTH_ARENAS_SEEN: aya_ebpf::maps::Array<u32> = aya_ebpf::maps::Array::with_max_entries(1, 0);

/// Each thread's call in flight: the arguments its exit needs.
#[map]
static GROWTH_CALLS: LruHashMap<u32, [u64; 3]> = LruHashMap::with_max_entries(MAPPING_THREADS, 0);

/// Where a `sys_enter_*` record holds argument `n`, and a `sys_exit_*`
/// record its return value (after the common fields and the syscall
/// number: `/sys/kernel/tracing/events/syscalls/*/format`).
const fn arg_at(n: usize) -> usize {
    16 + 8 * n
}
const RET_AT: usize = 16;

/// `mmap(addr, len, prot, flags, fd, off)` called: its length, protection
/// and flags kept.
#[tracepoint]
pub fn growth_mmap_enter(ctx: TracePointContext) -> u32 {
    run(&ctx, false, |ctx, _, _| keep([arg(ctx, 1)?, arg(ctx, 2)?, arg(ctx, 3)?]))
}

/// `mmap` returned.
#[tracepoint]
pub fn growth_mmap_exit(ctx: TracePointContext) -> u32 {
    run(&ctx, true, try_mmap)
}

/// `munmap(addr, len)` called: the sample at its address ends.
#[tracepoint]
pub fn growth_munmap_enter(ctx: TracePointContext) -> u32 {
    run(&ctx, true, |ctx, tgid, counts| {
        if end(&MappedKey { tgid, kind: MAPPED_MMAP, address: arg(ctx, 0)? }) {
            count!(counts, unmapped);
        }
        Ok(())
    })
}

/// `mremap(old, old_len, new_len, flags, new)` called: the three kept.
#[tracepoint]
pub fn growth_mremap_enter(ctx: TracePointContext) -> u32 {
    run(&ctx, false, |ctx, _, _| keep([arg(ctx, 0)?, arg(ctx, 1)?, arg(ctx, 2)?]))
}

/// `mremap` returned.
#[tracepoint]
pub fn growth_mremap_exit(ctx: TracePointContext) -> u32 {
    run(&ctx, true, try_mremap)
}

/// `brk(addr)` returned: the break now (the old one where it failed).
#[tracepoint]
pub fn growth_brk_exit(ctx: TracePointContext) -> u32 {
    run(&ctx, true, try_brk)
}

/// Runs `f` for the target's calls only, timed; with `exit`, one of its
/// syscalls counted. An `Err` of `f` is a miss: counted.
#[inline(always)]
fn run(
    ctx: &TracePointContext,
    exit: bool,
    f: impl Fn(&TracePointContext, u32, *mut GrowthCounts) -> Result<(), ()>,
) -> u32 {
    let Ok(tgid) = crate::common::only_target() else { return 0 };
    let start = now_ns();
    let Some(counts) = GROWTH_COUNTS.get_ptr_mut(0) else { return 0 };
    if exit {
        count!(counts, syscalls);
    }
    if f(ctx, tgid, counts).is_err() {
        count!(counts, mapped_missed);
    }
    crate::sampled::ran_mapped(counts, start);
    0
}

/// Argument `n` of a `sys_enter_*` record.
#[inline(always)]
fn arg(ctx: &TracePointContext, n: usize) -> Result<u64, ()> {
    // SAFETY: a read of the record through the helper, which fails rather
    // than read past it.
    unsafe { ctx.read_at::<u64>(arg_at(n)) }.map_err(|_| ())
}

/// A `sys_exit_*` record's return value, `None` where the call failed.
#[inline(always)]
fn returned(ctx: &TracePointContext) -> Result<Option<u64>, ()> {
    // SAFETY: as in `arg`.
    let ret = unsafe { ctx.read_at::<u64>(RET_AT) }.map_err(|_| ())?;
    // -4095..-1 are errors, as the C library tells them.
    Ok((ret <= u64::MAX - 4095).then_some(ret))
}

/// The current thread's id.
#[inline(always)]
fn thread() -> u32 {
    #[allow(clippy::cast_possible_truncation, reason = "the lower half of pid_tgid")]
    let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
    tid
}

/// Keeps `args` for the thread's exit from the call.
#[inline(always)]
fn keep(args: [u64; 3]) -> Result<(), ()> {
    GROWTH_CALLS.insert(&thread(), &args, 0).map_err(|_| ())
}

/// The arguments the thread's entry kept, taken: `Err` where there are
/// none (the entry came before the attach, or its room was taken).
#[inline(always)]
fn kept() -> Result<[u64; 3], ()> {
    let tid = thread();
    // SAFETY: a lookup whose value is copied at once.
    let args = unsafe { GROWTH_CALLS.get(&tid) }.copied().ok_or(())?;
    let _ = GROWTH_CALLS.remove(&tid);
    Ok(args)
}

#[inline(always)]
fn try_mmap(ctx: &TracePointContext, tgid: u32, counts: *mut GrowthCounts) -> Result<(), ()> {
    let [len, prot, flags] = kept()?;
    let Some(address) = returned(ctx)? else { return Ok(()) };
    if flags & MAP_ANONYMOUS == 0 || flags & MAP_STACK != 0 || prot == PROT_NONE {
        return Ok(());
    }
    // A pymalloc arena: its pools are sampled. Where `growth_arena` sees
    // each new arena, it ends the sample of its mapping (a malloc chunk of
    // the same size stays); else every mapping of that size is left.
    let arenas_seen = GROWTH_ARENAS_SEEN.get(0).is_some_and(|v| *v != 0);
    if len == ARENA_SIZE && !arenas_seen {
        return Ok(());
    }
    grown(MappedKey { tgid, kind: MAPPED_MMAP, address }, len, true, counts);
    Ok(())
}

#[inline(always)]
fn try_mremap(ctx: &TracePointContext, tgid: u32, counts: *mut GrowthCounts) -> Result<(), ()> {
    let [old, old_len, len] = kept()?;
    let Some(address) = returned(ctx)? else { return Ok(()) };
    if end(&MappedKey { tgid, kind: MAPPED_MMAP, address: old }) {
        count!(counts, unmapped);
    }
    // The mapping as it is now, sampled anew and held by whoever resized
    // it (a list's items grown in place are its appender's); a growth
    // only where it grew.
    grown(MappedKey { tgid, kind: MAPPED_MMAP, address }, len, len > old_len, counts);
    Ok(())
}

#[inline(always)]
fn try_brk(ctx: &TracePointContext, tgid: u32, counts: *mut GrowthCounts) -> Result<(), ()> {
    // brk returns the break, the old one where it failed.
    let Some(now) = returned(ctx)? else { return Ok(()) };
    // 0: none seen yet (a break is never 0). Kept as a plain word: an
    // `Option` here once compiled to a read of an unset register.
    // SAFETY: a lookup whose value is copied at once.
    let top = unsafe { GROWTH_BRK.get(&tgid) }.map_or(0, |t| *t);
    if top != now {
        GROWTH_BRK.insert(&tgid, &now, 0).map_err(|_| ())?;
    }
    if top != 0 && now > top {
        grown(MappedKey { tgid, kind: MAPPED_BRK, address: top }, now - top, true, counts);
    } else if top != 0 && now < top {
        // Lowered: every break sample taken before now loses what lies
        // above it (userspace cuts them, even if the break is raised again
        // before it reads them).
        let key = MappedKey { tgid, kind: MAPPED_LOW, address: now };
        let low = MappedSample { stack: 0, taken_ns: now_ns(), len: top - now, weight: 0 };
        if GROWTH_MAPPED.insert(&key, &low, 0).is_err() {
            count!(counts, grown_lost);
        }
    }
    Ok(())
}

/// `len` bytes mapped at `key` (with `growth`, a growth of the heap): the
/// old sample there ended, and a new one kept with probability `len` /
/// [`MAPPED_SAMPLE_BYTES`].
#[inline(always)]
fn grown(key: MappedKey, len: u64, growth: bool, counts: *mut GrowthCounts) {
    if growth {
        count!(counts, grown);
    }
    if end(&key) {
        count!(counts, unmapped);
    }
    if len < MAPPED_SAMPLE_BYTES {
        // SAFETY: the helper has no arguments and no side effects.
        let draw = u64::from(unsafe { bpf_get_prandom_u32() }) % MAPPED_SAMPLE_BYTES;
        if draw >= len {
            return;
        }
    }
    count!(counts, grown_sampled);
    let stack = walk(key.tgid, counts);
    let sample = MappedSample { stack, taken_ns: now_ns(), len, weight: len.max(MAPPED_SAMPLE_BYTES) };
    if GROWTH_MAPPED.insert(&key, &sample, 0).is_err() {
        count!(counts, grown_lost);
    }
}

/// Ends the sample at `key`, if there is one: whether there was.
#[inline(always)]
pub fn end(key: &MappedKey) -> bool {
    // A lookup first: most addresses have no sample (see `growth::take`).
    // SAFETY: a lookup of a key, whose value is not used.
    unsafe { GROWTH_MAPPED.get(key) }.is_some() && GROWTH_MAPPED.remove(key).is_ok()
}
