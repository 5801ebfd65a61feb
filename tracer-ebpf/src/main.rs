//! tracer's BPF side.
//!
//! Four counting programs, one per argument shape, serve every probed
//! function of CPython (and six more libc's allocator, with `--native`:
//! see [`native`]): the loader attaches the same program to many functions and
//! passes each one's counter slot as the BPF cookie. Two more read return
//! values (a uprobe on a return site and a uretprobe), and an empty one is
//! the floor `tracer bench` measures against. `count_site` serves inlined
//! copies, whose size the cookie locates, and `count_object` counts new
//! references by type (`--types`). A counting hit costs one map lookup and
//! two atomic adds (`count_object`: a read of the target's memory and a
//! second lookup); nothing is sent to userspace per event.
//!
//! With `--bpf-log`, the programs also log each probe's first hit in each
//! process and every miss, through aya-log. Its level global is 0 unless
//! that flag is given, which makes every log statement code the verifier
//! proves dead, so logging costs nothing while off.
#![no_std]
#![no_main]
// Inline asm is how a BPF program gets an atomic add: core has no atomic
// read-modify-write for this target.
#![feature(asm_experimental_arch)]

// Bench-only programs (`meta_insert`, `meta_lookup`, `meta_pool`,
// `meta_chunk`): the allocator-metadata experiment.
mod experiment;
// The GC programs (`gc_start`, `gc_done`): collections per generation, from
// CPython's markers or its collection function.
mod gc;
// Live memory (`live_alloc`, `live_free`, `live_impl`, `live_ret`,
// `live_ret_uret`).
mod live;
// libc's allocator, with `--native`.
mod native;
// The `--types` programs (`count_object`, `free_object`): objects created
// and destroyed per type.
mod types;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext},
};
use aya_log_ebpf::{info, warn};
use tracer_common::{
    counter::{Counter, CounterKey, DEFAULT_COUNTER_ENTRIES},
    site,
    returns::Returned,
    stats::{STAT_COUNT, Stat},
    sizes::{self, BUCKETS, DEFAULT_SLOTS, DOMAINS, NO_DOMAIN},
    unwind::{self, NativeStack, Page, PageKey, Row},
    stack::{self, DEFAULT_STACK_ENTRIES, FRAME_HEAD, Frame, MAX_DEPTH, NO_OFFSET, Stack, StackKey, WalkConfig},
};

/// Thread-group id to count for; 0 counts every process. Set by the loader.
/// The kernel's per-process uprobe filter already limits hits to the target,
/// so this is a second line of defence whose rejections are counted.
#[unsafe(no_mangle)]
static TARGET_TGID: u32 = 0;

/// Calls and bytes per (process, probe slot). The loader sets the size.
#[map]
static COUNTERS: PerCpuHashMap<CounterKey, Counter> = PerCpuHashMap::with_max_entries(DEFAULT_COUNTER_ENTRIES, 0);

/// Calls and bytes per (domain, log2 size bucket), over every process.
#[map]
static SIZES: PerCpuArray<Counter> = PerCpuArray::with_max_entries(DOMAINS * BUCKETS, 0);

/// The domain of each probe slot, which the loader fills.
#[map]
pub(crate) static SLOT_DOMAINS: Array<u32> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// Whether any probe records Python stacks (`--stacks`); 0 makes all the
/// stack code dead to the verifier, so it costs nothing while off.
#[unsafe(no_mangle)]
static STACKS_ON: u32 = 0;

/// `--sample N`: record the stack of each event with probability 1/N.
#[unsafe(no_mangle)]
static SAMPLE_EVERY: u64 = 1;

/// `--native-stacks`: unwind the native stack too; 0 makes the unwinder
/// dead code to the verifier.
#[unsafe(no_mangle)]
static NATIVE_ON: u32 = 0;

/// Every module's unwind rows, each module's sorted by pc. The loader
/// sets the size.
#[map]
static UNWIND_ROWS: Array<Row> = Array::with_max_entries(1, 0);

/// Each traced process's executable pages. The loader sets the size.
#[map]
static NATIVE_PAGES: HashMap<PageKey, Page> = HashMap::with_max_entries(DEFAULT_STACK_ENTRIES, BPF_F_NO_PREALLOC);

/// Each native stack seen, by its hash; as [`STACKS`], never removed.
#[map]
static NATIVE_STACKS: HashMap<u64, NativeStack> =
    HashMap::with_max_entries(DEFAULT_STACK_ENTRIES, BPF_F_NO_PREALLOC);

