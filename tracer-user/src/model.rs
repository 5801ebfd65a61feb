//! One typed model of what tracer reports. The JSON Lines schema (README,
//! "JSON output") is these types: producers fill them, and every output
//! (the table, the JSON, later an exporter, a live view, flame graphs)
//! reads them. Fields are only ever added, as `Option`s or empty lists
//! that are left out while unset, so that older lines still read.

mod live;
pub use live::{Leak, Leaks, Live, LiveDomain};

use std::time::Duration;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use tracer_common::stats::Stat;

use crate::plan::{
    HitCosts,
    coverage::Coverage,
    gc::{GcPlan, GcSource},
    placement::Placement,
    returns::{ReturnMeasurement, ReturnPlan},
};

/// One line of `--json` output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    /// Every probe is live.
    Attached(Attached),
    /// An `--interval` elapsed: cumulative counts since the attach.
    Interval(Snapshot),
    /// Something the user should know: a fallback, a module mapped late, a
    /// BPF log line.
    Note(Note),
    /// The run ended and every probe is detached.
    Summary(Summary),
}

/// The interpreter traced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonInfo {
    pub version: String,
    /// The file with the probed functions, as the target sees it.
    pub image: String,
}

/// How the probes were attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Links {
    /// uprobe-multi links.
    Multi,
    /// One perf-event uprobe per probe.
    Perf,
}

/// What was attached, reported once every probe is live.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attached {
    /// The traced process, or `None` when tracing every process of `exe`.
    pub pid: Option<u32>,
    /// With `--exe`, the executable asked for.
    pub exe: Option<String>,
    pub python: PythonInfo,
    /// The traced process's PID in its own PID namespace (a container's),
    /// where that differs from `pid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_in_namespace: Option<u32>,
    /// The probed functions, in report order.
    pub probes: Vec<String>,
    /// Optional probes this build lacks.
    pub missing: Vec<String>,
    pub links: Links,
    /// With `--returns`: how each allocating function's return is read.
    pub returns: IndexMap<String, ReturnPlan>,
    /// With `--returns`: what each way of reading a return value cost when
    /// calibrated at start.
    pub return_costs_ns: Option<ReturnMeasurement>,
    /// With `--placement call-sites`: each function probed at its callers,
    /// and at how many.
    pub call_sites: IndexMap<String, usize>,
    /// Where each probe sits in its function.
    pub placements: IndexMap<String, Placement>,
    /// The probes whose `bytes` mean something (the allocating functions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measures_bytes: Vec<String>,
    /// Per probe: which copies of the function are probed, and whether its
    /// calls and bytes are complete.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub coverage: IndexMap<String, Coverage>,
    /// Per probe: how many of its counting uprobes (its placed entry or
    /// call sites, and its inlined copies) sit on instructions the kernel
    /// emulates and how many on ones it single-steps, which cost many
    /// times more per hit.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub sites: IndexMap<String, SiteKinds>,
    /// How garbage collections are seen (`--gc`): the markers or the
    /// function probed, or why neither is; left out by a tracer before GC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcPlan>,
    /// With `--native`: the C library whose functions are probed, as the
    /// target sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<String>,
}

/// How many uprobes sit on each kind of instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteKinds {
    pub emulated: usize,
    pub single_stepped: usize,
}

impl std::ops::Add for SiteKinds {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self { emulated: self.emulated + other.emulated, single_stepped: self.single_stepped + other.single_stepped }
    }
}

impl Attached {
    /// Whether `probe`'s bytes mean something.
    #[must_use]
    pub fn measures_bytes(&self, probe: &str) -> bool {
        self.measures_bytes.iter().any(|p| p == probe)
    }
}

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

/// A `--budget` rate estimate of one probe, while traced.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeEstimate {
    pub calls_per_s: f64,
    /// The 95% confidence interval, once there are two windows.
    pub calls_per_s_ci95: Option<[f64; 2]>,
    pub bytes_per_s: f64,
    pub bytes_per_s_ci95: Option<[f64; 2]>,
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

