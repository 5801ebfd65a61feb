//! Heap growth by Python stack (`--growth`): pymalloc's pools charged to
//! the stack that grew pymalloc's footprint by them, sampled.
//!
//! pymalloc takes a pool from empty in one function, `allocate_from_new_pool`
//! (`Objects/obmalloc.c`, v3.11 to v3.14), which runs only when a size
//! class has no used pool with room. Its footprint grows in one branch of
//! it only: the carve of a never used pool out of an arena
//! (`pool_address += POOL_SIZE`, a new arena's first pool included); the
//! other reuses a pool emptied before, which churny code does tens of
//! thousands of times a second. `growth_carve` sits in each carve block,
//! where the carved pool's address is where its cookie says (a register,
//! or the arena's `pool_address` still unmoved), and sees nothing else.
//!
//! Where a build's carve blocks cannot be found, `growth_take` sits at one
//! instruction of the function that runs once per call instead, where
//! `usable_arenas` is where its cookie says, and tells the call's outcome
//! apart by one read: no usable arena (a new one is mapped, whose first
//! pool `growth_arena` sees), an emptied pool reused
//! (`usable_arenas->freepools`) or a never used one carved
//! (`usable_arenas->pool_address`).
//!
//! Every take (or carve) ends the pool's old sample, if it has one: a take
//! of the same address proves its last holder let go of it (a carve, that
//! its arena was freed and another mapped at its address). One in
//! [`DEFAULT_EVERY`] (chosen at random, each) walks the Python stack and
//! keeps a sample for its pool, with the stack's hash; userspace counts
//! each stack's live samples (a pool still in use) times the bytes one
//! stands for, and drops those whose pool it finds empty or gone.

use crate::site;

/// Key of the samples map: a pool of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub tgid: u32,
    /// Always 0: spells out the padding, so that the key has no
    /// uninitialised bytes (the kernel hashes every byte).
    pub reserved: u32,
    /// The pool's address (its header).
    pub pool: u64,
}

const _: () = assert!(core::mem::size_of::<PoolKey>() == 16);

/// A sampled take: the stack that took the pool, and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolSample {
    /// The hash of the taker's Python stack (its key in the stacks map), or
    /// below [`crate::stack::FIRST_HASH`] why it has none
    /// ([`crate::stack::why`]: the walk failed, plus the
    /// [`crate::stats::Stat`]).
    pub stack: u64,
    /// `bpf_ktime_get_ns` at the take: tells two samples of one pool apart.
    pub taken_ns: u64,
}

const _: () = assert!(core::mem::size_of::<PoolSample>() == 16);

/// What the growth programs saw, summed over CPUs; every miss is here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthCounts {
    /// Hits of `growth_take`: calls of `allocate_from_new_pool`.
    pub takes: u64,
    /// Of those, reuses of an emptied pool.
    pub reused: u64,
    /// Carves of a never used pool: of `growth_take`'s hits those that
    /// found one in a usable arena, and every hit of `growth_carve` (a new
    /// arena's first pool included).
    pub carved: u64,
    /// Hits of `growth_carve`.
    pub carve_hits: u64,
    /// Of those, at a carve block's single-stepped probe (priced as such).
    pub carve_stepped: u64,
    /// Calls that found no usable arena (a new arena is mapped).
    pub new_arena: u64,
    /// Hits of `growth_arena`: new arenas marked used, whose first pool is
    /// taken.
    pub arenas: u64,
    /// Takes sampled (each walks the stack).
    pub sampled: u64,
    /// Takes that ended a sample of the same pool.
    pub ended: u64,
    /// Sampled takes whose walk failed: kept, charged to no stack.
    pub walk_failed: u64,
    /// Sampled takes whose walk was cut at its depth.
    pub truncated: u64,
    /// Sampled takes the samples map had no room for: lost.
    pub lost: u64,
    /// Hits whose pool could not be read (the state where the cookie says,
    /// or the arena's fields): not counted as any outcome.
    pub unread: u64,
    /// pymalloc's programs' own running time, in ns: their cost beyond the
    /// hit.
    pub run_ns: u64,
    /// The target's calls of the mapping syscalls the C library's heap
    /// grows and shrinks by (`mmap`, `munmap`, `mremap`, `brk`): each
    /// seen once (an exit, or `munmap`'s entry).
    pub syscalls: u64,
    /// Of those, growths of the C library's heap: an anonymous mapping
    /// made (other than a pymalloc arena), one grown by `mremap`, or the
    /// break raised.
    pub grown: u64,
    /// Growths sampled (each walks the stack).
    pub grown_sampled: u64,
    /// Samples ended by an `munmap` or `mremap` of their address, or by a
    /// later mapping at it.
    pub unmapped: u64,
    /// Sampled growths (or lowerings of the break) the mapped samples map
    /// had no room for: lost.
    pub grown_lost: u64,
    /// The target's mapping calls that could not be judged: their
    /// arguments or outcome unread, or an exit whose entry was not kept
    /// (before the attach, or no room).
    pub mapped_missed: u64,
    /// The C library's programs' running time, in ns (they cost no trap):
    /// apart from [`Self::run_ns`], because the profile judges pymalloc's
    /// probes on their own cost.
    pub mapped_run_ns: u64,
}

