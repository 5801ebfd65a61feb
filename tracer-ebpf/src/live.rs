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
        ALIGNMENT_SHIFT, LiveCounts, LiveEntry, LiveKey, POOL_FREEBLOCK, POOL_NEXTPOOL, POOL_SIZE, POOL_SZIDX, Pymalloc, SMALL_REQUEST, kind,
        Role,
    },
    sizes::DEFAULT_SLOTS,
    stack::why,
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

/// Per probe slot, its [`Role`]; the loader fills it.
#[map]
static SLOT_LIVE: Array<Role> = Array::with_max_entries(DEFAULT_SLOTS, 0);

pub use tracer_common::live::UNKNOWN_BLOCK;

/// Whether probe slot `slot` is a realloc's, with `--live`.
#[inline(always)]
pub fn reallocates(slot: u32) -> bool {
    role_of(slot).api() == Role::REALLOC
}

/// Probe slot `slot`'s role ([`Role::NONE`] past the loader's slots).
#[inline(always)]
fn role_of(slot: u32) -> Role {
    SLOT_LIVE.get(slot).copied().unwrap_or(Role::NONE)
}

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
    let r = role_of(slot).api();
    let arg = |n: usize| ctx.arg::<u64>(n).ok_or(Stat::ArgMissing);
    let (size, block) = match r {
        Role::MALLOC => (arg(0)?, 0),
        Role::CALLOC => (product(arg(0)?, arg(1)?), 0),
        Role::REALLOC => (arg(1)?, arg(0)?),
        Role::FREE => (0, arg(0)?),
        _ => return Ok(()),
    };
    api(ctx.regs, slot, size, block)?;
    adopt(slot);
    Ok(())
}

/// `n * e`, saturated: BPF has no 128-bit multiply (as in try_record).
#[inline(always)]
fn product(n: u64, e: u64) -> u64 {
    if (n | e) >> 32 != 0 && e != 0 && n > core::hint::black_box(u64::MAX) / e { u64::MAX } else { n.wrapping_mul(e) }
}

/// An API call of slot `slot` (at its entry or at an inlined copy), with
/// its requested `size` (an allocation's; 0: unknown) or the `block` it
/// frees or reallocates (a free's or a realloc's; [`UNKNOWN_BLOCK`]:
/// unknown, and a free's 0 is nothing to take; a plain value, not an
/// `Option`, whose undefined payload the verifier refuses once spilled):
/// pushes its
/// frame, for the implementation it calls. A free takes its block out of
/// the table at once. An allocation that pymalloc serves inline puts the
/// block it will get in the table at once ([`predict`]). An API frame
/// already on top is stale: its call ran an inlined allocator and called
/// none (LTO's devirtualised pymalloc); its block is unseen, which is
/// counted, unless it was taken or predicted. A moving realloc's frame on
/// top freed its old block inline, which is taken out now where it is
/// known.
#[inline(always)]
pub fn api(regs: *mut pt_regs, slot: u32, size: u64, block: u64) -> Result<(), Stat> {
    let role = role_of(slot);
    let r = role.api();
    let domain = match r {
        Role::MALLOC | Role::CALLOC | Role::REALLOC => crate::SLOT_DOMAINS.get(slot).copied().unwrap_or(0),
        Role::FREE => role.domain(),
        _ => return Ok(()),
    };
    let (tgid, tid) = ids();
    // SAFETY: regs is the context the kernel passed, readable directly.
    let sp = unsafe { (*regs).rsp };
    let mut frame = Frame { size, sp, domain, slot, kind: kind::API, role: r, ..Frame::default() };
    if r == Role::REALLOC {
        frame.old = block;
    }
    let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
    // SAFETY: a valid pointer to the value, which only this thread (so
    // only this program run) uses.
    let frames = unsafe { &mut *frames };
    let top = usize::try_from(frames.depth).unwrap_or(0).wrapping_sub(1);
    let mut continued = false;
    if let Some(last) = frames.frames.get_mut(top)
        && matches!(last.kind, kind::API | kind::MOVED)
    {
        if continues(last, &frame, block) {
            // The outer call's allocator, inlined, passes it on to this
            // domain's (pymalloc's requests over 512 bytes, a block it
            // does not own): the same call, in the outer one's domain.
            continued = true;
            frame.domain = last.domain;
            frame.slot = last.slot;
            frame.stack = last.stack;
            frame.old = if r == Role::FREE { last.old } else { frame.old };
        } else {
            unseen(tgid, *last);
        }
        frames.depth -= 1;
    }
    if r == Role::FREE && frame.old == 0 && block != 0 && block != UNKNOWN_BLOCK {
        take(tgid, block, frame.domain);
        frame.old = block;
    }
    if !continued {
        frame.predicted = match r {
            Role::MALLOC | Role::CALLOC => predict(tgid, &frame),
            Role::REALLOC => predict_realloc(tgid, &frame),
            _ => 0,
        };
    }
    push(frames, frame)
}

