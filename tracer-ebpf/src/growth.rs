//! Heap growth by Python stack (`--growth`; see [`tracer_common::growth`]):
//! `growth_carve` in each carve block of pymalloc's
//! `allocate_from_new_pool` sees a never used pool carved (a new arena's
//! first included), where its cookie says; `growth_arena`, at the call
//! that marks a new arena used, counts it and ends its mapping's sample.
//! Where the carve blocks were not found, `growth_take`, at an instruction
//! each call runs once, tells the pool taken from `usable_arenas` instead,
//! and `growth_arena` the first pool of a new arena. Each take ends the
//! pool's sample, if it has one, and one in [`GROWTH_EVERY`] walks the
//! Python stack (the stacks step's walk, [`crate::stacks::python`]) and
//! keeps a sample for the pool.
//!
//! Neither reads the stack pointer or the thread's stack: only registers,
//! the interpreter's memory and the Python frames, which is what lets the
//! plan put `growth_take` past the function's stack-pointer moves, on an
//! instruction the kernel emulates.

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_get_prandom_u32},
    macros::{map, uprobe},
    maps::HashMap,
    programs::ProbeContext,
};
use tracer_common::{
    growth::{
        ARENA_CARVED, ARENA_FREEPOOLS, ARENA_POOL_ADDRESS, CARVE_STEPPED, DEFAULT_EVERY, DEFAULT_POOL_ENTRIES,
        GrowthCounts, POOL_SIZE, PoolKey, PoolSample,
    },
    site,
};

use crate::{
    args,
    sampled::{GROWTH_COUNTS, count, now_ns, ran, walk},
};

/// One take in this many is sampled. Set by the loader.
#[unsafe(no_mangle)]
static GROWTH_EVERY: u32 = DEFAULT_EVERY;