const _: () = assert!(core::mem::size_of::<GrowthCounts>() == 21 * 8);

impl GrowthCounts {
    /// Adds another CPU's counts, saturating.
    #[must_use]
    pub const fn merged(self, o: Self) -> Self {
        Self {
            takes: self.takes.saturating_add(o.takes),
            reused: self.reused.saturating_add(o.reused),
            carved: self.carved.saturating_add(o.carved),
            carve_hits: self.carve_hits.saturating_add(o.carve_hits),
            carve_stepped: self.carve_stepped.saturating_add(o.carve_stepped),
            new_arena: self.new_arena.saturating_add(o.new_arena),
            arenas: self.arenas.saturating_add(o.arenas),
            sampled: self.sampled.saturating_add(o.sampled),
            ended: self.ended.saturating_add(o.ended),
            walk_failed: self.walk_failed.saturating_add(o.walk_failed),
            truncated: self.truncated.saturating_add(o.truncated),
            lost: self.lost.saturating_add(o.lost),
            unread: self.unread.saturating_add(o.unread),
            run_ns: self.run_ns.saturating_add(o.run_ns),
            syscalls: self.syscalls.saturating_add(o.syscalls),
            grown: self.grown.saturating_add(o.grown),
            grown_sampled: self.grown_sampled.saturating_add(o.grown_sampled),
            unmapped: self.unmapped.saturating_add(o.unmapped),
            grown_lost: self.grown_lost.saturating_add(o.grown_lost),
            mapped_missed: self.mapped_missed.saturating_add(o.mapped_missed),
            mapped_run_ns: self.mapped_run_ns.saturating_add(o.mapped_run_ns),
        }
    }
}

/// One take in this many is sampled by default: a pool is 16 KiB, so a
/// sample stands for 512 KiB of pools, the sampling distance of Go's
/// runtime and jemalloc's profiler.
pub const DEFAULT_EVERY: u32 = 32;

/// Room for samples by default: a sample per 512 KiB of pools in use, so
/// 32 GiB of them.
pub const DEFAULT_POOL_ENTRIES: u32 = 1 << 16;

/// The C library's heap, seen at its syscalls' tracepoints (`mmap`,
/// `munmap`, `mremap`, `brk`: no uprobe, and only these syscalls run a
/// program). A growth of `bytes` is sampled with probability
/// `bytes` / [`MAPPED_SAMPLE_BYTES`] (every growth of that size or more),
/// standing for `max(bytes, MAPPED_SAMPLE_BYTES)`: Go's and jemalloc's
/// rule, unbiased. A sample is kept by the address where the growth
/// begins: the mapping's, or the break's before it was raised.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappedKey {
    pub tgid: u32,
    /// [`MAPPED_MMAP`] or [`MAPPED_BRK`].
    pub kind: u32,
    pub address: u64,
}

const _: () = assert!(core::mem::size_of::<MappedKey>() == 16);

/// A sampled growth of the C library's heap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappedSample {
    /// As [`PoolSample::stack`].
    pub stack: u64,
    /// `bpf_ktime_get_ns` at the growth: the later of two overlapping
    /// samples holds the bytes.
    pub taken_ns: u64,
    /// The bytes grown.
    pub len: u64,
    /// The bytes the sample stands for.
    pub weight: u64,
}

const _: () = assert!(core::mem::size_of::<MappedSample>() == 32);

/// A mapping, kept by its address.
pub const MAPPED_MMAP: u32 = 1;
/// The break raised, kept by where it was.
pub const MAPPED_BRK: u32 = 2;
/// The break lowered, kept by where it went (`taken_ns` when; `len` by
/// how much): no sample, a cut of the break samples taken before.
pub const MAPPED_LOW: u32 = 3;

/// The sampling distance of the C library's heap: as a pymalloc sample's
/// by default (32 pools of 16 KiB).
pub const MAPPED_SAMPLE_BYTES: u64 = DEFAULT_EVERY as u64 * POOL_SIZE;

/// Room for mapped samples by default.
pub const DEFAULT_MAPPED_ENTRIES: u32 = 1 << 14;