/// Per probe slot, 1 where its events get stacks.
#[map]
static SLOT_STACKS: Array<u32> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// Where each traced process's frames are, by thread-group id.
#[map]
static WALKS: HashMap<u32, WalkConfig> = HashMap::with_max_entries(DEFAULT_STACK_ENTRIES, 0);

/// Each stack seen, by its hash. Not preallocated: a stack is 2 KB, and
/// most runs fill a fraction of the room. Entries are never removed (a
/// hash may be another process's stack too): `try_stack` takes a count in
/// [`STACK_COUNTS`] as proof that its stack is here.
#[map]
static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(DEFAULT_STACK_ENTRIES, BPF_F_NO_PREALLOC);

/// Calls and bytes per (process, probe, stack).
#[map]
static STACK_COUNTS: PerCpuHashMap<StackKey, Counter> =
    PerCpuHashMap::with_max_entries(DEFAULT_STACK_ENTRIES, BPF_F_NO_PREALLOC);

/// This CPU's walk in progress (a stack is too large for the BPF stack).
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The walk reads a frame's page from its start up to the end of the
/// frame's head: the frames of Python-to-Python calls sit one after the
/// other on the thread's data stack, each caller below its callee, so one
/// read gives the next frames too, and a read never reaches into a page
/// the frame is not in.
const PAGE: u64 = 4096;

/// Words of a window: a page, and a head that crosses into the next.
const WINDOW_WORDS: usize = ((PAGE + FRAME_HEAD) / 8) as usize;

/// What [`SCRATCH`] holds.
#[repr(C)]
pub struct Scratch {
    stack: Stack,
    native: NativeStack,
    /// The memory read last: the start of a frame's page up to the end of
    /// its head.
    window: [u64; WINDOW_WORDS],
}

/// Returns per (process, probe slot). The loader sets the size.
#[map]
static RETURNS: PerCpuHashMap<CounterKey, Returned> = PerCpuHashMap::with_max_entries(DEFAULT_COUNTER_ENTRIES, 0);

/// Misses, indexed by [`Stat`].
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// Which argument registers hold the requested size.
#[derive(Clone, Copy)]
pub(crate) enum Size {
    /// Not an allocating function.
    None,
    /// The size is argument N (malloc: 0, realloc: 1).
    Arg(usize),
    /// The size is argument A times argument B (calloc).
    Product(usize, usize),
}

/// Does nothing: the cost of a uprobe hit itself, for benchmarks.
#[uprobe]
pub fn empty(_ctx: ProbeContext) -> u32 {
    0
}

/// Counts a call of a function that allocates nothing (`_Py_NewReference`,
/// `_Py_Dealloc`, the `*_Free` functions).
#[uprobe]
pub fn count_call(ctx: ProbeContext) -> u32 {
    record(&ctx, Size::None)
}

/// Counts a call whose first argument is the size (`*_Malloc`).
#[uprobe]
pub fn count_size_arg0(ctx: ProbeContext) -> u32 {
    record(&ctx, Size::Arg(0))
}

/// Counts a call whose second argument is the new size (`*_Realloc`).
#[uprobe]
pub fn count_size_arg1(ctx: ProbeContext) -> u32 {
    record(&ctx, Size::Arg(1))
}

/// Counts a call that requests nelem × elsize bytes (`*_Calloc`).
#[uprobe]
pub fn count_calloc(ctx: ProbeContext) -> u32 {
    record(&ctx, Size::Product(0, 1))
}

/// Counts a call at an inlined copy, with the size where the cookie says
/// (see [`tracer_common::site`]).
#[uprobe]
pub fn count_site(ctx: ProbeContext) -> u32 {
    if let Err(stat) = try_count_site(&ctx) {
        bump(&ctx, stat);
    }
    0
}

