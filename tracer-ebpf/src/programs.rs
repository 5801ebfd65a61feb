//! The programs: each is a thin `#[uprobe]` around a `try_*` that decodes
//! its hit (cookie, registers: see [`crate::args`]) into an [`Event`] and
//! hands it to [`pipeline::run`]; a miss on the way is counted. The same
//! program serves every function whose arguments have its shape, told
//! apart by the attach cookie (the probe slot, or an inlined copy's
//! operands: [`tracer_common::site`]).

use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    live::{Role, UNKNOWN_BLOCK},
    site,
    stats::Stat,
};

use crate::{
    args::{self, Size},
    common::{bump, check_target},
    live, nested,
    pipeline::{self, Event, Source},
};

/// Runs a program's `try_*`, counting its miss.
#[inline(always)]
fn counted<C: EbpfContext>(ctx: &C, result: Result<(), Stat>) -> u32 {
    if let Err(stat) = result {
        bump(ctx, stat);
    }
    0
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
    counted(&ctx, try_call(&ctx, Size::None))
}

/// Counts a call whose first argument is the size (`*_Malloc`).
#[uprobe]
pub fn count_size_arg0(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_call(&ctx, Size::Arg(0)))
}

/// Counts a call whose second argument is the new size (`*_Realloc`).
#[uprobe]
pub fn count_size_arg1(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_call(&ctx, Size::Arg(1)))
}

/// Counts a call that requests nelem × elsize bytes (`*_Calloc`).
#[uprobe]
pub fn count_calloc(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_call(&ctx, Size::Product(0, 1)))
}

/// A call at a function's entry (its cookie the slot), or at an inlined
/// copy whose size needs no operand: its cookie's first operand is
/// [`site::INLINED`], and a free's or a realloc's copy may have its
/// block's place as the second, which the live table reads.
#[inline(always)]
fn try_call(ctx: &ProbeContext, size: Size) -> Result<(), Stat> {
    let tgid = check_target()?;
    let bytes = args::requested(ctx, size)?;
    let cookie = args::cookie(ctx);
    if !args::through_gate(ctx, tgid, cookie) {
        return Ok(());
    }
    let inlined = site::first(cookie) == site::INLINED;
    // An entry's cookie is its slot, marked where the entry is
    // single-stepped.
    if !inlined && cookie > u64::from(u32::MAX) {
        return Err(Stat::SlotOutOfRange);
    }
    let slot = site::slot(cookie);
    let (pointer, read) = match site::second(cookie) {
        kind if inlined && kind != site::NONE && live::on() => args::pointer(ctx.regs, kind, site::constant(cookie)),
        _ => (UNKNOWN_BLOCK, true),
    };
    let event = Event {
        inlined,
        sized: size.requests(),
        unread: !read,
        stepped: site::stepped(cookie),
        bytes,
        pointer,
        ..Event::new(tgid, slot, Source::Call, args::sp(ctx.regs))
    };
    pipeline::run(ctx, ctx.regs, event)
}

/// Counts a call at an inlined copy, with the size where the cookie says
/// (see [`tracer_common::site`]).
#[uprobe]
pub fn count_site(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_count_site(&ctx))
}

#[inline(always)]
fn try_count_site(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let cookie = args::cookie(ctx);
    if !args::through_gate(ctx, tgid, cookie) {
        return Ok(());
    }
    let slot = site::slot(cookie);
    let constant = site::constant(cookie);
    let first = args::operand(ctx.regs, site::first(cookie), constant)?;
    // With --live, a realloc's copy has its block as the second operand.
    let realloc = live::on() && live::reallocates(slot);
    let (bytes, (pointer, read)) = match site::second(cookie) {
        site::NONE => (first, (UNKNOWN_BLOCK, true)),
        kind if realloc => (first, args::pointer(ctx.regs, kind, constant)),
        kind => {
            let second = args::operand(ctx.regs, kind, constant)?;
            (args::counted_product(ctx, first, second), (UNKNOWN_BLOCK, true))
        }
    };
    let event = Event {
        inlined: true,
        sized: true,
        unread: !read,
        stepped: site::stepped(cookie),
        bytes,
        pointer,
        ..Event::new(tgid, slot, Source::Call, args::sp(ctx.regs))
    };
    pipeline::run(ctx, ctx.regs, event)
}

/// `--types`: counts a new reference, and the new object under its type:
/// the object is where the cookie's first operand says (`%rdi` at a
/// function's entry, or where an inlined copy's DWARF or code puts it).
#[uprobe]
pub fn count_object(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_count_object(&ctx))
}