/// With `--live` on a build that inlines pymalloc: what pymalloc's
/// inline `pymalloc_realloc` (Objects/obmalloc.c, v3.11.0 to v3.14.0)
/// does with `frame`'s tracked block of its own and new size. A block
/// whose size class still fits the size, shrinking by no more than a
/// quarter, stays: the table gets its new size now, and it is the
/// prediction. Else the block moves to the one a malloc of the new size
/// gets ([`predict`]), put in the table now; the old one goes when the
/// frame is found stale, or with the free implementation it calls. A
/// realloc of NULL is a malloc. 0: nothing predicted (an untracked block,
/// one pymalloc does not own, a move to a block over 512 bytes or to a
/// new pool, where the implementations it calls give the block).
#[inline(always)]
fn predict_realloc(tgid: u32, frame: &Frame) -> u64 {
    let Some(p) = PYMALLOC.get(0) else { return 0 };
    let old = frame.old;
    // The table is set whole (`PyMem_SetAllocator`): holding pymalloc's
    // realloc, it holds its malloc too, which a move or a realloc of NULL
    // runs.
    if p.usedpools == 0
        || p.realloc == 0
        || old == UNKNOWN_BLOCK
        || frame.size == 0
        || frame.domain > 1
        || !holds(p, frame.domain, 24, p.realloc)
    {
        return 0;
    }
    // A realloc of NULL is a malloc (`_PyObject_Realloc`).
    let malloc = Frame { role: Role::MALLOC, ..*frame };
    if old == 0 {
        return predict_pool(tgid, p, &malloc);
    }
    let key = LiveKey { tgid, reserved: 0, address: old };
    let Some(entry) = LIVE.get_ptr_mut(&key) else { return 0 };
    // SAFETY: a valid pointer to the entry, which only this thread's calls
    // write (the GIL serialises the allocator).
    let was = unsafe { *entry };
    // Only pymalloc serves a request of 1 to 512 bytes in these domains.
    if was.size == 0 || was.size > SMALL_REQUEST || was.domain != frame.domain {
        return 0;
    }
    // SAFETY: the helper reads the probed thread's memory and fails rather
    // than fault: the block's pool header, which pymalloc reads.
    let Ok(szidx) = (unsafe { bpf_probe_read_user(((old & !(POOL_SIZE - 1)) + POOL_SZIDX) as *const u32) }) else {
        return 0;
    };
    let class = (u64::from(szidx) + 1) << ALIGNMENT_SHIFT;
    if frame.size <= class && 4 * frame.size > 3 * class {
        // SAFETY: as above.
        let time_ns = unsafe { bpf_ktime_get_ns() };
        // SAFETY: as above.
        unsafe {
            *entry = LiveEntry { size: frame.size, time_ns, stack: frame.stack, domain: frame.domain, slot: frame.slot };
        }
        // As a realloc implementation's return counts it: the old block
        // freed, the new one tracked.
        add(frame.domain, field!(bytes), frame.size.wrapping_sub(was.size));
        add(frame.domain, field!(tracked), 1);
        add(frame.domain, field!(freed), 1);
        return old;
    }
    predict_pool(tgid, p, &malloc)
}

