//! Live memory (`--live`, see [`tracer_common::live`]): an allocator API
//! call (`live_alloc`, `live_free` at an out-of-line API function's
//! entry, [`api`] at its inlined copies) leaves its domain on its
//! thread's frame stack; the implementation it calls (`live_impl` at its
//! entry) takes it, a free's takes its block out of [`LIVE`], and an
//! allocation's return (`live_ret` at a `ret`, `live_ret_uret`) puts the
//! block in. Every block put in or taken out moves its domain's count and
//! bytes in [`LIVE_COUNTS`]; nothing goes to userspace per event.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_ANY, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_ktime_get_ns},
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    live::{
        API_FRAME_ROOM, DEFAULT_LIVE_ENTRIES, DOMAIN_SLOTS, FRAME_DEPTH, FRAME_THREADS, Frame, Frames,
        ALIGNMENT_SHIFT, LiveCounts, LiveEntry, LiveKey, POOL_FREEBLOCK, POOL_NEXTPOOL, Pymalloc, SMALL_REQUEST, kind,
        role,
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

/// Each thread's calls in flight.
#[map]
static FRAMES: LruHashMap<u32, Frames> = LruHashMap::with_max_entries(FRAME_THREADS, 0);

/// One empty [`Frames`], never written: the first value of a thread's
/// stack.
#[map]
static EMPTY_FRAMES: Array<Frames> = Array::with_max_entries(1, 0);

/// Per domain, what the table did.
#[map]
static LIVE_COUNTS: PerCpuArray<LiveCounts> = PerCpuArray::with_max_entries(DOMAIN_SLOTS, 0);

/// Where the target's pymalloc state is, for [`predict`]; the loader
/// fills it on builds that inline the allocator API.
#[map]
static PYMALLOC: Array<Pymalloc> = Array::with_max_entries(1, 0);

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

/// At an allocating API function's entry (out of line): leaves the call's
/// domain and size for the implementation it calls.
#[uprobe]
pub fn live_alloc(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_api_entry(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

/// At a free's entry (out of line): takes its block out of the table.
#[uprobe]
pub fn live_free(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_api_entry(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_api_entry(ctx: &ProbeContext) -> Result<(), Stat> {
    crate::check_target()?;
    // SAFETY: the helper reads this run's cookie.
    let slot = u32::try_from(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).map_err(|_| Stat::SlotOutOfRange)?;
    let r = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE) & 0xff;
    let arg = |n: usize| ctx.arg::<u64>(n).ok_or(Stat::ArgMissing);
    let (size, block) = match r {
        role::MALLOC => (arg(0)?, 0),
        role::CALLOC => (product(arg(0)?, arg(1)?), 0),
        role::REALLOC => (arg(1)?, 0),
        role::FREE => (0, arg(0)?),
        _ => return Ok(()),
    };
    api(ctx.regs, slot, size, block)
}

/// `n * e`, saturated: BPF has no 128-bit multiply (as in try_record).
#[inline(always)]
fn product(n: u64, e: u64) -> u64 {
    if (n | e) >> 32 != 0 && e != 0 && n > core::hint::black_box(u64::MAX) / e { u64::MAX } else { n.wrapping_mul(e) }
}

/// An API call of slot `slot` (at its entry or at an inlined copy), with
/// its requested `size` (an allocation's; 0: unknown) or the `block` it
/// frees (a free's; 0: unknown): pushes its frame, for the implementation
/// it calls. A free takes its block out of the table at once. An
/// allocation that pymalloc serves inline puts the block it will get in
/// the table at once ([`predict`]). An API frame already on top is stale:
/// its call ran an inlined allocator and called none (LTO's devirtualised
/// pymalloc); its block is unseen, which is counted, unless it was taken
/// or predicted.
#[inline(always)]
pub fn api(regs: *mut pt_regs, slot: u32, size: u64, block: u64) -> Result<(), Stat> {
    let kind_of = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE);
    let r = kind_of & 0xff;
    let domain = match r {
        role::MALLOC | role::CALLOC | role::REALLOC => crate::SLOT_DOMAINS.get(slot).copied().unwrap_or(0),
        role::FREE => kind_of >> 8,
        _ => return Ok(()),
    };
    let (tgid, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let sp = unsafe { (*regs).rsp };
    let mut frame = Frame { size, sp, domain, slot, kind: kind::API, role: r, ..Frame::default() };
    if r == role::FREE && block != 0 {
        take(tgid, block, domain);
        frame.old = block;
    }
    let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
    // SAFETY: a valid pointer to the value, which only this thread (so
    // only this program run) uses.
    let frames = unsafe { &mut *frames };
    let top = usize::try_from(frames.depth).unwrap_or(0).wrapping_sub(1);
    if let Some(last) = frames.frames.get_mut(top)
        && last.kind == kind::API
    {
        unseen(*last);
        frames.depth -= 1;
    }
    if matches!(r, role::MALLOC | role::CALLOC) {
        frame.predicted = predict(tgid, &frame);
    }
    push(frames, frame)
}

/// With `--live` on a build that inlines pymalloc: the block pymalloc's
/// inline fast path hands an allocation of `frame`'s size and domain,
/// put in the table now (0: none predicted; the implementation it calls
/// then gives it, or it is unseen). An allocation's code reads the same
/// words in the same order right after this entry, and nothing else runs
/// pymalloc in between: the GIL is held, and the thread is stopped here.
#[inline(always)]
fn predict(tgid: u32, frame: &Frame) -> u64 {
    let Some(p) = PYMALLOC.get(0) else { return 0 };
    if p.usedpools == 0 || frame.size == 0 || frame.size > SMALL_REQUEST || frame.domain > 1 {
        return 0;
    }
    // The domain's table must hold pymalloc's function, as the inlined
    // code checks before it runs pymalloc (`PYTHONMALLOC=debug` puts the
    // debug hooks there, which are probed as implementations).
    let table = p.tables.get(frame.domain as usize).copied().unwrap_or(0);
    let (field, function) = if frame.role == role::CALLOC { (16, p.calloc) } else { (8, p.malloc) };
    if table != 0 {
        // SAFETY: the helper reads the probed thread's memory and fails
        // rather than fault.
        match unsafe { bpf_probe_read_user((table + field) as *const u64) } {
            Ok(f) if f == function => {}
            _ => return 0,
        }
    }
    let class = (frame.size - 1) >> ALIGNMENT_SHIFT;
    // SAFETY: as above.
    let Ok(pool) = (unsafe { bpf_probe_read_user((p.usedpools + 16 * class) as *const u64) }) else { return 0 };
    // SAFETY: as above: the pool header's first three words.
    let Ok(head) = (unsafe { bpf_probe_read_user(pool as *const [u64; 3]) }) else { return 0 };
    let (freeblock, nextpool) =
        (head[(POOL_FREEBLOCK / 8) as usize], head[(POOL_NEXTPOOL / 8) as usize]);
    if nextpool == pool || freeblock == 0 {
        // No used pool of its class: `allocate_from_new_pool` gives it.
        return 0;
    }
    if put(tgid, freeblock, frame).is_err() {
        return 0;
    }
    freeblock
}

/// Takes a predicted block back out of the table: the call went to an
/// implementation, whose return gives its block.
#[inline(always)]
fn unpredict(tgid: u32, frame: &Frame) {
    let key = LiveKey { tgid, reserved: 0, address: frame.predicted };
    if LIVE.remove(&key).is_ok() {
        add(frame.domain, field!(count), u64::MAX);
        add(frame.domain, field!(bytes), frame.size.wrapping_neg());
        add(frame.domain, field!(tracked), u64::MAX);
    }
}

/// This thread's calls in flight, an empty stack on its first call. The
/// empty value comes from a map, as a stack of frames does not fit in a
/// BPF program's stack beside the rest.
#[inline(always)]
fn frames_of(tid: u32) -> Option<*mut Frames> {
    if let Some(frames) = FRAMES.get_ptr_mut(&tid) {
        return Some(frames);
    }
    // SAFETY: a reference into a map value no program writes.
    let empty = unsafe { EMPTY_FRAMES.get(0) }?;
    let _ = FRAMES.insert(&tid, empty, u64::from(BPF_ANY));
    FRAMES.get_ptr_mut(&tid)
}

/// Pushes `frame`; a full stack loses its outermost call (one whose
/// return was never seen), which is counted.
#[inline(always)]
fn push(frames: &mut Frames, frame: Frame) -> Result<(), Stat> {
    let at = usize::try_from(frames.depth).unwrap_or(FRAME_DEPTH);
    if let Some(slot) = frames.frames.get_mut(at) {
        *slot = frame;
        frames.depth += 1;
        return Ok(());
    }
    frames.frames.copy_within(1.., 0);
    if let Some(last) = frames.frames.last_mut() {
        *last = frame;
    }
    frames.depth = FRAME_DEPTH as u64;
    Err(Stat::LivePendingFull)
}

/// A stale API call: its block is not in the table.
#[inline(always)]
fn unseen(frame: Frame) {
    if frame.role == role::FREE {
        if frame.old == 0 {
            add(frame.domain, field!(unseen_frees), 1);
        }
    } else if frame.predicted == 0 {
        add(frame.domain, field!(unseen_allocs), 1);
    }
}

/// At an allocator implementation's entry: pairs it with the API call on
/// top of its thread's stack (the outer call), or marks it nested or an
/// orphan; an outer free takes its block out now.
#[uprobe]
pub fn live_impl(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_live_impl(&ctx) {
        crate::bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_live_impl(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = crate::check_target()?;
    // SAFETY: the helper reads this run's cookie.
    let slot = u32::try_from(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).map_err(|_| Stat::SlotOutOfRange)?;
    let r = SLOT_LIVE.get(slot).copied().unwrap_or(role::NONE) & !role::IMPLEMENTATION & 0xff;
    // The implementation's arguments follow the allocator's context.
    let arg = |n: usize| ctx.arg::<u64>(n).ok_or(Stat::ArgMissing);
    let (size, old) = match r {
        role::MALLOC => (arg(1)?, 0),
        role::CALLOC => (product(arg(1)?, arg(2)?), 0),
        role::REALLOC => (arg(2)?, arg(1)?),
        role::FREE => (0, arg(1)?),
        // Its argument is a size class: the size is the API call's.
        role::POOL => (0, 0),
        _ => return Ok(()),
    };
    let (_, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let sp = unsafe { (*ctx.regs).rsp };
    let mut frame = Frame { size, old, sp, slot, kind: kind::ORPHAN, role: r, ..Frame::default() };
    let Some(frames) = frames_of(tid) else { return Err(Stat::LivePendingFull) };
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
    // Inside another implementation: an implementation frame below.
    let mut nested = false;
    for f in frames.frames.iter().take(depth) {
        nested |= matches!(f.kind, kind::OUTER | kind::NESTED);
    }
    let api = frames.frames.get(depth.wrapping_sub(1)).copied().unwrap_or_default();
    let mut result = Ok(());
    if nested {
        frame.kind = kind::NESTED;
        frame.domain = api.domain;
    } else if api.kind == kind::API && serves(api.role, r) && api.sp.abs_diff(sp) <= API_FRAME_ROOM {
        frame.kind = kind::OUTER;
        frame.domain = api.domain;
        frame.slot = api.slot;
        if r == role::POOL {
            frame.size = api.size;
        }
        // The block it returns replaces the one predicted.
        if api.predicted != 0 {
            unpredict(tgid, &api);
        }
        // A free whose API call knew its block took it already.
        if r == role::FREE && old != 0 && api.old == 0 {
            take(tgid, old, frame.domain);
        }
    } else {
        // Not called for this thread's last API call (or not from its
        // frame): its block has no domain, and is not tracked.
        result = Err(Stat::LiveUnmatched);
    }
    push(frames, frame)?;
    result
}

/// Whether an implementation of role `implementation` serves an API call
/// of role `api`: its own role, a malloc for a realloc (pymalloc's
/// realloc of NULL or of a block it moves calls `_PyObject_Malloc`), or a
/// new pool for an allocation.
#[inline(always)]
fn serves(api: u32, implementation: u32) -> bool {
    api == implementation
        || (api == role::REALLOC && implementation == role::MALLOC)
        || (implementation == role::POOL && matches!(api, role::MALLOC | role::CALLOC | role::REALLOC))
}

/// At an implementation's `ret`: the stack pointer is the entry's.
#[uprobe]
pub fn live_ret(ctx: ProbeContext) -> u32 {
    if let Err(stat) = returned(ctx.regs, 0) {
        crate::bump(&ctx, stat);
    }
    0
}

/// At an implementation's return, through a uretprobe: the return address
/// is popped, so the stack pointer is 8 above the entry's.
#[uretprobe]
pub fn live_ret_uret(ctx: RetProbeContext) -> u32 {
    if let Err(stat) = returned(ctx.regs, 8) {
        crate::bump(&ctx, stat);
    }
    0
}

/// An implementation returns: pops its frame (and the API call's under an
/// outer one); an outer allocation puts the block returned in `rax` in
/// the live table.
#[inline(always)]
fn returned(regs: *mut pt_regs, sp_delta: u64) -> Result<(), Stat> {
    let tgid = crate::check_target()?;
    let (_, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let (address, sp) = unsafe { ((*regs).rax, (*regs).rsp) };
    let sp = sp.wrapping_sub(sp_delta);
    let frames = FRAMES.get_ptr_mut(&tid).ok_or(Stat::LiveUnmatched)?;
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    // The innermost implementation frame at this stack pointer; any frame
    // above it is a call whose return was lost (an unwind), dropped.
    let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
    let mut found = None;
    for (i, f) in frames.frames.iter().enumerate().take(depth) {
        if f.sp == sp && matches!(f.kind, kind::OUTER | kind::NESTED | kind::ORPHAN) {
            found = Some((i, *f));
        }
    }
    let (at, frame) = found.ok_or(Stat::LiveUnmatched)?;
    // The API call that called it ends with it.
    let below = frames.frames.get(at.wrapping_sub(1)).is_some_and(|f| f.kind == kind::API);
    frames.depth = (at - usize::from(below)) as u64;
    match frame.kind {
        kind::NESTED => {
            add(frame.domain, field!(nested), 1);
            return Ok(());
        }
        kind::OUTER => {}
        _ => return Ok(()),
    }
    if frame.role == role::FREE || address == 0 {
        // A free took its block at its entry; a failed allocation is never
        // live, and a failed realloc keeps the old block.
        return Ok(());
    }
    if frame.old != 0 {
        take(tgid, frame.old, frame.domain);
    }
    put(tgid, address, &frame)
}

/// Puts `address`, allocated by `frame`'s call, in the live table.
#[inline(always)]
fn put(tgid: u32, address: u64, frame: &Frame) -> Result<(), Stat> {
    let live = LiveKey { tgid, reserved: 0, address };
    // SAFETY: the helper has no arguments.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    let entry = LiveEntry { size: frame.size, time_ns, stack: frame.stack, domain: frame.domain, slot: frame.slot };
    // A block already in the table was freed by a call the table did not
    // see (an inlined free): its old entry is replaced.
    // SAFETY: a copy is taken at once.
    if let Some(stale) = unsafe { LIVE.get(&live) }.copied() {
        add(stale.domain, field!(count), u64::MAX);
        add(stale.domain, field!(bytes), stale.size.wrapping_neg());
        add(stale.domain, field!(freed), 1);
    }
    if LIVE.insert(&live, &entry, u64::from(BPF_ANY)).is_err() {
        add(frame.domain, field!(dropped), 1);
        return Err(Stat::LiveFull);
    }
    add(frame.domain, field!(count), 1);
    add(frame.domain, field!(bytes), frame.size);
    add(frame.domain, field!(tracked), 1);
    Ok(())
}

/// Takes `address` out of the live table, for a free (or a realloc); a
/// block not there is counted as untracked, under `domain`, the freeing
/// family's.
#[inline(always)]
fn take(tgid: u32, address: u64, domain: u32) {
    let key = LiveKey { tgid, reserved: 0, address };
    // SAFETY: a copy is taken at once.
    if let Some(entry) = unsafe { LIVE.get(&key) }.copied()
        && LIVE.remove(&key).is_ok()
    {
        add(entry.domain, field!(count), u64::MAX);
        add(entry.domain, field!(bytes), entry.size.wrapping_neg());
        add(entry.domain, field!(freed), 1);
        return;
    }
    add(domain, field!(untracked_frees), 1);
}