/// Each sampled pool's taker, until the pool is taken again. Not
/// preallocated: most runs hold a fraction of the room.
#[map]
static GROWTH_POOLS: HashMap<PoolKey, PoolSample> =
    HashMap::with_max_entries(DEFAULT_POOL_ENTRIES, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// A pool taken: what `allocate_from_new_pool` found in `usable_arenas`.
#[uprobe]
pub fn growth_take(ctx: ProbeContext) -> u32 {
    // Another process's hit (where the kernel's links cannot keep one
    // process, they are made for every one): neither counted nor its
    // running time charged to the target.
    let Ok(tgid) = crate::common::check_target() else { return 0 };
    let start = now_ns();
    let Some(counts) = GROWTH_COUNTS.get_ptr_mut(0) else { return 0 };
    let _ = try_take(&ctx, counts, tgid);
    ran(counts, start);
    0
}

/// A never used pool carved out of an arena: its address where the
/// cookie says.
#[uprobe]
pub fn growth_carve(ctx: ProbeContext) -> u32 {
    // Another process's hit (where the kernel's links cannot keep one
    // process, they are made for every one): neither counted nor its
    // running time charged to the target.
    let Ok(tgid) = crate::common::check_target() else { return 0 };
    let start = now_ns();
    let Some(counts) = GROWTH_COUNTS.get_ptr_mut(0) else { return 0 };
    let _ = try_carve(&ctx, counts, tgid);
    ran(counts, start);
    0
}

/// A new arena marked used: its first pool taken.
#[uprobe]
pub fn growth_arena(ctx: ProbeContext) -> u32 {
    // Another process's hit (where the kernel's links cannot keep one
    // process, they are made for every one): neither counted nor its
    // running time charged to the target.
    let Ok(tgid) = crate::common::check_target() else { return 0 };
    let start = now_ns();
    let Some(counts) = GROWTH_COUNTS.get_ptr_mut(0) else { return 0 };
    let _ = try_arena(&ctx, counts, tgid);
    ran(counts, start);
    0
}

#[inline(always)]
fn try_take(ctx: &ProbeContext, counts: *mut GrowthCounts, tgid: u32) -> Result<(), ()> {
    count!(counts, takes);
    let cookie = args::cookie(ctx);
    let Ok(usable) = args::operand(ctx.regs, site::first(cookie), site::constant(cookie)) else {
        count!(counts, unread);
        return Err(());
    };
    if usable == 0 {
        // `new_arena` maps one; `growth_arena` sees its first pool.
        count!(counts, new_arena);
        return Ok(());
    }
    let (Ok(freepools), Ok(pool_address)) =
        (word(usable.wrapping_add(ARENA_FREEPOOLS)), word(usable.wrapping_add(ARENA_POOL_ADDRESS)))
    else {
        count!(counts, unread);
        return Err(());
    };
    let pool = if freepools != 0 {
        count!(counts, reused);
        freepools
    } else {
        count!(counts, carved);
        pool_address
    };
    take(tgid, pool, counts);
    Ok(())
}

#[inline(always)]
fn try_carve(ctx: &ProbeContext, counts: *mut GrowthCounts, tgid: u32) -> Result<(), ()> {
    count!(counts, carve_hits);
    let cookie = args::cookie(ctx);
    if site::slot(cookie) == CARVE_STEPPED {
        count!(counts, carve_stepped);
    }
    let pool = match args::operand(ctx.regs, site::first(cookie), site::constant(cookie)) {
        Ok(pool) if pool != 0 => pool,
        _ => {
            count!(counts, unread);
            return Err(());
        }
    };
    count!(counts, carved);
    take(tgid, pool, counts);
    Ok(())
}

#[inline(always)]
fn try_arena(ctx: &ProbeContext, counts: *mut GrowthCounts, tgid: u32) -> Result<(), ()> {
    count!(counts, arenas);
    let cookie = args::cookie(ctx);
    let Ok(arena) = args::operand(ctx.regs, site::first(cookie), site::constant(cookie)) else {
        count!(counts, unread);
        return Err(());
    };
    // Its mapping is pymalloc's: its pools are sampled, not the mapping.
    crate::mapped::end(&tracer_common::growth::MappedKey {
        tgid,
        kind: tracer_common::growth::MAPPED_MMAP,
        address: arena,
    });
    // The carve blocks' probe takes the first pool, where there is one.
    if site::slot(cookie) == ARENA_CARVED {
        return Ok(());
    }
    // `new_arena`: the first pool is the arena's address rounded up to a
    // pool (an mmap is page-aligned only).
    take(tgid, arena.wrapping_add(POOL_SIZE - 1) & !(POOL_SIZE - 1), counts);
    Ok(())
}

/// `pool` taken by the current thread of `tgid`: its old sample ended, and
/// maybe a new one kept.
#[inline(always)]
fn take(tgid: u32, pool: u64, counts: *mut GrowthCounts) {
    let key = PoolKey { tgid, reserved: 0, pool };
    // A lookup first: most pools have no sample, and a lookup takes no
    // lock where a delete does.
    // SAFETY: a lookup of a key, whose value is not used.
    if unsafe { GROWTH_POOLS.get(&key) }.is_some() && GROWTH_POOLS.remove(&key).is_ok() {
        count!(counts, ended);
    }
    // SAFETY: a plain global the loader patches before load.
    let every = unsafe { core::ptr::read_volatile(&raw const GROWTH_EVERY) };
    // Each take independently, with probability 1/N: a stack's sample
    // count is then binomial, whose error userspace states.
    // SAFETY: the helper has no arguments and no side effects.
    if every > 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
        return;
    }
    count!(counts, sampled);
    let stack = walk(tgid, counts);
    if GROWTH_POOLS.insert(&key, &PoolSample { stack, taken_ns: now_ns() }, 0).is_err() {
        count!(counts, lost);
    }
}

/// The 8 bytes of the target's memory at `address`.
#[inline(always)]
fn word(address: u64) -> Result<u64, ()> {
    // SAFETY: the helper reads the probed thread's memory and fails
    // (counted by the caller) rather than fault.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| ())
}
