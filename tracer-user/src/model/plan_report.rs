//! `tracer probes --json`: the attach plan as reported, probe by probe.

use serde::{Deserialize, Serialize};

use super::notes::Note;
use crate::plan::{
    HitCosts,
    coverage::Coverage,
    gc::GcPlan,
    growth::GrowthPlan,
    placement::Placement,
    returns::{ReturnMeasurement, ReturnPlan},
};

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
    /// Where garbage collections are seen (see [`Attached::gc`](super::Attached::gc)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcPlan>,
    /// With `--growth`: where heap growth is sampled, or why it cannot be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthPlan>,
    /// With `--live`: the allocator implementations the live table
    /// probes, and how each one's return is read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_impls: Vec<LiveImplReport>,
    /// What one hit costs the target here, as calibrated (in the CPU time
    /// of the thread hit); absent where tracer could not measure it (not
    /// root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_cost_ns: Option<HitCosts>,
    /// Why the hits are not priced, where they are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpriced: Option<String>,
}

/// What one hit of a probe costs the target, from where its sites sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostPerHit {
    /// Every hit at an emulated site, where the probe has any.
    pub low_ns: u64,
    /// Every hit at a single-stepped site, where the probe has any. The
    /// two are equal where its sites are all of one kind; else where
    /// between them its hits fall is known only once attached, from
    /// which sites the target runs.
    pub high_ns: u64,
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
    /// Prices each probe's hits at `hit`, the calibrated cost of one.
    pub fn price(&mut self, hit: HitCosts) {
        for p in &mut self.probes {
            let (emulated, stepped) = p.site_kinds();
            let (high, low) = hit.range(emulated, stepped);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a cost in ns, rounded")]
            let ns = |x: f64| x.round().max(0.0) as u64;
            p.cost_per_hit_ns = Some(CostPerHit { low_ns: ns(low), high_ns: ns(high) });
        }
        self.hit_cost_ns = Some(hit);
    }

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
                inline_sites_single_stepped: p.inline_sites.iter().filter(|s| !s.emulated).count(),
                inline_sites_moved: p.inline_sites.iter().filter(|s| s.moved).count(),
                inline_sites_gated: p.inline_sites.iter().filter(|s| s.jump).count(),
                inline_sites_stepped_why: p.inline_sites.iter().filter_map(|s| s.stay).fold(
                    std::collections::BTreeMap::new(),
                    |mut why, stay| {
                        *why.entry(stay.to_string()).or_default() += 1;
                        why
                    },
                ),
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
                cost_per_hit_ns: None,
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
            growth: None,
            hit_cost_ns: None,
            unpriced: None,
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
    /// Offset of the function's entry in the image file: for a free
    /// probed at its allocator's implementation, the implementation's (its
    /// `reason` says so; see `plan::slots`).
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
    /// How many are single-stepped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inline_sites_single_stepped: usize,
    /// How many of the emulated ones are probed past the copy's first
    /// point, on the straight line after it, where what the probe reads
    /// was followed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inline_sites_moved: usize,
    /// How many of the moved sites are at a jump that leads into a copy,
    /// no instruction of the copy's own being one the kernel emulates: a
    /// hit at a conditional one counts where the jump goes into the copy,
    /// and costs where it does not too (`gate_other`). A copy that only
    /// jumps lead into is probed at each of them, so it may have several
    /// such sites.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inline_sites_gated: usize,
    /// Why the single-stepped ones are not moved: each reason, with how
    /// many copies it holds back.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub inline_sites_stepped_why: std::collections::BTreeMap<String, usize>,
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
    /// What one of its hits costs the target, where the hit's cost was
    /// calibrated ([`PlanReport::hit_cost_ns`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hit_ns: Option<CostPerHit>,
}

impl PlannedProbeReport {
    /// Its sites on an instruction the kernel emulates and on one it
    /// single-steps: its call sites, or its own placed probe, and its
    /// inlined copies.
    #[must_use]
    pub fn site_kinds(&self) -> (usize, usize) {
        let (emulated, stepped) = match &self.call_sites {
            Some(c) => (c.emulated, c.single_stepped),
            None => (usize::from(self.emulated), usize::from(!self.emulated)),
        };
        (emulated + self.inline_sites_emulated, stepped + self.inline_sites_single_stepped)
    }
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

/// For `skip_serializing_if`.
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde passes a reference")]
const fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN_SAMPLES: &str = include_str!("../../tests/data/plans.jsonl");

    #[test]
    fn every_plan_round_trips() {
        for line in PLAN_SAMPLES.lines().filter(|l| !l.is_empty()) {
            let plan: PlanReport = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(serde_json::to_string(&plan).unwrap(), line);
        }
    }
}