#[inline(always)]
fn try_count_site(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    // SAFETY: as in try_record: the helper reads this run's cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let constant = site::constant(cookie);
    let first = operand(ctx.regs, site::first(cookie), constant)?;
    // With --live, a realloc's copy has its block as the second operand.
    let realloc = live::on() && live::reallocates(site::slot(cookie));
    let mut block = live::UNKNOWN_BLOCK;
    let bytes = match site::second(cookie) {
        site::NONE => first,
        kind if realloc => {
            block = operand(ctx.regs, kind, constant)?;
            first
        }
        kind => {
            let second = operand(ctx.regs, kind, constant)?;
            if (first | second) >> 32 != 0 && second != 0 && first > core::hint::black_box(u64::MAX) / second {
                bump(ctx, Stat::SizeOverflow);
                u64::MAX
            } else {
                first.wrapping_mul(second)
            }
        }
    };
    let counter = slot_of(ctx, &COUNTERS, CounterKey { tgid, slot: site::slot(cookie) })?;
    // SAFETY: as in try_record.
    unsafe {
        atomic_add(&raw mut (*counter).calls, 1);
        atomic_add(&raw mut (*counter).bytes, bytes);
    }
    add_size(site::slot(cookie), bytes);
    if live::on()
        && let Err(stat) = live::api(ctx.regs, site::slot(cookie), bytes, block)
    {
        bump(ctx, stat);
    }
    stacks(ctx, tgid, site::slot(cookie), bytes);
    Ok(())
}

/// Adds one request of `bytes` to the size histogram of probe `slot`'s
/// domain. Both maps are arrays the loader sized, so a lookup fails only
/// for a slot past the last probe, which the counters already report.
#[inline(always)]
pub(crate) fn add_size(slot: u32, bytes: u64) {
    let Some(&domain) = SLOT_DOMAINS.get(slot) else { return };
    if domain == NO_DOMAIN {
        return;
    }
    if let Some(counter) = SIZES.get_ptr_mut(sizes::index(domain, sizes::bucket(bytes))) {
        // SAFETY: as in try_record, a valid pointer to this CPU's value.
        unsafe {
            atomic_add(&raw mut (*counter).calls, 1);
            atomic_add(&raw mut (*counter).bytes, bytes);
        }
    }
}

/// The value of a size operand: a register (DWARF number + 1) of the
/// probed thread, the cookie's constant, or the 8 bytes in the thread's
/// memory at a register plus the constant (a stack slot).
#[inline(always)]
fn operand(regs: *mut pt_regs, kind: u8, constant: u64) -> Result<u64, Stat> {
    match kind {
        site::CONSTANT => Ok(constant),
        site::MEMORY_FIRST..=site::MEMORY_LAST => {
            let base = register(regs, kind - site::MEMORY)?;
            let address = base.wrapping_add(site::offset(constant).cast_unsigned());
            // SAFETY: the helper reads user memory of the probed thread and
            // fails (counted) rather than fault where it is not mapped.
            unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| Stat::ArgMissing)
        }
        _ => register(regs, kind),
    }
}

/// The value of register `n` (DWARF number + 1) of the probed thread.
#[inline(always)]
fn register(regs: *mut pt_regs, n: u8) -> Result<u64, Stat> {
    // Each field is read at its own constant offset: the verifier refuses a
    // context pointer moved by a computed offset, which the compiler would
    // otherwise make of this match.
    macro_rules! field {
        ($f:ident) => {
            // SAFETY: regs is the context the kernel passed to this
            // program (the user registers at the probe), which the program
            // may read directly.
            unsafe { core::ptr::read_volatile(&raw const (*regs).$f) }
        };
    }
    // In DWARF order, from a copy on the stack, which may be indexed.
    let all: [u64; 16] = [
        field!(rax),
        field!(rdx),
        field!(rcx),
        field!(rbx),
        field!(rsi),
        field!(rdi),
        field!(rbp),
        field!(rsp),
        field!(r8),
        field!(r9),
        field!(r10),
        field!(r11),
        field!(r12),
        field!(r13),
        field!(r14),
        field!(r15),
    ];
    if !(1..=16).contains(&n) {
        return Err(Stat::ArgMissing);
    }
    // Masked so that the verifier sees the index bounded by the array.
    Ok(all[usize::from((n - 1) & 15)])
}

/// With `--stacks`, records the Python stack of this event of probe `slot`
/// where the probe gets stacks; a miss is counted, never the event lost
/// (its call is counted already). Returns the stack's hash, or why it has
/// none (a [`stack::why`] value), for the live table; with `--live`, the
/// API call's frame takes it.
#[inline(always)]
pub(crate) fn stacks(ctx: &ProbeContext, tgid: u32, slot: u32, bytes: u64) -> u64 {
    if !stacks_at(slot) {
        return stack::why::NOT_WALKED;
    }
    let walked = match try_stack(ctx, tgid, slot, bytes) {
        Ok(hash) => hash,
        Err(stat) => {
            bump(ctx, stat);
            stack::why::FAILED + stat as u64
        }
    };
    if live::on() {
        live::walked(slot, walked);
    }
    walked
}

