//! The counts an interval or the summary reports: per probe and per
//! process since the attach, with the BPF misses, requested sizes, types,
//! collections and what `--stacks` and `--live` add, and the rates
//! between two of them.

use std::time::Duration;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use tracer_common::stats::Stat;

use super::{
    attached::Attached,
    cost::{Budget, Cost, ProfileCost},
    live::{Leaks, Live},
    stacks::{NativeModule, Site, StackCount, StackCoverage},
};
use crate::plan::gc::GcSource;

/// Calls and requested bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub calls: u64,
    pub bytes: u64,
}

/// What an allocating function returned (`--returns`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Returned {
    pub returns: u64,
    /// Returns of NULL: failed allocations.
    pub null: u64,
    /// Wrapping sum of the returned pointers.
    pub pointer_sum: u64,
}

/// A `--budget` rate estimate of one probe: counted while traced, and
/// taken to the target's rate untraced by `budget.slowdown`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeEstimate {
    pub calls_per_s: f64,
    /// The 95% confidence interval, once there are two windows; its upper
    /// end infinite (`null` in the JSON) with `lower_bound`.
    #[serde(default, deserialize_with = "interval")]
    pub calls_per_s_ci95: Option<[f64; 2]>,
    pub bytes_per_s: f64,
    #[serde(default, deserialize_with = "interval")]
    pub bytes_per_s_ci95: Option<[f64; 2]>,
    /// The rates are known only from below: the windows slowed the target
    /// so much (`budget.slowdown` has no `at_most`) that its rates
    /// untraced are at least these, and the intervals' upper ends are
    /// `null`; or the probe's calls all fell while the windows went live
    /// or came down, and its rate is its calls over every moment it was
    /// attached.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lower_bound: bool,
}

impl ProbeEstimate {
    /// Whether the calls' rate is a figure: not a zero that nothing bounds
    /// from above (no interval yet, or windows that slowed the target past
    /// knowing by how much), which every output shows as unknown.
    #[must_use]
    pub fn calls_known(&self) -> bool {
        rate_told(self.calls_per_s, self.calls_per_s_ci95)
    }

    /// As [`Self::calls_known`], for the bytes' rate (unknown too where no
    /// call, so no size, was seen).
    #[must_use]
    pub fn bytes_known(&self) -> bool {
        rate_told(self.bytes_per_s, self.bytes_per_s_ci95)
    }
}

/// Whether an estimated rate is a figure: anything but a zero with no
/// finite upper end, which every output shows as unknown (`?`).
#[must_use]
pub fn rate_told(per_s: f64, ci95: Option<[f64; 2]>) -> bool {
    per_s != 0.0 || ci95.is_some_and(|[_, hi]| hi.is_finite())
}

/// An interval as the JSON has it: an upper end with no bound is written
/// `null` (`serde_json` writes an infinite number so), and read back as
/// infinite, so that `--all` and `tracer report` read what a run wrote.
fn interval<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<[f64; 2]>, D::Error> {
    let pair = Option::<[Option<f64>; 2]>::deserialize(d)?;
    Ok(pair.map(|[lo, hi]| [lo.unwrap_or(0.0), hi.unwrap_or(f64::INFINITY)]))
}

/// One probe's cumulative counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeCounts {
    pub calls: u64,
    /// Requested bytes (0 for a function that requests none).
    pub bytes: u64,
    /// With `--native`, for a libc function that another probed one calls
    /// directly (glibc's `realloc` relaying to `malloc` and `free`): those
    /// calls, which are not in `calls` and `bytes` (the request is counted
    /// once, under the function the program called).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<Counts>,
    /// With `--returns`, for an allocating function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned: Option<Returned>,
    /// Passes of its gated sites (jumps probed for the inlined copy they
    /// lead into) that went elsewhere: hits it costs, no calls. Left out
    /// where 0.
    #[serde(default, skip_serializing_if = "super::cost::is_zero_u64")]
    pub gate_other: u64,
    /// Of its hits, those at its single-stepped sites, where it has sites
    /// of both kinds (an emulated entry and single-stepped copies, or the
    /// other way round) and counts them apart: each priced as what it
    /// cost. Left out where it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stepped_hits: Option<u64>,
    /// With `--budget`: the counts are of the traced windows; these are
    /// the rates estimated from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<ProbeEstimate>,
    /// Calls per second over this interval (in a summary, over the run).
    /// Left out with `--budget`, whose rates are estimates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_s: Option<f64>,
    /// Bytes per second likewise; left out too for a function that
    /// requests no bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<f64>,
}

