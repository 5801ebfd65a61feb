//! The stacks step (`--stacks`): the Python stack of an event, walked
//! from the thread's current frame through the target's memory, kept once
//! per hash in [`STACKS`] and counted per (process, probe, stack) in
//! [`STACK_COUNTS`]; with `--native-stacks`, its native stack too
//! ([`crate::unwind`]). [`STACKS_ON`] at 0 makes all of it dead code to
//! the verifier, so it costs nothing while off.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
};
use tracer_common::{
    counter::Counter,
    sizes::DEFAULT_SLOTS,
    stack::{self, DEFAULT_STACK_ENTRIES, FRAME_HEAD, Frame, MAX_DEPTH, NO_OFFSET, Stack, StackKey, WalkConfig},
    stats::Stat,
    unwind::NativeStack,
};

use crate::common::{atomic_add, bump};

/// Whether any probe records Python stacks (`--stacks`); 0 makes all the
/// stack code dead to the verifier, so it costs nothing while off.
#[unsafe(no_mangle)]
static STACKS_ON: u32 = 0;

/// `--sample N`: record the stack of each event with probability 1/N.
#[unsafe(no_mangle)]
static SAMPLE_EVERY: u64 = 1;

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

/// With `--stacks`, records the Python stack of this event of probe `slot`
/// where the probe gets stacks; a miss is counted, never the event lost
/// (its call is counted already). Returns the stack's hash, or why it has
/// none (a [`stack::why`] value: [`stack::why::NOT_WALKED`] where the
/// probe gets no stacks), which the live table gives the call's block.
#[inline(always)]
pub fn walk<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, tgid: u32, slot: u32, bytes: u64) -> u64 {
    if !at(slot) {
        return stack::why::NOT_WALKED;
    }
    match try_stack(ctx, regs, tgid, slot, bytes) {
        Ok(hash) => hash,
        Err(stat) => {
            bump(ctx, stat);
            stack::why::FAILED + stat as u64
        }
    }
}

/// Whether probe `slot`'s events get stacks.
#[inline(always)]
pub fn at(slot: u32) -> bool {
    // SAFETY: a plain global the loader patches before load.
    if unsafe { core::ptr::read_volatile(&raw const STACKS_ON) } == 0 {
        return false;
    }
    SLOT_STACKS.get(slot).copied().unwrap_or(0) != 0
}

/// The walk of [`walk`]: the stack's hash, or [`stack::why::SAMPLED_OUT`].
#[inline(always)]
fn try_stack<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, tgid: u32, slot: u32, bytes: u64) -> Result<u64, Stat> {
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
    let (hash, truncated) = python(tgid)?;
    // A stack counted before is kept already: its count is made only after
    // its frames are in STACKS, whose entries are never removed. So the
    // common case is one lookup, and only a new stack pays for the
    // insert, which locks a bucket. A full map loses the frames of new
    // stacks, which is counted.
    // SAFETY: as above, this CPU's scratch value.
    let native = crate::unwind::native_stack(ctx, regs, tgid, unsafe { &mut (*scratch).native });
    let key = StackKey { tgid, slot, stack: hash, native };
    let counter = match STACK_COUNTS.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            keep(hash)?;
            let _ = STACK_COUNTS.insert(&key, &Counter::default(), u64::from(BPF_NOEXIST));
            STACK_COUNTS.get_ptr_mut(&key).ok_or(Stat::StacksFull)?
        }
    };
    // SAFETY: a valid pointer to this CPU's value, as in [`crate::count`].
    unsafe {
        atomic_add(&raw mut (*counter).calls, 1);
        atomic_add(&raw mut (*counter).bytes, bytes);
    }
    if truncated {
        // Counted under its cut stack, which a block keeps too.
        bump(ctx, Stat::StackTruncated);
    }
    Ok(hash)
}

/// Walks the current thread's Python stack into this CPU's scratch stack
/// (see [`keep`]): its hash, and whether the walk stopped at its depth
/// with frames left. Used by the stacks step and by the growth programs,
/// which sample on their own.
#[inline(always)]
pub fn python(tgid: u32) -> Result<(u64, bool), Stat> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(Stat::StackReadFailed)?;
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
        let owner = ((word(head.owner)? >> (head.owner_shift & 63)) & head.owner_mask) as u8;
        let previous = word(head.previous)?;
        let code = word(head.code)? & !config.code_tag_mask;
        let instr = word(head.instr)?;
        // Without a branch, which would double the paths the verifier
        // walks at every frame: an interpreter frame's pointer difference
        // (masked off for a frame object: `frame_kind` 1 makes the mask 0)
        // plus a frame object's `int f_lasti` (3.9, 3.10: an index, -1
        // before the first instruction, sign-extended and scaled to bytes;
        // `lasti_unit` is 0 for an interpreter frame).
        let pointer_mask = u64::from(config.frame_kind).wrapping_sub(1);
        #[allow(clippy::cast_possible_truncation, reason = "f_lasti is the C int at its shift")]
        let lasti = i64::from((instr >> (head.instr_shift & 63)) as u32 as i32);
        let offset = (instr.wrapping_sub(code.wrapping_add(config.code_adaptive)) & pointer_mask)
            .wrapping_add(lasti.wrapping_mul(i64::from(config.lasti_unit)).cast_unsigned());
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
    Ok((stack::keyed(stack::mix(hash, u64::from(truncated))), truncated != 0))
}

/// Keeps the stack [`python`] walked last on this CPU in [`STACKS`] under
/// `hash`, unless another walk (of another process, or CPU) kept it first.
/// A full map loses it, which is an error.
#[inline(always)]
pub fn keep(hash: u64) -> Result<(), Stat> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(Stat::StackReadFailed)?;
    // SAFETY: this CPU's scratch value, valid while the program runs.
    let walk = unsafe { &(*scratch).stack };
    if STACKS.insert(&hash, walk, u64::from(BPF_NOEXIST)).is_err() {
        // Another process, or CPU, may have kept it first.
        // SAFETY: a lookup of a key, whose value is not used.
        if unsafe { STACKS.get(&hash) }.is_none() {
            return Err(Stat::StacksFull);
        }
    }
    Ok(())
}

/// Whether [`STACKS`] holds `hash`'s frames already.
#[inline(always)]
pub fn kept(hash: u64) -> bool {
    // SAFETY: a lookup of a key, whose value is not used.
    unsafe { STACKS.get(&hash) }.is_some()
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
    if config.thread_check == stack::thread_check::PTHREAD_FSBASE {
        // 3.9, 3.10: the state's `pthread_t` is the thread's control block,
        // where its fsbase points.
        return if native == fsbase(config)? { Ok(()) } else { Err(Stat::StackOtherThread) };
    }
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
