//! `--budget PERCENT`: trace in windows, detaching between them for as long
//! as it takes to keep tracer's estimated cost under that share of the
//! time, and estimate rates from what the windows saw.
//!
//! The cost of a window is its hits times the calibrated cost of one hit
//! (single-stepped or emulated, see [`crate::run::calibrate`]). After a window
//! that cost `O` in `w` seconds, tracer stays detached for
//! `O / (budget × HEADROOM) - w` seconds, so over every window and the gap
//! after it the estimated cost is 80% of the budget, leaving room for what
//! the estimate misses. A window that stayed within budget on its own is followed by
//! the next one at once, without detaching: a quiet target is traced in
//! full.
//!
//! Rates are ratio estimates: hits in all windows over the time they were
//! traced, with a 95% confidence interval from the spread between windows.
//! They are rates *while traced*, as a full count measures them: a probe
//! that slows the target slows its events too.

use std::time::Duration;

/// The share of the budget the controller aims at. The calibrated cost of a
/// hit is measured on tracer's own function; a hit in CPython's costs up to
/// about 15% more (BENCHMARKS.md, five ways), and attaching and detaching
/// cost the target a little that no hit count shows.
pub const HEADROOM: f64 = 0.8;

/// Decides how long to stay detached after each window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    /// The budget as a fraction of time (0.01 for `--budget 1`).
    pub budget: f64,
    /// How long a window stays attached.
    pub window: Duration,
}

impl Controller {
    /// After a window traced for `traced` whose hits cost `overhead`, how
    /// long to stay detached; `None` when the window kept within the budget
    /// by itself, so the next one may follow without detaching.
    #[must_use]
    pub fn gap(&self, traced: Duration, overhead: Duration) -> Option<Duration> {
        let needed = overhead.as_secs_f64() / (self.budget * HEADROOM) - traced.as_secs_f64();
        if needed <= 0.0 { None } else { Some(Duration::try_from_secs_f64(needed).unwrap_or(Duration::MAX / 4)) }
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
        self.probes.iter().map(|s| (self.rate(s, s.calls), self.rate(s, s.bytes))).collect()
    }

    #[allow(clippy::cast_precision_loss, reason = "a window count")]
    fn rate(&self, s: &Sums, (h, hh, hw): (f64, f64, f64)) -> RateEstimate {
        if s.w <= 0.0 {
            return RateEstimate { per_s: 0.0, ci95: None };
        }
        let r = h / s.w;
        if self.windows < 2 {
            return RateEstimate { per_s: r, ci95: None };
        }
        let n = self.windows as f64;
        // Σ(h − r·w)², expanded so that only sums need keeping; clamped
        // because rounding can make an exact zero slightly negative.
        let residual = (hh - 2.0 * r * hw + r * r * s.ww).max(0.0);
        let mean_w = s.w / n;
        let se = (residual / (n * (n - 1.0))).sqrt() / mean_w;
        let half = t95(self.windows - 1) * se;
        RateEstimate { per_s: r, ci95: Some(((r - half).max(0.0), r + half)) }
    }
}

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
    fn gap_keeps_each_window_and_its_gap_within_budget() {
        let c = Controller { budget: 0.01, window: MS(20) };
        // 20 ms of window that cost 19 ms: 2.375 s of window + gap in all,
        // aiming at 0.8% to keep under 1%.
        let gap = c.gap(MS(20), MS(19)).unwrap();
        assert_eq!(gap, MS(2355));
        let share: f64 = 19.0 / (20.0 + 2355.0);
        assert!((share - 0.01 * HEADROOM).abs() < 1e-12);
        // A window that cost less than 0.8% of itself needs no gap.
        assert_eq!(c.gap(MS(20), Duration::from_micros(150)), None);
        assert_eq!(c.gap(MS(20), Duration::ZERO), None);
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
        assert_eq!(e.rates()[0].0, RateEstimate { per_s: 0.0, ci95: None });
        let live = |ms, calls| ProbeWindow { live: MS(ms), calls, bytes: 0 };
        // Each probe's rate is over its own live time.
        e.add(&[live(500, 5), live(250, 5)], MS(500), Duration::ZERO);
        assert_eq!(e.rates()[0].0, RateEstimate { per_s: 10.0, ci95: None });
        assert_eq!(e.rates()[1].0, RateEstimate { per_s: 20.0, ci95: None });
    }

    #[test]
    fn t_quantiles() {
        assert!(t95(0).is_infinite());
        assert!((t95(1) - 12.706).abs() < 1e-9);
        assert!((t95(30) - 2.042).abs() < 1e-9);
        assert!((t95(1000) - 1.96).abs() < 1e-9);
    }
}
