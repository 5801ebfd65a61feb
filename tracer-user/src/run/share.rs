//! The production profile's budget, shared between its sources: each
//! reports what it cost over the interval just ended (its probe hits
//! priced, as CPU time of the target, and what tracer spent reading the
//! target's memory), and the duty cycle of the rates gets what the others
//! leave of the budget for the next one.
//!
//! The budget is a share of the target's CPU time (`utime + stime` in
//! `/proc/PID/stat`, over every traced process), not of the time that
//! passes: its promise is that the target's work slows by at most that
//! much, and a target busy 30% of the time pays for a probe hit out of
//! that 30%. tracer's own CPU time (the heap census, the statistics read,
//! the run loop attaching and detaching windows) counts against it too,
//! as a share of the target's CPU time or of one CPU's time, whichever is
//! more: on a host whose CPUs are all busy it comes out of someone's work,
//! the target's where tracer shares its CPU, and an idle target still
//! lets tracer use its budget's share of one CPU. Every source reports
//! here, and the rates' windows get what the others leave, over the run.

use std::time::Duration;

use indexmap::IndexMap;

use crate::model::{ProfileCost, SourceCost};

/// The source whose windows take what the others leave.
pub const RATES: &str = crate::model::RATES_SOURCE;
/// The rates' first window, at the attach: charged to the rates' duty
/// cycle as every window is (the windows after it wait until it is paid
/// for), and shown apart.
pub const FIRST_WINDOW: &str = crate::model::FIRST_WINDOW_SOURCE;
/// The probes that time collections.
pub const GC_PROBES: &str = "gc_probes";
/// The collector's statistics read from memory.
pub const GC_MEMORY: &str = "gc_memory";
/// The heap census.
pub const CENSUS: &str = "census";
/// Heap growth sampling's probes (`--growth`, or the profile's default),
/// and its reads of the sampled pools.
pub const GROWTH: &str = crate::model::GROWTH_SOURCE;
/// tracer's run loop: attaching and detaching the windows, reading the
/// counts, writing the report (tracer's CPU time not spent by a source
/// above).
pub const LOOP: &str = "tracer";

/// The least share of the budget the rates keep when the other sources
/// took it all: their windows then come rarely, but still come, and the
/// report says the budget was exceeded.
pub const RATES_FLOOR: f64 = 0.05;

/// What one source spent: target CPU time, tracer CPU time, bytes read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Spent {
    target: Duration,
    tracer: Duration,
    bytes: u64,
}

impl Spent {
    fn add(&mut self, other: Self) {
        self.target += other.target;
        self.tracer += other.tracer;
        self.bytes += other.bytes;
    }
}

/// The budget's ledger.
#[derive(Clone, Debug)]
pub struct BudgetLedger {
    /// The budget, as a share of the target's CPU time.
    budget: f64,
    /// This interval's spending, by source, in the order first reported.
    interval: IndexMap<&'static str, Spent>,
    /// The run's.
    total: IndexMap<&'static str, Spent>,
    total_span: Duration,
    /// The target's CPU time over the run.
    total_cpu: Duration,
    /// What the other sources cost over the run, as a share.
    others: f64,
}

impl BudgetLedger {
    #[must_use]
    pub fn new(budget: f64) -> Self {
        Self {
            budget,
            interval: IndexMap::new(),
            total: IndexMap::new(),
            total_span: Duration::ZERO,
            total_cpu: Duration::ZERO,
            others: 0.0,
        }
    }

    /// `source` cost the target `target` of CPU time and tracer `tracer`,
    /// reading `bytes` of the target's memory, since its last report.
    pub fn report(&mut self, source: &'static str, target: Duration, tracer: Duration, bytes: u64) {
        self.interval.entry(source).or_default().add(Spent { target, tracer, bytes });
    }

    /// tracer's CPU time reported by `source` this interval so far.
    #[must_use]
    pub fn tracer_spent(&self, source: &str) -> Duration {
        self.interval.get(source).map_or(Duration::ZERO, |s| s.tracer)
    }

    /// Ends the interval, which lasted `span` and in which the target used
    /// `cpu` of CPU time: its cost by source. What the sources other than
    /// the rates took over the run so far, the rates' duty cycle leaves
    /// them from now on: over the run, because a census comes every few
    /// intervals, and the rates' windows catch up after one. The run's
    /// cost so far goes with it.
    pub fn close_interval(&mut self, span: Duration, cpu: Duration) -> ProfileCost {
        let interval = std::mem::take(&mut self.interval);
        for (name, spent) in &interval {
            self.total.entry(name).or_default().add(*spent);
        }
        self.total_span += span;
        self.total_cpu += cpu;
        let total = self.total();
        self.others = total
            .sources
            .iter()
            .filter(|(name, _)| *name != RATES && *name != FIRST_WINDOW)
            .map(|(_, s)| s.fraction)
            .sum();
        ProfileCost { so_far: Some(Box::new(total)), ..self.cost(&interval, span, cpu) }
    }

    /// The run's cost so far.
    #[must_use]
    pub fn total(&self) -> ProfileCost {
        self.cost(&self.total, self.total_span, self.total_cpu)
    }

    /// The share of the time the rates' windows may cost the target: the
    /// budget less what the other sources cost over the run, and at least
    /// [`RATES_FLOOR`] of the budget.
    #[must_use]
    pub fn left_for_rates(&self) -> f64 {
        (self.budget - self.others).max(self.budget * RATES_FLOOR)
    }