impl ProbeCounts {
    /// `calls` and `bytes` alone: no nested calls, returns, gates' other
    /// passes, estimates or rates.
    #[must_use]
    pub const fn new(calls: u64, bytes: u64) -> Self {
        Self {
            calls,
            bytes,
            nested: None,
            returned: None,
            gate_other: 0,
            stepped_hits: None,
            estimate: None,
            calls_per_s: None,
            bytes_per_s: None,
        }
    }
}

/// A file mapped after the attach whose calls are counted only from
/// `since_s` on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateModule {
    pub path: String,
    /// When its sites were attached, in seconds since the attach.
    pub since_s: f64,
    #[serde(flatten)]
    pub coverage: LateCoverage,
}

/// What became of a file mapped after the attach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LateCoverage {
    /// Its direct calls to `symbol` are probed at `sites` call sites; with
    /// `escape`, its calls through that function's address are not.
    Sites { symbol: String, sites: usize, escape: Option<String> },
    /// It could not be probed at all.
    Failed { error: String },
}

/// A traced process that exited: its final counts, read before its
/// entries left the kernel maps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitedProcess {
    pub pid: u32,
    /// When tracer saw it gone, in seconds since the attach.
    pub exited_s: f64,
    pub probes: IndexMap<String, Counts>,
}

/// Cumulative counts since the attach.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub elapsed_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// tracer's estimated cost to the target, over this interval (in a
    /// summary, over the run); left out until the cost of a hit is
    /// calibrated, or when it could not be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// In the production profile: every source's cost against the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileCost>,
    /// Totals over every traced process, in report order.
    pub probes: IndexMap<String, ProbeCounts>,
    /// The same per process that hit any probe, by PID (processes that
    /// exited included; a PID used by two processes in turn adds both).
    pub pids: IndexMap<String, IndexMap<String, Counts>>,
    /// With `--all`: what each process in `pids` is (its namespace PID,
    /// container, command line and interpreter), by host PID.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub processes: IndexMap<String, super::ProcessInfo>,
    /// Every BPF-side miss counter, then [`KERNEL_MISSES`].
    pub stats: IndexMap<String, u64>,
    /// With call sites (`--placement call-sites`, or `auto` tracing one
    /// running process exactly): each file mapped after the attach that
    /// calls, or lets out the address of, a function at its call sites,
    /// and what of it is counted.
    pub late_modules: Vec<LateModule>,
    /// With `--exe`: each traced process that exited, separately.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exited: Vec<ExitedProcess>,
    /// Every probe hit so far, return probes included: what tracer's cost
    /// to the target is made of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hits: Option<u64>,
    /// Requested sizes by domain; left out when no allocating function is
    /// probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<Sizes>,
    /// With `--stacks`: the allocation sites (innermost Python frames) with
    /// the most calls, most first, `--top` of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<Vec<Site>>,
    /// With `--stacks`, in the summary only: every stack seen, with its
    /// counts (what `--folded` and `--flamegraph` are made of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<StackCount>>,
    /// With `--stacks`: how much of the events the stacks cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_coverage: Option<StackCoverage>,
    /// With `--native-stacks`: each module the unwinder read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_modules: Option<Vec<NativeModule>>,
    /// With `--types`: objects created by type since the attach, over every
    /// traced process, most first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<TypeCount>>,
    /// Garbage collections since the attach, over every traced process;
    /// left out with `--gc off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<Gc>,
    /// In the production profile with `--pid`: the heap by type from the
    /// latest census, with each type's change (see [`super::heap`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap: Option<super::heap::Heap>,
    /// With `--live`: the blocks outstanding now, per domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// With `--leaks`, in the summary only: the oldest outstanding blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaks: Option<Leaks>,
    /// With `--growth`: heap growth by Python stack, sampled, over the
    /// interval (in the summary, since the attach), or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<super::growth::Growth>,
}

