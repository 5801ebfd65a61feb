//! What probe hits cost: where each probe's uprobes sit (emulated or
//! single-stepped, and how its returns are read), the price of one hit
//! there, and the share of the target's CPU time the hits took.

use std::{fs::File, os::unix::fs::FileExt as _};

use indexmap::IndexMap;

use super::ledger::Reading;
use crate::{
    model::{Cost, SiteKinds},
    plan::{
        HitCosts, Plan, PlannedProbe,
        placement::{self, KernelVersion},
        returns::ReturnPlan,
    },
    prepare::calibrate::Prices,
};

/// How a probe's return values are read, as far as their cost goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReturnSites {
    /// Not read.
    #[default]
    None,
    /// By a uretprobe. `entry` is the kind of its entry breakpoint
    /// (emulated or not), `None` where it shares the counting probe's.
    Uretprobe { entry: Option<bool> },
    /// By uprobes on return sites, one of which each call passes.
    Sites(SiteKinds),
}

/// The (high, low) cost in ns of one hit at a probe with sites of `kinds`
/// ([`HitCosts::range`]).
#[must_use]
pub fn hit_range(kinds: SiteKinds, hit: HitCosts) -> (f64, f64) {
    hit.range(kinds.emulated, kinds.single_stepped)
}

/// The (high, low) cost in ns of one return read as `returns` says.
#[must_use]
pub fn return_range(returns: ReturnSites, prices: Prices) -> (f64, f64) {
    match returns {
        ReturnSites::None => (0.0, 0.0),
        ReturnSites::Uretprobe { entry } => {
            // Without a calibrated return, the dearer kind of hit: the
            // estimate errs high rather than low.
            let ret = prices.uretprobe_return_ns.unwrap_or(prices.hit.single_stepped_ns);
            let ns = ret + entry.map_or(0.0, |emulated| prices.hit.of(emulated));
            (ns, ns)
        }
        ReturnSites::Sites(kinds) => hit_range(kinds, prices.hit),
    }
}

/// The cost of `high_ns` (and `low_ns`, see [`hit_range`]) of probe time
/// for `hits` hits against `target_cpu_ns` of the target's CPU time.
#[must_use]
pub fn estimate(high_ns: f64, low_ns: f64, target_cpu_ns: f64, hits: u64, hit: HitCosts) -> Cost {
    let share = |ns: f64| {
        if target_cpu_ns > 0.0 {
            // The probes ran on that CPU time: more than all of it is the
            // estimate's error.
            Some((ns / target_cpu_ns).min(1.0))
        } else if ns == 0.0 {
            Some(0.0)
        } else {
            // Hits, but less CPU time than /proc can show (a clock tick):
            // no share to give.
            None
        }
    };
    let (high, low) = (share(high_ns), share(low_ns));
    Cost {
        estimate: true,
        overhead_fraction: high,
        // Only a range that says something: both ends can be at the cap.
        overhead_fraction_low: low.filter(|l| high.is_some_and(|h| *l < h)),
        tracer_cpu_s: high_ns / 1e9,
        target_cpu_s: target_cpu_ns / 1e9,
        hits,
        unpriced_hits: 0,
        hit_cost_ns: hit,
    }
}

/// Where each probe's uprobes sit, by slot: what prices its hits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SitePlan {
    /// The kinds of each probe's inlined copies, fixed at the attach.
    pub(super) inline: Vec<SiteKinds>,
    /// Each probe's counting sites, inlined copies included, as of the
    /// last [`Self::refresh`] (call sites grow as late modules are probed).
    pub(super) counting: Vec<SiteKinds>,
    pub(super) returns: Vec<ReturnSites>,
    /// Whether each probe counts its hits at single-stepped sites apart
    /// ([`PlannedProbe::stepped_apart`]): those are then priced each as
    /// what it cost, not as a range.
    pub(super) apart: Vec<bool>,
}

impl SitePlan {
    /// Counts each probe's sites by kind, as the plan placed them, reading
    /// from the image the instruction at each function entry a uretprobe
    /// needs of its own.
    #[must_use]
    pub fn new(plan: &Plan) -> Self {
        let kernel = placement::running_kernel();
        // One open for every site; a file that cannot be read prices
        // every site in it as single-stepped, the dearer kind.
        let file = File::open(&plan.attach_path).ok();
        // `--native`'s probes are in libc.
        let libc = plan.probes.iter().find_map(|p| p.file.as_ref()).and_then(|f| File::open(&f.attach_path).ok());
        let slots = plan.probes.len();
        let mut sites = Self {
            inline: vec![SiteKinds::default(); slots],
            counting: Vec::new(),
            returns: vec![ReturnSites::None; slots],
            apart: vec![false; slots],
        };
        for p in &plan.probes {
            let Some(slot) = usize::try_from(p.slot).ok().filter(|&s| s < slots) else { continue };
            sites.inline[slot] = inline_sites(p);
            sites.apart[slot] = p.stepped_apart();
            sites.returns[slot] = match &p.returns {
                None => ReturnSites::None,
                Some(ReturnPlan::Sites { sites, .. }) => {
                    ReturnSites::Sites(sites.iter().fold(SiteKinds::default(), |k, s| k + kind(s.emulated)))
                }
                // The uretprobe's breakpoint is the counting probe's when
                // that sits on the entry too.
                Some(ReturnPlan::Uretprobe { .. }) if p.call_sites.is_none() && p.placement.offset == 0 => {
                    ReturnSites::Uretprobe { entry: None }
                }
                Some(ReturnPlan::Uretprobe { .. }) => {
                    let file = if p.file.is_some() { libc.as_ref() } else { file.as_ref() };
                    ReturnSites::Uretprobe { entry: Some(emulated_at(file, p.file_offset, kernel)) }
                }
            };
        }
        sites.refresh(plan);
        sites
    }

