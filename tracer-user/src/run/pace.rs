//! How much the rates' windows slowed the target, and so how far a rate
//! counted while traced falls short of the target's rate untraced.
//!
//! A window traces every event, and every hit costs the thread hit a
//! calibrated 0.4–15 µs: on allocation-bound code, where an event comes
//! every 0.1–0.3 µs of the target's own work, the target runs 5–100 times
//! slower while traced, and so do its events. The rate while traced is
//! then that much below the target's.
//!
//! The target's own work in the windows is its CPU time there less what
//! the hits cost it; untraced, it does that work at the CPU rate it has
//! between windows. So a window's events took, untraced,
//! `(cpu − hits' cost) / cpu rate between windows` seconds, and the
//! factor from the rate while traced to the rate untraced is
//! `cpu rate between windows × window time / (cpu − hits' cost)`. A target
//! that keeps up with its load (a paced service) spends the hits' cost
//! on top of its own work in the windows, and the factor is 1; one that
//! is busy throughout loses the hits' cost from its own work.
//!
//! The hits' cost is a calibrated price, not a measurement, and where the
//! hits take most of the windows' CPU time the difference is too small to
//! know. So the factor is a range. Its likely value prices each hit at its
//! probe's placement (an inlined copy's as emulated, what it costs at
//! least); its low end at that price less [`PRICE_SPREAD`], its high end
//! as the budget prices them (single-stepped where they may be) and at
//! that price and the spread above it. Where a price leaves the target
//! less than a tenth of the windows' work, the factor is unknown at that
//! end: the rate is at least the low end's, with no upper bound.

use std::time::Duration;

/// How far a hit in CPython's code can cost from the calibrated hit on
/// tracer's own function, either way: up to about 15% more (BENCHMARKS.md),
/// calibrations here differ by up to a quarter from one to the next (one is
/// kept for an hour, [`crate::prepare::kept`]), and on 4 allocating threads
/// a hit cost 1.2 times the calibrated price.
pub const PRICE_SPREAD: f64 = 1.5;

/// The high end of the factor past which it is not bounded: the windows
/// left the target less than this share of the work it does untraced in
/// the same time.
const LEAST_SHARE: f64 = 0.1;

/// The CPU time of each traced process at one moment, by its exact
/// process clock ([`super::cost::process_cpu_ns`]), sorted by PID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuMark(Vec<(u32, u64)>);

impl CpuMark {
    /// The clocks of `pids` now (those gone are left out).
    #[must_use]
    pub fn read(pids: &[u32]) -> Self {
        let mut each: Vec<(u32, u64)> =
            pids.iter().filter_map(|&pid| Some((pid, super::cost::process_cpu_ns(pid)?))).collect();
        each.sort_unstable();
        each.dedup_by_key(|(pid, _)| *pid);
        Self(each)
    }

    /// The CPU time used since `then` by the processes in both (one that
    /// started or ended between them is left out of both ends); `None`
    /// where none is.
    #[must_use]
    pub fn since(&self, then: &Self) -> Option<Duration> {
        let mut any = false;
        let mut ns = 0u64;
        for &(pid, now) in &self.0 {
            if let Ok(i) = then.0.binary_search_by_key(&pid, |&(p, _)| p) {
                any = true;
                ns = ns.saturating_add(now.saturating_sub(then.0[i].1));
            }
        }
        any.then(|| Duration::from_nanos(ns))
    }

    /// The CPU time used since `then`, only where both read the same
    /// processes: an upper bound on what any hit in them since can have
    /// cost. `None` where a process started or ended between them (its
    /// share is not known, and leaving it out would bound too low).
    #[must_use]
    pub fn spent_since(&self, then: &Self) -> Option<Duration> {
        let same = !self.0.is_empty()
            && self.0.len() == then.0.len()
            && self.0.iter().zip(&then.0).all(|(now, was)| now.0 == was.0);
        if same { self.since(then) } else { None }
    }
}

/// Sums over the windows and the gaps between them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[allow(clippy::struct_field_names, reason = "every field is in seconds, and says so as the model's do")]
pub struct Pace {
    /// Wall time the windows' probes were live, and the target's CPU
    /// time meanwhile.
    window_s: f64,
    window_cpu_s: f64,
    /// The windows' hits priced at their placement (an inlined copy's as
    /// emulated), and as the budget prices them.
    placed_s: f64,
    priced_s: f64,
    /// Wall time between windows, and the target's CPU time meanwhile.
    gap_s: f64,
    gap_cpu_s: f64,
}

/// The factor from a rate counted while traced to the target's rate
/// untraced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factor {
    /// At least this (1 where the windows did not slow the target).
    pub low: f64,
    /// Likely this; `None` where the hits, so priced, took nearly all the
    /// target's time in the windows.
    pub likely: Option<f64>,
    /// At most this; `None` where the windows' hits may have taken
    /// nearly all the target's time in them.
    pub high: Option<f64>,
}

impl Pace {
    /// Adds a window live for `wall`, in which the target used `cpu` and
    /// its hits cost `placed` priced at their placement, `priced` as the
    /// budget prices them.
    pub fn add_window(&mut self, wall: Duration, cpu: Duration, placed: Duration, priced: Duration) {
        self.window_s += wall.as_secs_f64();
        self.window_cpu_s += cpu.as_secs_f64();
        self.placed_s += placed.as_secs_f64();
        self.priced_s += priced.as_secs_f64();
    }

    /// Adds a gap between windows of `wall`, in which the target used
    /// `cpu`.
    pub fn add_gap(&mut self, wall: Duration, cpu: Duration) {
        self.gap_s += wall.as_secs_f64();
        self.gap_cpu_s += cpu.as_secs_f64();
    }