/// Whether probe `slot`'s events get stacks.
#[inline(always)]
pub(crate) fn stacks_at(slot: u32) -> bool {
    // SAFETY: a plain global the loader patches before load.
    if unsafe { core::ptr::read_volatile(&raw const STACKS_ON) } == 0 {
        return false;
    }
    SLOT_STACKS.get(slot).copied().unwrap_or(0) != 0
}

/// The walk of [`stacks`]: the stack's hash, or [`stack::why::SAMPLED_OUT`].
#[inline(always)]
fn try_stack(ctx: &ProbeContext, tgid: u32, slot: u32, bytes: u64) -> Result<u64, Stat> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(Stat::StackReadFailed)?;
    // SAFETY: a plain global the loader patches before load.
    let every = unsafe { core::ptr::read_volatile(&raw const SAMPLE_EVERY) };
    // Each event independently, with probability 1/N: the sampled counts
    // are then binomial, whose error userspace states. (Every N-th event
    // would beat with a workload's own period.)
    // SAFETY: the helper has no arguments and no side effects.
    if every > 1 && u64::from(unsafe { aya_ebpf::helpers::generated::bpf_get_prandom_u32() }) % every != 0 {
        return Ok(stack::why::SAMPLED_OUT);
    }
    // SAFETY: a reference into a map value that stays valid while the
    // program runs.
    let config = unsafe { WALKS.get(&tgid) }.ok_or(Stat::StackNoConfig)?;
    let tstate = current_thread(config)?;
    if tstate == 0 {
        return Err(Stat::StackNoThread);
    }
    check_thread(config, tstate)?;
    let mut frame = if config.cframe == NO_OFFSET {
        read(tstate.wrapping_add(config.current_frame))?
    } else {
        let cframe = read(tstate.wrapping_add(config.cframe))?;
        read(cframe.wrapping_add(config.current_frame))?
    };
    let depth = usize::try_from(config.depth).unwrap_or(MAX_DEPTH).min(MAX_DEPTH);
    let head = config.frame_head().ok_or(Stat::StackNoConfig)?;
    let mut hash = stack::FNV_OFFSET;
    let mut n = 0usize;
    // SAFETY: as above, this CPU's scratch value.
    let walk = unsafe { &mut (*scratch).stack };
    // SAFETY: as above.
    let window = unsafe { &mut (*scratch).window };
    // The target's address of window[0], and how many bytes it holds.
    let (mut base, mut held) = (0u64, 0u64);
    // Every frame is recorded, the C stack's entry frames too (userspace
    // leaves them out by their owner): the count of frames is then the
    // same on every path through one iteration, which lets the verifier
    // prune, where a count that depends on the owner would double its
    // paths at every frame.
    while n < depth && frame != 0 {
        let mut at = frame.wrapping_sub(base);
        if at >= held || held - at < head.bytes {
            // Not read yet. A frame is pointer-aligned; one that is not
            // is read alone, so that its fields are still whole words.
            let start = if frame % 8 == 0 { frame & !(PAGE - 1) } else { frame };
            let len = frame.wrapping_sub(start).wrapping_add(head.bytes);
            // Checked here, where the verifier sees it, that the read
            // fits the window.
            if len == 0 || len > PAGE + FRAME_HEAD {
                return Err(Stat::StackNoConfig);
            }
            #[allow(clippy::cast_possible_truncation, reason = "at most PAGE + FRAME_HEAD")]
            let size = len as u32;
            // SAFETY: the helper writes `size` bytes, at most the window's,
            // into this CPU's window, and reads the probed thread's memory
            // within one page and the frame's head, failing (counted)
            // rather than faulting where it is not mapped.
            let rc = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    window.as_mut_ptr().cast(),
                    size,
                    start as *const core::ffi::c_void,
                )
            };
            if rc != 0 {
                return Err(Stat::StackReadFailed);
            }
            (base, held) = (start, len);
            at = frame - start;
        }
        // `at` is a multiple of 8 (both ends aligned, or 0): its fields
        // are whole words of the window.
        #[allow(clippy::cast_possible_truncation, reason = "word indices within the window")]
        let word = |field: u64| window.get(((at / 8) + field) as usize).copied().ok_or(Stat::StackNoConfig);
        #[allow(clippy::cast_possible_truncation, reason = "the owner is the byte at its shift")]
        let owner = (word(head.owner)? >> (head.owner_shift & 63)) as u8;
        let previous = word(head.previous)?;
        let code = word(head.code)? & !config.code_tag_mask;
        let instr = word(head.instr)?;
        let offset = instr.wrapping_sub(code.wrapping_add(config.code_adaptive));
        // Masked so that the verifier sees the index bounded.
        if let Some(f) = walk.frames.get_mut(n & (MAX_DEPTH - 1)) {
            #[allow(clippy::cast_possible_truncation, reason = "an instruction's offset in its code fits 32 bits")]
            {
                *f = Frame { code, offset: offset as u32, owner: u32::from(owner) };
            }
        }
        hash = stack::mix(stack::mix(hash, code), offset);
        n += 1;
        frame = previous;
    }
    let truncated = u32::from(frame != 0);
    #[allow(clippy::cast_possible_truncation, reason = "at most MAX_DEPTH")]
    {
        walk.depth = n as u32;
    }
    walk.truncated = truncated;
    hash = stack::keyed(stack::mix(hash, u64::from(truncated)));
    // A stack counted before is kept already: its count is made only after
    // its frames are in STACKS, whose entries are never removed. So the
    // common case is one lookup, and only a new stack pays for the
    // insert, which locks a bucket. A full map loses the frames of new
    // stacks, which is counted.
    // SAFETY: as above, this CPU's scratch value.
    let native = native_stack(ctx, tgid, unsafe { &mut (*scratch).native });
    let key = StackKey { tgid, slot, stack: hash, native };
    let counter = match STACK_COUNTS.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            if STACKS.insert(&hash, walk, u64::from(BPF_NOEXIST)).is_err() {
                // Another process, or CPU, may have kept it first.
                // SAFETY: a lookup of a key, whose value is not used.
                if unsafe { STACKS.get(&hash) }.is_none() {
                    return Err(Stat::StacksFull);
                }
            }
            let _ = STACK_COUNTS.insert(&key, &Counter::default(), u64::from(BPF_NOEXIST));
            STACK_COUNTS.get_ptr_mut(&key).ok_or(Stat::StacksFull)?
        }
    };
    // SAFETY: as in try_record.
    unsafe {
        atomic_add(&raw mut (*counter).calls, 1);
        atomic_add(&raw mut (*counter).bytes, bytes);
    }
    if truncated != 0 {
        // Counted under its cut stack, which a block keeps too.
        bump(ctx, Stat::StackTruncated);
    }
    Ok(hash)
}