    /// The budget.
    #[must_use]
    pub const fn budget(&self) -> f64 {
        self.budget
    }

    fn cost(&self, spent: &IndexMap<&'static str, Spent>, span: Duration, cpu: Duration) -> ProfileCost {
        let share = |d: Duration| share(d, cpu, spent);
        let own = own_share(span, cpu);
        let sources: IndexMap<String, SourceCost> = spent
            .iter()
            .map(|(name, s)| {
                let tracer_fraction = own(s.tracer);
                let cost = SourceCost {
                    target_s: s.target.as_secs_f64(),
                    fraction: share(s.target) + tracer_fraction,
                    tracer_fraction,
                    tracer_cpu_s: s.tracer.as_secs_f64(),
                    bytes_read: s.bytes,
                };
                ((*name).to_owned(), cost)
            })
            .collect();
        ProfileCost {
            budget_percent: self.budget * 100.0,
            fraction: sources.values().map(|s| s.fraction).sum(),
            span_s: span.as_secs_f64(),
            target_cpu_s: cpu.as_secs_f64(),
            sources,
            so_far: None,
        }
    }
}

/// `cost` as a share of the target's CPU time `cpu`, over a span in
/// which every source of `spent` cost the target what it says. The probes
/// run on the target's CPU time, so it is at least what they cost: where
/// `/proc` counts less (it counts in clock ticks, 10 ms here), the sum of
/// the costs stands in for it.
fn share(cost: Duration, cpu: Duration, spent: &IndexMap<&'static str, Spent>) -> f64 {
    let all: Duration = spent.values().map(|s| s.target).sum();
    let cpu = cpu.max(all);
    if cpu.is_zero() { 0.0 } else { cost.as_secs_f64() / cpu.as_secs_f64() }
}

/// tracer's own CPU time as a share of the target's CPU time `cpu` over
/// `span`, or of one CPU's time over it, whichever is more: see the
/// module's comment.
pub fn own_share(span: Duration, cpu: Duration) -> impl Fn(Duration) -> f64 {
    let over = cpu.max(span).as_secs_f64();
    move |d: Duration| if over > 0.0 { d.as_secs_f64() / over } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_rates_get_what_the_others_leave() {
        let mut ledger = BudgetLedger::new(0.01);
        assert!((ledger.left_for_rates() - 0.01).abs() < 1e-12);
        ledger.report(RATES, MS(7), Duration::ZERO, 0);
        ledger.report(GC_PROBES, MS(2), Duration::ZERO, 0);
        ledger.report(GC_MEMORY, Duration::ZERO, Duration::from_micros(30), 72);
        ledger.report(GC_MEMORY, Duration::ZERO, Duration::from_micros(10), 72);
        // The target used 1 s of CPU time over 2 s: the shares are of that.
        let cost = ledger.close_interval(MS(2000), MS(1000));
        // 2 ms of 1 s to the GC probes, and 40 µs of tracer's CPU over
        // 2 s (more than the target's 1 s): the rates keep the rest.
        let own = 40e-6 / 2.0;
        assert!((ledger.left_for_rates() - (0.008 - own)).abs() < 1e-12, "{}", ledger.left_for_rates());
        assert!((cost.fraction - (0.009 + own)).abs() < 1e-12);
        assert!((cost.sources[GC_MEMORY].tracer_fraction - own).abs() < 1e-12);
        assert_eq!(cost.sources.keys().collect::<Vec<_>>(), [RATES, GC_PROBES, GC_MEMORY]);
        assert_eq!(cost.sources[GC_MEMORY].bytes_read, 144);
        assert!((cost.sources[GC_MEMORY].tracer_cpu_s - 40e-6).abs() < 1e-12);
        assert!((cost.budget_percent - 1.0).abs() < 1e-12);
        // Others over the budget: the rates keep their floor.
        ledger.report(GC_PROBES, MS(30), Duration::ZERO, 0);
        let _ = ledger.close_interval(MS(1000), MS(1000));
        assert!((ledger.left_for_rates() - 0.01 * RATES_FLOOR).abs() < 1e-12);
        let total = ledger.total();
        assert!((total.span_s - 3.0).abs() < 1e-12);
        assert!((total.target_cpu_s - 2.0).abs() < 1e-12);
        assert!((total.sources[GC_PROBES].target_s - 0.032).abs() < 1e-12);
        assert!((total.fraction - (0.0195 + 40e-6 / 3.0)).abs() < 1e-12, "{}", total.fraction);
    }

    #[test]
    fn a_target_that_used_less_cpu_than_the_probes_cost_pays_at_least_that() {
        let mut ledger = BudgetLedger::new(0.01);
        // 4 ms of probe hits while /proc counted no tick: all of the time
        // the target ran went to them.
        ledger.report(RATES, MS(4), Duration::ZERO, 0);
        let cost = ledger.close_interval(MS(1000), Duration::ZERO);
        assert!((cost.fraction - 1.0).abs() < 1e-12);
        // An idle target that cost nothing: no share, not a division by 0.
        let cost = ledger.close_interval(MS(1000), Duration::ZERO);
        assert!(cost.fraction.abs() < 1e-12);
    }
}
