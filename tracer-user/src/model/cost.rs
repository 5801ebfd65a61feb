//! What tracing costs the target, as reported: `--budget`'s windows and
//! the estimated share of the target's CPU time.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::plan::HitCosts;

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
    /// The probes' estimated cost to the target as a share of its CPU
    /// time (`target_cpu_s`; of the time that passed before that field
    /// was).
    pub estimated_overhead_fraction: f64,
    /// The calibrated cost of one hit.
    pub hit_cost_ns: HitCosts,
    /// Time spent attaching and detaching the probes, summed over windows:
    /// their hits meanwhile are priced with the windows'. Left out by a
    /// tracer before it was.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub switching_s: f64,
    /// The CPU time the traced processes used since the windows began
    /// (`/proc/PID/stat`, at least what the windows cost), which the budget
    /// and `estimated_overhead_fraction` are shares of. Left out by a
    /// tracer before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cpu_s: Option<f64>,
    /// How much the windows slowed the target, which the rates are
    /// corrected by (`run::pace`); left out before a window and a gap
    /// after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<Slowdown>,
}

/// The factor by which the windows slowed the target's work: the rates
/// counted while traced, times it, are the target's untraced.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slowdown {
    /// At least this: the hits priced at their placement (an inlined
    /// copy's as emulated) less the calibration's spread.
    pub at_least: f64,
    /// Likely this, the rates' figure where `at_least` is above 1 (at 1 the
    /// rates are those while traced): the hits priced at their placement;
    /// `null` where so priced they took nearly all the target's time in
    /// the windows (the rates are then the low end's).
    pub likely: Option<f64>,
    /// At most this: the hits priced as the budget prices them, plus the
    /// calibration's spread; `null` where they may have taken nearly all
    /// the target's time in the windows (the rates' intervals are then
    /// unbounded above).
    pub at_most: Option<f64>,
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
    /// Where a probe has sites of both kinds whose hits cannot be told
    /// apart (call sites of both kinds; a probe with an entry and inlined
    /// copies counts its single-stepped hits apart, `stepped_hits`),
    /// `overhead_fraction` prices them all as single-stepped; this is the
    /// share had they all been emulated. Left out when no such probe was
    /// hit.
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
    /// `--budget`, which may already be on (`budget` as a percentage), and
    /// which refuses the flags of this run in `refused` (from
    /// [`BudgetRefuses::flags`]): the advice names them, so that it never
    /// sends the user to a command line tracer rejects.
    #[must_use]
    pub fn warning(&self, budget: Option<f64>, refused: &[&str]) -> Option<String> {
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
            None if refused.is_empty() => {
                "--budget PERCENT keeps the cost near PERCENT% by tracing in windows".to_owned()
            }
            None => format!(
                "--budget PERCENT keeps the cost near PERCENT% by tracing in windows (without {}, which it does not combine with)",
                and_list(refused)
            ),
        };
        Some(format!("tracing costs the target an estimated {:.0}% of its CPU time ({slowdown}); {advice}", f * 100.0))
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The flags of a run that `--budget` refuses (config's `BudgetWith*`
/// errors), as far as a report shows them: its return counts, call sites
/// asked for, libc's probes, and the types, stacks and live blocks an
/// interval carries.
#[derive(Clone, Copy, Debug, Default)]
#[allow(clippy::struct_excessive_bools, reason = "one field per flag that --budget refuses")]
pub struct BudgetRefuses {
    pub types: bool,
    pub stacks: bool,
    pub live: bool,
    pub native: bool,
    pub returns: bool,
    pub call_sites: bool,
}

impl BudgetRefuses {
    /// The flags on, by name, for [`Cost::warning`].
    #[must_use]
    pub fn flags(self) -> Vec<&'static str> {
        [
            (self.types, "--types"),
            (self.stacks, "--stacks"),
            (self.live, "--live"),
            (self.native, "--native"),
            (self.returns, "--returns"),
            (self.call_sites, "--placement call-sites"),
        ]
        .into_iter()
        .filter_map(|(on, flag)| on.then_some(flag))
        .collect()
    }
}

