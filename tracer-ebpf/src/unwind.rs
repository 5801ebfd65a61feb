//! With `--native-stacks`, the native half of the stacks step: the probed
//! thread's stack unwound from its registers by the unwind rows userspace
//! gives per module ([`UNWIND_ROWS`], [`NATIVE_PAGES`]), kept once per hash
//! in [`NATIVE_STACKS`]. [`NATIVE_ON`] at 0 makes it dead code to the
//! verifier.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, pt_regs},
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap},
};
use tracer_common::{
    stack::{self, DEFAULT_STACK_ENTRIES},
    stats::Stat,
    unwind::{self, NativeStack, Page, PageKey, Row},
};

use crate::common::bump;

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

/// Each native stack seen, by its hash; as [`crate::stacks`]' stacks, never
/// removed.
#[map]
static NATIVE_STACKS: HashMap<u64, NativeStack> =
    HashMap::with_max_entries(DEFAULT_STACK_ENTRIES, BPF_F_NO_PREALLOC);

/// With `--native-stacks`, unwinds this event's native stack into `out`,
/// keeps it in [`NATIVE_STACKS`] under its hash, and returns the hash (0
/// while off). How the unwind ended is counted unless at the root.
#[inline(always)]
pub fn native_stack<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, tgid: u32, out: &mut NativeStack) -> u64 {
    // SAFETY: a plain global the loader patches before load.
    if unsafe { core::ptr::read_volatile(&raw const NATIVE_ON) } == 0 {
        return 0;
    }
    let (end, hash) = unwind(regs, tgid, out);
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


/// The 8 bytes of the target's memory at `address`.
#[inline(always)]
fn read(address: u64) -> Result<u64, ()> {
    // SAFETY: the helper reads the probed thread's memory and fails rather
    // than fault.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| ())
}
