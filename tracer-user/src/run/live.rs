//! `--live` and `--leaks`: the model of the live table, from its counts
//! and, at the end, its blocks.

use tracer_common::{
    live::{FRAME_DEPTH, FRAME_THREADS, LiveCounts, Pymalloc, Stale},
    sizes::Domain,
    stack::{FIRST_HASH, why},
    stats::Stat,
};

use super::stacks::StackNames;
use crate::{
    config::LeaksConfig,
    discover::{Inlining, Resolved},
    kernel::Session,
    model,
    plan::Plan,
};

/// What the live figures cannot know, said with every one of them.
pub const UNKNOWN: &str = "allocations made before tracer attached are not in the table: their frees are counted as untracked_frees, and never lower the live counts";

/// With `--native`, how libc's blocks are counted.
pub const NATIVE_ONCE: &str = "libc's allocator (--native) is the native domain: a libc call made inside another allocator call (the raw domain's _PyMem_RawMalloc calling malloc, pymalloc's arenas, glibc's realloc calling malloc, malloc calling mmap) counts once, under the outer call, as nested; munmap takes out the mapping that starts at its address, whole";

/// The model of the live table's counts (per domain, in
/// [`Domain::ALL`] order) for `plan`, whose table has room for `capacity`,
/// where `pending_full` calls in flight found their thread's stack of
/// calls full (`live_pending_full`) and `unmatched` calls or returns found
/// no call of theirs in flight (`live_unmatched`).
#[must_use]
pub fn report(plan: &Plan, counts: &[LiveCounts], (capacity, pending_full, unmatched): (u32, u64, u64)) -> model::Live {
    let domain = |d: Domain| {
        let c = counts.get(d as usize).copied().unwrap_or_default();
        model::LiveDomain {
            count: c.count.cast_signed(),
            bytes: c.bytes.cast_signed(),
            allocations: c.tracked,
            frees: c.freed,
            untracked_frees: c.untracked_frees,
            dropped: c.dropped,
            unseen_allocations: c.unseen_allocs,
            unseen_frees: c.unseen_frees,
            nested: c.nested,
        }
    };
    let (object, mem, raw) = (domain(Domain::Object), domain(Domain::Mem), domain(Domain::Raw));
    let natives: Vec<_> = plan.probes.iter().filter(|p| p.program.is_native()).collect();
    let native = (!natives.is_empty()).then(|| domain(Domain::Native));
    let all = [object, mem, raw, native.unwrap_or_default()];
    let dropped = all.iter().map(|d| d.dropped).sum();
    let unseen: u64 = all.iter().map(|d| d.unseen_allocations + d.unseen_frees).sum();
    // libc's functions whose blocks are not tracked, with why.
    let native_partial: Vec<String> = natives
        .iter()
        .filter(|p| p.coverage.live != Some(crate::plan::coverage::Completeness::Complete))
        .map(|p| format!("{}: {}", p.symbol, p.coverage.reason.as_deref().unwrap_or("not tracked")))
        .collect();
    let why = if !native_partial.is_empty() {
        Some(format!("libc's blocks are not all tracked ({})", native_partial.join("; ")))
    } else if plan.live_impls.is_empty() {
        Some(format!(
            "the allocator implementations (_PyObject_Malloc, _PyMem_RawMalloc, ...) were not found in the image's symbols nor in a debug file, so no returned pointer is read and no block is tracked; {}",
            plan.live_fix
        ))
    } else if unseen > 0 {
        let libc =
            if natives.is_empty() { " (with --native, libc's functions serve as its implementation)" } else { "" };
        Some(format!(
            "{unseen} allocator calls (the unseen_* counts) ran an allocator inlined into their caller and called no implementation tracer probes, so their blocks are not tracked (on an LTO build: the raw allocator inlined, calling the C library's directly{libc}; a copy whose size or block neither the DWARF nor the code shows, which coverage counts; a realloc of a block the table does not hold; or pymalloc itself, where its state was not found); for exact live memory start the target with PYTHONMALLOC=debug (every call then goes through the out-of-line debug hooks, at some cost to the target) or use a build without LTO"
        ))
    } else {
        None
    };
    // Calls lost in flight cut the figures whatever else does.
    let lost = (pending_full > 0).then(|| format!(
        "{pending_full} allocator calls in flight could not be kept (live_pending_full): a thread's stack of calls in flight ({FRAME_DEPTH} deep) was full and lost its outermost call, or the map of threads was full; the blocks of the calls lost are not tracked"
    ));
    let unpaired = (unmatched > 0).then(|| format!(
        "{unmatched} allocator calls or returns were not paired (live_unmatched): an implementation entered with no API call of its kind in flight on its thread (called directly, or by an inlined copy tracer does not probe), a return or a frame whose call began before the attach, or a thread's calls pushed out of the map of threads with calls in flight ({FRAME_THREADS} threads); their blocks are not tracked"
    ));
    let partial = [why, lost, unpaired].into_iter().flatten().collect::<Vec<_>>();
    let partial = (!partial.is_empty()).then(|| partial.join("; "));
    let unknown = if natives.is_empty() { UNKNOWN.to_owned() } else { format!("{UNKNOWN}; {NATIVE_ONCE}") };
    model::Live { object, mem, raw, native, capacity, dropped, unknown, partial }
}

