//! Output formats. Each is a module implementing [`Reporter`]; the run loop
//! only ever talks to the trait.

mod json;
mod table;

use std::{io::Write, time::Duration};

use tracer_common::stats::Stat;

pub use json::{JsonReporter, return_plan};
pub use table::TableReporter;

use crate::{
    budget::{HitCosts, RateEstimate},
    config::Format,
};

/// What was attached, reported once every probe is live.
#[derive(Clone, Debug)]
pub struct AttachInfo {
    /// The traced process, or `None` when tracing every process of `exe`.
    pub pid: Option<u32>,
    /// With `--exe`, the executable asked for.
    pub exe: Option<String>,
    pub python_version: String,
    pub image: String,
    pub probes: Vec<&'static str>,
    /// Where each probe sits in its function.
    pub placements: Vec<(&'static str, crate::placement::Placement)>,
    pub missing: Vec<&'static str>,
    /// With `--returns`: how each allocating function's return is read.
    pub returns: Vec<(&'static str, crate::returns::ReturnPlan)>,
    /// With `--returns`: what each way of reading a return value cost when
    /// calibrated at start.
    pub return_costs: Option<crate::calibrate::ReturnMeasurement>,
    /// How the probes were attached (multi or perf).
    pub links: crate::config::LinkMode,
    /// With `--placement call-sites`: each function probed at its callers,
    /// and at how many.
    pub call_sites: Vec<(&'static str, usize)>,
}

/// One probe's cumulative counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSample {
    pub name: &'static str,
    /// Whether `bytes` means anything for this function.
    pub counts_bytes: bool,
    pub calls: u64,
    pub bytes: u64,
    /// With `--returns`, for an allocating function: what it returned.
    pub returned: Option<tracer_common::returns::Returned>,
}

/// A counter of things that went wrong (or worth knowing) while counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatSample {
    pub name: &'static str,
    pub value: u64,
    /// Whether a non-zero value means events are missing from the counts.
    pub loss: bool,
}

/// Name of the kernel's recursion-miss count in the output.
pub const KERNEL_MISSES: &str = "kernel_recursion_misses";

/// One process's cumulative counts, per probe in [`Sample::probes`] order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    pub pid: u32,
    /// (calls, bytes) per probe.
    pub counts: Vec<(u64, u64)>,
}

/// Cumulative counts since attach.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub elapsed: Duration,
    /// Totals over every traced process.
    pub probes: Vec<ProbeSample>,
    /// The same per process that hit any probe, by PID.
    pub processes: Vec<ProcessSample>,
    /// Every BPF-side [`Stat`], then [`KERNEL_MISSES`].
    pub stats: Vec<StatSample>,
    /// With `--budget`: the counts above are of the traced windows only,
    /// and these are the rates estimated from them.
    pub estimate: Option<EstimateSample>,
    /// With `--placement call-sites`: each file mapped after the attach (by
    /// the target, or with `--exe` by any of its processes) that calls, or
    /// lets out the address of, a function at its call sites, and what of
    /// it is counted.
    pub late_modules: Vec<LateModuleSample>,
}

/// A file the target mapped after the attach. Its calls are counted only
/// from `since` on, so a consumer can tell that counts before that are
/// short by whatever it called then.
#[derive(Clone, Debug, PartialEq)]
pub struct LateModuleSample {
    pub path: String,
    /// When its sites were attached, since the attach.
    pub since: Duration,
    /// How it is covered.
    pub coverage: LateCoverage,
}

/// What became of a file mapped after the attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LateCoverage {
    /// Its direct calls to `symbol` are probed at `sites` call sites;
    /// with `escape`, its calls through that function's address are not.
    Sites { symbol: &'static str, sites: usize, escape: Option<String> },
    /// It could not be probed at all.
    Failed { error: String },
}

/// What `--budget` traced and the rates it estimates.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimateSample {
    /// The budget as a fraction of time.
    pub budget: f64,
    pub windows: u64,
    /// Time the probes were attached, summed over windows.
    pub traced: Duration,
    /// The probes' estimated cost to the target: hits × calibrated cost.
    pub overhead: Duration,
    pub costs: HitCosts,
    /// Per probe, in [`Sample::probes`] order: (calls/s, bytes/s) while
    /// traced.
    pub rates: Vec<(RateEstimate, RateEstimate)>,
}

impl EstimateSample {
    /// The share of `elapsed` that was traced.
    #[must_use]
    pub fn traced_fraction(&self, elapsed: Duration) -> f64 {
        ratio(self.traced, elapsed)
    }

    /// The estimated share of `elapsed` the probes cost the target.
    #[must_use]
    pub fn overhead_fraction(&self, elapsed: Duration) -> f64 {
        ratio(self.overhead, elapsed)
    }
}

fn ratio(part: Duration, whole: Duration) -> f64 {
    if whole.is_zero() { 0.0 } else { (part.as_secs_f64() / whole.as_secs_f64()).min(1.0) }
}

impl Sample {
    /// Builds the stats list from the BPF-side stats (in [`Stat::ALL`]
    /// order) and the kernel's miss count.
    #[must_use]
    pub fn stats_from(bpf: &[u64], kernel_misses: u64) -> Vec<StatSample> {
        Stat::ALL
            .iter()
            .zip(bpf)
            .map(|(s, &value)| StatSample { name: s.name(), value, loss: s.is_loss() })
            .chain(std::iter::once(StatSample { name: KERNEL_MISSES, value: kernel_misses, loss: true }))
            .collect()
    }
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

/// An output format.
pub trait Reporter {
    /// Every probe is live.
    fn attached(&mut self, info: &AttachInfo) -> std::io::Result<()>;
    /// An `--interval` elapsed.
    fn interval(&mut self, sample: &Sample) -> std::io::Result<()>;
    /// The run ended; probes are already detached.
    fn summary(&mut self, sample: &Sample, end: End) -> std::io::Result<()>;
}

/// The reporter for `format`, writing to `out`.
#[must_use]
pub fn reporter<'a>(format: Format, out: Box<dyn Write + 'a>) -> Box<dyn Reporter + 'a> {
    match format {
        Format::Table => Box::new(TableReporter::new(out)),
        Format::Json => Box::new(JsonReporter::new(out)),
    }
}

#[cfg(test)]
pub(crate) fn example_sample(elapsed_ms: u64, scale: u64) -> Sample {
    Sample {
        elapsed: Duration::from_millis(elapsed_ms),
        probes: vec![
            ProbeSample { name: "_Py_NewReference", counts_bytes: false, calls: 10 * scale, bytes: 0, returned: None },
            ProbeSample {
                name: "PyObject_Malloc",
                counts_bytes: true,
                calls: 4 * scale,
                bytes: 4000 * scale,
                returned: None,
            },
        ],
        stats: Sample::stats_from(&[0; Stat::ALL.len()], 0),
        processes: vec![ProcessSample { pid: 77, counts: vec![(10 * scale, 0), (4 * scale, 4000 * scale)] }],
        estimate: None,
        late_modules: vec![],
    }
}