/// With `--native-stacks`, unwinds this event's native stack into `out`,
/// keeps it in [`NATIVE_STACKS`] under its hash, and returns the hash (0
/// while off). How the unwind ended is counted unless at the root.
#[inline(always)]
fn native_stack(ctx: &ProbeContext, tgid: u32, out: &mut NativeStack) -> u64 {
    // SAFETY: a plain global the loader patches before load.
    if unsafe { core::ptr::read_volatile(&raw const NATIVE_ON) } == 0 {
        return 0;
    }
    let (end, hash) = unwind(ctx.regs, tgid, out);
    out.end = end;
    let stat = match end {
        unwind::end::ROOT => None,
        unwind::end::TRUNCATED => Some(Stat::NativeTruncated),
        unwind::end::NO_MAPPING => Some(Stat::NativeNoMapping),
        unwind::end::NO_INFO => Some(Stat::NativeNoInfo),
        unwind::end::UNSUPPORTED => Some(Stat::NativeUnsupported),
        _ => Some(Stat::NativeReadFailed),
    };
    if let Some(stat) = stat {
        bump(ctx, stat);
    }
    let hash = stack::mix(hash, u64::from(end));
    // As STACKS: kept once, never removed, so a stack seen before costs a
    // lookup.
    // SAFETY: a lookup of a key, whose value is not used.
    if unsafe { NATIVE_STACKS.get(&hash) }.is_none()
        && NATIVE_STACKS.insert(&hash, out, u64::from(BPF_NOEXIST)).is_err()
        // SAFETY: as above.
        && unsafe { NATIVE_STACKS.get(&hash) }.is_none()
    {
        bump(ctx, Stat::NativeFull);
    }
    hash
}

