//! Bench-only programs (`tracer bench --also meta-insert,meta-lookup,
//! meta-pool,meta-chunk`): what reading a freed block's size from the
//! allocator's own metadata costs, against the live table's lookup that
//! a free makes today (`take` in [`crate::live`]). Nothing else attaches
//! them.
//!
//! Each program takes the pointer in the first argument register and does
//! its work [`REPEAT`] times, so that the differences between them stand
//! out of a probe hit's own noise: `meta_insert` puts the pointer in a
//! table shaped as the live table (same key, value and room) and takes
//! it out again, so that the table never fills; `meta_lookup` does that
//! and looks it up [`REPEAT`] times in between, as `take` does once; `meta_pool` reads pymalloc's size class from the
//! pool header (the pointer rounded down to 16 KiB, `szidx` at +36);
//! `meta_chunk` reads glibc's chunk size word at the pointer − 8.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{map, uprobe},
    maps::{HashMap, PerCpuArray},
    programs::ProbeContext,
};
use tracer_common::live::{LiveEntry, LiveKey};

/// Operations per hit.
const REPEAT: u32 = 32;

/// pymalloc's pools are 16 KiB with the radix tree that 3.10+ build by
/// default on 64-bit (`POOL_BITS` 14: Objects/obmalloc.c in 3.11,
/// Include/internal/pycore_obmalloc.h in 3.12+), and `szidx` follows
/// `ref`, `freeblock`, `nextpool`, `prevpool` and `arenaindex` in
/// `struct pool_header`.
const POOL_MASK: u64 = !((1 << 14) - 1);
const SZIDX: u64 = 36;

/// A table shaped as the live table, preallocated as it is; the loader
/// gives it the live table's default room (`--live-max`'s default) when a bench attaches
/// `meta_insert` or `meta_lookup`, and one entry otherwise.
#[map]
static META_LIVE: HashMap<LiveKey, LiveEntry> = HashMap::with_max_entries(1, 0);

/// What the reads returned and what failed, so that no work is dead code
/// and a failed read shows: [0] the sum of the words read or found, [1]
/// the failures.
#[map]
static META_SINK: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

fn sink(value: u64, failed: u64) {
    for (i, v) in [(0, value), (1, failed)] {
        if let Some(p) = META_SINK.get_ptr_mut(i) {
            // SAFETY: a valid pointer to this CPU's value; only this CPU's
            // program runs use it, and a preempting run loses a count at
            // worst, which a bench-only sum tolerates.
            unsafe { *p = (*p).wrapping_add(v) };
        }
    }
}

fn pointer(ctx: &ProbeContext) -> Option<(LiveKey, u64)> {
    let address: u64 = ctx.arg(0)?;
    #[allow(clippy::cast_possible_truncation, reason = "the upper half of pid_tgid")]
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    Some((LiveKey { tgid, reserved: 0, address }, address))
}

fn insert(key: &LiveKey) -> u64 {
    let entry = LiveEntry { size: key.address & 0xff, ..LiveEntry::default() };
    u64::from(META_LIVE.insert(key, &entry, 0).is_err())
}

fn remove(key: &LiveKey) -> u64 {
    u64::from(META_LIVE.remove(key).is_err())
}

/// The pointer put in the table and taken out.
#[uprobe]
pub fn meta_insert(ctx: ProbeContext) -> u32 {
    if let Some((key, _)) = pointer(&ctx) {
        let failed = insert(&key);
        sink(0, failed + remove(&key));
    }
    0
}

/// The same, then looked up [`REPEAT`] times.
#[uprobe]
pub fn meta_lookup(ctx: ProbeContext) -> u32 {
    let Some((key, _)) = pointer(&ctx) else { return 0 };
    let mut failed = insert(&key);
    let mut sum = 0u64;
    for _ in 0..REPEAT {
        // SAFETY: the value is copied at once.
        match unsafe { META_LIVE.get(&key) } {
            Some(e) => sum = sum.wrapping_add(e.size),
            None => failed += 1,
        }
    }
    sink(sum, failed + remove(&key));
    0
}

/// pymalloc's size class, read [`REPEAT`] times.
#[uprobe]
pub fn meta_pool(ctx: ProbeContext) -> u32 {
    let Some((_, address)) = pointer(&ctx) else { return 0 };
    let at = (address & POOL_MASK) + SZIDX;
    let (mut sum, mut failed) = (0u64, 0u64);
    for i in 0..REPEAT {
        // The index keeps the compiler from folding the reads into one.
        let at = at + u64::from(i & core::hint::black_box(0));
        // SAFETY: the helper checks the address.
        match unsafe { bpf_probe_read_user(at as *const u32) } {
            Ok(szidx) => sum = sum.wrapping_add(u64::from(szidx)),
            Err(_) => failed += 1,
        }
    }
    sink(sum, failed);
    0
}

/// glibc's chunk size word, read [`REPEAT`] times.
#[uprobe]
pub fn meta_chunk(ctx: ProbeContext) -> u32 {
    let Some((_, address)) = pointer(&ctx) else { return 0 };
    let at = address.wrapping_sub(8);
    let (mut sum, mut failed) = (0u64, 0u64);
    for i in 0..REPEAT {
        let at = at + u64::from(i & core::hint::black_box(0));
        // SAFETY: the helper checks the address.
        match unsafe { bpf_probe_read_user(at as *const u64) } {
            Ok(word) => sum = sum.wrapping_add(word),
            Err(_) => failed += 1,
        }
    }
    sink(sum, failed);
    0
}