    /// Takes the probes' call sites as they are now.
    pub fn refresh(&mut self, plan: &Plan) {
        self.counting = vec![SiteKinds::default(); self.inline.len()];
        for p in &plan.probes {
            let Some(slot) = usize::try_from(p.slot).ok().filter(|&s| s < self.inline.len()) else { continue };
            self.counting[slot] = own_sites(p) + self.inline[slot];
        }
    }

    /// Each probe's counting sites by kind, by name.
    #[must_use]
    pub fn by_probe(&self, plan: &Plan) -> IndexMap<String, SiteKinds> {
        plan.probes
            .iter()
            .filter_map(|p| Some((p.symbol.to_owned(), *self.counting.get(usize::try_from(p.slot).ok()?)?)))
            .collect()
    }

    /// The (high, low) cost in ns of the hits in `delta`.
    pub(super) fn price(&self, delta: &Reading, prices: Prices) -> (f64, f64) {
        let mut total = (0.0, 0.0);
        for (slot, (&calls, &returns)) in delta.calls.iter().zip(&delta.returns).enumerate() {
            let (rh, rl) = self.returns.get(slot).map_or((0.0, 0.0), |&r| return_range(r, prices));
            #[allow(clippy::cast_precision_loss, reason = "hit counts, priced")]
            let returns = returns as f64;
            let stepped = delta.stepped.get(slot).copied().unwrap_or(0);
            let kinds = self.counting.get(slot).copied().unwrap_or_default();
            let apart = self.apart.get(slot) == Some(&true);
            let (ch, cl) = priced_range(kinds, apart, (calls, stepped), prices.hit);
            total.0 += ch + returns * rh;
            total.1 += cl + returns * rl;
        }
        total
    }
}

/// What `hits` hits cost, `stepped` of them at single-stepped sites and
/// the rest at emulated ones (a probe that counts them apart).
#[must_use]
pub fn priced_apart(hits: u64, stepped: u64, hit: HitCosts) -> f64 {
    let stepped = stepped.min(hits);
    #[allow(clippy::cast_precision_loss, reason = "hit counts, priced")]
    let (stepped, emulated) = (stepped as f64, (hits - stepped) as f64);
    stepped * hit.single_stepped_ns + emulated * hit.emulated_ns
}

/// The (high, low) cost in ns of a probe's `hits`, `stepped` of them at
/// single-stepped sites, its sites being of `kinds`: each hit by its kind
/// where it counts them `apart`, else as [`hit_range`] prices one.
#[must_use]
pub fn priced_range(kinds: SiteKinds, apart: bool, (hits, stepped): (u64, u64), hit: HitCosts) -> (f64, f64) {
    if apart {
        let ns = priced_apart(hits, stepped, hit);
        return (ns, ns);
    }
    #[allow(clippy::cast_precision_loss, reason = "hit counts, priced")]
    let hits = hits as f64;
    let (high, low) = hit_range(kinds, hit);
    (hits * high, hits * low)
}

const fn kind(emulated: bool) -> SiteKinds {
    if emulated { SiteKinds { emulated: 1, single_stepped: 0 } } else { SiteKinds { emulated: 0, single_stepped: 1 } }
}

/// A probe's inlined copies by kind.
fn inline_sites(p: &PlannedProbe) -> SiteKinds {
    p.inline_sites.iter().fold(SiteKinds::default(), |k, s| k + kind(s.emulated))
}

/// Every site a probe counts at, by kind: its own ([`own_sites`]) and its
/// inlined copies. The hits share one counter, so where both kinds are
/// there the kind of each hit is not known ([`hit_range`]).
#[must_use]
pub fn counting_sites(p: &PlannedProbe) -> SiteKinds {
    own_sites(p) + inline_sites(p)
}

/// A probe's own counting sites: its call sites, or its placed entry.
fn own_sites(p: &PlannedProbe) -> SiteKinds {
    match &p.call_sites {
        Some(c) => SiteKinds { emulated: c.emulated, single_stepped: c.stepped },
        None => kind(p.placement.emulated),
    }
}