/// How long the calls left on top of their threads' stacks must stay
/// there to be taken for left: a call in flight (an out-of-line API
/// function about to call its implementation) is gone well within it.
const SETTLED: std::time::Duration = std::time::Duration::from_millis(20);

/// At the end: the calls still last on their threads' stacks, which the
/// thread's next API call would have judged and counted, judged as the
/// programs do ([`tracer_common::live::Frame::stale`]) into the live
/// table's `counts` (per domain): unseen allocations and frees, and a
/// moving realloc's old block, freed inline, taken out of the table. Only
/// a call found on top at two readings [`SETTLED`] apart with no frame
/// pushed on its thread between: one in flight (a busy target's thread
/// inside an API call) would be served, and a busy loop's next call may
/// push a frame equal to it.
pub fn left_unseen(session: &mut Session, counts: &mut [LiveCounts]) -> Result<(), crate::kernel::AttachError> {
    let first = session.left_calls()?;
    std::thread::sleep(SETTLED);
    for (tid, (call, pushes)) in session.left_calls()? {
        if first.get(&tid) != Some(&(call, pushes)) {
            continue;
        }
        // A moved realloc's old block: taken out where its process is
        // known (`Some(None)`: not in the table).
        let stale = call.stale();
        let held = match stale {
            Stale::Take(old) => match crate::discover::process::thread_group_of(tid) {
                Some(tgid) => Some(session.take_block(tgid, old)?),
                None => None,
            },
            _ => None,
        };
        let Some(c) = usize::try_from(call.domain).ok().and_then(|d| counts.get_mut(d)) else { continue };
        match (stale, held) {
            (Stale::Allocation, _) => c.unseen_allocs = c.unseen_allocs.wrapping_add(1),
            // A free whose block stays in the table (its thread gone, its
            // process unknown): unseen, as the programs count one whose
            // block they do not know.
            (Stale::Free, _) | (Stale::Take(_), None) => c.unseen_frees = c.unseen_frees.wrapping_add(1),
            // Not in the table (allocated before the attach): as the
            // programs count a free of such a block.
            (Stale::Take(_), Some(None)) => c.untracked_frees = c.untracked_frees.wrapping_add(1),
            (Stale::Take(_), Some(Some(_))) | (Stale::Seen, _) => {}
        }
        if let Some(e) = held.flatten()
            && let Some(c) = usize::try_from(e.domain).ok().and_then(|d| counts.get_mut(d))
        {
            c.count = c.count.wrapping_sub(1);
            c.bytes = c.bytes.wrapping_sub(e.size);
            c.freed = c.freed.wrapping_add(1);
        }
    }
    Ok(())
}

/// With `--leaks`, the blocks still in `session`'s live table, the oldest
/// first, as `config` says; with `--stacks` (`names`), each with the
/// Python stack it was allocated on, or why it has none.
#[must_use]
pub fn leaks(session: &Session, config: LeaksConfig, mut names: Option<&mut StackNames>) -> model::Leaks {
    let now = monotonic_ns();
    let plan = session.plan();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "--older is checked to be finite, 0 or more and at most ten years, so its nanoseconds fit"
    )]
    let min_age_ns = (config.older_s * 1e9) as u64;
    let mut blocks: Vec<_> =
        session.live_blocks().into_iter().filter(|(_, e)| now.saturating_sub(e.time_ns) >= min_age_ns).collect();
    blocks.sort_by_key(|(k, e)| (e.time_ns, k.address));
    let count = blocks.len() as u64;
    let bytes = blocks.iter().map(|(_, e)| e.size).fold(0u64, u64::saturating_add);
    let mut oldest = Vec::new();
    for (k, e) in blocks.iter().take(config.list) {
        let function = plan.probes.iter().find(|p| p.slot == e.slot).map_or("?", |p| p.symbol);
        let (stack, stack_truncated, no_stack) = match names.as_deref_mut() {
            None => (None, false, None),
            Some(names) => match site(names, session, k.tgid, e.stack, e.slot, function) {
                Ok((frames, cut)) => (Some(frames), cut, None),
                Err(why) => (None, false, Some(why)),
            },
        };
        oldest.push(model::Leak {
            pid: k.tgid,
            address: k.address,
            size: e.size,
            domain: Domain::ALL.iter().find(|d| **d as u32 == e.domain).map_or("?", |d| d.name()).to_owned(),
            function: function.to_owned(),
            #[allow(clippy::cast_precision_loss, reason = "seconds from nanoseconds")]
            age_s: now.saturating_sub(e.time_ns) as f64 / 1e9,
            stack,
            stack_truncated,
            no_stack,
        });
    }
    let sites = if names.is_some() {
        let without = oldest.iter().filter(|l| l.no_stack.is_some()).count();
        format!(
            "each block's Python stack where it was allocated (the table gives its innermost frame, the JSON `stack` all of them, innermost first); {without} of the {} listed have none, and `no_stack` says why",
            oldest.len()
        )
    } else {
        "not recorded: run with --stacks to keep each block's Python stack in the live table".to_owned()
    };
    model::Leaks { older_than_s: config.older_s, count, bytes, oldest, sites }
}

