//! Live memory (`--live`, see [`tracer_common::live`]): `live_alloc` at an
//! allocating function's entry keeps the call's size by (thread, stack
//! pointer); the return probe (`ret_value` at a `ret`, `ret_value_uret`)
//! takes it and puts the returned block in [`LIVE`]; `live_free` at a
//! free's entry takes the block out. Every block put in or taken out moves
//! its domain's count and bytes in [`LIVE_COUNTS`]; nothing goes to
//! userspace per event.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_ANY, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    },
    macros::{map, uprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::ProbeContext,
};
use tracer_common::{
    live::{
        Call, DEFAULT_LIVE_ENTRIES, DOMAIN_SLOTS, LAST_FREE_THREADS, LiveCounts, LiveEntry, LiveKey, PENDING_ENTRIES,
        Pending, PendingKey, role,
    },
    sizes::DEFAULT_SLOTS,
    stats::Stat,
};

/// Whether `--live` is on; 0 makes the return probes' live code dead.
#[unsafe(no_mangle)]
static LIVE_ON: u32 = 0;

/// The outstanding blocks. Preallocated: an insert then takes no
/// allocation in the kernel, and a full table fails the insert, which is
/// counted (`dropped`). The loader sets the size (`--live-max`).
#[map]
static LIVE: HashMap<LiveKey, LiveEntry> = HashMap::with_max_entries(DEFAULT_LIVE_ENTRIES, 0);

/// Calls in flight.
#[map]
static PENDING: LruHashMap<PendingKey, Pending> = LruHashMap::with_max_entries(PENDING_ENTRIES, 0);

/// Each thread's last freed block.
#[map]
static LAST_FREE: LruHashMap<u32, u64> = LruHashMap::with_max_entries(LAST_FREE_THREADS, 0);

/// Per domain, what the table did.
#[map]
static LIVE_COUNTS: PerCpuArray<LiveCounts> = PerCpuArray::with_max_entries(DOMAIN_SLOTS, 0);

/// Per probe slot, its [`role`]; the loader fills it.
#[map]
static SLOT_LIVE: Array<u32> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// This thread's id and its process's.
#[inline(always)]
fn ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    #[allow(clippy::cast_possible_truncation, reason = "the halves of pid_tgid")]
    ((id >> 32) as u32, id as u32)
}

/// Whether `--live` is on.
#[inline(always)]
pub fn on() -> bool {
    // SAFETY: a plain global the loader patches before load.
    unsafe { core::ptr::read_volatile(&raw const LIVE_ON) != 0 }
}

/// `field += value` in this CPU's counts of `domain`.
#[inline(always)]
fn add(domain: u32, field: usize, value: u64) {
    if field >= FIELDS {
        return;
    }
    if let Some(counts) = LIVE_COUNTS.get_ptr_mut(domain) {
        // SAFETY: a valid pointer to this CPU's value, whose `field`-th
        // u64 (checked above) is in it; the add is atomic, as a preempted
        // program on this CPU may be updating it.
        unsafe { crate::atomic_add(counts.cast::<u64>().add(field), value) };
    }
}

/// The number of u64 fields of [`LiveCounts`].
const FIELDS: usize = core::mem::size_of::<LiveCounts>() / 8;

/// The index of a [`LiveCounts`] field, in its declaration order.
macro_rules! field {
    (count) => {
        0
    };
    (bytes) => {
        1
    };
    (tracked) => {
        2
    };
    (freed) => {
        3
    };
    (untracked_frees) => {
        4
    };
    (dropped) => {
        5
    };
    (unseen_allocs) => {
        6
    };
    (unseen_frees) => {
        7
    };
    (nested) => {
        8
    };
}

