//! Garbage collections (see [`tracer_common::gc`]): `gc_start` at each
//! `gc__start` marker (or the collection function's entry) records the
//! thread's start and generation; `gc_done` at each `gc__done` marker (or
//! as a uretprobe of that function) adds the collection, its duration and
//! the objects found unreachable to its (process, generation). Both read
//! their argument where the attach cookie says. A hit costs an LRU-map
//! update and, at the done, one lookup and three atomic adds: nothing goes
//! to userspace.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    },
    macros::{map, uprobe},
    maps::{LruHashMap, PerCpuHashMap},
    programs::ProbeContext,
};
use tracer_common::{
    gc::{self, DEFAULT_GC_ENTRIES, DEFAULT_GC_THREADS, GcKey, GcRunning, GcTotals, UNKNOWN_GENERATION},
    site,
    stats::Stat,
};

/// Collections, durations and objects per (process, generation).
#[map]
static GC_TOTALS: PerCpuHashMap<GcKey, GcTotals> = PerCpuHashMap::with_max_entries(DEFAULT_GC_ENTRIES, 0);

/// Each thread's collection in flight, by thread id.
#[map]
static GC_RUNNING: LruHashMap<u32, GcRunning> = LruHashMap::with_max_entries(DEFAULT_GC_THREADS, 0);

/// A collection starts.
#[uprobe]
pub fn gc_start(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_gc_start(&ctx) {
        crate::common::bump(&ctx, stat);
    }
    0
}

/// A collection ends. Also attached as a uretprobe (the same program: a
/// return probe differs only in how it is attached), reading rax.
#[uprobe]
pub fn gc_done(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_gc_done(&ctx) {
        crate::common::bump(&ctx, stat);
    }
    0
}

/// The calling thread's id (the low half of pid_tgid).
#[inline(always)]
#[allow(clippy::cast_possible_truncation, reason = "the low 32 bits are the thread id")]
fn thread_id() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments and only reads the clock.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn try_gc_start(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = crate::common::check_target()?;
    let start_ns = now_ns();
    let tid = thread_id();
    // SAFETY: the helper only reads the cookie of this run's attachment;
    // ctx is the context the kernel passed to this program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // A generation that cannot be read still leaves the collection counted,
    // under the unknown one.
    let generation = match argument(ctx.regs, cookie) {
        Ok(g) => i32::try_from(g).unwrap_or(UNKNOWN_GENERATION),
        Err(stat) => {
            crate::common::bump(ctx, stat);
            UNKNOWN_GENERATION
        }
    };
    if let Some(running) = GC_RUNNING.get_ptr(tid) {
        // SAFETY: the map returned a valid pointer to the entry; only this
        // thread writes its own entry, and the field is copied out at once.
        let previous = unsafe { core::ptr::read_volatile(&raw const (*running).tgid) };
        // The thread's previous collection never ended as far as tracer
        // saw (CPython does not nest them): its end was lost. This start
        // replaces it, so that the thread's later collections count. An
        // entry of another process is a reused thread id's leftover.
        crate::common::bump(ctx, if previous == tgid { Stat::GcUnended } else { Stat::GcUnmatched });
    }
    let running = GcRunning { start_ns, tgid, generation, reserved: 0 };
    GC_RUNNING.insert(tid, running, 0).map_err(|_| Stat::GcFull)
}

#[inline(always)]
fn try_gc_done(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = crate::common::check_target()?;
    let done_ns = now_ns();
    let tid = thread_id();
    let entry = GC_RUNNING.get_ptr(tid).ok_or(Stat::GcUnmatched)?;
    // SAFETY: as in try_gc_start.
    let running: GcRunning = unsafe { core::ptr::read_volatile(entry) };
    if running.tgid != tgid {
        let _ = GC_RUNNING.remove(tid);
        return Err(Stat::GcUnmatched);
    }
    let _ = GC_RUNNING.remove(tid);
    let key = GcKey { tgid, generation: running.generation };
    let totals = match GC_TOTALS.get_ptr_mut(key) {
        Some(totals) => totals,
        None => {
            // As in slot_of: insert a zero, then add to whatever is there.
            let _ = GC_TOTALS.insert(key, GcTotals::default(), u64::from(BPF_NOEXIST));
            GC_TOTALS.get_ptr_mut(key).ok_or(Stat::GcFull)?
        }
    };
    // SAFETY: the map returned a valid, aligned pointer to this CPU's
    // value, valid while the program runs; the adds are atomic because a
    // preempted program on this CPU may be updating the same value. The
    // collection is counted before its objects are read, so that a failed
    // read loses the objects, never the collection.
    unsafe {
        crate::common::atomic_add(&raw mut (*totals).collections, 1);
        crate::common::atomic_add(&raw mut (*totals).duration_ns, done_ns.saturating_sub(running.start_ns));
    }
    let collected = u64::try_from(argument(ctx.regs, cookie_of(ctx))?).map_err(|_| Stat::GcArgMissing)?;
    // SAFETY: as above.
    unsafe { crate::common::atomic_add(&raw mut (*totals).collected, collected) };
    Ok(())
}

#[inline(always)]
fn cookie_of(ctx: &ProbeContext) -> u64 {
    // SAFETY: as in try_gc_start.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// The probe's argument, where `cookie` says: a register of the probed
/// thread, a constant, or memory at a register plus an offset, cut to its
/// width and sign-extended if it is signed.
#[inline(always)]
fn argument(regs: *mut pt_regs, cookie: u64) -> Result<i64, Stat> {
    let (size, signed) = gc::arg_width(cookie);
    let constant = site::constant(cookie);
    let raw = match site::first(cookie) {
        site::CONSTANT => return Ok(if signed { site::offset(constant) } else { constant.cast_signed() }),
        kind @ site::MEMORY_FIRST..=site::MEMORY_LAST => {
            let base = crate::args::register(regs, kind - site::MEMORY).map_err(|_| Stat::GcArgMissing)?;
            let address = base.wrapping_add(site::offset(constant).cast_unsigned());
            // Exactly the argument's bytes: the next ones may not be mapped.
            // SAFETY: the helper reads the probed thread's memory and fails
            // (counted) rather than fault where it is not mapped.
            let read = unsafe {
                match size {
                    1 => bpf_probe_read_user(address as *const u8).map(u64::from),
                    2 => bpf_probe_read_user(address as *const u16).map(u64::from),
                    4 => bpf_probe_read_user(address as *const u32).map(u64::from),
                    _ => bpf_probe_read_user(address as *const u64),
                }
            };
            read.map_err(|_| Stat::GcArgMissing)?
        }
        kind => crate::args::register(regs, kind).map_err(|_| Stat::GcArgMissing)?,
    };
    Ok(gc::narrow(raw, size, signed))
}