/// The threads inside a mapping syscall at once that `GROWTH_CALLS`
/// keeps, besides what the kernel's LRU lists hold back per CPU.
pub const MAPPING_THREADS: u32 = 1024;

/// `ARENA_SIZE` (`Objects/obmalloc.c` at v3.11.2: `ARENA_BITS` 20 with
/// `USE_LARGE_ARENAS`; `Include/internal/pycore_obmalloc.h` at v3.12.1,
/// v3.13.0, v3.14.8): pymalloc's arenas are mappings of exactly this
/// size, accounted by their pools, not as the C library's heap.
pub const ARENA_SIZE: u64 = 1 << 20;

/// `mmap`'s flags and protection the programs read (`<sys/mman.h>`, Linux
/// x86-64): anonymous mappings only (files are not the heap), never a
/// thread's stack, never an address range reserved with no access.
pub const MAP_ANONYMOUS: u64 = 0x20;
pub const MAP_STACK: u64 = 0x2_0000;
pub const PROT_NONE: u64 = 0;

/// `struct arena_object`'s fields the programs read (`Objects/obmalloc.c`
/// at v3.11.2, `Include/internal/pycore_obmalloc.h` at v3.12.1, v3.13.0 and
/// v3.14.8; DWARF of every build the tests run): the next pool to carve,
/// and the list of emptied pools.
pub const ARENA_POOL_ADDRESS: u64 = 8;
pub const ARENA_FREEPOOLS: u64 = 24;

/// `POOL_SIZE`: a new arena's first pool is its address rounded up to it.
pub const POOL_SIZE: u64 = 1 << 14;

/// The cookie of `growth_take`: where `usable_arenas` is, as an operand of
/// [`crate::site`] (a register, or memory at a register plus an offset).
#[must_use]
pub const fn take_cookie(first: u8, constant: u16) -> u64 {
    site::encode(0, first, site::NONE, constant)
}

/// The cookie of `growth_arena`: where the new arena's address is (a
/// register operand), and whether `growth_carve` takes the arena's first
/// pool (`carves`: the arena's probe then only counts it and ends its
/// mapping's sample).
#[must_use]
pub const fn arena_cookie(first: u8, carves: bool) -> u64 {
    site::encode(if carves { ARENA_CARVED } else { 0 }, first, site::NONE, 0)
}

/// The slot of an arena cookie whose first pool `growth_carve` takes.
pub const ARENA_CARVED: u32 = 1;

/// The cookie of `growth_carve`: where the carved pool's address is (a
/// register, or memory at a register plus an offset), and whether the
/// probe is single-stepped (counted apart, to be priced as such).
#[must_use]
pub const fn carve_cookie(first: u8, constant: u16, stepped: bool) -> u64 {
    site::encode(if stepped { CARVE_STEPPED } else { 0 }, first, site::NONE, constant)
}

/// The slot of a carve cookie at a single-stepped probe.
pub const CARVE_STEPPED: u32 = 1;

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, no padding (the padding is the named
// `reserved`, asserted by the size above), every bit pattern valid.
unsafe impl aya::Pod for PoolKey {}
#[cfg(feature = "user")]
// SAFETY: two u64, every bit pattern valid.
unsafe impl aya::Pod for PoolSample {}
#[cfg(feature = "user")]
// SAFETY: u64s only (asserted by the size above), every bit pattern valid.
unsafe impl aya::Pod for GrowthCounts {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, a u32 pair and a u64 (no padding, asserted by
// the size above), every bit pattern valid.
unsafe impl aya::Pod for MappedKey {}
#[cfg(feature = "user")]
// SAFETY: four u64, every bit pattern valid.
unsafe impl aya::Pod for MappedSample {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_hold_their_operands() {
        let (first, constant) = site::memory(5, 0x218).unwrap_or_default();
        let c = take_cookie(first, constant);
        assert_eq!((site::first(c), site::offset(site::constant(c))), (site::MEMORY + 6, 0x218));
        let c = arena_cookie(site::register(4).unwrap_or(site::NONE), false);
        assert_eq!((site::first(c), site::second(c), site::slot(c)), (5, site::NONE, 0));
        assert_eq!(site::slot(arena_cookie(5, true)), ARENA_CARVED);
        let c = carve_cookie(site::register(1).unwrap_or(site::NONE), 0, true);
        assert_eq!((site::first(c), site::slot(c)), (2, CARVE_STEPPED));
        assert_eq!(site::slot(carve_cookie(2, 0, false)), 0);
        let one = GrowthCounts { takes: 1, run_ns: u64::MAX, ..GrowthCounts::default() };
        assert_eq!(one.merged(one), GrowthCounts { takes: 2, run_ns: u64::MAX, ..GrowthCounts::default() });
    }
}