/// Unwinds the probed thread's native stack from its registers at the
/// probe, by the unwind rows of each pc's module, into `out`; returns how
/// it ended (one of [`unwind::end`]) and the hash of the pcs recorded.
#[inline(always)]
fn unwind(regs: *mut pt_regs, tgid: u32, out: &mut NativeStack) -> (u32, u64) {
    let mut hash = stack::FNV_OFFSET;
    out.depth = 0;
    // SAFETY: regs is the context the kernel passed to this program (the
    // user registers at the probe), which the program may read directly.
    let (mut pc, mut rsp, mut rbp) = unsafe { ((*regs).rip, (*regs).rsp, (*regs).rbp) };
    // 0 at the probed instruction, else 1: a return address is looked up
    // one byte back, inside its call (a call can be a function's last
    // instruction, when the callee does not return).
    let mut back = 0u64;
    let mut n = 0usize;
    while n < unwind::MAX_NATIVE_DEPTH {
        if let Some(slot) = out.pcs.get_mut(n & (unwind::MAX_NATIVE_DEPTH - 1)) {
            *slot = pc;
        }
        hash = stack::mix(hash, pc);
        n += 1;
        #[allow(clippy::cast_possible_truncation, reason = "at most MAX_NATIVE_DEPTH")]
        {
            out.depth = n as u32;
        }
        let step = step(tgid, pc, back, rsp, rbp);
        let Ok((ra, cfa, saved_rbp)) = step else {
            return (step.err().unwrap_or(unwind::end::NO_INFO), hash);
        };
        (pc, rsp, rbp, back) = (ra, cfa, saved_rbp, 1);
    }
    (unwind::end::TRUNCATED, hash)
}

/// One frame of [`unwind`]: the caller's (pc, rsp, rbp) from this frame's
/// row, or how the unwind ends here.
#[inline(always)]
fn step(tgid: u32, pc: u64, back: u64, rsp: u64, rbp: u64) -> Result<(u64, u64, u64), u32> {
    let looked_up = pc.wrapping_sub(back);
    let key = PageKey { tgid, reserved: 0, page: looked_up >> unwind::PAGE_SHIFT };
    // SAFETY: a lookup whose value is copied out at once.
    let page = unsafe { NATIVE_PAGES.get(&key) }.copied().ok_or(unwind::end::NO_MAPPING)?;
    let at = u32::try_from(looked_up.wrapping_sub(page.bias)).map_err(|_| unwind::end::NO_INFO)?;
    let row = find_row(page.rows, page.count, at).ok_or(unwind::end::NO_INFO)?;
    let cfa = match row.rule {
        unwind::rule::RSP => rsp.wrapping_add_signed(i64::from(row.cfa)),
        unwind::rule::RBP => rbp.wrapping_add_signed(i64::from(row.cfa)),
        unwind::rule::PLT => rsp.wrapping_add(if pc & 15 >= 11 { 16 } else { 8 }),
        unwind::rule::ROOT => return Err(unwind::end::ROOT),
        unwind::rule::NONE => return Err(unwind::end::NO_INFO),
        _ => return Err(unwind::end::UNSUPPORTED),
    };
    let ra = read(cfa.wrapping_sub(8)).map_err(|_| unwind::end::READ_FAILED)?;
    let rbp = if row.rbp_rule == unwind::rbp::AT_CFA {
        read(cfa.wrapping_add_signed(i64::from(row.rbp))).map_err(|_| unwind::end::READ_FAILED)?
    } else {
        rbp
    };
    if ra == 0 {
        // A thread's outermost frame may end so, where its CFI does not
        // mark the return address undefined.
        return Err(unwind::end::ROOT);
    }
    Ok((ra, cfa, rbp))
}

/// The row that holds module address `at`: the last of the `count` rows
/// from `first` whose pc is not above it.
#[inline(always)]
fn find_row(first: u32, count: u32, at: u32) -> Option<Row> {
    let (mut lo, mut hi) = (0u32, count);
    let mut step = 0;
    while step < unwind::ROW_SEARCH_STEPS && lo < hi {
        let mid = u32::midpoint(lo, hi);
        let row = UNWIND_ROWS.get(first.wrapping_add(mid))?;
        if row.pc <= at {
            lo = mid + 1;
        } else {
            hi = mid;
        }
        step += 1;
    }
    if lo < hi {
        // The search ran out of steps: more rows than it can search.
        return None;
    }
    UNWIND_ROWS.get(first.wrapping_add(lo.checked_sub(1)?)).copied()
}

