//! The event pipeline: every probed call the programs decode (see
//! [`crate::programs`]) goes through [`run`], which takes it through each
//! step in turn: heat, count, sizes, types, live, stacks. A step is
//! switched by the event's [`Source`], which each program sets as a
//! constant, and by the loader's globals (`HEAT_ON`, `STACKS_ON`,
//! `LIVE_ON`), which the verifier reads as constants: a step that is off
//! is dead code to it, so it costs nothing per hit. Each step's miss is
//! counted where it happens; the event goes on, but for a call that could
//! not be counted.
//!
//! The live step comes in two halves, around the stacks step: the call's
//! frame first, then its walk, which the frame (and the block it gets)
//! takes.

use aya_ebpf::{EbpfContext, bindings::pt_regs};
use tracer_common::{
    counter::{CounterKey, NESTED_SLOT, STEPPED_SLOT},
    live::{Role, UNKNOWN_BLOCK},
    stack::why,
    stats::Stat,
};

use crate::{common::bump, count, heat, live, returns, sizes, stacks, types};

/// What kind of hit an event is, which decides the steps it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A call of a probed CPython function, at its entry (or a call site)
    /// or at an inlined copy: counted, its size in the histogram where it
    /// requests one, its stack walked; with `--live`, an inlined copy's
    /// call is an API call of the live table, and an entry's walk goes to
    /// the call its `live_alloc` or `live_free` pushed.
    Call,
    /// `--types`: a new reference, whose object is [`Event::pointer`].
    NewObject,
    /// `--types`: a free in the object domain, whose block is
    /// [`Event::pointer`]; as a [`Source::Call`] otherwise.
    FreeObject,
    /// `--native`: a call of libc's allocator; the live table reads its
    /// arguments by the slot's role.
    Native,
    /// A call of libc's allocator made inside another probed one with
    /// `--native`, or of a free's implementation marked by another API
    /// function or a direct call (see [`crate::nested`]): counted apart,
    /// nothing else.
    NestedNative,
    /// `--live`: an allocator API function's entry (`live_alloc`,
    /// `live_free`), whose counting probe at the same place counts it.
    ApiEntry,
    /// `--live`: an allocator implementation's entry, of [`Event::role`],
    /// requesting [`Event::bytes`] or freeing [`Event::pointer`].
    Implementation,
    /// `--live`: an implementation's (or libc call's) return of
    /// [`Event::pointer`].
    Return,
    /// `--returns`: a function's return value, [`Event::pointer`].
    Returned,
}

/// One hit, decoded: plain values only (a `Result` or `Option` kept
/// across the steps' calls would spill its undefined payload, which the
/// verifier refuses).
#[derive(Clone, Copy)]
pub struct Event {
    /// The process.
    pub tgid: u32,
    /// The probe slot: the counter's, the histogram domain's, the stacks'
    /// switch's and the live role's.
    pub slot: u32,
    pub source: Source,
    /// At an inlined copy (see [`Source::Call`]).
    pub inlined: bool,
    /// Whether its bytes go in the size histogram (of its slot's domain).
    pub sized: bool,
    /// At a single-stepped site of a probe with sites of both kinds: its
    /// hit is counted again apart, to be priced as what it cost.
    pub stepped: bool,
    /// Whether [`Event::pointer`] could not be read: it is then
    /// [`tracer_common::live::UNKNOWN_BLOCK`], and a miss.
    pub unread: bool,
    /// For [`Source::Implementation`], its role's kind.
    pub role: Role,
    /// The bytes it requests (0: none, or unknown).
    pub bytes: u64,
    /// The pointer it frees, moves, creates or returns, as its
    /// [`Source`] says; [`tracer_common::live::UNKNOWN_BLOCK`] where it
    /// has none or it was not read.
    pub pointer: u64,
    /// The stack pointer at the call's entry, which pairs its frames in
    /// the live table.
    pub sp: u64,
}

