//! The count step: calls and bytes per (process, probe slot), one map
//! lookup and two atomic adds; nothing goes to userspace per event.

use aya_ebpf::{EbpfContext, macros::map, maps::PerCpuHashMap};
use tracer_common::{
    counter::{Counter, CounterKey, DEFAULT_COUNTER_ENTRIES},
    stats::Stat,
};

use crate::common::{atomic_add, slot_of};

/// Calls and bytes per (process, probe slot). The loader sets the size.
#[map]
static COUNTERS: PerCpuHashMap<CounterKey, Counter> = PerCpuHashMap::with_max_entries(DEFAULT_COUNTER_ENTRIES, 0);

/// Adds one call of `bytes` to `key`'s counter.
#[inline(always)]
pub fn add<C: EbpfContext>(ctx: &C, key: CounterKey, bytes: u64) -> Result<(), Stat> {
    let counter = slot_of(ctx, &COUNTERS, key)?;
    // SAFETY: the map returned a valid, aligned pointer to this CPU's value,
    // which stays valid while the program runs (hash map values are freed
    // only after an RCU grace period).
    unsafe {
        atomic_add(&raw mut (*counter).calls, 1);
        atomic_add(&raw mut (*counter).bytes, bytes);
    }
    Ok(())
}