/// At an allocating function's entry: keeps its size by (thread, stack
/// pointer) until its return.
#[uprobe]
pub fn live_alloc(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_live_alloc(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_live_alloc(ctx: &ProbeContext) -> Result<(), Stat> {
    crate::check_target()?;
    // SAFETY: the helper reads this run's cookie.
    let slot = u32::try_from(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).map_err(|_| Stat::SlotOutOfRange)?;
    let kind = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE);
    let domain = crate::SLOT_DOMAINS.get(slot).copied().ok_or(Stat::SlotOutOfRange)?;
    let arg = |n: usize| ctx.arg::<u64>(n).ok_or(Stat::ArgMissing);
    let (size, old) = match kind {
        role::MALLOC => (arg(0)?, 0),
        role::CALLOC => {
            let (n, e) = (arg(0)?, arg(1)?);
            // As in try_record: BPF has no 128-bit multiply.
            if (n | e) >> 32 != 0 && e != 0 && n > core::hint::black_box(u64::MAX) / e {
                (u64::MAX, 0)
            } else {
                (n.wrapping_mul(e), 0)
            }
        }
        role::REALLOC => (arg(1)?, arg(0)?),
        _ => return Ok(()),
    };
    let (_, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let sp = unsafe { (*ctx.regs).rsp };
    let key = PendingKey { tid, reserved: 0, sp };
    let call = Call { size, old, stack: 0, domain, slot };
    match PENDING.get_ptr_mut(&key) {
        Some(p) => {
            // SAFETY: a valid pointer to the value, which only this thread
            // (so only this program run) uses.
            let p = unsafe { &mut *p };
            if p.depth >= 2 {
                p.calls[0] = p.calls[1];
                p.calls[1] = call;
                p.depth = 2;
            } else if p.depth == 1 {
                p.calls[1] = call;
                p.depth = 2;
            } else {
                p.calls[0] = call;
                p.depth = 1;
            }
            Ok(())
        }
        None => {
            let p = Pending { calls: [call, Call::default()], depth: 1 };
            PENDING.insert(&key, &p, u64::from(BPF_ANY)).map_err(|_| Stat::LivePendingFull)
        }
    }
}

/// At an allocating function's return (`sp_delta`: what the stack pointer
/// there is above the entry's: 0 at a `ret`, 8 after it, for a
/// uretprobe): takes the call's pending entry and puts the block returned
/// in `rax` in the live table.
#[inline(always)]
pub fn returned(regs: *mut pt_regs, tgid: u32, sp_delta: u64) -> Result<(), Stat> {
    let (_, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let (address, sp) = unsafe { ((*regs).rax, (*regs).rsp) };
    let key = PendingKey { tid, reserved: 0, sp: sp.wrapping_sub(sp_delta) };
    let pending = PENDING.get_ptr_mut(&key).ok_or(Stat::LiveUnmatched)?;
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let pending = unsafe { &mut *pending };
    let p = match pending.depth {
        0 => return Err(Stat::LiveUnmatched),
        1 => pending.calls[0],
        _ => pending.calls[1],
    };
    pending.depth = pending.depth.saturating_sub(1).min(1);
    if pending.depth == 0 {
        let _ = PENDING.remove(&key);
    }
    if address == 0 {
        // A failed allocation is never live; a failed realloc keeps the
        // old block.
        return Ok(());
    }
    if p.old != 0 && p.old != address {
        take(tgid, tid, p.old, p.domain);
    }
    let live = LiveKey { tgid, reserved: 0, address };
    // An inner call of another family returned this block first (a large
    // `PyObject_Malloc` is `PyMem_RawMalloc`'s block): the outer call's
    // entry replaces it, and the inner one is counted as nested.
    // SAFETY: a copy is taken at once.
    if let Some(inner) = unsafe { LIVE.get(&live) }.copied() {
        add(inner.domain, field!(count), u64::MAX);
        add(inner.domain, field!(bytes), inner.size.wrapping_neg());
        add(inner.domain, field!(nested), 1);
        add(inner.domain, field!(tracked), u64::MAX);
    }
    // SAFETY: the helper has no arguments.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    let entry = LiveEntry { size: p.size, time_ns, stack: p.stack, domain: p.domain, slot: p.slot };
    if LIVE.insert(&live, &entry, u64::from(BPF_ANY)).is_err() {
        add(p.domain, field!(dropped), 1);
        return Err(Stat::LiveFull);
    }
    add(p.domain, field!(count), 1);
    add(p.domain, field!(bytes), p.size);
    add(p.domain, field!(tracked), 1);
    Ok(())
}

/// Takes `address` out of the live table, for a free (or a realloc that
/// moved it) by thread `tid`; a block not there is counted as untracked
/// (under `domain`, the freeing family's), or as nested when the thread's
/// last free took it.
#[inline(always)]
fn take(tgid: u32, tid: u32, address: u64, domain: u32) {
    let key = LiveKey { tgid, reserved: 0, address };
    // SAFETY: a copy is taken at once.
    if let Some(entry) = unsafe { LIVE.get(&key) }.copied()
        && LIVE.remove(&key).is_ok()
    {
        add(entry.domain, field!(count), u64::MAX);
        add(entry.domain, field!(bytes), entry.size.wrapping_neg());
        add(entry.domain, field!(freed), 1);
        let _ = LAST_FREE.insert(&tid, &address, u64::from(BPF_ANY));
        return;
    }
    // SAFETY: a lookup whose value is copied at once.
    let nested = unsafe { LAST_FREE.get(&tid) }.is_some_and(|last| *last == address);
    if nested {
        add(domain, field!(nested), 1);
    } else {
        add(domain, field!(untracked_frees), 1);
    }
}

/// At a free's entry: takes the block out of the live table.
#[uprobe]
pub fn live_free(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_live_free(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_live_free(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = crate::check_target()?;
    let address = ctx.arg::<u64>(0).ok_or(Stat::ArgMissing)?;
    if address == 0 {
        return Ok(());
    }
    // SAFETY: the helper reads this run's cookie.
    let slot = u32::try_from(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).map_err(|_| Stat::SlotOutOfRange)?;
    let kind = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE);
    let (_, tid) = ids();
    take(tgid, tid, address, kind >> 8);
    Ok(())
}

/// At an inlined copy of slot `slot`'s function, where no pointer is
/// read: counts the call as unseen by the live table.
#[inline(always)]
pub fn unseen(slot: u32) {
    let kind = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE);
    let domain = crate::SLOT_DOMAINS.get(slot).copied().unwrap_or(0);
    match kind {
        role::MALLOC | role::CALLOC | role::REALLOC => add(domain, field!(unseen_allocs), 1),
        // A free's slot has no domain: the loader keeps its family's in
        // the role's upper bits.
        k if k & 0xff == role::FREE => add(k >> 8, field!(unseen_frees), 1),
        _ => {}
    }
}