/// The current thread's `PyThreadState *`, as `config` says to find it.
#[inline(always)]
fn current_thread(config: &WalkConfig) -> Result<u64, Stat> {
    match config.current {
        stack::current::AT_ADDRESS => read(config.tstate_at),
        stack::current::FS_RELATIVE => read(fsbase(config)?.wrapping_add(config.tstate_at)),
        stack::current::TLS_MODULE => {
            // glibc x86-64: the TCB at fsbase holds the DTV pointer at 8;
            // DTV entries are 16 bytes, the block's address first.
            let dtv = read(fsbase(config)?.wrapping_add(8))?;
            let block = read(dtv.wrapping_add(config.tls_module.wrapping_mul(16)))?;
            read(block.wrapping_add(config.tstate_at))
        }
        _ => Err(Stat::StackNoConfig),
    }
}

/// The current task's fsbase (its thread pointer), from the kernel's
/// `task_struct` at the offset its BTF gives.
#[inline(always)]
fn fsbase(config: &WalkConfig) -> Result<u64, Stat> {
    // SAFETY: the helper returns the current task's address and reads
    // nothing.
    let task = unsafe { aya_ebpf::helpers::generated::bpf_get_current_task() };
    // SAFETY: the helper reads kernel memory and fails rather than fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel((task.wrapping_add(config.task_fsbase)) as *const u64) }
        .map_err(|_| Stat::StackReadFailed)
}

/// Fails unless `tstate` is the event's own thread's: a GIL holder's, or a
/// stale thread-local, is never taken for another thread's stack.
#[inline(always)]
fn check_thread(config: &WalkConfig, tstate: u64) -> Result<(), Stat> {
    let native = read(tstate.wrapping_add(config.native_thread_id))?;
    let mut ns = aya_ebpf::bindings::bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: ns is a valid, writable bpf_pidns_info of the size passed.
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_get_ns_current_pid_tgid(
            config.pid_ns_dev,
            config.pid_ns_ino,
            &raw mut ns,
            core::mem::size_of::<aya_ebpf::bindings::bpf_pidns_info>() as u32,
        )
    };
    if rc != 0 {
        return Err(Stat::StackNoThread);
    }
    if native != u64::from(ns.pid) {
        return Err(Stat::StackOtherThread);
    }
    Ok(())
}

/// The 8 bytes of the target's memory at `address`.
#[inline(always)]
fn read(address: u64) -> Result<u64, Stat> {
    // SAFETY: the helper reads the probed thread's memory and fails
    // (counted) rather than fault.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| Stat::StackReadFailed)
}

/// Records the value in rax at a point where it holds the function's
/// result: on a `ret` instruction, or placed where the result is final.
#[uprobe]
pub fn ret_value(ctx: ProbeContext) -> u32 {
    record_return(&ctx, ctx.regs)
}

/// Records a function's return value through a uretprobe.
#[uretprobe]
pub fn ret_value_uret(ctx: RetProbeContext) -> u32 {
    record_return(&ctx, ctx.regs)
}

#[inline(always)]
fn record_return<C: EbpfContext>(ctx: &C, regs: *mut pt_regs) -> u32 {
    if let Err(stat) = try_record_return(ctx, regs) {
        bump(ctx, stat);
    }
    0
}

#[inline(always)]
fn try_record_return<C: EbpfContext>(ctx: &C, regs: *mut pt_regs) -> Result<(), Stat> {
    let tgid = check_target()?;
    // SAFETY: regs is the context the kernel passed to this program (the
    // user registers at the probe), which the program may read directly.
    let value = unsafe { (*regs).rax };
    // SAFETY: as in try_record: the helper reads this run's cookie.
    let cookie = unsafe { bpf_get_attach_cookie(regs.cast()) };
    let slot = u32::try_from(cookie).map_err(|_| Stat::SlotOutOfRange)?;
    let returned = slot_of(ctx, &RETURNS, CounterKey { tgid, slot })?;
    // SAFETY: as in try_record, a valid pointer to this CPU's value; the
    // adds are atomic for the same reason.
    unsafe {
        atomic_add(&raw mut (*returned).returns, 1);
        atomic_add(&raw mut (*returned).null, u64::from(value == 0));
        atomic_add(&raw mut (*returned).pointer_sum, value);
    }
    Ok(())
}

/// The thread-group id of this hit, if it is one tracer counts.
#[inline(always)]
pub(crate) fn check_target() -> Result<u32, Stat> {
    // SAFETY: TARGET_TGID is a plain u32 the loader patches before load; the
    // volatile read stops the compiler from folding in the initial 0.
    let target = unsafe { core::ptr::read_volatile(&raw const TARGET_TGID) };
    // The upper half of pid_tgid is the thread-group id.
    #[allow(clippy::cast_possible_truncation)]
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if target != 0 && tgid != target {
        return Err(Stat::OtherProcess);
    }
    Ok(tgid)
}

