//! Decoding a hit: its attach cookie, its arguments by the ABI, and the
//! operands an inlined copy's cookie locates (see [`tracer_common::site`]).
//! Nothing here writes a map but [`crate::common::bump`]'s misses.

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    programs::ProbeContext,
};
use tracer_common::{
    counter::{CounterKey, GATE_SLOT},
    site,
    stats::Stat,
};

use crate::common::bump;

/// Which argument registers hold the requested size.
#[derive(Clone, Copy)]
pub enum Size {
    /// Not an allocating function.
    None,
    /// The size is argument N (malloc: 0, realloc: 1).
    Arg(usize),
    /// The size is argument A times argument B (calloc).
    Product(usize, usize),
}

impl Size {
    /// Whether the call requests bytes, for the size histogram.
    #[inline(always)]
    pub const fn requests(self) -> bool {
        !matches!(self, Self::None)
    }
}

/// This run's attach cookie.
#[inline(always)]
pub fn cookie<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: the helper only reads the cookie stored in the program's run
    // context; ctx is the context the kernel passed to this program.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// The probe slot of a cookie that is the slot alone (a function's entry,
/// an implementation's, a libc function's).
#[inline(always)]
pub fn slot<C: EbpfContext>(ctx: &C) -> Result<u32, Stat> {
    u32::try_from(cookie(ctx)).map_err(|_| Stat::SlotOutOfRange)
}

/// Whether a hit of process `tgid` is an event: always, but at a gate (the
/// conditional jump probed for the inlined copy it leads into:
/// [`site::gated`]) only where the flags send the jump into the copy. A
/// pass that goes elsewhere is counted in `GateOther` (the hit's cost, not
/// a loss, so not logged as a miss) and under the probe's slot with
/// [`GATE_SLOT`], which prices it with the probe's hits.
#[inline(always)]
pub fn through_gate(ctx: &ProbeContext, tgid: u32, cookie: u64) -> bool {
    let regs = ctx.regs;
    let Some(condition) = site::gate(cookie) else { return true };
    // SAFETY: regs is the context the kernel passed to this program (the
    // user registers at the probe), which the program may read directly.
    let flags = unsafe { core::ptr::read_volatile(&raw const (*regs).eflags) };
    if site::holds(condition, flags) {
        return true;
    }
    crate::common::tally(Stat::GateOther);
    crate::heat::bump(regs);
    // A full map loses no call here, only this pass's price: `GateOther`
    // has it.
    let _ = crate::count::add(ctx, CounterKey { tgid, slot: site::slot(cookie) | GATE_SLOT }, 0);
    false
}

/// The probed thread's `rax`: a function's result, at its return.
#[inline(always)]
pub fn rax(regs: *mut pt_regs) -> u64 {
    // SAFETY: regs is the context the kernel passed to this program (the
    // user registers at the probe), which the program may read directly.
    unsafe { (*regs).rax }
}

/// The probed thread's stack pointer.
#[inline(always)]
pub fn sp(regs: *mut pt_regs) -> u64 {
    // SAFETY: regs is the context the kernel passed to this program (the
    // user registers at the probe), which the program may read directly.
    unsafe { (*regs).rsp }
}

/// The bytes a call requests, from its arguments as `size` says.
#[inline(always)]
pub fn requested(ctx: &ProbeContext, size: Size) -> Result<u64, Stat> {
    Ok(match size {
        Size::None => 0,
        Size::Arg(n) => arg(ctx, n)?,
        Size::Product(a, b) => counted_product(ctx, arg(ctx, a)?, arg(ctx, b)?),
    })
}

/// Argument `n` by the ABI.
#[inline(always)]
pub fn arg(ctx: &ProbeContext, n: usize) -> Result<u64, Stat> {
    ctx.arg::<u64>(n).ok_or(Stat::ArgMissing)
}

/// `n * e`, or `None` where it overflows. checked_mul (and the division
/// test LLVM rewrites into it) needs a 128-bit multiply, which BPF lacks:
/// the bound is hidden from the optimiser. Sizes that fit in 32 bits
/// cannot overflow.
#[inline(always)]
pub fn product(n: u64, e: u64) -> Option<u64> {
    if (n | e) >> 32 != 0 && e != 0 && n > core::hint::black_box(u64::MAX) / e {
        None
    } else {
        Some(n.wrapping_mul(e))
    }
}

/// `n * e`, or `u64::MAX` where it overflows, which is counted.
#[inline(always)]
pub fn counted_product<C: EbpfContext>(ctx: &C, n: u64, e: u64) -> u64 {
    product(n, e).unwrap_or_else(|| {
        bump(ctx, Stat::SizeOverflow);
        u64::MAX
    })
}

/// The value of an operand of `cookie`'s encoding: a register (DWARF
/// number + 1) of the probed thread, the cookie's constant, or the 8 bytes
/// in the thread's memory at a register plus the constant (a stack slot).
#[inline(always)]
pub fn operand(regs: *mut pt_regs, kind: u8, constant: u64) -> Result<u64, Stat> {
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

/// A pointer operand (a block, an object) as a plain value, with whether
/// it was read: [`tracer_common::live::UNKNOWN_BLOCK`] where it was not.
/// A `Result` kept across the pipeline's calls would spill its payload
/// where it is undefined, which the verifier refuses.
#[inline(always)]
pub fn pointer(regs: *mut pt_regs, kind: u8, constant: u64) -> (u64, bool) {
    match operand(regs, kind, constant) {
        Ok(pointer) => (pointer, true),
        Err(_) => (tracer_common::live::UNKNOWN_BLOCK, false),
    }
}

/// The value of register `n` (DWARF number + 1) of the probed thread.
#[inline(always)]
pub fn register(regs: *mut pt_regs, n: u8) -> Result<u64, Stat> {
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