/// Garbage collections since the attach, by generation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gc {
    /// Where they are seen from: `markers`, `function`, `none`, or in the
    /// production profile `memory` (the interpreter's own statistics).
    pub source: GcSource,
    /// With `none`, why; with `function`, what its calls count that the
    /// markers would not (3.13's automatic collections), if anything; with
    /// `memory`, why the durations are unknown, or what the statistics'
    /// generations are where they are not generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// With `memory`: where the durations come from (`markers`,
    /// `function`, or `none`, and then each `duration_s` is null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durations: Option<GcSource>,
    /// Generations 0, 1 and 2 always (with `none`, nothing), then any other
    /// the probes saw, such as the unknown one.
    pub generations: Vec<GcGeneration>,
    /// With `--exe`: the same per process that collected, by PID (exited
    /// ones included).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub pids: IndexMap<String, Vec<GcGeneration>>,
    /// With `memory`: where the GC probes counted more collections of a
    /// generation than the statistics' last good reading (the process
    /// ended before tracer could read them again), which generations'
    /// counts are the probes', and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes_past_memory: Option<String>,
    /// With `memory`: where the readings since the last good one failed
    /// (the process ended) and no GC probe counts the collections after
    /// it, when that reading was, in seconds since the attach: the
    /// collections after it are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read_s: Option<f64>,
    /// With `last_read_s`: that the collections after it are not counted,
    /// why, and what would count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<String>,
}

/// The collections of one generation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GcGeneration {
    /// `null` where the generation is not known: the start's argument could
    /// not be read (`gc_arg_missing`), or it was 3.13's `GENERATION_AUTO`.
    pub generation: Option<u32>,
    /// Collections that ended (a start and its done seen on one thread).
    pub collections: u64,
    /// Their summed durations, start to done, in seconds; null where no
    /// probe sees them (the profile on a build without markers).
    pub duration_s: Option<f64>,
    /// The objects they found unreachable (collected, and uncollectable
    /// ones, as `gc.collect()` returns them).
    pub collected: u64,
    /// With `memory`: of those, the uncollectable ones (`gc.get_stats()`'s
    /// `uncollectable`; its `collected` is `collected` minus these).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncollectable: Option<u64>,
    /// Over the interval (in a summary, over the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collections_per_s: Option<f64>,
}

/// Requested sizes since the attach, per allocator domain, over every
/// traced process: `[lo, hi, calls, bytes]` for each log2 bucket that has
/// calls (sizes `lo` to `hi`), smallest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    pub object: Vec<[u64; 4]>,
    pub mem: Vec<[u64; 4]>,
    pub raw: Vec<[u64; 4]>,
    /// With `--native`: libc's `malloc`, `calloc`, `realloc`,
    /// `posix_memalign` and `aligned_alloc` (not `mmap`, whose lengths are
    /// pages, not requests); nested calls are not in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<Vec<[u64; 4]>>,
    /// Per domain, calls whose size is not known (inlined copies where
    /// neither the DWARF nor the code shows it), so in no bucket; left out
    /// where there are none.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub unsized_calls: IndexMap<String, u64>,
}

/// Objects of one type created since the attach, and how many of them
/// died since.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TypeCount {
    /// Its qualified name (a heap type's module and `__qualname__`, a
    /// static type's `tp_name`); where that could not be read, its address
    /// and PID.
    pub name: String,
    /// New references to objects of this type (creations, and objects a
    /// free list gave out again).
    pub created: u64,
    /// Of those, the objects whose memory the object domain's free
    /// (`PyObject_Free`, and its inlined copies) gave back. Objects
    /// created before the attach are not known, and their frees are not
    /// counted.
    pub destroyed: u64,
    /// Of those, the objects that died without a free: a later new
    /// reference reused their address (a free list gave the object out
    /// again, or it was resized in place).
    pub reused: u64,
    /// Of those, the objects not seen to die: `created - destroyed -
    /// reused`. An object a free list holds, dead but not given out again,
    /// is still counted here.
    pub live: u64,
    /// Over the interval (in a summary, over the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_per_s: Option<f64>,
    /// Why its name could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
}

/// Name of the kernel's recursion-miss count in `stats`.
pub const KERNEL_MISSES: &str = "kernel_recursion_misses";

/// Names in `stats` of the reads of tracer's maps that fell back to a key
/// at a time: the kernel has no batch lookup for them, or a bucket was
/// busy. No event is missing for them (the map is read whole all the
/// same); tracer spends more CPU time.
pub const MAP_BATCH_UNSUPPORTED: &str = "map_batch_unsupported";
pub const MAP_BATCH_BUSY: &str = "map_batch_busy";

/// Name in `stats` of the readings of the collector's statistics that
/// failed where the GC probes counted the collections all the same (see
/// `gc_memory_failed`, those they did not).
pub const GC_MEMORY_FAILED_COVERED: &str = "gc_memory_failed_covered";

/// The stats that tracer, not a BPF program, counts, and that mean no
/// event is missing.
const NO_LOSS: [&str; 3] = [MAP_BATCH_UNSUPPORTED, MAP_BATCH_BUSY, GC_MEMORY_FAILED_COVERED];