impl Event {
    /// An event of `source` with nothing but its process, slot and stack
    /// pointer: no bytes, no pointer.
    #[inline(always)]
    pub const fn new(tgid: u32, slot: u32, source: Source, sp: u64) -> Self {
        Self {
            tgid,
            slot,
            source,
            inlined: false,
            sized: false,
            stepped: false,
            unread: false,
            role: Role::NONE,
            bytes: 0,
            pointer: UNKNOWN_BLOCK,
            sp,
        }
    }
}

/// Takes `event` through every step that is on; `regs` are its registers
/// (the native stack's unwind and libc's arguments read them).
#[inline(always)]
pub fn run<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, event: Event) -> Result<(), Stat> {
    let Event { tgid, slot, source, bytes, pointer, .. } = event;
    heat::bump(regs);
    match source {
        Source::Call | Source::NewObject | Source::FreeObject | Source::Native => {
            count::add(ctx, CounterKey { tgid, slot }, bytes)?;
            if event.stepped {
                // A full map loses no call here, only this hit's kind (as
                // a gate's other pass loses its price): the loader gives
                // these slots room, and where processes fill it anyway
                // `MapFull` counts the calls it lost.
                let _ = count::add(ctx, CounterKey { tgid, slot: slot | STEPPED_SLOT }, 0);
            }
        }
        Source::NestedNative => count::add(ctx, CounterKey { tgid, slot: slot | NESTED_SLOT }, bytes)?,
        Source::Returned => returns::add(ctx, CounterKey { tgid, slot }, pointer)?,
        Source::ApiEntry | Source::Implementation | Source::Return => {}
    }
    // A pointer that could not be read is a miss, counted now: a flag kept
    // to the end would double the states the verifier walks the stack
    // walk with.
    if event.unread {
        bump(ctx, if source == Source::FreeObject { Stat::FreeArgMissing } else { Stat::ArgMissing });
    }
    if event.sized && matches!(source, Source::Call | Source::Native) {
        sizes::add(slot, bytes);
    }
    let typed = match source {
        Source::NewObject if !event.unread => types::created(ctx, tgid, pointer),
        Source::FreeObject if !event.unread => types::destroyed(tgid, pointer),
        _ => Ok(()),
    };
    if let Err(stat) = typed {
        bump(ctx, stat);
    }
    // The live step's first half, the call itself: an API call's frame
    // (for the implementation it calls), an implementation's entry, a
    // return's block. Before the walk: a frame whose walk is a constant
    // here (a failed walk's reason) would be verified once per reason,
    // which no program's budget of instructions allows.
    let lived = if live::on() {
        let sp = event.sp;
        match source {
            Source::Call | Source::FreeObject if event.inlined => live::api(tgid, slot, bytes, pointer, sp),
            Source::ApiEntry => live::entry(tgid, slot, bytes, pointer, sp),
            Source::Implementation => live::implementation(tgid, slot, event.role, bytes, pointer, sp),
            Source::Return => live::returned(tgid, pointer, sp),
            _ => Ok(()),
        }
    } else {
        Ok(())
    };
    if let Err(stat) = lived {
        bump(ctx, stat);
    }
    let walk = match source {
        Source::Call | Source::NewObject | Source::FreeObject | Source::Native => {
            stacks::walk(ctx, regs, tgid, slot, bytes)
        }
        _ => why::NOT_WALKED,
    };
    // Its second half, the walk: an API call's frame takes it, and a libc
    // call's frame is pushed with it.
    if live::on() {
        match source {
            Source::Call | Source::FreeObject if walk != why::NOT_WALKED => live::walked(slot, walk),
            Source::Native => live::native(regs, tgid, slot, false, event.sp, walk)?,
            Source::NestedNative => live::native(regs, tgid, slot, true, event.sp, why::NOT_WALKED)?,
            _ => {}
        }
    }
    Ok(())
}
