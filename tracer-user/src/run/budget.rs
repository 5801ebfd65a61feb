//! `--budget PERCENT`: trace in windows, detaching between them for as long
//! as it takes to keep tracer's estimated cost under that share of the
//! target's CPU time, and estimate rates from what the windows saw.
//!
//! The cost of a window is its hits times the calibrated cost of one hit
//! in the CPU time of the thread hit (single-stepped or emulated, see
//! [`crate::prepare::calibrate`]), from before its probes begin to go live
//! to after the last has come down. The budget is a share of the target's
//! CPU time (`/proc/PID/stat`), because its promise is that the target's
//! work slows by at most that much: a target busy 30% of the time has 30%
//! of the time's budget.
//!
//! The [`Controller`] keeps a credit: HEADROOM of the budget of every bit
//! of CPU time the target uses, less what the windows cost. A window
//! starts only once the credit covers what the next one is expected to
//! cost (the last one's, its switching and its live time apart), so that
//! the target has paid for a window before it runs, from the first on.
//! A window whose successor the credit covers at once is followed without
//! detaching: a quiet target, once it has paid for a window's breakpoint
//! writes (see [`super::duty::BREAKPOINT_WRITE`]), is traced in full. The
//! credit is capped at one window's cost, so that a quiet spell does not
//! buy a burst later.
//!
//! Rates are ratio estimates: hits in all windows over the time they were
//! traced, with a 95% confidence interval from the spread between windows.
//! They are rates *while traced*, as a full count measures them: a probe
//! that slows the target slows its events too.

use std::time::Duration;

/// The share of the budget the controller aims at. The calibrated cost of a
/// hit is measured on tracer's own function; a hit in CPython's costs up to
/// about 15% more (BENCHMARKS.md, five ways), and what attaching and
/// detaching cost beyond their hits is priced from one workload's fit
/// (see [`super::duty::BREAKPOINT_WRITE`]).
pub const HEADROOM: f64 = 0.8;

/// The shortest wait before a window, so that a credit just short does not
/// spin.
const MIN_WAIT: Duration = Duration::from_millis(10);

/// The longest wait before the credit is looked at again: a target's
/// CPU time per second changes, and its credit with it.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// What the credit may fall short by and still cover a window: a quiet
/// target's credit is exactly what its windows cost, which float sums may
/// miss by an ulp (1 ns, in seconds).
const ROUNDING: f64 = 1e-9;

/// How many windows' detaches the next one's is expected from: the
/// costliest of them.
const DETACHES: usize = 4;

/// What a window is expected to cost, from the last ones: its hits while
/// the probes went live, while they came down (the costliest of the last
/// [`DETACHES`]: once a detach begins it cannot be cut short), and per
/// second of live time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Expected {
    attach: f64,
    detaches: [f64; DETACHES],
    live_per_s: f64,
}

impl Expected {
    /// The next detach's expected cost: the costliest of the last.
    fn detach(&self) -> f64 {
        self.detaches.iter().copied().fold(0.0, f64::max)
    }
}

/// Decides when a window may start, in the target's CPU time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    /// The budget as a share of the target's CPU time (0.01 for
    /// `--budget 1`).
    pub budget: f64,
    /// How long a window stays attached.
    pub window: Duration,
    /// What the windows may still spend, in seconds of the target's CPU
    /// time; below 0 after a window that cost more than was put by.
    credit: f64,
    expected: Expected,
    /// The target's CPU time at the last reading, in seconds.
    cpu: f64,
    /// Its CPU time per second of wall time, over the run so far.
    rate: f64,
}

impl Controller {
    /// A controller whose target had used `cpu` when it began.
    #[must_use]
    pub const fn new(budget: f64, window: Duration, cpu: Duration) -> Self {
        Self {
            budget,
            window,
            credit: 0.0,
            expected: Expected { attach: 0.0, detaches: [0.0; DETACHES], live_per_s: 0.0 },
            cpu: cpu.as_secs_f64(),
            rate: 0.0,
        }
    }

    fn aim(&self) -> f64 {
        self.budget * HEADROOM
    }

    /// What the next window is expected to cost: with its switching, or
    /// (`following`) one that follows its predecessor without detaching.
    fn expected(&self, following: bool) -> f64 {
        let live = self.expected.live_per_s * self.window.as_secs_f64();
        if following { live } else { live + self.expected.attach + self.expected.detach() }
    }