/// Whether the raw-domain API call `call` (freeing or reallocating
/// `block`, where known) is the one `last`, an unserved object- or
/// mem-domain API call on top of its thread's stack, passes on: pymalloc,
/// inlined into its caller (LTO), passes a request over 512 bytes or of 0
/// (which it never serves), and a free or realloc of a block it does not
/// own, to the raw domain's API, also inlined, with the same role, size
/// (or block) and stack frame. A size or block either probe does not know
/// is no match: a stale call of unknown size is not taken for the one
/// that goes on.
#[inline(always)]
fn continues(last: &Frame, call: &Frame, block: u64) -> bool {
    let raw = tracer_common::sizes::Domain::Raw as u32;
    if last.kind != kind::API
        || call.domain != raw
        || last.domain >= raw
        || last.role != call.role
        || last.predicted != 0
        || last.sp.abs_diff(call.sp) > API_FRAME_ROOM
    {
        return false;
    }
    match call.role {
        Role::MALLOC | Role::CALLOC => last.size == call.size,
        Role::REALLOC => last.size == call.size && block != UNKNOWN_BLOCK && block == last.old,
        Role::FREE => block != 0 && block != UNKNOWN_BLOCK && block == last.old,
        _ => false,
    }
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
    let (field, function) = if frame.role == Role::CALLOC { (16, p.calloc) } else { (8, p.malloc) };
    if p.usedpools == 0 || frame.domain > 1 || !holds(p, frame.domain, field, function) {
        return 0;
    }
    predict_pool(tgid, p, frame)
}

/// Whether domain `domain`'s allocator table holds pymalloc's `function`
/// at byte `field`, as the inlined code checks before it runs pymalloc
/// (`PYTHONMALLOC=debug` puts the debug hooks there, which are probed as
/// implementations). A table whose address is not known is taken to.
#[inline(always)]
fn holds(p: &Pymalloc, domain: u32, field: u64, function: u64) -> bool {
    let table = p.tables.get(domain as usize).copied().unwrap_or(0);
    // SAFETY: the helper reads the probed thread's memory and fails
    // rather than fault.
    table == 0 || unsafe { bpf_probe_read_user((table + field) as *const u64) } == Ok(function)
}

