//! The returns step (`--returns`): per (process, probe slot), how many
//! returns were seen, how many were NULL, and the sum of the pointers.

use aya_ebpf::{EbpfContext, macros::map, maps::PerCpuHashMap};
use tracer_common::{
    counter::{CounterKey, DEFAULT_COUNTER_ENTRIES},
    returns::Returned,
    stats::Stat,
};

use crate::common::{atomic_add, slot_of};

/// Returns per (process, probe slot). The loader sets the size.
#[map]
static RETURNS: PerCpuHashMap<CounterKey, Returned> = PerCpuHashMap::with_max_entries(DEFAULT_COUNTER_ENTRIES, 0);

/// Adds one return of `value` to `key`'s counts.
#[inline(always)]
pub fn add<C: EbpfContext>(ctx: &C, key: CounterKey, value: u64) -> Result<(), Stat> {
    let returned = slot_of(ctx, &RETURNS, key)?;
    // SAFETY: a valid pointer to this CPU's value, as in [`crate::count`].
    unsafe {
        atomic_add(&raw mut (*returned).returns, 1);
        atomic_add(&raw mut (*returned).null, u64::from(value == 0));
        atomic_add(&raw mut (*returned).pointer_sum, value);
    }
    Ok(())
}