#[inline(always)]
fn try_count_object(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let cookie = args::cookie(ctx);
    if !args::through_gate(ctx, tgid, cookie) {
        return Ok(());
    }
    // Not read is a miss, after the call is counted.
    let (pointer, read) = args::pointer(ctx.regs, site::first(cookie), site::constant(cookie));
    let event = Event {
        unread: !read,
        stepped: site::stepped(cookie),
        pointer,
        ..Event::new(tgid, site::slot(cookie), Source::NewObject, args::sp(ctx.regs))
    };
    pipeline::run(ctx, ctx.regs, event)
}

/// `--types`: counts a call of the object domain's free
/// (`PyObject_Free`) and the destruction of the object whose block it
/// frees: the pointer is where the cookie's first operand says (`%rdi` at
/// the entry, or where an inlined copy's DWARF puts `ptr`).
#[uprobe]
pub fn free_object(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_free_object(&ctx))
}

#[inline(always)]
fn try_free_object(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let cookie = args::cookie(ctx);
    if !args::through_gate(ctx, tgid, cookie) {
        return Ok(());
    }
    let (pointer, read) = args::pointer(ctx.regs, site::first(cookie), site::constant(cookie));
    // An inlined copy's second operand is `INLINED` (a free reads one):
    // with --live, its call is an API call, as `count_call`'s at the
    // copies of a free without --types.
    let event = Event {
        inlined: site::second(cookie) == site::INLINED,
        unread: !read,
        stepped: site::stepped(cookie),
        pointer,
        ..Event::new(tgid, site::slot(cookie), Source::FreeObject, args::sp(ctx.regs))
    };
    pipeline::run(ctx, ctx.regs, event)
}

/// `--native`: `malloc(size)`.
#[uprobe]
pub fn native_size_arg0(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::Arg(0)))
}

/// `--native`: `realloc(ptr, size)`, `aligned_alloc(alignment, size)`,
/// `mmap(addr, length, …)`.
#[uprobe]
pub fn native_size_arg1(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::Arg(1)))
}

/// `--native`: `posix_memalign(&ptr, alignment, size)`.
#[uprobe]
pub fn native_size_arg2(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::Arg(2)))
}

/// `--native`: `calloc(nelem, elsize)`.
#[uprobe]
pub fn native_calloc(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::Product(0, 1)))
}

/// `--native`: `free(ptr)`.
#[uprobe]
pub fn native_call(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::None))
}

/// `--native`: `munmap(addr, length)`: the length is released, not
/// requested; the loader gives its slot no histogram domain.
#[uprobe]
pub fn native_release_arg1(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_native(&ctx, Size::Arg(1)))
}

/// A call of libc's allocator, counted as the Python allocators are, but
/// apart where a nested call site marked it (see [`crate::nested`]).
#[inline(always)]
fn try_native(ctx: &ProbeContext, size: Size) -> Result<(), Stat> {
    let tgid = check_target()?;
    let bytes = args::requested(ctx, size)?;
    let slot = args::slot(ctx)?;
    let source = if nested::take(slot) { Source::NestedNative } else { Source::Native };
    let event = Event { sized: size.requests(), bytes, ..Event::new(tgid, slot, source, args::sp(ctx.regs)) };
    pipeline::run(ctx, ctx.regs, event)
}

/// A free probed at the implementation its function pointer holds
/// (pyenv's `_PyObject_Free`, whose `PyObject_Free` jumps there through
/// the pointer with nothing the kernel emulates on the way): counts the
/// call as its slot's function, or apart, as nested, where the thread was
/// marked on the way by another API function that jumps to the same
/// implementation (`PyMem_Free`, counted at its own entry) or by a direct
/// call in the image (pymalloc's realloc moving a block): see
/// [`crate::nested`].
#[uprobe]
pub fn count_claimed(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_claimed(&ctx))
}

#[inline(always)]
fn try_claimed(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let slot = args::slot(ctx)?;
    let sp = args::sp(ctx.regs);
    let source = if nested::take_at(slot, sp) { Source::NestedNative } else { Source::Call };
    pipeline::run(ctx, ctx.regs, Event::new(tgid, slot, source, sp))
}

/// A nested call site, whose cookie is the slot of the function it calls
/// (a libc function with `--native`, or a free's implementation): marks
/// that call (see [`crate::nested`]).
#[uprobe]
pub fn native_nested(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_nested(&ctx))
}