/// [`predict`] once the domain's table is known to hold pymalloc.
#[inline(always)]
fn predict_pool(tgid: u32, p: &Pymalloc, frame: &Frame) -> u64 {
    if frame.size == 0 || frame.size > SMALL_REQUEST {
        return 0;
    }
    let class = (frame.size - 1) >> ALIGNMENT_SHIFT;
    // SAFETY: the helper reads the probed thread's memory and fails rather
    // than fault.
    let Ok(pool) = (unsafe { bpf_probe_read_user((p.usedpools + 16 * class) as *const u64) }) else { return 0 };
    // SAFETY: as above: the pool header's first three words.
    let Ok(head) = (unsafe { bpf_probe_read_user(pool as *const [u64; 3]) }) else { return 0 };
    let (freeblock, nextpool) =
        (head[(POOL_FREEBLOCK / 8) as usize], head[(POOL_NEXTPOOL / 8) as usize]);
    if nextpool == pool || freeblock == 0 {
        // No used pool of its class: `allocate_from_new_pool` gives it.
        return 0;
    }
    // Its walk comes after this entry, in the same program or at the
    // counting probe's, and gives the block its site (`give_walk`): only
    // a block the table had no room for is no prediction.
    if matches!(put(tgid, freeblock, frame), Err(Stat::LiveFull)) {
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

/// A stale API call: its block is not in the table. A moving realloc
/// freed its old block inline: out it goes, where it is known.
#[inline(always)]
fn unseen(tgid: u32, frame: Frame) {
    if frame.kind == kind::MOVED {
        if frame.old == UNKNOWN_BLOCK {
            add(frame.domain, field!(unseen_frees), 1);
        } else {
            take(tgid, frame.old, frame.domain);
        }
    } else if frame.role == Role::REALLOC && frame.predicted != 0 {
        // Predicted: a block that stays, or one that moved, freeing the
        // old one inline.
        if frame.predicted != frame.old && frame.old != 0 {
            take(tgid, frame.old, frame.domain);
        }
    } else if frame.role == Role::FREE {
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
    let r = role_of(slot).kind();
    // The implementation's arguments follow the allocator's context.
    let arg = |n: usize| ctx.arg::<u64>(n).ok_or(Stat::ArgMissing);
    let (size, old) = match r {
        Role::MALLOC => (arg(1)?, 0),
        Role::CALLOC => (product(arg(1)?, arg(2)?), 0),
        Role::REALLOC => (arg(2)?, arg(1)?),
        Role::FREE => (0, arg(1)?),
        // Its argument is a size class: the size is the API call's.
        Role::POOL => (0, 0),
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
    } else if serves(&api, r, old) && api.sp.abs_diff(sp) <= API_FRAME_ROOM {
        frame.kind = kind::OUTER;
        frame.domain = api.domain;
        frame.slot = api.slot;
        frame.stack = api.stack;
        if r == Role::POOL {
            frame.size = api.size;
        }
        // The block it returns replaces the one predicted. A realloc
        // predicted to stay has its new size already, and the block's
        // return counts it again: as one realloc, once.
        if api.kind == kind::API && api.predicted != 0 {
            if api.predicted != api.old {
                unpredict(tgid, &api);
            } else if r == Role::REALLOC {
                add(api.domain, field!(tracked), u64::MAX);
                add(api.domain, field!(freed), u64::MAX);
            }
        }
        // A free whose API call knew its block took it already; a moving
        // realloc's old block is still in.
        if r == Role::FREE && old != 0 && (api.old == 0 || api.kind == kind::MOVED) {
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

/// Whether an implementation of role `implementation` (freeing `old`)
/// serves the API call `api` on top of its thread's stack: one of its own
/// role, a malloc for a realloc (pymalloc's realloc of NULL or of a block
/// it moves calls `_PyObject_Malloc`), or a new pool for an allocation;
/// after a moving realloc's malloc, the free of its old block.
#[inline(always)]
fn serves(api: &Frame, implementation: Role, old: u64) -> bool {
    match api.kind {
        kind::API => {
            api.role == implementation
                || (api.role == Role::REALLOC && implementation == Role::MALLOC)
                || (implementation == Role::POOL && matches!(api.role, Role::MALLOC | Role::CALLOC | Role::REALLOC))
        }
        kind::MOVED => implementation == Role::FREE && (api.old == UNKNOWN_BLOCK || api.old == old),
        _ => false,
    }
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
        if f.sp == sp && matches!(f.kind, kind::OUTER | kind::NESTED | kind::ORPHAN | kind::NATIVE | kind::NATIVE_NESTED)
        {
            found = Some((i, *f));
        }
    }
    let (at, frame) = found.ok_or(Stat::LiveUnmatched)?;
    // The API call that called it ends with it (a libc call has none),
    // but for a realloc that allocated a new block: it frees the old one
    // next.
    let native = matches!(frame.kind, kind::NATIVE | kind::NATIVE_NESTED);
    let mut below = false;
    if !native && let Some(api) = frames.frames.get_mut(at.wrapping_sub(1)) {
        // (A realloc of NULL is a malloc, and frees nothing.)
        if api.kind == kind::API
            && api.role == Role::REALLOC
            && api.old != 0
            && frame.kind == kind::OUTER
            && matches!(frame.role, Role::MALLOC | Role::POOL)
            && address != 0
        {
            // Its new block is the one returned, whatever was predicted.
            api.kind = kind::MOVED;
            api.predicted = 0;
        } else {
            below = matches!(api.kind, kind::API | kind::MOVED);
        }
    }
    frames.depth = (at - usize::from(below)) as u64;
    match frame.kind {
        kind::NESTED | kind::NATIVE_NESTED => {
            add(frame.domain, field!(nested), 1);
            return Ok(());
        }
        kind::OUTER | kind::NATIVE => {}
        _ => return Ok(()),
    }
    let (address, frame) = if native { native_result(frame, address)? } else { (address, frame) };
    if frame.role == Role::FREE || address == 0 {
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
    // A walk expected and not come: the block is kept without its site.
    let no_stack = frame.stack == why::NOT_WALKED && crate::stacks_at(frame.slot);
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
    if no_stack {
        return Err(Stat::LiveNoStack);
    }
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

/// A walk that came before its API call's frame (an entry probe placed at
/// the call sites, or run before `live_alloc` at the same address), left
/// for that frame.
#[derive(Clone, Copy)]
#[repr(C)]
struct Walked {
    stack: u64,
    slot: u32,
    reserved: u32,
}

/// Per thread, the walk of its last API call not yet on a frame.
#[map]
static WALKED: LruHashMap<u32, Walked> = LruHashMap::with_max_entries(FRAME_THREADS, 0);

/// With `--stacks`, the walk of an event of slot `slot` (its stack's hash,
/// or a [`why`] value): the API call's frame on top of the thread's stack
/// takes it, or, where the walk comes first, [`adopt`] does.
#[inline(always)]
pub fn walked(slot: u32, stack: u64) {
    // Only an API call's frame takes it (a libc call's entry takes its
    // own walk).
    let r = role_of(slot);
    if r.is_none() || r.is_native() || r.is_implementation() {
        return;
    }
    let (_, tid) = ids();
    if give_walk(tid, slot, stack, true) {
        return;
    }
    // A thread pushed out of the LRU map loses only a site, which
    // `live_no_stack` counts where its block is put in the table.
    let _ = WALKED.insert(&tid, &Walked { stack, slot, reserved: 0 }, u64::from(BPF_ANY));
}

/// Gives the block at `address` in the table its call's walk.
#[inline(always)]
fn set_stack(address: u64, stack: u64) {
    let (tgid, _) = ids();
    let key = LiveKey { tgid, reserved: 0, address };
    if let Some(entry) = LIVE.get_ptr_mut(&key) {
        // SAFETY: a valid pointer to the entry, which only this thread's
        // calls write (the GIL serialises the allocator).
        unsafe { (*entry).stack = stack };
    }
}

/// At an out-of-line API call's entry, after its frame is pushed: takes
/// the walk its event left before it.
#[inline(always)]
fn adopt(slot: u32) {
    if !crate::stacks_at(slot) {
        return;
    }
    let (_, tid) = ids();
    // SAFETY: a copy is taken at once.
    let Some(w) = (unsafe { WALKED.get(&tid) }).copied() else { return };
    if w.slot != slot {
        return;
    }
    let _ = WALKED.remove(&tid);
    give_walk(tid, slot, w.stack, false);
}

/// Gives the walk `stack` to thread `tid`'s API call of slot `slot` on top
/// of its stack (`unwalked`: only if it has none yet), and to the block
/// predicted at its entry, which is in the table already; whether there
/// was such a call.
#[inline(always)]
fn give_walk(tid: u32, slot: u32, stack: u64, unwalked: bool) -> bool {
    let Some(frames) = FRAMES.get_ptr_mut(&tid) else { return false };
    // SAFETY: a valid pointer to the value, which only this thread uses.
    let frames = unsafe { &mut *frames };
    let top = usize::try_from(frames.depth).unwrap_or(0).wrapping_sub(1);
    let Some(last) = frames.frames.get_mut(top) else { return false };
    if last.kind != kind::API || last.slot != slot || (unwalked && last.stack != why::NOT_WALKED) {
        return false;
    }
    last.stack = stack;
    if last.predicted != 0 {
        set_stack(last.predicted, stack);
    }
    true
}

/// With `--native`, at the entry of libc's allocator function of slot
/// `slot` (`marked`: a call site inside another one marked it nested):
/// pushes its frame, whose return gives the block (or ends a free's call),
/// and takes a freed block out now. A call inside another allocator call
/// (an enclosing frame, above on the stack, or an interpreter's
/// implementation at the same stack pointer, which jumped to it), or
/// marked, is nested: its
/// block is the outer call's. A marked entry at the stack pointer of the
/// frame on top is a jump into it: the same call, re-entered from its own
/// code (pushes nothing), or a tail call from another function, whose
/// return comes first (a nested frame), then the outer's at the same
/// stack pointer. `stack` is the call's walk (see [`walked`]).
#[inline(always)]
pub fn native(ctx: &ProbeContext, tgid: u32, slot: u32, marked: bool, stack: u64) -> Result<(), Stat> {
    let role = role_of(slot);
    if !role.is_native() {
        return Ok(());
    }
    let r = role.kind();
    // The ABI's first three arguments and the stack pointer, each read at
    // its own constant offset: the verifier refuses a context pointer
    // moved by a computed one, which arguments picked per role become.
    let regs = ctx.regs;
    // SAFETY: regs is the context the kernel passed, readable directly.
    let (a0, a1, a2, sp) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*regs).rdi),
            core::ptr::read_volatile(&raw const (*regs).rsi),
            core::ptr::read_volatile(&raw const (*regs).rdx),
            core::ptr::read_volatile(&raw const (*regs).rsp),
        )
    };
    let (_, tid) = ids();
    let mut inside = marked;
    let mut top = Frame::default();
    if let Some(frames) = FRAMES.get_ptr_mut(&tid) {
        // SAFETY: a valid pointer to the value, which only this thread uses.
        let frames = unsafe { &mut *frames };
        let depth = usize::try_from(frames.depth).unwrap_or(0).min(FRAME_DEPTH);
        for f in frames.frames.iter().take(depth) {
            // An interpreter's implementation may jump to libc's function
            // (`_PyMem_RawMalloc` to `malloc`): at its own stack pointer,
            // it encloses the call too.
            let python = matches!(f.kind, kind::OUTER | kind::NESTED) && f.sp >= sp;
            inside |= python || (matches!(f.kind, kind::NATIVE | kind::NATIVE_NESTED) && f.sp > sp);
        }
        top = frames.frames.get(depth.wrapping_sub(1)).copied().unwrap_or_default();
        if matches!(top.kind, kind::NATIVE | kind::NATIVE_NESTED) && top.sp == sp && !marked {
            // A call at the stack pointer of one whose return was lost
            // (an unwind): that one is over.
            frames.depth = depth.wrapping_sub(1) as u64;
            top = Frame::default();
        }
    }
    let jumped = marked && top.sp == sp && matches!(top.kind, kind::NATIVE | kind::NATIVE_NESTED);
    if jumped && top.slot == slot {
        return Ok(());
    }
    inside |= jumped;
    let (size, mut old) = match r {
        Role::MALLOC => (a0, 0),
        Role::CALLOC => {
            let (n, e) = (a0, a1);
            // As in try_record: BPF has no 128-bit multiply.
            if (n | e) >> 32 != 0 && e != 0 && n > core::hint::black_box(u64::MAX) / e {
                (u64::MAX, 0)
            } else {
                (n.wrapping_mul(e), 0)
            }
        }
        Role::REALLOC => (a1, a0),
        Role::ALIGNED | Role::MMAP => (a1, 0),
        // `old` is where the block will be written.
        Role::MEMALIGN => (a2, a0),
        Role::FREE | Role::MUNMAP => (0, a0),
        _ => return Ok(()),
    };
    if !inside && top.kind == kind::API && top.sp.abs_diff(sp) <= API_FRAME_ROOM && implements(&top, r, size, old) {
        // The API call's own allocator, inlined into its caller (LTO),
        // calls libc directly: this call is its implementation, and its
        // block is the API call's domain's.
        if r == Role::FREE && top.old == 0 {
            take(tgid, old, top.domain);
        }
        let old = if r == Role::REALLOC { old } else { 0 };
        // The raw allocator asks libc for 1 byte where it was asked for 0.
        let size = if top.size == 0 && size == 1 { 0 } else { size };
        let frame = Frame { size, old, stack: top.stack, sp, domain: top.domain, slot: top.slot, kind: kind::OUTER, role: r, ..Frame::default() };
        let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
        // SAFETY: a valid pointer to the value, which only this thread uses.
        return push(unsafe { &mut *frames }, frame);
    }
    let domain = tracer_common::sizes::Domain::Native as u32;
    if !inside && old != 0 && (matches!(r, Role::FREE | Role::MUNMAP) || (r == Role::REALLOC && size == 0)) {
        // glibc's realloc(p, 0) frees p and returns NULL.
        take(tgid, old, domain);
        old = 0;
    }
    let kind = if inside { kind::NATIVE_NESTED } else { kind::NATIVE };
    let frame = Frame { size, old, stack, sp, domain, slot, kind, role: r, ..Frame::default() };
    let frames = frames_of(tid).ok_or(Stat::LivePendingFull)?;
    // SAFETY: a valid pointer to the value, which only this thread uses.
    push(unsafe { &mut *frames }, frame)
}

/// Whether a libc call of role `r` (requesting `size`, or freeing or
/// moving `old`) is what the API call `api`, on top of its thread's stack
/// and unserved, runs: an API call whose allocator is inlined into its
/// caller (LTO) and passes its request on to libc (pymalloc's requests
/// over 512 bytes, the raw domain's every call) calls libc's function of
/// its own role with its own size (a request of 0 the raw allocator makes
/// 1; a call of unknown size is never taken for another's) or block,
/// or a realloc that moves a pymalloc block (or has none) libc's `malloc`.
/// An allocation pymalloc served inline ([`predict`]) calls nothing.
#[inline(always)]
fn implements(api: &Frame, r: Role, size: u64, old: u64) -> bool {
    match r {
        Role::MALLOC | Role::CALLOC => {
            (api.role == r || (api.role == Role::REALLOC && r == Role::MALLOC))
                && api.predicted == 0
                && (api.size == size || (api.size == 0 && size == 1))
        }
        Role::REALLOC => {
            api.role == r
                && (api.size == size || (api.size == 0 && size == 1))
                && (api.old == UNKNOWN_BLOCK || api.old == old)
        }
        Role::FREE => api.role == Role::FREE && old != 0 && (api.old == 0 || api.old == old),
        _ => false,
    }
}

/// A libc call's block from its return value: `mmap`'s `MAP_FAILED` is
/// none, and `posix_memalign`'s is at the pointer its entry saved, where
/// it returned 0.
#[inline(always)]
fn native_result(frame: Frame, rax: u64) -> Result<(u64, Frame), Stat> {
    match frame.role {
        Role::MMAP if rax == u64::MAX => Ok((0, frame)),
        // Took its block at its entry.
        Role::FREE | Role::MUNMAP => Ok((0, frame)),
        Role::MEMALIGN => {
            let at = frame.old;
            let frame = Frame { old: 0, ..frame };
            // An int: the upper half of rax is not the result's.
            if rax & 0xffff_ffff != 0 {
                return Ok((0, frame));
            }
            // SAFETY: the helper reads the probed thread's memory and fails
            // (counted) rather than fault.
            let block = unsafe { aya_ebpf::helpers::bpf_probe_read_user(at as *const u64) }
                .map_err(|_| Stat::ArgMissing)?;
            Ok((block, frame))
        }
        _ => Ok((rax, frame)),
    }
}
