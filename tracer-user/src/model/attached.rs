//! The `attached` event's content: what was probed, where and how, told
//! once every probe is live.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::plan::{
    coverage::Coverage,
    gc::GcPlan,
    growth::GrowthPlan,
    placement::Placement,
    returns::{ReturnMeasurement, ReturnPlan},
};

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
    /// `profile` (the production profile) or `exact`; left out by a tracer
    /// before the profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// With `exact`: the flag that chose it, where `--exact` did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_because: Option<String>,
    /// The estimated cost to the target, from the first window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cost: Option<super::cost::CostEstimate>,
    /// When the probes went live, by the wall clock, in seconds since
    /// 1970 (UTC): what a report made later from a record dates itself by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_s: Option<f64>,
    /// The traced process, or `None` when tracing every process of `exe`.
    pub pid: Option<u32>,
    /// With `--exe`, the executable asked for.
    pub exe: Option<String>,
    pub python: PythonInfo,
    /// The traced process's PID in its own PID namespace (a container's),
    /// where that differs from `pid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_in_namespace: Option<u32>,
    /// With `--all`: every interpreter traced, each by a `tracer attach
    /// --exe` of its own; `python` then names the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interpreters: Vec<super::InterpreterInfo>,
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
    /// With call sites (`--placement call-sites`, or `auto` tracing one
    /// running process exactly): each function probed at its callers, and
    /// at how many.
    pub call_sites: IndexMap<String, usize>,
    /// Whether call sites were asked for (`--placement call-sites`), which
    /// `--budget` refuses; `auto` takes them only without `--budget`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub call_sites_asked: bool,
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
    /// With `--growth`: where heap growth is sampled (each probe's
    /// instruction, and whether the kernel emulates it), or why it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthPlan>,
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