/// What `--budget` traced.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Always true: the rates are estimates.
    pub estimates: bool,
    pub percent: f64,
    pub windows: u64,
    /// Time the probes were attached, summed over windows.
    pub traced_s: f64,
    pub traced_fraction: f64,
    /// The probes' estimated cost to the target as a share of the time.
    pub estimated_overhead_fraction: f64,
    /// The calibrated cost of one hit.
    pub hit_cost_ns: HitCosts,
}

/// tracer's estimated cost to the target over an interval (in a summary,
/// over the run): its hits times the calibrated cost of a hit where each
/// sits, against the CPU time the target used meanwhile. The uprobe
/// handler runs in the target's thread, so that time is charged to the
/// target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Always true: hits priced at costs calibrated on tracer's own
    /// function, not a measurement of the target.
    pub estimate: bool,
    /// The share of the target's CPU time spent in tracer's probes, at
    /// most 1 (the probes run on that time, so more is the estimate's
    /// error); left out when the target used no measurable CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_fraction: Option<f64>,
    /// Where a probe has sites of both kinds, whose hits share one counter
    /// and so cannot be told apart, `overhead_fraction` prices them all as
    /// single-stepped; this is the share had they all been emulated. Left
    /// out when no such probe was hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_fraction_low: Option<f64>,
    /// The estimated CPU time the probe hits cost the target, in seconds.
    pub tracer_cpu_s: f64,
    /// The CPU time (user and system) the traced processes used over the
    /// same span, in seconds.
    pub target_cpu_s: f64,
    /// The hits priced.
    pub hits: u64,
    /// Hits over the same span that could not be priced: those of a process
    /// whose CPU time could not be read with them (it exited between two
    /// readings, and no exit record gave its CPU time at its end). Where
    /// every hit is unpriced there is no share to give.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub unpriced_hits: u64,
    /// The calibrated cost of one hit.
    pub hit_cost_ns: HitCosts,
}

impl Cost {
    /// This cost, knowing that `all` hits happened over its span: those it
    /// did not price are counted as such, and where it priced none, it has
    /// no share to give (never a share of 0 for hits unseen).
    #[must_use]
    pub fn of_all_hits(mut self, all: u64) -> Self {
        self.unpriced_hits = all.saturating_sub(self.hits);
        if self.hits == 0 && self.unpriced_hits > 0 {
            self.overhead_fraction = None;
            self.overhead_fraction_low = None;
        }
        self
    }

    /// Above this share of the target's CPU time, tracer warns.
    pub const HIGH: f64 = 0.10;

    /// Whether the estimate is above [`Self::HIGH`].
    #[must_use]
    pub fn is_high(&self) -> bool {
        self.overhead_fraction.is_some_and(|f| f > Self::HIGH)
    }