/// A block's stack field (a hash, or a [`why`] value) as its frames, or
/// why it has none.
fn site(
    names: &mut StackNames,
    session: &Session,
    pid: u32,
    stack: u64,
    slot: u32,
    function: &str,
) -> Result<(Vec<model::SiteFrame>, bool), String> {
    let native = session.plan().probes.iter().any(|p| p.slot == slot && p.program.is_native());
    match stack {
        why::NOT_WALKED if native => {
            Err("no stack: --stacks walks at the interpreter's functions, not at libc's".to_owned())
        }
        why::NOT_WALKED if !names.has_stacks(slot) => {
            Err(format!("no stack: {function}'s events get no stacks (add it to --stacks)"))
        }
        why::NOT_WALKED => Err(format!(
            "no stack: its walk did not reach its call's frame in the kernel (counted as {})",
            Stat::LiveNoStack.name()
        )),
        why::SAMPLED_OUT => Err(format!("no stack: --sample {} left its call out", names.sample())),
        v if v < FIRST_HASH => {
            let stat = usize::try_from(v - why::FAILED).ok().and_then(|i| Stat::ALL.get(i));
            Err(stat.map_or_else(
                || format!("no stack: unknown reason {v}"),
                |s| format!("no stack: its walk failed ({}, counted in the stats)", s.name()),
            ))
        }
        hash => names.site(session, pid, hash).map_err(|why| format!("its stack's frames could not be named: {why}")),
    }
}

/// With `--live` on a build that inlines the allocator API (an LTO build:
/// its allocating API functions have inlined copies), where process
/// `pid`'s pymalloc state is, in its memory, so that the programs know
/// the block an inlined pymalloc hands out. `None` on other builds, which
/// call an implementation tracer probes for every block, or where the
/// state is not found (those allocations are then counted as unseen, and
/// the live report says it is partial).
#[must_use]
pub fn pymalloc(r: &Resolved, plan: &Plan, pid: u32) -> Option<Pymalloc> {
    use tracer_common::live::Role;
    let inlined = plan
        .probes
        .iter()
        .any(|p| p.live.is_some_and(|l| matches!(l.api(), Role::MALLOC | Role::CALLOC)) && !p.inline_sites.is_empty());
    if !inlined {
        return None;
    }
    let names = crate::python::pymalloc_names(r.abi)?;
    let debug = match &r.inlining {
        Inlining::Known { source, .. } => Some(std::path::PathBuf::from(source)),
        _ => None,
    };
    let at = crate::discover::pymalloc::find(r.elf.path(), debug.as_deref(), &names)?;
    let function = |name: &str| r.implementations.iter().find(|i| i.name == name);
    let (malloc, calloc) = (function("_PyObject_Malloc")?, function("_PyObject_Calloc")?);
    // One bias for the whole image: its segments keep their distances.
    let target = crate::discover::process::Target::inspect(pid).ok()?;
    let bias = target.address_of_file_offset(malloc.file_offset)?.wrapping_sub(malloc.address);
    let runtime = |address: u64| if address == 0 { 0 } else { address.wrapping_add(bias) };
    Some(Pymalloc {
        usedpools: runtime(at.usedpools),
        tables: [runtime(at.tables[0]), runtime(at.tables[1])],
        malloc: runtime(malloc.address),
        calloc: runtime(calloc.address),
        realloc: function("_PyObject_Realloc").map_or(0, |f| runtime(f.address)),
    })
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut t) };
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}