/// For `skip_serializing_if`: exactly zero, as a tracer before the field
/// wrote nothing.
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde passes a reference")]
#[allow(clippy::float_cmp, reason = "only an exact 0.0 is left out")]
fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// For `skip_serializing_if`.
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde passes a reference")]
pub(super) const fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The estimated cost the header states, from the first window: the hits
/// it saw priced at the calibrated cost of a hit where each sits, over the
/// CPU time the target used in the window (with `--exe`, over the
/// window's wall time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    /// The estimated share of the target's CPU time the run will cost it:
    /// what exact tracing costs, or in the profile that held to its budget
    /// (`None` when no hit's cost is known; `reason` says why).
    pub fraction: Option<f64>,
    /// What tracing every event costs at the rate of the first window.
    pub exact_fraction: Option<f64>,
    /// With the profile: its budget, as a share of the target's CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_fraction: Option<f64>,
    /// The first window: how long, the CPU time the target used in it
    /// (its process CPU clock, exact; left out with `--exe`, and
    /// the shares are then of `window_s`), and the probe hits in it.
    pub window_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    pub hits: u64,
    /// Why `fraction` is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Above 10%: what that means for the target, and what lowers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The ledger's name for heap growth sampling's cost (a key of
/// [`ProfileCost::sources`]).
pub const GROWTH_SOURCE: &str = "growth";

/// The ledger's name for the attach's first window of the rates (a key of
/// [`ProfileCost::sources`]): it runs before the target has paid for
/// anything, and gives the header its estimate.
pub const FIRST_WINDOW_SOURCE: &str = "first_window";

/// The ledger's name for the rates' windows after the first.
pub const RATES_SOURCE: &str = "rates";

/// What one source of the production profile cost over an interval (in a
/// summary, over the run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceCost {
    /// The estimated CPU time it cost the target: its probe hits, priced.
    pub target_s: f64,
    /// What it cost against the budget: `target_s` as a share of the
    /// target's CPU time over the span (`target_cpu_s` of the
    /// [`ProfileCost`]), plus `tracer_fraction`.
    pub fraction: f64,
    /// tracer's own CPU time spent on it, as a share of the target's CPU
    /// time or of one CPU's time over the span, whichever is more.
    #[serde(default)]
    pub tracer_fraction: f64,
    /// tracer's own CPU time spent on it (reading the target's memory,
    /// attaching and detaching).
    pub tracer_cpu_s: f64,
    /// The bytes of the target's memory it read.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub bytes_read: u64,
}

/// The production profile's cost over an interval (in a summary, over the
/// run): every source's against the budget they share.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileCost {
    /// The budget, as a percentage of the target's CPU time.
    pub budget_percent: f64,
    /// The sources' estimated cost to the target together, as a share of
    /// its CPU time over the span (at least what the sources cost: the
    /// probes run on it).
    pub fraction: f64,
    pub span_s: f64,
    /// The CPU time the traced processes used over the span, by their
    /// CPU clocks.
    pub target_cpu_s: f64,
    /// By source: `first_window` (the attach's window of the rates),
    /// `rates` (the duty cycle's windows after it), `gc_probes` (the
    /// probes that time collections), `gc_memory` (the statistics read),
    /// `census` (the heap census), `growth` (its probes and reads),
    /// `tracer` (the run loop's own CPU time).
    pub sources: IndexMap<String, SourceCost>,
    /// In an interval: the run's cost so far, which the budget holds to.
    /// An interval's own can be over it in steady state: a census, paid
    /// for over the intervals before, falls in one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub so_far: Option<Box<ProfileCost>>,
}

impl ProfileCost {
    /// Where the run's cost passed its budget by the attach's first window
    /// alone (run before the target had paid for anything; the windows
    /// after it wait until it is paid for): how long a run at this
    /// target's pace pays for it, in seconds. The other sources keep to
    /// what they took, the rates' windows after the first to what the
    /// budget leaves, so the run holds its budget once the first window's
    /// cost is within what the budget leaves the rates of the target's
    /// CPU time.
    #[must_use]
    pub fn first_window_paid_by_s(&self) -> Option<f64> {
        let budget = self.budget_percent / 100.0;
        let first = self.sources.get(FIRST_WINDOW_SOURCE)?;
        let rates = self.sources.get(RATES_SOURCE).map_or(0.0, |s| s.fraction);
        let others = self.fraction - first.fraction - rates;
        let over_by_it = self.fraction > budget && self.fraction - first.fraction <= budget;
        if !over_by_it || others >= budget || self.span_s <= 0.0 || self.target_cpu_s <= 0.0 {
            return None;
        }
        let pace = self.target_cpu_s / self.span_s;
        let paid_by = first.target_s / ((budget - others) * pace);
        // A run already that long that is still over: the rates' windows
        // took more than the budget left them, not the first window's doing
        // ([`Self::over_budget`] says what).
        (paid_by > self.span_s).then_some(paid_by)
    }

