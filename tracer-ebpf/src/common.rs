//! What every program needs, whatever its step: whose hit it is
//! ([`check_target`]), its misses ([`bump`], into [`STATS`]), a map value
//! made on first use ([`slot_of`]) and the atomic add ([`atomic_add`]).

use aya_ebpf::{EbpfContext, bindings::BPF_NOEXIST, macros::map, maps::PerCpuArray, maps::PerCpuHashMap};
use aya_log_ebpf::{info, warn};
use tracer_common::{
    counter::CounterKey,
    stats::{STAT_COUNT, Stat},
};

/// Thread-group id to count for; 0 counts every process. Set by the loader.
/// The kernel's per-process uprobe filter already limits hits to the target,
/// so this is a second line of defence whose rejections are counted.
#[unsafe(no_mangle)]
static TARGET_TGID: u32 = 0;

/// Misses, indexed by [`Stat`].
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// The thread-group id of this hit, if it is one tracer counts.
#[inline(always)]
pub fn check_target() -> Result<u32, Stat> {
    // SAFETY: TARGET_TGID is a plain u32 the loader patches before load; the
    // volatile read stops the compiler from folding in the initial 0.
    let target = unsafe { core::ptr::read_volatile(&raw const TARGET_TGID) };
    // The upper half of pid_tgid is the thread-group id.
    #[allow(clippy::cast_possible_truncation, reason = "the upper half of pid_tgid")]
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if target != 0 && tgid != target {
        return Err(Stat::OtherProcess);
    }
    Ok(tgid)
}

/// The thread-group id of this hit, if it is the target's: for programs
/// that every process runs (no per-process uprobe filter), which count
/// nothing without a target.
#[inline(always)]
pub fn only_target() -> Result<u32, Stat> {
    // SAFETY: as in `check_target`.
    let target = unsafe { core::ptr::read_volatile(&raw const TARGET_TGID) };
    #[allow(clippy::cast_possible_truncation, reason = "the upper half of pid_tgid")]
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if target == 0 || tgid != target {
        return Err(Stat::OtherProcess);
    }
    Ok(tgid)
}

/// Counts a miss (and, with `--bpf-log`, logs it).
#[inline(always)]
pub fn bump<C: EbpfContext>(ctx: &C, stat: Stat) {
    warn!(ctx, "miss: {}", stat.name());
    tally(stat);
}

/// Counts a miss where no context is at hand to log it with (a step that
/// goes on after it: its result is the event's, not the miss's).
#[inline(always)]
pub fn tally(stat: Stat) {
    if let Some(value) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: a valid pointer to this CPU's u64 slot of the array.
        unsafe { atomic_add(value, 1) };
    }
}

/// This CPU's value for `key` in `map`, inserting a zero on first use.
#[inline(always)]
pub fn slot_of<C: EbpfContext, V: Default>(
    ctx: &C,
    map: &PerCpuHashMap<CounterKey, V>,
    key: CounterKey,
) -> Result<*mut V, Stat> {
    match map.get_ptr_mut(&key) {
        Some(value) => Ok(value),
        None => {
            info!(ctx, "first hit of probe slot {} by PID {} on this CPU", key.slot, key.tgid);
            // First hit of this probe by this process on any CPU. Insert a
            // zero and look it up again rather than inserting the count: if
            // a preempted hit inserted first, NOEXIST keeps its count.
            // An insert that fails for a full map leaves the lookup empty.
            let _ = map.insert(&key, &V::default(), u64::from(BPF_NOEXIST));
            map.get_ptr_mut(&key).ok_or(Stat::MapFull)
        }
    }
}

/// `lock *(u64 *)(dst) += value`: the BPF atomic add instruction. Atomic
/// because a preempted program on the same CPU may be updating the same
/// per-CPU value (core has no atomic read-modify-write for this target).
///
/// # Safety
/// `dst` must be a valid, 8-byte aligned pointer into a map value.
#[inline(always)]
pub unsafe fn atomic_add(dst: *mut u64, value: u64) {
    // SAFETY: the caller guarantees dst is a valid map value pointer; the
    // instruction writes only those 8 bytes.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({dst} + 0) += {value}",
            dst = in(reg) dst,
            value = in(reg) value,
        );
    }
}
