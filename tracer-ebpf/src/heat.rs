//! The heat step: one hit more in the bucket of the probed address (see
//! [`tracer_common::heat`]). Off (`HEAT_ON` 0) it is dead code to the
//! verifier; on, one inlined per-CPU array lookup and an add.

use aya_ebpf::{bindings::pt_regs, macros::map, maps::PerCpuArray};
use tracer_common::heat::{Heat, bucket};

/// Whether to count heat: set by the loader for the budget's windows.
#[unsafe(no_mangle)]
static HEAT_ON: u32 = 0;

/// Hits per bucket, per CPU.
#[map]
static HEAT: PerCpuArray<Heat> = PerCpuArray::with_max_entries(1, 0);

/// Counts a hit at the probed address in `regs`.
#[inline(always)]
pub fn bump(regs: *mut pt_regs) {
    // SAFETY: HEAT_ON is a plain u32 the loader patches before load; the
    // volatile read stops the compiler from folding in the initial 0.
    if unsafe { core::ptr::read_volatile(&raw const HEAT_ON) } == 0 {
        return;
    }
    // SAFETY: regs is the context the kernel passed to this program; in a
    // uprobe's handler its instruction pointer is the breakpoint's address
    // (handle_swbp sets it back before the handlers run).
    let ip = unsafe { (*regs).rip };
    let Some(heat) = HEAT.get_ptr_mut(0) else { return };
    // SAFETY: the map returned a valid pointer to this CPU's value, which
    // stays valid while the program runs. The add is not atomic: a program
    // that interrupted this one on its CPU could lose an increment, which
    // only blurs the order the heat is for.
    unsafe {
        if let Some(h) = (*heat).hits.get_mut(bucket(ip)) {
            *h = h.wrapping_add(1);
        }
    }
}