    /// Where the profile cost more than its budget, other than by the
    /// first window alone ([`Self::first_window_paid_by_s`] says that): by
    /// how much, the costliest sources, and what lowers the costliest. In
    /// an interval, of the run so far: the budget holds over a run, and a
    /// census it paid for over several intervals takes one over it.
    #[must_use]
    pub fn over_budget(&self) -> Option<String> {
        match &self.so_far {
            Some(run) => run.over("has cost", " over the run so far"),
            None => self.over("cost", ""),
        }
    }

    fn over(&self, verb: &str, span: &str) -> Option<String> {
        // Rounded as shown: 1.0004% is not over a 1% budget.
        let (cost, budget) = (self.fraction * 100.0, self.budget_percent);
        if (cost * 1000.0).round() <= (budget * 1000.0).round() || self.first_window_paid_by_s().is_some() {
            return None;
        }
        let mut sources: Vec<(&String, f64)> =
            self.sources.iter().map(|(n, s)| (n, s.fraction)).filter(|(_, f)| *f > 0.0).collect();
        sources.sort_by(|a, b| b.1.total_cmp(&a.1));
        let most: Vec<String> =
            sources.iter().take(3).map(|(n, f)| format!("{} {:.3}%", n.replace('_', " "), f * 100.0)).collect();
        // The first window is never what to lower here: a run it alone
        // took over is said apart (above), so one still over is over by
        // what the others took beyond what the budget left them.
        let costliest = sources.iter().map(|(n, _)| n.as_str()).find(|n| *n != FIRST_WINDOW_SOURCE);
        let hint = match costliest {
            Some(RATES_SOURCE) => {
                "the rates' windows cost more than priced (a hit's price varies with what the target runs); the windows after wait until they are paid for"
            }
            Some("census") => {
                "the heap census keeps to half the budget over a run, and the first is taken before that much is earned; a longer run spreads it"
            }
            Some(GROWTH_SOURCE) => {
                "growth stops once it costs over half the budget (--growth keeps it on, --no-growth drops it)"
            }
            Some("tracer") => "tracer's own work each interval: a longer --interval lowers it",
            Some("gc_probes") => "each collection's two probe hits: --gc off drops them",
            Some("gc_memory") => "the GC statistics read each interval: a longer --interval lowers it",
            _ => "a longer run spreads what a source took at the start",
        };
        Some(format!(
            "the profile {verb} {cost:.3}% of the target's CPU time{span}, over its {}% budget; the most: {}; {hint}",
            (budget * 1e6).round() / 1e6,
            most.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(target_s: f64, fraction: f64) -> SourceCost {
        SourceCost { target_s, fraction, ..SourceCost::default() }
    }

    /// A 5 s run of a target at a quarter of a CPU (1.25 s of CPU time):
    /// a 20 ms first window is 1.6% of it, the census 0.4%.
    fn run(first_s: f64) -> ProfileCost {
        let cpu = 1.25;
        let sources = [
            (FIRST_WINDOW_SOURCE, source(first_s, first_s / cpu)),
            (RATES_SOURCE, source(0.0, 0.0)),
            ("census", source(0.0, 0.004)),
        ];
        ProfileCost {
            budget_percent: 1.0,
            fraction: sources.iter().map(|(_, s)| s.fraction).sum(),
            span_s: 5.0,
            target_cpu_s: cpu,
            sources: sources.into_iter().map(|(n, s)| (n.to_owned(), s)).collect(),
            so_far: None,
        }
    }

    #[test]
    fn a_run_over_its_budget_by_the_first_window_alone_says_how_long_a_run_pays_for_it() {
        // The budget leaves the rates 0.6% of 0.25 s of CPU time a second:
        // 20 ms takes 13.3 s.
        let paid = run(0.020).first_window_paid_by_s().expect("over by the first window");
        assert!((paid - 0.020 / (0.006 * 0.25)).abs() < 1e-9, "{paid}");
        // Within the budget: nothing to say.
        assert_eq!(run(0.005).first_window_paid_by_s(), None);
        // A run longer than that which is still over (the rates' windows
        // took more than the budget left them): not the first window's doing,
        // so over_budget names the sources.
        let mut long = run(0.020);
        long.span_s = 20.0;
        long.target_cpu_s = 5.0;
        let first = 0.020 / 5.0;
        long.sources.get_mut(FIRST_WINDOW_SOURCE).expect("first").fraction = first;
        long.sources.get_mut(RATES_SOURCE).expect("rates").fraction = 0.0055;
        long.fraction = first + 0.0055 + 0.004;
        // Without the first window within the budget, and 13.3 s pays for it.
        assert!(long.fraction - first <= 0.01);
        assert_eq!(long.first_window_paid_by_s(), None);
        let said = long.over_budget().expect("over");
        assert!(
            said.starts_with(
                "the profile cost 1.350% of the target's CPU time, over its 1% budget; the most: rates 0.550%"
            ),
            "{said}"
        );
        // The first window the costliest, and paid for by so long a run:
        // the hint is the next's, which took more than was left it.
        long.sources.get_mut(FIRST_WINDOW_SOURCE).expect("first").fraction = 0.006;
        long.sources.get_mut(FIRST_WINDOW_SOURCE).expect("first").target_s = 0.006 * 5.0;
        long.sources.get_mut("census").expect("census").fraction = 0.003;
        long.sources.get_mut(RATES_SOURCE).expect("rates").fraction = 0.002;
        long.fraction = 0.011;
        assert_eq!(long.first_window_paid_by_s(), None, "17.1 s pays for it, in a 20 s run");
        assert_eq!(
            long.over_budget().expect("over"),
            "the profile cost 1.100% of the target's CPU time, over its 1% budget; the most: first window 0.600%, census 0.300%, rates 0.200%; the heap census keeps to half the budget over a run, and the first is taken before that much is earned; a longer run spreads it"
        );
        // Over it without the first window too: not the first window's doing.
        let mut over = run(0.020);
        over.sources.get_mut("census").expect("census").fraction = 0.012;
        over.fraction += 0.008;
        assert_eq!(over.first_window_paid_by_s(), None);
    }

    /// Over the budget other than by the first window: said, with the
    /// costliest sources and what lowers the costliest.
    #[test]
    fn a_run_over_its_budget_says_by_what() {
        assert_eq!(run(0.005).over_budget(), None, "within it");
        assert_eq!(run(0.020).over_budget(), None, "the first window alone: said apart");
        let mut over = run(0.005);
        over.sources.get_mut("census").expect("census").fraction = 0.012;
        over.fraction += 0.008;
        assert_eq!(
            over.over_budget().expect("over"),
            "the profile cost 1.600% of the target's CPU time, over its 1% budget; the most: census 1.200%, first window 0.400%; the heap census keeps to half the budget over a run, and the first is taken before that much is earned; a longer run spreads it"
        );
    }

    /// An interval over the budget in a run within it (a census, paid for
    /// over the intervals before, fell in it): nothing to warn of. One in
    /// a run over it: said of the run so far.
    #[test]
    fn an_interval_warns_of_the_run_so_far() {
        let mut interval = run(0.005);
        interval.sources.get_mut("census").expect("census").fraction = 0.012;
        interval.fraction += 0.008;
        interval.so_far = Some(Box::new(run(0.005)));
        assert_eq!(interval.over_budget(), None, "the run so far is within the budget");
        let mut over = run(0.005);
        over.sources.get_mut("census").expect("census").fraction = 0.012;
        over.fraction += 0.008;
        interval.so_far = Some(Box::new(over));
        assert_eq!(
            interval.over_budget().expect("over"),
            "the profile has cost 1.600% of the target's CPU time over the run so far, over its 1% budget; the most: census 1.200%, first window 0.400%; the heap census keeps to half the budget over a run, and the first is taken before that much is earned; a longer run spreads it"
        );
    }
}