    /// The warning to give for a high cost, pointing to what lowers it:
    /// `--budget`, which refuses `--returns` and call sites, and which may
    /// already be on (`budget` as a percentage).
    #[must_use]
    pub fn warning(&self, budget: Option<f64>, returns: bool, call_sites: bool) -> Option<String> {
        let f = self.overhead_fraction.filter(|_| self.is_high())?;
        // A CPU-bound target does its own work in the share the probes
        // leave it. Near 1 the estimate's error swamps that ratio.
        let slowdown = if f <= 0.9 {
            format!("a CPU-bound target runs about {:.1}× slower", 1.0 / (1.0 - f))
        } else {
            "a CPU-bound target runs over 10× slower".to_owned()
        };
        let advice = match budget {
            // Rounded: a percentage made from a fraction, 7 → 0.07 → 7.000000000000001.
            Some(percent) => format!(
                "--budget {}% is on; a lower --budget leaves longer gaps between windows",
                (percent * 1e6).round() / 1e6
            ),
            None if returns || call_sites => "--budget PERCENT keeps the cost near PERCENT% by tracing in windows (without --returns and --placement call-sites, which it does not combine with)".to_owned(),
            None => "--budget PERCENT keeps the cost near PERCENT% by tracing in windows".to_owned(),
        };
        Some(format!("tracing costs the target an estimated {:.0}% of its CPU time ({slowdown}); {advice}", f * 100.0))
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
    /// Totals over every traced process, in report order.
    pub probes: IndexMap<String, ProbeCounts>,
    /// The same per process that hit any probe, by PID (processes that
    /// exited included; a PID used by two processes in turn adds both).
    pub pids: IndexMap<String, IndexMap<String, Counts>>,
    /// Every BPF-side miss counter, then [`KERNEL_MISSES`].
    pub stats: IndexMap<String, u64>,
    /// With `--placement call-sites`: each file mapped after the attach
    /// that calls, or lets out the address of, a function at its call
    /// sites, and what of it is counted.
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
    /// With `--live`: the blocks outstanding now, per domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
    /// With `--leaks`, in the summary only: the oldest outstanding blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaks: Option<Leaks>,
}

/// Garbage collections since the attach, by generation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gc {
    /// Where they are seen from: `markers`, `function` or `none`.
    pub source: GcSource,
    /// With `none`, why; with `function`, what its calls count that the
    /// markers would not (3.13's automatic collections), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Generations 0, 1 and 2 always (with `none`, nothing), then any other
    /// the probes saw, such as the unknown one.
    pub generations: Vec<GcGeneration>,
    /// With `--exe`: the same per process that collected, by PID (exited
    /// ones included).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub pids: IndexMap<String, Vec<GcGeneration>>,
}

/// The collections of one generation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GcGeneration {
    /// `null` where the generation is not known: the start's argument could
    /// not be read (`gc_arg_missing`), or it was 3.13's `GENERATION_AUTO`.
    pub generation: Option<u32>,
    /// Collections that ended (a start and its done seen on one thread).
    pub collections: u64,
    /// Their summed durations, start to done, in seconds.
    pub duration_s: f64,
    /// The objects they found unreachable (collected, and uncollectable
    /// ones, as `gc.collect()` returns them).
    pub collected: u64,
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

/// One Python frame of a stack, as its code says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteFrame {
    /// The code's qualified name (`Class.method`), or what could be read.
    pub function: String,
    pub file: String,
    /// `None` where the line table has no line for the instruction.
    pub line: Option<u32>,
}

/// An allocation site: the innermost Python frame of the stacks its
/// events had, with their counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
    pub calls: u64,
    pub bytes: u64,
    /// With `--sample N`: the counts are the sampled ones times N.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimate: bool,
    /// With `--sample N`: the 95% confidence interval of `calls` (each
    /// event sampled with probability 1/N: binomial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_ci95: Option<[f64; 2]>,
}

/// One stack and its counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackCount {
    /// The probed function the events were of.
    pub probe: String,
    /// Innermost first.
    pub frames: Vec<SiteFrame>,
    /// The walk stopped at `--depth` with frames left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// With `--native-stacks`: the native frames, innermost first (the
    /// probed instruction's function, with what is inlined there, then
    /// each caller), as unwound in the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<Vec<NativeFrame>>,
    /// With `--native-stacks`, where the frames show it (3.12+, whose
    /// C-stack entry frames mark each call of the eval loop): how many of
    /// `frames`, innermost first, each C-level call of the eval loop runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_calls: Option<Vec<u32>>,
    /// With `--native-stacks`: why the native unwind ended before the
    /// process's outermost frame, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_end: Option<String>,
    pub calls: u64,
    pub bytes: u64,
}

/// A native (C) frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFrame {
    /// The function, from the ELF symbols or the DWARF, or the address.
    pub function: String,
    /// The file name of the module (`python3.14`, `libc.so.6`).
    pub module: String,
    /// The source file and line, where DWARF gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Inlined into the frame after it (its caller at the same pc).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