    /// The target has used `cpu` in all, `elapsed` after the controller
    /// began: the credit grows by the budget's aim of what it used since
    /// the last reading, up to one window's cost.
    pub fn observe(&mut self, cpu: Duration, elapsed: Duration) {
        let cpu = cpu.as_secs_f64();
        let used = (cpu - self.cpu).max(0.0);
        self.cpu = self.cpu.max(cpu);
        let cap = self.expected(false).max(0.0);
        // Over the cap already: a window cost less than expected. Kept, not
        // raised.
        if self.credit < cap {
            self.credit = (self.credit + self.aim() * used).min(cap);
        }
        if elapsed > Duration::ZERO {
            self.rate = self.cpu / elapsed.as_secs_f64();
        }
    }

    /// A window that lived `live` cost `live_cost` while live and `extra`
    /// besides (while its probes went live, or came down): spent. The next
    /// is expected to cost as much per second live, and `switching` (to
    /// attach, and to detach) where a whole cycle of the two was priced.
    pub fn spend(
        &mut self,
        live: Duration,
        live_cost: Duration,
        extra: Duration,
        switching: Option<(Duration, Duration)>,
    ) {
        self.credit -= live_cost.as_secs_f64() + extra.as_secs_f64();
        if live > Duration::ZERO {
            self.expected.live_per_s = live_cost.as_secs_f64() / live.as_secs_f64();
        }
        if let Some((attach, detach)) = switching {
            let e = &mut self.expected;
            e.attach = attach.as_secs_f64();
            e.detaches.rotate_right(1);
            e.detaches[0] = detach.as_secs_f64();
        }
    }

    /// Whether a window that has spent `spent` so far (from before its
    /// attach), `per_s` a second while live, may stay live `step` more:
    /// the credit covers that, and its detach as expected. A window whose
    /// hits come faster than the last one's ends early rather than spend
    /// what the target has not paid for.
    #[must_use]
    pub fn goes_on(&self, spent: Duration, per_s: f64, step: Duration) -> bool {
        self.credit - spent.as_secs_f64() - self.expected.detach() - per_s * step.as_secs_f64() >= -ROUNDING
    }

    /// Whether a window that lived `live` and cost `live_cost` while live
    /// may be followed at once, without detaching, when it and what came
    /// with it cost `spent` in all: the credit less `spent` covers the
    /// next one at the same cost per second.
    #[must_use]
    pub fn follows(&self, live: Duration, live_cost: Duration, spent: Duration) -> bool {
        let per_s =
            if live > Duration::ZERO { live_cost.as_secs_f64() / live.as_secs_f64() } else { self.expected.live_per_s };
        self.credit - spent.as_secs_f64() >= per_s * self.window.as_secs_f64() - ROUNDING
    }

    /// Whether the credit covers the next window now: one that follows
    /// without detaching (`following`), or one that attaches.
    #[must_use]
    pub fn covers(&self, following: bool) -> bool {
        self.credit >= self.expected(following)
    }

    /// How long to wait before looking at the credit again, detached: the
    /// time the target takes, at its rate so far, to make up what the
    /// next window lacks, between [`MIN_WAIT`] and [`MAX_WAIT`].
    #[must_use]
    pub fn wait(&self) -> Duration {
        let lacking = self.expected(false) - self.credit;
        if lacking <= 0.0 {
            return Duration::ZERO;
        }
        let per_s = self.aim() * self.rate;
        let wait =
            if per_s > 0.0 { Duration::try_from_secs_f64(lacking / per_s).unwrap_or(MAX_WAIT) } else { MAX_WAIT };
        wait.clamp(MIN_WAIT, MAX_WAIT)
    }

    /// The credit, in seconds of the target's CPU time.
    #[must_use]
    pub const fn credit(&self) -> f64 {
        self.credit
    }
}

/// A rate with its 95% confidence interval (`None` until there are two
/// windows to compare).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateEstimate {
    pub per_s: f64,
    pub ci95: Option<(f64, f64)>,
}

/// Sums over windows for one probe, enough for the ratio estimator and its
/// variance: its live time `w` and its calls and bytes `h`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sums {
    /// Windows the probe was live in.
    n: u64,
    w: f64,
    ww: f64,
    /// (Σh, Σh², Σhw) for calls, then for bytes.
    calls: (f64, f64, f64),
    bytes: (f64, f64, f64),
}

/// Everything the windows so far add up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Estimator {
    windows: u64,
    /// Time any probe was live, summed over windows.
    traced: Duration,
    probes: Vec<Sums>,
    overhead: Duration,
}

