//! `--live` and `--leaks`: the model of the live table, from its counts
//! and, at the end, its blocks.

use tracer_common::{
    live::{LiveCounts, Pymalloc},
    sizes::Domain,
};

use crate::{
    discover::{Inlining, Resolved},
    kernel::Session,
    model,
    plan::Plan,
};

/// What the live figures cannot know, said with every one of them.
pub const UNKNOWN: &str = "allocations made before tracer attached are not in the table: their frees are counted as untracked_frees, and never lower the live counts";

/// With `--native`, what the live table leaves out.
pub const NATIVE_UNTRACKED: &str = "libc's allocator (--native) is not tracked: its blocks are in no live count and no --leaks list (the interpreter's raw domain, which calls libc, is)";

/// `--leaks`: which blocks the summary lists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaksConfig {
    /// At most this many, oldest first.
    pub list: usize,
    /// Only blocks at least this many seconds old.
    pub older_s: f64,
}

/// The model of the live table's counts (per domain, in
/// [`Domain::ALL`] order) for `plan`, whose table has room for `capacity`.
#[must_use]
pub fn report(plan: &Plan, counts: &[LiveCounts], capacity: u32) -> model::Live {
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
    let all = [object, mem, raw];
    let dropped = all.iter().map(|d| d.dropped).sum();
    let unseen: u64 = all.iter().map(|d| d.unseen_allocations + d.unseen_frees).sum();
    let partial = if plan.live_impls.is_empty() {
        Some(format!(
            "the allocator implementations (_PyObject_Malloc, _PyMem_RawMalloc, ...) were not found in the image's symbols nor in a debug file, so no returned pointer is read and no block is tracked; {}",
            plan.live_fix
        ))
    } else if unseen > 0 {
        Some(format!(
            "{unseen} allocator calls (the unseen_* counts) ran an allocator inlined into their caller and called no implementation tracer probes (on an LTO build, the raw allocator calling libc directly for a block pymalloc does not serve, a realloc, or pymalloc itself where its state was not found), so their blocks are not tracked; for exact live memory start the target with PYTHONMALLOC=debug (every call then goes through the out-of-line debug hooks, at some cost to the target) or use a build without LTO"
        ))
    } else {
        None
    };
    // libc's allocator (`--native`) has its calls counted, never its
    // blocks tracked: said where it is probed, not left as a missing domain.
    let unknown = if plan.probes.iter().any(|p| p.program.is_native()) {
        format!("{UNKNOWN}; {NATIVE_UNTRACKED}")
    } else {
        UNKNOWN.to_owned()
    };
    model::Live { object, mem, raw, capacity, dropped, unknown, partial }
}

/// With `--leaks`, the blocks still in `session`'s live table, the oldest
/// first, as `config` says.
#[must_use]
pub fn leaks(session: &Session, config: LeaksConfig) -> model::Leaks {
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
    let oldest = blocks
        .iter()
        .take(config.list)
        .map(|(k, e)| model::Leak {
            pid: k.tgid,
            address: k.address,
            size: e.size,
            domain: Domain::ALL.iter().find(|d| **d as u32 == e.domain).map_or("?", |d| d.name()).to_owned(),
            function: plan.probes.iter().find(|p| p.slot == e.slot).map_or("?", |p| p.symbol).to_owned(),
            #[allow(clippy::cast_precision_loss, reason = "seconds from nanoseconds")]
            age_s: now.saturating_sub(e.time_ns) as f64 / 1e9,
        })
        .collect();
    model::Leaks {
        older_than_s: config.older_s,
        count,
        bytes,
        oldest,
        sites: "not recorded yet: a block's Python stack is not kept in the live table (see --stacks for where allocations come from)".to_owned(),
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
    use tracer_common::live::role;
    let inlined = plan
        .probes
        .iter()
        .any(|p| p.live.is_some_and(|l| matches!(l & 0xff, role::MALLOC | role::CALLOC)) && !p.inline_sites.is_empty());
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