/// With `--native-stacks`: what one module gave the unwinder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeModule {
    pub path: String,
    /// Unwind rows from its `.eh_frame` (0: none, and native stacks stop
    /// in it).
    pub rows: u64,
    /// Rows whose rule the unwinder does not follow.
    pub unsupported_rows: u64,
    /// The file its DWARF was read from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dwarf: Option<String>,
    /// Why it has no rows, or no DWARF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// How many of the events that should have stacks have them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackCoverage {
    /// `--sample N` (1: every event).
    pub sample: u64,
    /// Events of the probes with stacks (exact).
    pub events: u64,
    /// Events counted under a stack (times `sample`, an estimate when it is
    /// over 1).
    pub stacked: u64,
    /// Events whose stack was cut at `--depth` (counted under the cut
    /// stack; as `stacked`, times `sample`).
    pub truncated: u64,
    /// Whether `stacked` and `truncated` are estimates (`sample` over 1).
    /// Why an event has no stack is in `stats` (`stack_*`).
    pub estimate: bool,
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

impl Snapshot {
    /// The stats map from the BPF-side stats (in [`Stat::ALL`] order) and
    /// the kernel's miss count.
    #[must_use]
    pub fn stats_from(bpf: &[u64], kernel_misses: u64) -> IndexMap<String, u64> {
        Stat::ALL
            .iter()
            .zip(bpf)
            .map(|(s, &value)| (s.name().to_owned(), value))
            .chain(std::iter::once((KERNEL_MISSES.to_owned(), kernel_misses)))
            .collect()
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
        Stat::ALL.iter().find(|s| s.name() == stat).is_none_or(|s| s.is_loss())
    }
}

#[allow(clippy::cast_precision_loss, reason = "a rate, not a count")]
fn rate(delta: u64, secs: f64) -> f64 {
    if secs > 0.0 { delta as f64 / secs } else { 0.0 }
}

/// Why the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// `--duration` elapsed.
    Duration,
    /// SIGINT (Ctrl-C) or SIGTERM.
    Signal(&'static str),
    /// The target process exited.
    TargetExit,
}

impl End {
    /// The JSON `end` value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Duration => "duration",
            Self::Signal(_) => "signal",
            Self::TargetExit => "target-exit",
        }
    }
}

/// Why the run ended, as the JSON `end` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndKind {
    Duration,
    Signal,
    TargetExit,
}

/// The last counts, once every probe is detached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    #[serde(flatten)]
    pub snapshot: Snapshot,
    /// `duration`, `signal` or `target-exit`.
    pub end: EndKind,
    /// With `end` `signal`: which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

impl Summary {
    #[must_use]
    pub fn new(snapshot: Snapshot, end: End) -> Self {
        let signal = match end {
            End::Signal(name) => Some(name.to_owned()),
            End::Duration | End::TargetExit => None,
        };
        let kind = match end {
            End::Duration => EndKind::Duration,
            End::Signal(_) => EndKind::Signal,
            End::TargetExit => EndKind::TargetExit,
        };
        Self { snapshot, end: kind, signal }
    }
}

/// How much a note matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Worth knowing; the counts are whole.
    Note,
    /// Some events may not be counted, or something is not as expected.
    Warning,
}

/// What a note is about, for a consumer that acts on some.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteCode {
    /// `--links auto` fell back to perf-event uprobes.
    LinkFallback,
    /// A module mapped after the attach is probed from now on.
    LateModule,
    /// A late module lets a probed function's address escape.
    LateModuleEscape,
    /// A late module could not be probed.
    LateModuleFailed,
    /// A line a BPF program logged (`--bpf-log`).
    BpfLog,
    /// `_Py_DebugOffsets` disagrees with what tracer expected.
    DebugOffsets,
    /// A traced process cannot be watched for its exit.
    ProcessUnwatched,
    /// tracer's estimated cost to the target passed [`Cost::HIGH`] (told
    /// once).
    HighCost,
    /// The cost of a hit could not be calibrated, so no cost is estimated.
    CostUnknown,
    /// With `--stacks`: a traced process's frames cannot be found, so its
    /// events have no stacks.
    NoStacks,
    /// With `--native-stacks`: a module whose native frames cannot be
    /// unwound (no usable `.eh_frame`), or a process whose cannot.
    NoNativeStacks,
    /// With `--folded` or `--flamegraph`: the file written.
    Written,
    /// Garbage collections cannot be seen in this build (no markers, no
    /// collection function tracer knows), or the function's counts hold
    /// calls the markers would not count.
    Gc,
}

