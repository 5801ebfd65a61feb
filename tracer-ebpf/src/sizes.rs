//! The sizes step: calls and bytes per (domain, log2 size bucket), over
//! every process, for the probes whose requests have a domain.

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    counter::Counter,
    sizes::{self, BUCKETS, DEFAULT_SLOTS, DOMAINS, NO_DOMAIN},
};

use crate::common::atomic_add;

/// Calls and bytes per (domain, log2 size bucket), over every process.
#[map]
static SIZES: PerCpuArray<Counter> = PerCpuArray::with_max_entries(DOMAINS * BUCKETS, 0);

/// The domain of each probe slot, which the loader fills.
#[map]
static SLOT_DOMAINS: Array<u32> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// Probe slot `slot`'s domain ([`NO_DOMAIN`] where its requests have
/// none); `None` past the loader's slots.
#[inline(always)]
pub fn domain(slot: u32) -> Option<u32> {
    SLOT_DOMAINS.get(slot).copied()
}

/// Adds one request of `bytes` to the size histogram of probe `slot`'s
/// domain. Both maps are arrays the loader sized, so a lookup fails only
/// for a slot past the last probe, which the counters already report.
#[inline(always)]
pub fn add(slot: u32, bytes: u64) {
    let Some(&domain) = SLOT_DOMAINS.get(slot) else { return };
    if domain == NO_DOMAIN {
        return;
    }
    if let Some(counter) = SIZES.get_ptr_mut(sizes::index(domain, sizes::bucket(bytes))) {
        // SAFETY: a valid pointer to this CPU's value of the array.
        unsafe {
            atomic_add(&raw mut (*counter).calls, 1);
            atomic_add(&raw mut (*counter).bytes, bytes);
        }
    }
}