/// This CPU's value for `key` in `map`, inserting a zero on first use.
#[inline(always)]
fn slot_of<C: EbpfContext, V: Default>(
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

#[inline(always)]
fn record(ctx: &ProbeContext, size: Size) -> u32 {
    if let Err(stat) = try_record(ctx, size) {
        bump(ctx, stat);
    }
    0
}

#[inline(always)]
fn try_record(ctx: &ProbeContext, size: Size) -> Result<(), Stat> {
    let tgid = check_target()?;
    let bytes = requested(ctx, size)?;
    // SAFETY: the helper only reads the cookie stored in the program's run
    // context; ctx is the context the kernel passed to this program.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // An inlined copy's cookie has its first operand set (see
    // `tracer_common::site::INLINED`); a free's copy may have its block's
    // place as the second operand, for --live.
    let inlined = site::first(cookie) == site::INLINED;
    let slot = if inlined { site::slot(cookie) } else { u32::try_from(cookie).map_err(|_| Stat::SlotOutOfRange)? };
    count(ctx, CounterKey { tgid, slot }, bytes)?;
    if inlined && live::on() {
        let block = match site::second(cookie) {
            site::NONE => Ok(live::UNKNOWN_BLOCK),
            kind => operand(ctx.regs, kind, site::constant(cookie)),
        };
        if let Err(stat) = block.and_then(|block| live::api(ctx.regs, slot, bytes, block)) {
            bump(ctx, stat);
        }
    }
    if !matches!(size, Size::None) {
        add_size(slot, bytes);
    }
    stacks(ctx, tgid, slot, bytes);
    Ok(())
}

/// The bytes a call requests, from its arguments as `size` says.
#[inline(always)]
pub(crate) fn requested(ctx: &ProbeContext, size: Size) -> Result<u64, Stat> {
    Ok(match size {
        Size::None => 0,
        Size::Arg(n) => ctx.arg::<u64>(n).ok_or(Stat::ArgMissing)?,
        Size::Product(a, b) => {
            let nelem = ctx.arg::<u64>(a).ok_or(Stat::ArgMissing)?;
            let elsize = ctx.arg::<u64>(b).ok_or(Stat::ArgMissing)?;
            // checked_mul (and the division test LLVM rewrites into it)
            // needs a 128-bit multiply, which BPF lacks: hide the bound from
            // the optimiser. Sizes that fit in 32 bits cannot overflow.
            if (nelem | elsize) >> 32 != 0 && elsize != 0 && nelem > core::hint::black_box(u64::MAX) / elsize {
                bump(ctx, Stat::SizeOverflow);
                u64::MAX
            } else {
                nelem.wrapping_mul(elsize)
            }
        }
    })
}

/// Adds one call of `bytes` to `key`'s counter.
#[inline(always)]
pub(crate) fn count(ctx: &ProbeContext, key: CounterKey, bytes: u64) -> Result<(), Stat> {
    let counter = slot_of(ctx, &COUNTERS, key)?;
    // SAFETY: the map returned a valid, aligned pointer to this CPU's value,
    // which stays valid while the program runs (hash map values are freed
    // only after an RCU grace period). The adds are atomic because a
    // preempted program on the same CPU may be updating the same value.
    unsafe {
        atomic_add(&raw mut (*counter).calls, 1);
        atomic_add(&raw mut (*counter).bytes, bytes);
    }
    Ok(())
}

#[inline(always)]
pub(crate) fn bump<C: EbpfContext>(ctx: &C, stat: Stat) {
    warn!(ctx, "miss: {}", stat.name());
    if let Some(value) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: as above, a valid pointer to this CPU's u64 slot.
        unsafe { atomic_add(value, 1) };
    }
}

/// `lock *(u64 *)(dst) += value`: the BPF atomic add instruction.
///
/// # Safety
/// `dst` must be a valid, 8-byte aligned pointer into a map value.
#[inline(always)]
unsafe fn atomic_add(dst: *mut u64, value: u64) {
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

/// [`tracer_common::LICENSE`], as the array the `license` section holds.
const fn license() -> [u8; tracer_common::LICENSE.len()] {
    let mut out = [0u8; tracer_common::LICENSE.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = tracer_common::LICENSE[i];
        i += 1;
    }
    out
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; tracer_common::LICENSE.len()] = license();

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No code path here can panic (no unwrap, no indexing); the verifier
    // would reject a program that could reach this loop.
    loop {}
}