/// A diagnostic, as an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub level: Level,
    pub code: NoteCode,
    /// One line for a person.
    pub message: String,
}

impl Note {
    #[must_use]
    pub fn new(level: Level, code: NoteCode, message: impl Into<String>) -> Self {
        Self { level, code, message: message.into() }
    }
}

/// `tracer probes --json`: the attach plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    pub image: String,
    pub python: String,
    pub probes: Vec<PlannedProbeReport>,
    pub missing: Vec<String>,
    /// With `--returns`: what each way of reading a return value cost.
    pub return_costs_ns: Option<ReturnMeasurement>,
    /// What the user should know about this image (`_Py_DebugOffsets`
    /// disagreeing with `Py_Version`, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    /// Where garbage collections are seen (see [`Attached::gc`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcPlan>,
    /// With `--live`: the allocator implementations the live table
    /// probes, and how each one's return is read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_impls: Vec<LiveImplReport>,
}

/// One allocator implementation of [`PlanReport::live_impls`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveImplReport {
    pub symbol: String,
    /// Offset of its entry in the image file.
    pub file_offset: u64,
    /// Where `live_impl` traps, and a uretprobe with it: the first
    /// emulated instruction before the stack pointer or the arguments
    /// change, else the entry.
    pub placement: Placement,
    pub returns: ReturnPlan,
}

impl PlanReport {
    /// The report of `plan` for an image of Python `version`.
    #[must_use]
    pub fn new(plan: &crate::plan::Plan, version: &str, return_costs_ns: Option<ReturnMeasurement>) -> Self {
        let probes = plan
            .probes
            .iter()
            .map(|p| PlannedProbeReport {
                symbol: p.symbol.to_owned(),
                file_offset: p.file_offset,
                offset: p.placement.offset,
                instruction: p.placement.instruction.clone(),
                emulated: p.placement.emulated,
                reason: p.placement.reason.clone(),
                returns: p.returns.clone(),
                inline_sites: p.inline_sites.iter().map(|s| s.offset).collect(),
                inline_sites_emulated: p.inline_sites.iter().filter(|s| s.emulated).count(),
                coverage: Some(p.coverage.clone()),
                file: p.file.as_ref().map(|f| f.display_path.display().to_string()),
                nested_sites: p.nested_sites.clone(),
                call_sites: p.call_sites.as_ref().map(|c| CallSitesReport {
                    emulated: c.emulated,
                    single_stepped: c.stepped,
                    files: c
                        .files
                        .iter()
                        .map(|f| SiteFileReport { path: f.display_path.clone(), offsets: f.offsets.clone() })
                        .collect(),
                }),
            })
            .collect();
        Self {
            image: plan.display_path.display().to_string(),
            python: version.to_owned(),
            probes,
            missing: plan.missing.iter().map(|m| (*m).to_owned()).collect(),
            return_costs_ns,
            notes: Vec::new(),
            gc: None,
            live_impls: plan
                .live_impls
                .iter()
                .map(|i| LiveImplReport {
                    symbol: i.name.to_owned(),
                    file_offset: i.file_offset,
                    placement: i.placement.clone(),
                    returns: i.returns.clone(),
                })
                .collect(),
        }
    }
}

/// One probe of [`PlanReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedProbeReport {
    pub symbol: String,
    /// Offset of the function's entry in the image file.
    pub file_offset: u64,
    /// Where the probe sits, from the entry.
    pub offset: u64,
    pub instruction: String,
    pub emulated: bool,
    pub reason: String,
    pub returns: Option<ReturnPlan>,
    pub call_sites: Option<CallSitesReport>,
    /// File offsets in the image of the probed inlined copies (and
    /// out-of-line clones), each counted as a call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inline_sites: Vec<u64>,
    /// How many of those are on an instruction the kernel emulates (the
    /// rest are single-stepped, at several times the cost of a hit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inline_sites_emulated: usize,
    /// What the counts will cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// The file the function is in, where it is not `image` (libc, with
    /// `--native`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// With `--native`: file offsets of the calls of this function by
    /// another probed libc function, which mark those calls as nested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested_sites: Vec<u64>,
}