/// Whether the kernel emulates the instruction at `offset` in `file`; one
/// that cannot be read counts as single-stepped.
fn emulated_at(file: Option<&File>, offset: u64, kernel: KernelVersion) -> bool {
    let Some(file) = file else { return false };
    let mut code = [0u8; 16];
    // Near the end of the file fewer bytes are there: decode what is.
    let n = file.read_at(&mut code, offset).unwrap_or(0);
    n > 0 && placement::at_entry_of(&code[..n], 0, kernel, "").emulated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::cost::tests::{HIT, PRICES, sites};

    #[test]
    fn a_probe_of_one_kind_is_priced_exactly_and_of_both_as_a_range() {
        assert_eq!(hit_range(sites(1, 0), HIT), (500.0, 500.0));
        assert_eq!(hit_range(sites(0, 209), HIT), (15_000.0, 15_000.0));
        // An emulated entry and single-stepped inlined copies: the hits
        // share a counter, so the kind of each is unknown.
        assert_eq!(hit_range(sites(1, 209), HIT), (15_000.0, 500.0));
        assert_eq!(hit_range(sites(0, 0), HIT), (0.0, 0.0));
    }

    #[test]
    fn returns_cost_their_probe_and_a_uretprobe_its_own_entry() {
        assert_eq!(return_range(ReturnSites::None, PRICES), (0.0, 0.0));
        // Sharing the counting probe's breakpoint: the return only.
        assert_eq!(return_range(ReturnSites::Uretprobe { entry: None }, PRICES), (200.0, 200.0));
        assert_eq!(return_range(ReturnSites::Uretprobe { entry: Some(false) }, PRICES), (15_200.0, 15_200.0));
        assert_eq!(return_range(ReturnSites::Uretprobe { entry: Some(true) }, PRICES), (700.0, 700.0));
        assert_eq!(return_range(ReturnSites::Sites(sites(2, 1)), PRICES), (15_000.0, 500.0));
        // Uncalibrated returns err high.
        let uncalibrated = Prices { uretprobe_return_ns: None, ..PRICES };
        assert_eq!(return_range(ReturnSites::Uretprobe { entry: None }, uncalibrated), (15_000.0, 15_000.0));
    }

    #[test]
    fn the_share_is_of_the_targets_cpu_time_and_at_most_all_of_it() {
        // 2,000 single-stepped hits (30 ms) in 1 s of CPU time: 3%.
        let c = estimate(30e6, 30e6, 1e9, 2000, HIT);
        assert!((c.overhead_fraction.unwrap() - 0.03).abs() < 1e-12, "{c:?}");
        assert_eq!(c.overhead_fraction_low, None);
        assert!((c.tracer_cpu_s - 0.03).abs() < 1e-12);
        assert!((c.target_cpu_s - 1.0).abs() < 1e-12);
        assert!(c.estimate);
        assert!(!c.is_high());
        let c = estimate(30e6, 1e6, 1e9, 2000, HIT);
        assert!((c.overhead_fraction_low.unwrap() - 0.001).abs() < 1e-12, "{c:?}");
        // More than the CPU time it ran on: the estimate's error.
        assert_eq!(estimate(2e9, 2e9, 1e9, 1, HIT).overhead_fraction, Some(1.0));
        // A range with both ends at that cap is none.
        assert_eq!(estimate(3e9, 2e9, 1e9, 1, HIT).overhead_fraction_low, None);
        // No hits, no CPU time: nothing spent.
        assert_eq!(estimate(0.0, 0.0, 0.0, 0, HIT).overhead_fraction, Some(0.0));
        // Hits within less CPU time than /proc shows: no share.
        assert_eq!(estimate(1e3, 1e3, 0.0, 1, HIT).overhead_fraction, None);
    }

    #[test]
    fn a_high_cost_warns_and_points_to_budget() {
        let c = estimate(0.5e9, 0.5e9, 1e9, 1, HIT);
        assert!(c.is_high());
        assert_eq!(
            c.warning(None, &[]).unwrap(),
            "tracing costs the target an estimated 50% of its CPU time (a CPU-bound target runs about 2.0× slower); --budget PERCENT keeps the cost near PERCENT% by tracing in windows"
        );
        assert!(
            c.warning(None, &["--returns"]).unwrap().contains("(without --returns, which it does not combine with)")
        );
        assert!(
            c.warning(None, &["--types", "--stacks", "--native"])
                .unwrap()
                .contains("(without --types, --stacks and --native, which it does not combine with)")
        );
        assert!(c.warning(Some(20.0), &[]).unwrap().contains("--budget 20% is on"));
        assert!(estimate(0.99e9, 0.99e9, 1e9, 1, HIT).warning(None, &[]).unwrap().contains("over 10×"));
        assert_eq!(estimate(0.1e9, 0.1e9, 1e9, 1, HIT).warning(None, &[]), None, "10% is not above 10%");
    }
}