    /// The factor, once a window and a gap have been seen with CPU time in
    /// them (`None` before, and where no traced process's clock could be
    /// read at both ends of one).
    #[must_use]
    pub fn factor(&self) -> Option<Factor> {
        if self.window_s <= 0.0 || self.gap_s <= 0.0 || self.window_cpu_s <= 0.0 || self.gap_cpu_s <= 0.0 {
            return None;
        }
        // The work the target did in the windows' time untraced, in CPU
        // seconds.
        let untraced = self.gap_cpu_s / self.gap_s * self.window_s;
        // None where the cost leaves less than a tenth of that.
        let factor = |cost: f64| {
            let own = self.window_cpu_s - cost;
            (own > LEAST_SHARE * untraced).then(|| (untraced / own).max(1.0))
        };
        let low = factor(self.placed_s / PRICE_SPREAD).unwrap_or(1.0 / LEAST_SHARE);
        let likely = factor(self.placed_s).map(|f| f.max(low));
        let high = factor(self.priced_s.max(self.placed_s) * PRICE_SPREAD).map(|f| f.max(likely.unwrap_or(low)));
        Some(Factor { low, likely, high })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// A ceiling on what hits cost holds only over the same processes: one
    /// gone or new between the readings ran an unknown share.
    #[test]
    fn cpu_spent_bounds_a_cost_only_over_the_same_processes() {
        let then = CpuMark(vec![(10, 1_000), (20, 5_000)]);
        assert_eq!(CpuMark(vec![(10, 1_500), (20, 7_000)]).spent_since(&then), Some(Duration::from_nanos(2_500)));
        assert_eq!(CpuMark(vec![(10, 1_500)]).spent_since(&then), None, "20 ended");
        assert_eq!(CpuMark(vec![(10, 1_500), (20, 7_000), (30, 9)]).spent_since(&then), None, "30 began");
        assert_eq!(CpuMark(vec![(10, 1_500), (30, 9)]).spent_since(&then), None, "20 ended, 30 began");
        assert_eq!(CpuMark(Vec::new()).spent_since(&CpuMark(Vec::new())), None, "no process");
        // `since` counts those in both, for the pace.
        assert_eq!(CpuMark(vec![(10, 1_500)]).since(&then), Some(Duration::from_nanos(500)));
    }

    #[test]
    fn a_target_keeping_up_is_not_slowed() {
        // 10% busy untraced; in the windows 10% of own work plus the hits.
        let mut p = Pace::default();
        p.add_gap(ms(10_000), ms(1_000));
        p.add_window(ms(100), ms(10 + 30), ms(30), ms(30));
        let f = p.factor().expect("a factor");
        assert!(near(f.low, 1.0) && f.likely.is_some_and(|l| near(l, 1.0)), "{f:?}");
        // Priced half as high again the target would have lost work it
        // did not: the high end is unknown.
        assert!(f.high.is_none(), "{f:?}");
    }

    #[test]
    fn a_busy_target_loses_the_hits_cost() {
        // Busy throughout: a CPU-second per second, 40% of it hits.
        let mut p = Pace::default();
        p.add_gap(ms(1_000), ms(1_000));
        p.add_window(ms(100), ms(100), ms(40), ms(40));
        let f = p.factor().expect("a factor");
        assert!(near(f.low, 100.0 / (100.0 - 40.0 / 1.5)), "{f:?}");
        assert!(f.likely.is_some_and(|l| near(l, 100.0 / 60.0)), "{f:?}");
        assert!(f.high.is_some_and(|h| near(h, 100.0 / 40.0)), "{f:?}");
    }

    #[test]
    fn hits_taking_nearly_all_the_time_leave_no_upper_bound() {
        let mut p = Pace::default();
        p.add_gap(ms(1_000), ms(1_000));
        // Priced single-stepped the hits cost more than the CPU time.
        p.add_window(ms(100), ms(100), ms(60), ms(300));
        let f = p.factor().expect("a factor");
        assert!(near(f.low, 100.0 / 60.0) && f.likely.is_some_and(|l| near(l, 2.5)) && f.high.is_none(), "{f:?}");
        // Even the low price leaves too little: at least tenfold.
        let mut p = Pace::default();
        p.add_gap(ms(1_000), ms(1_000));
        p.add_window(ms(100), ms(100), ms(150), ms(150));
        let f = p.factor().expect("a factor");
        assert!(near(f.low, 10.0) && f.likely.is_none() && f.high.is_none(), "{f:?}");
    }

    #[test]
    fn cpu_marks_count_the_processes_in_both() {
        let then = CpuMark(vec![(10, 1_000), (20, 5_000)]);
        let now = CpuMark(vec![(20, 8_000), (30, 99_000)]);
        assert_eq!(now.since(&then), Some(Duration::from_micros(3)));
        assert_eq!(CpuMark(vec![(30, 1)]).since(&then), None);
        // Our own clock moves as we run.
        let me = std::process::id();
        let a = CpuMark::read(&[me, me]);
        assert_eq!(a.0.len(), 1);
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(CpuMark::read(&[me]).since(&a).is_some_and(|d| d > Duration::ZERO));
    }

    #[test]
    fn no_factor_without_a_gap_or_cpu_time() {
        let mut p = Pace::default();
        assert_eq!(p.factor(), None);
        p.add_window(ms(100), ms(100), ms(10), ms(10));
        assert_eq!(p.factor(), None);
        p.add_gap(ms(1_000), Duration::ZERO);
        assert_eq!(p.factor(), None);
    }
}