/// One window of one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeWindow {
    /// How long the probe was live.
    pub live: Duration,
    pub calls: u64,
    pub bytes: u64,
}

impl Estimator {
    #[must_use]
    pub fn new(probes: usize) -> Self {
        Self { probes: vec![Sums::default(); probes], ..Self::default() }
    }

    /// Adds one window: each probe's live time and counts, how long any
    /// probe was live, and what the hits cost the target.
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52 per window")]
    pub fn add(&mut self, probes: &[ProbeWindow], traced: Duration, overhead: Duration) {
        self.windows += 1;
        self.traced += traced;
        self.overhead += overhead;
        for (s, p) in self.probes.iter_mut().zip(probes) {
            let w = p.live.as_secs_f64();
            s.n += u64::from(w > 0.0);
            s.w += w;
            s.ww += w * w;
            for (sums, v) in [(&mut s.calls, p.calls as f64), (&mut s.bytes, p.bytes as f64)] {
                sums.0 += v;
                sums.1 += v * v;
                sums.2 += v * w;
            }
        }
    }

    #[must_use]
    pub const fn windows(&self) -> u64 {
        self.windows
    }

    /// Total time any probe was live.
    #[must_use]
    pub const fn traced(&self) -> Duration {
        self.traced
    }

    /// The estimated time the probes cost the target.
    #[must_use]
    pub const fn overhead(&self) -> Duration {
        self.overhead
    }

    /// Per probe: (calls/s, bytes/s) while traced.
    #[must_use]
    pub fn rates(&self) -> Vec<(RateEstimate, RateEstimate)> {
        self.probes
            .iter()
            .map(|s| {
                let bytes = if s.calls.0 == 0.0 {
                    // No call seen: no size either, so no bound.
                    RateEstimate { per_s: 0.0, ci95: None }
                } else {
                    Self::rate(s, s.bytes, false)
                };
                (Self::rate(s, s.calls, true), bytes)
            })
            .collect()
    }

    /// The rate of `(h, hh, hw)` over the probe's live time; `events`:
    /// whether they are counts of calls, whose none seen is bounded below.
    #[allow(clippy::cast_precision_loss, reason = "a window count")]
    fn rate(s: &Sums, (h, hh, hw): (f64, f64, f64), events: bool) -> RateEstimate {
        if s.w <= 0.0 {
            return RateEstimate { per_s: 0.0, ci95: None };
        }
        if events && h == 0.0 && s.n >= 2 {
            // No call in any window: their agreement would make it a sure
            // zero however little was traced, and 0.1 ms without a call
            // says little of a rate of thousands a second. Calls as a
            // Poisson process, none in `w` seconds bounds the rate at
            // -ln(0.025)/w, the upper end of the 95% interval. Not from one
            // window, which a bursty target's pause can hold whole (the
            // caller then shows no figure).
            return RateEstimate { per_s: 0.0, ci95: Some((0.0, NONE_SEEN_95 / s.w)) };
        }
        let r = h / s.w;
        // The windows this probe was live in: with perf-event uprobes one
        // may go live in fewer than the others.
        if s.n < 2 {
            return RateEstimate { per_s: r, ci95: None };
        }
        let n = s.n as f64;
        // Σ(h − r·w)², expanded so that only sums need keeping; clamped
        // because rounding can make an exact zero slightly negative.
        let residual = (hh - 2.0 * r * hw + r * r * s.ww).max(0.0);
        let mean_w = s.w / n;
        let se = (residual / (n * (n - 1.0))).sqrt() / mean_w;
        let half = t95(s.n - 1) * se;
        RateEstimate { per_s: r, ci95: Some(((r - half).max(0.0), r + half)) }
    }
}

/// The upper end of the two-sided 95% interval of a Poisson mean when none
/// was seen: -ln(0.025).
const NONE_SEEN_95: f64 = 3.688_879_454_113_936;