/// Where a function probed at its callers is called from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSitesReport {
    pub emulated: usize,
    pub single_stepped: usize,
    pub files: Vec<SiteFileReport>,
}

/// The call sites in one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteFileReport {
    pub path: std::path::PathBuf,
    pub offsets: Vec<u64>,
}

/// `tracer bench --json`: one object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub python: BenchPython,
    pub stmt: String,
    pub setup: String,
    pub baseline: BenchState,
    /// Per measured setup, in order: `NAME` (its timing), then
    /// `NAME_vs_baseline` (pyperf's comparison).
    #[serde(flatten)]
    pub setups: IndexMap<String, BenchEntry>,
    /// Exact probe hits per loop of the statement.
    pub hits_per_loop: f64,
    pub hits_per_loop_by_probe: IndexMap<String, f64>,
    /// What one hit costs while attached (`attached` in
    /// `ns_per_hit_by_setup`); `null` when the statement hits no probe.
    pub ns_per_hit: Option<f64>,
    pub ns_per_hit_by_setup: IndexMap<String, Option<f64>>,
    /// What the user should know about the interpreter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
}

/// The interpreter `tracer bench` measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchPython {
    pub executable: std::path::PathBuf,
    pub version: String,
    pub image: std::path::PathBuf,
}

/// One setup's timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchState {
    pub mean_ns: f64,
    pub stdev_ns: f64,
    pub values: usize,
    /// pyperf's JSON file.
    pub file: std::path::PathBuf,
}

/// A setup's timing, or its comparison with the baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BenchEntry {
    State(BenchState),
    Versus {
        /// mean(setup) / mean(baseline).
        ratio: f64,
        /// pyperf's significance test.
        significant: bool,
    },
}