#[inline(always)]
fn try_nested(ctx: &ProbeContext) -> Result<(), Stat> {
    check_target()?;
    nested::mark(args::slot(ctx)?, args::sp(ctx.regs))
}

/// `--live`: at an allocating API function's entry (out of line): leaves
/// the call's domain and size for the implementation it calls.
#[uprobe]
pub fn live_alloc(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_api_entry(&ctx))
}

/// `--live`: at a free's entry (out of line): takes its block out of the
/// table.
#[uprobe]
pub fn live_free(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_api_entry(&ctx))
}

/// An API function's entry: its arguments as its slot's role says.
#[inline(always)]
fn try_api_entry(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let slot = args::slot(ctx)?;
    let arg = |n| args::arg(ctx, n);
    let (bytes, pointer) = match live::role_of(slot).api() {
        Role::MALLOC => (arg(0)?, 0),
        // Saturated: its counting probe counts the overflow.
        Role::CALLOC => (args::product(arg(0)?, arg(1)?).unwrap_or(u64::MAX), 0),
        Role::REALLOC => (arg(1)?, arg(0)?),
        Role::FREE => (0, arg(0)?),
        _ => return Ok(()),
    };
    let event = Event { bytes, pointer, ..Event::new(tgid, slot, Source::ApiEntry, args::sp(ctx.regs)) };
    pipeline::run(ctx, ctx.regs, event)
}

/// `--live`: at an allocator implementation's entry.
#[uprobe]
pub fn live_impl(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_live_impl(&ctx))
}

/// An implementation's entry: its arguments, which follow the
/// allocator's context, as its slot's role says.
#[inline(always)]
fn try_live_impl(ctx: &ProbeContext) -> Result<(), Stat> {
    let tgid = check_target()?;
    let slot = args::slot(ctx)?;
    let role = live::role_of(slot).kind();
    let arg = |n| args::arg(ctx, n);
    let (bytes, pointer) = match role {
        Role::MALLOC => (arg(1)?, 0),
        Role::CALLOC => (args::product(arg(1)?, arg(2)?).unwrap_or(u64::MAX), 0),
        Role::REALLOC => (arg(2)?, arg(1)?),
        Role::FREE => (0, arg(1)?),
        // Its argument is a size class: the size is the API call's.
        Role::POOL => (0, 0),
        _ => return Ok(()),
    };
    let event = Event { role, bytes, pointer, ..Event::new(tgid, slot, Source::Implementation, args::sp(ctx.regs)) };
    pipeline::run(ctx, ctx.regs, event)
}

/// `--live`: at an implementation's (or a libc call's) `ret`: the stack
/// pointer is the entry's.
#[uprobe]
pub fn live_ret(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_live_ret(&ctx, ctx.regs, 0))
}

/// `--live`: at an implementation's return, through a uretprobe: the
/// return address is popped, so the stack pointer is 8 above the entry's.
#[uretprobe]
pub fn live_ret_uret(ctx: RetProbeContext) -> u32 {
    counted(&ctx, try_live_ret(&ctx, ctx.regs, 8))
}

#[inline(always)]
fn try_live_ret<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, popped: u64) -> Result<(), Stat> {
    let tgid = check_target()?;
    let sp = args::sp(regs).wrapping_sub(popped);
    // The slot is the implementation's frame's, found by its stack pointer.
    let event = Event { pointer: args::rax(regs), ..Event::new(tgid, 0, Source::Return, sp) };
    pipeline::run(ctx, regs, event)
}

/// `--returns`: records the value in rax at a point where it holds the
/// function's result: on a `ret` instruction, or placed where the result
/// is final.
#[uprobe]
pub fn ret_value(ctx: ProbeContext) -> u32 {
    counted(&ctx, try_ret_value(&ctx, ctx.regs))
}

/// `--returns`: records a function's return value through a uretprobe.
#[uretprobe]
pub fn ret_value_uret(ctx: RetProbeContext) -> u32 {
    counted(&ctx, try_ret_value(&ctx, ctx.regs))
}

#[inline(always)]
fn try_ret_value<C: EbpfContext>(ctx: &C, regs: *mut pt_regs) -> Result<(), Stat> {
    let tgid = check_target()?;
    let slot = args::slot(ctx)?;
    let event = Event { pointer: args::rax(regs), ..Event::new(tgid, slot, Source::Returned, args::sp(regs)) };
    pipeline::run(ctx, regs, event)
}