/// Two-sided 95% quantile of Student's t with `df` degrees of freedom.
#[allow(clippy::cast_possible_truncation, reason = "df is small where the table is used")]
fn t95(df: u64) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[(df - 1) as usize],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_window_waits_until_the_target_paid_for_it() {
        // 1%: the windows aim at 0.8% of the target's CPU time.
        let mut c = Controller::new(0.01, MS(20), Duration::ZERO);
        // Nothing known yet: the first window costs nothing expected.
        assert!(c.covers(false));
        // It lived 5 ms for 4 ms of hits, and cost 6 ms more going live
        // and coming down: the next is expected at 16 ms + 6 ms.
        c.spend(MS(5), MS(4), MS(6), Some((MS(2), MS(4))));
        assert!((c.credit() + 0.010).abs() < 1e-12);
        assert!(!c.covers(false) && !c.covers(true));
        // A target busy half the time: 1 s of wall time is 0.5 s of CPU
        // time, which puts by 4 ms.
        c.observe(MS(500), MS(1000));
        assert!((c.credit() + 0.006).abs() < 1e-12);
        // 28 ms lacking at 4 ms a second: 7 s, looked at again within 1 s.
        assert_eq!(c.wait(), MAX_WAIT);
        // 4 s of CPU time puts by 32 ms, more than the 28 lacking: capped
        // at one window's cost.
        c.observe(MS(4500), MS(9000));
        assert!((c.credit() - 0.022).abs() < 1e-12, "{}", c.credit());
        assert!(c.covers(false));
        // A quiet spell buys no burst.
        c.observe(MS(9000), MS(18000));
        assert!((c.credit() - 0.022).abs() < 1e-12);
        // Short of it by 0.4 ms at 4 ms/s: 0.1 s.
        c.spend(MS(20), MS(16), MS(6), Some((MS(2), MS(4))));
        c.observe(MS(9000 + 2750 - 50), MS(23_400));
        assert!(c.wait() > MS(10) && c.wait() < MS(1000), "{:?}", c.wait());
    }

    #[test]
    fn a_window_ends_early_where_its_hits_outrun_the_credit() {
        let mut c = Controller::new(0.01, MS(20), Duration::ZERO);
        c.spend(MS(20), MS(10), MS(6), Some((MS(2), MS(4))));
        // The next is expected at 10 + 2 + 4 ms; 4 s of CPU time puts by
        // 32 ms, 16 of them after the 16 spent.
        c.observe(MS(4000), MS(8000));
        assert!((c.credit() - 0.016).abs() < 1e-12, "{}", c.credit());
        // 5 ms spent (2 to attach, 3 of hits in 5 ms live): 5 ms more at
        // that pace (3 ms) and a 4-ms detach come to 12 ms of the 16.
        assert!(c.goes_on(MS(5), 0.6, MS(5)));
        // Hits twice as fast: 8 ms spent, 6 for the next 5 ms and the
        // detach's 4: 18, over the credit.
        assert!(!c.goes_on(MS(8), 1.2, MS(5)));
        // The costliest of the last detaches is expected: one of 1 ms
        // after the 4-ms one leaves 4 expected (10 + 4 + 3 is over the 16;
        // with 1 expected, 10 ms spent would go on).
        c.spend(MS(20), MS(10), MS(3), Some((MS(2), MS(1))));
        c.observe(MS(7000), MS(14000));
        assert!((c.credit() - 0.016).abs() < 1e-12, "{}", c.credit());
        assert!(c.goes_on(MS(6), 0.6, MS(5)) && !c.goes_on(MS(10), 0.6, MS(5)));
    }

    #[test]
    fn a_quiet_target_is_traced_without_a_gap() {
        let us = Duration::from_micros;
        let mut c = Controller::new(0.01, MS(20), Duration::ZERO);
        // 20 ms that cost 0.1 ms, on a target using a whole CPU: its 20 ms
        // of CPU time put by 0.16 ms. After the first, the credit is short
        // of the next window's 0.1 ms; after the second it covers it, and
        // stays there.
        c.spend(MS(20), us(100), Duration::ZERO, None);
        c.observe(MS(20), MS(20));
        assert!(!c.covers(true));
        for n in 2..10 {
            c.spend(MS(20), us(100), Duration::ZERO, None);
            c.observe(MS(20 * n), MS(20 * n));
            assert!(c.covers(true), "{n}: {}", c.credit());
        }
        // One that must attach again (1 ms of switching) is not covered.
        let mut d = Controller::new(0.01, MS(20), Duration::ZERO);
        d.spend(MS(20), us(100), MS(1), Some((us(500), us(500))));
        d.observe(MS(20), MS(20));
        assert!(!d.covers(false));
    }

    #[test]
    fn ratio_estimate_and_interval() {
        let window = |ms, calls, bytes| ProbeWindow { live: MS(ms), calls, bytes };
        let mut e = Estimator::new(1);
        // Three windows at exactly 1000 calls/s: no spread, a zero-width
        // interval.
        for ms in [10, 20, 30] {
            e.add(&[window(ms, ms, 8 * ms)], MS(ms), MS(1));
        }
        let (calls, bytes) = e.rates()[0];
        assert!((calls.per_s - 1000.0).abs() < 1e-9);
        assert!((bytes.per_s - 8000.0).abs() < 1e-9);
        let (lo, hi) = calls.ci95.unwrap();
        assert!((hi - lo).abs() < 1e-6, "{lo} {hi}");
        assert_eq!(e.windows(), 3);
        assert_eq!(e.overhead(), MS(3));
        assert_eq!(e.traced(), MS(60));

        // Windows that disagree: 100 and 300 calls in 100 ms each.
        let mut e = Estimator::new(1);
        e.add(&[window(100, 100, 0)], MS(100), Duration::ZERO);
        e.add(&[window(100, 300, 0)], MS(100), Duration::ZERO);
        let (calls, _) = e.rates()[0];
        assert!((calls.per_s - 2000.0).abs() < 1e-9);
        // residuals ±100, se = sqrt(20000 / 2) / 0.1 = 1000, t(1) = 12.706.
        let (lo, hi) = calls.ci95.unwrap();
        assert!((hi - (2000.0 + 12706.0)).abs() < 1e-6, "{hi}");
        assert!(lo.abs() < 1e-12, "clamped at zero: {lo}");
    }

    #[test]
    fn one_window_has_no_interval() {
        let mut e = Estimator::new(2);
        // Before any window: no figure to bound.
        assert_eq!(e.rates()[0], (RateEstimate { per_s: 0.0, ci95: None }, RateEstimate { per_s: 0.0, ci95: None }));
        let live = |ms, calls| ProbeWindow { live: MS(ms), calls, bytes: 0 };
        // Each probe's rate is over its own live time.
        e.add(&[live(500, 5), live(250, 5)], MS(500), Duration::ZERO);
        assert_eq!(e.rates()[0].0, RateEstimate { per_s: 10.0, ci95: None });
        assert_eq!(e.rates()[1].0, RateEstimate { per_s: 20.0, ci95: None });
    }

    /// Windows that saw no call bound the rate by the time they traced;
    /// their agreement made it a sure zero (±0). One window says nothing.
    #[test]
    fn no_call_seen_bounds_the_rate_by_the_time_traced() {
        let mut e = Estimator::new(1);
        let none = ProbeWindow { live: Duration::from_micros(100), calls: 0, bytes: 0 };
        e.add(&[none], Duration::from_micros(100), Duration::ZERO);
        let unknown = RateEstimate { per_s: 0.0, ci95: None };
        assert_eq!(e.rates()[0], (unknown, unknown));
        e.add(&[none], Duration::from_micros(100), Duration::ZERO);
        let (calls, bytes) = e.rates()[0];
        let (lo, hi) = calls.ci95.expect("a bound from two windows");
        assert_eq!((calls.per_s, lo), (0.0, 0.0));
        assert!((hi - 18_444.4).abs() < 0.1, "{hi}");
        // No call, no size: the bytes' rate has no bound.
        assert_eq!(bytes, unknown);
        // Calls of no bytes (a function that requests none): a sure zero,
        // not a bound made up from the calls' Poisson one.
        let mut e = Estimator::new(1);
        let calls = ProbeWindow { live: Duration::from_micros(100), calls: 3, bytes: 0 };
        e.add(&[calls], Duration::from_micros(100), Duration::ZERO);
        e.add(&[calls], Duration::from_micros(100), Duration::ZERO);
        assert_eq!(e.rates()[0].1, RateEstimate { per_s: 0.0, ci95: Some((0.0, 0.0)) });
        // A probe live in one window only: no bound from the other's time.
        let mut e = Estimator::new(2);
        let off = ProbeWindow { live: Duration::ZERO, calls: 0, bytes: 0 };
        e.add(&[none, none], Duration::from_micros(100), Duration::ZERO);
        e.add(&[none, off], Duration::from_micros(100), Duration::ZERO);
        assert!(e.rates()[0].0.ci95.is_some());
        assert_eq!(e.rates()[1].0, unknown);
    }

    #[test]
    fn t_quantiles() {
        assert!(t95(0).is_infinite());
        assert!((t95(1) - 12.706).abs() < 1e-9);
        assert!((t95(30) - 2.042).abs() < 1e-9);
        assert!((t95(1000) - 1.96).abs() < 1e-9);
    }
}