/// For `skip_serializing_if`.
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde passes a reference")]
const fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// For `skip_serializing_if`.
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde passes a reference")]
const fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines the previous tracer (before this model) wrote, for runs with
    /// `--returns`, `--budget`, call sites and `--exe`, then lines of this
    /// one with what it added (notes, `exited`, late modules, rates, hits,
    /// sites by kind, cost): each must read into the model and write back
    /// byte for byte.
    const SAMPLES: &str =
        concat!(include_str!("../tests/data/events.jsonl"), include_str!("../tests/data/events-current.jsonl"));
    const PLAN_SAMPLES: &str = include_str!("../tests/data/plans.jsonl");

    #[test]
    fn every_event_round_trips() {
        let mut types = std::collections::HashSet::new();
        for line in SAMPLES.lines().filter(|l| !l.is_empty()) {
            let event: Event = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            types.insert(std::mem::discriminant(&event));
            assert_eq!(serde_json::to_string(&event).unwrap(), line);
        }
        let fields = [
            "exited",
            "hits",
            "calls_per_s",
            "bytes_per_s",
            "measures_bytes",
            "\"code\":\"bpf_log\"",
            "\"sites\":58",
            "\"sites\":{\"_Py_NewReference\":{\"emulated\":2,\"single_stepped\":208}",
            "\"cost\":{\"estimate\":true",
            "overhead_fraction_low",
            "\"code\":\"high_cost\"",
            "\"gc\":{\"source\":\"markers\",\"detail\"",
            "\"gc\":{\"source\":\"markers\",\"generations\"",
            "\"gc\":{\"source\":\"function\",\"detail\"",
            "\"gc\":{\"source\":\"function\",\"reason\"",
            "\"gc\":{\"source\":\"none\",\"detail\"",
            "\"gc\":{\"source\":\"none\",\"reason\"",
            "\"caveat\":",
            "\"semaphore\":",
            "\"return\":true",
            "\"level\":\"warning\",\"code\":\"gc\"",
            "\"level\":\"note\",\"code\":\"gc\"",
            "\"collections_per_s\":",
            "\"pids\":{\"",
            "\"gc_unmatched\":0",
        ];
        for field in fields {
            assert!(SAMPLES.contains(field), "the samples lack {field}");
        }
        let note = Event::Note(Note::new(Level::Warning, NoteCode::LinkFallback, "no multi links"));
        let text = serde_json::to_string(&note).unwrap();
        assert_eq!(text, r#"{"type":"note","level":"warning","code":"link_fallback","message":"no multi links"}"#);
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), note);
        types.insert(std::mem::discriminant(&note));
        assert_eq!(types.len(), 4, "the samples hold attached, interval and summary lines");
    }

    #[test]
    fn end_names() {
        assert_eq!(End::Duration.as_str(), "duration");
        assert_eq!(End::TargetExit.as_str(), "target-exit");
        assert_eq!(End::Signal("SIGTERM").as_str(), "signal");
        let s = Summary::new(Snapshot::default(), End::Signal("SIGTERM"));
        assert_eq!((s.end, s.signal.as_deref()), (EndKind::Signal, Some("SIGTERM")));
        assert_eq!(serde_json::to_value(EndKind::TargetExit).unwrap(), "target-exit");
        assert_eq!(Summary::new(Snapshot::default(), End::TargetExit).signal, None);
    }

    #[test]
    fn a_bench_report_round_trips() {
        let line = r#"{"python":{"executable":"/v/bin/python","version":"3.11.7","image":"/l.so"},"stmt":"[]","setup":"pass","baseline":{"mean_ns":20.6,"stdev_ns":0.4,"values":60,"file":"b/baseline.json"},"attached":{"mean_ns":22.4,"stdev_ns":0.5,"values":60,"file":"b/attached.json"},"attached_vs_baseline":{"ratio":1.087,"significant":true},"hits_per_loop":2.0,"hits_per_loop_by_probe":{"_Py_NewReference":1.0,"_Py_Dealloc":1.0},"ns_per_hit":0.9,"ns_per_hit_by_setup":{"attached":0.9}}"#;
        let report: BenchReport = serde_json::from_str(line).unwrap();
        assert!(matches!(report.setups["attached_vs_baseline"], BenchEntry::Versus { significant: true, .. }));
        assert_eq!(serde_json::to_string(&report).unwrap(), line);
    }

    #[test]
    fn every_plan_round_trips() {
        for line in PLAN_SAMPLES.lines().filter(|l| !l.is_empty()) {
            let plan: PlanReport = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(serde_json::to_string(&plan).unwrap(), line);
        }
    }

    #[test]
    fn rates_are_per_interval_and_bytes_only_where_measured() {
        let line = SAMPLES.lines().find(|l| l.starts_with(r#"{"type":"attached""#)).unwrap();
        let Event::Attached(mut attached) = serde_json::from_str(line).unwrap() else { panic!() };
        attached.measures_bytes = vec!["PyObject_Malloc".into()];
        let counts = |calls, bytes| ProbeCounts {
            calls,
            bytes,
            nested: None,
            returned: None,
            estimate: None,
            calls_per_s: None,
            bytes_per_s: None,
        };
        let snap = |elapsed_s, scale: u64| Snapshot {
            elapsed_s,
            probes: [
                ("_Py_NewReference".to_owned(), counts(10 * scale, 0)),
                ("PyObject_Malloc".to_owned(), counts(4 * scale, 4000 * scale)),
            ]
            .into_iter()
            .collect(),
            ..Snapshot::default()
        };
        let first = snap(1.0, 1);
        let mut second = snap(2.0, 3);
        second.compute_rates(&attached, Some(&first));
        assert_eq!(second.probes["_Py_NewReference"].calls_per_s, Some(20.0));
        assert_eq!(second.probes["_Py_NewReference"].bytes_per_s, None);
        assert_eq!(second.probes["PyObject_Malloc"].bytes_per_s, Some(8000.0));
        let mut whole = snap(4.0, 4);
        whole.compute_rates(&attached, None);
        assert_eq!(whole.probes["PyObject_Malloc"].calls_per_s, Some(4.0));
    }
}