impl Snapshot {
    /// The stats map from the BPF-side stats (in [`Stat::ALL`] order), the
    /// kernel's miss count and the map reads that fell back to a key at a
    /// time.
    #[must_use]
    pub fn stats_from(
        bpf: &[u64],
        kernel_misses: u64,
        batch: crate::kernel::batch::Fallbacks,
    ) -> IndexMap<String, u64> {
        Stat::ALL
            .iter()
            .zip(bpf)
            .map(|(s, &value)| (s.name().to_owned(), value))
            .chain([
                (KERNEL_MISSES.to_owned(), kernel_misses),
                (MAP_BATCH_UNSUPPORTED.to_owned(), batch.unsupported),
                (MAP_BATCH_BUSY.to_owned(), batch.busy),
            ])
            .collect()
    }

    /// Whether `stat` is counted by a BPF program or the kernel's
    /// programs (a miss of theirs), rather than by tracer's own reads.
    #[must_use]
    pub fn is_bpf(stat: &str) -> bool {
        stat == KERNEL_MISSES || Stat::ALL.iter().any(|s| s.name() == stat)
    }

    /// The time since the attach.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        Duration::try_from_secs_f64(self.elapsed_s).unwrap_or_default()
    }

    /// Sets every probe's rates: over the time since `since` (the previous
    /// interval), or over the whole run without it. Not with `--budget`,
    /// whose counts are of windows only.
    pub fn compute_rates(&mut self, attached: &Attached, since: Option<&Self>) {
        if self.budget.is_some() {
            return;
        }
        let secs = self.elapsed_s - since.map_or(0.0, |s| s.elapsed_s);
        for (name, p) in &mut self.probes {
            let before = since.and_then(|s| s.probes.get(name)).copied();
            let dcalls = p.calls - before.map_or(0, |b| b.calls.min(p.calls));
            let dbytes = p.bytes - before.map_or(0, |b| b.bytes.min(p.bytes));
            p.calls_per_s = Some(rate(dcalls, secs));
            p.bytes_per_s = attached.measures_bytes(name).then(|| rate(dbytes, secs));
        }
        let before = since.and_then(|s| s.types.as_ref());
        for t in self.types.iter_mut().flatten() {
            let was = before.and_then(|b| b.iter().find(|b| b.name == t.name)).map_or(0, |b| b.created.min(t.created));
            t.created_per_s = Some(rate(t.created - was, secs));
        }
        let before = since.and_then(|s| s.gc.as_ref());
        for g in self.gc.iter_mut().flat_map(|gc| &mut gc.generations) {
            let was = before
                .and_then(|b| b.generations.iter().find(|b| b.generation == g.generation))
                .map_or(0, |b| b.collections.min(g.collections));
            g.collections_per_s = Some(rate(g.collections - was, secs));
        }
    }

    /// Whether a stat's non-zero value means events are missing from the
    /// counts (as opposed to merely worth knowing).
    #[must_use]
    pub fn is_loss(stat: &str) -> bool {
        !NO_LOSS.contains(&stat) && Stat::ALL.iter().find(|s| s.name() == stat).is_none_or(|s| s.is_loss())
    }
}

#[allow(clippy::cast_precision_loss, reason = "a rate, not a count")]
fn rate(delta: u64, secs: f64) -> f64 {
    if secs > 0.0 { delta as f64 / secs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::ProbeEstimate;

    /// A lower bound's interval has no upper end: written `null`, read back
    /// infinite (`--all` reads its children's lines so).
    #[test]
    fn an_interval_with_no_upper_end_reads_back() {
        let e = ProbeEstimate {
            calls_per_s: 300.0,
            calls_per_s_ci95: Some([180.0, f64::INFINITY]),
            bytes_per_s: 0.0,
            bytes_per_s_ci95: None,
            lower_bound: true,
        };
        let line = serde_json::to_string(&e).expect("JSON");
        assert_eq!(
            line,
            r#"{"calls_per_s":300.0,"calls_per_s_ci95":[180.0,null],"bytes_per_s":0.0,"bytes_per_s_ci95":null,"lower_bound":true}"#
        );
        assert_eq!(serde_json::from_str::<ProbeEstimate>(&line).expect("read back"), e);
        let old: ProbeEstimate =
            serde_json::from_str(r#"{"calls_per_s":1.0,"bytes_per_s":0.0}"#).expect("no intervals");
        assert_eq!((old.calls_per_s_ci95, old.lower_bound), (None, false));
    }
}
