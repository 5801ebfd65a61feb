//! What both kinds of growth programs share (pymalloc's in [`crate::growth`],
//! the C library's in [`crate::mapped`]): their counts and running time,
//! and the stack walk of a sample.

use aya_ebpf::{helpers::generated::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use tracer_common::{growth::GrowthCounts, stack, stats::Stat};

use crate::{common::atomic_add, stacks};

/// What the programs saw, per CPU.
#[map]
pub static GROWTH_COUNTS: PerCpuArray<GrowthCounts> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments and only reads the clock.
    unsafe { bpf_ktime_get_ns() }
}

/// Adds the time since `start` to pymalloc's programs' running time in
/// `counts`.
#[inline(always)]
pub fn ran(counts: *mut GrowthCounts, start: u64) {
    // SAFETY: a valid pointer to this CPU's value, which stays valid while
    // the program runs; atomic, as in `count!`.
    unsafe { atomic_add(&raw mut (*counts).run_ns, now_ns().saturating_sub(start)) };
}

/// Adds the time since `start` to the C library's programs' running time
/// in `counts`.
#[inline(always)]
pub fn ran_mapped(counts: *mut GrowthCounts, start: u64) {
    // SAFETY: as in `ran`.
    unsafe { atomic_add(&raw mut (*counts).mapped_run_ns, now_ns().saturating_sub(start)) };
}

/// Adds one to the field `field` of `counts`.
macro_rules! count {
    ($counts:expr, $field:ident) => {
        // SAFETY: a valid pointer to this CPU's value (see `timed`); the
        // add is atomic because a preempted program on this CPU may be
        // updating the same value.
        unsafe { $crate::common::atomic_add(&raw mut (*$counts).$field, 1) }
    };
}
pub(crate) use count;

/// The current thread's Python stack, kept in the stacks map: its hash,
/// or below [`tracer_common::stack::FIRST_HASH`] why it has none.
#[inline(always)]
pub fn walk(tgid: u32, counts: *mut GrowthCounts) -> u64 {
    match stacks::python(tgid) {
        Ok((hash, truncated)) => {
            if truncated {
                crate::sampled::count!(counts, truncated);
            }
            if stacks::kept(hash) || stacks::keep(hash).is_ok() {
                hash
            } else {
                crate::sampled::count!(counts, walk_failed);
                stack::why::FAILED + Stat::StacksFull as u64
            }
        }
        Err(stat) => {
            crate::sampled::count!(counts, walk_failed);
            stack::why::FAILED + stat as u64
        }
    }
}
