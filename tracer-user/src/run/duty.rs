//! `--budget`: attaches and detaches the session in windows (see
//! [`super::budget`]) and marks what it reports as estimates.

use std::time::{Duration, Instant};

use super::{
    budget::{Controller, Estimator, ProbeWindow, RateEstimate},
    readout::Readout,
};
use crate::{
    kernel::{AttachError, Session},
    model::{self, Counts, ProbeEstimate, Snapshot},
    plan::{HitCosts, Plan},
};

/// How long each `--budget` window stays attached before detaching starts.
/// Detaching takes the kernel about 0.13 s per probe here, one after
/// another, so that dominates a window anyway.
pub const BUDGET_WINDOW: Duration = Duration::from_millis(20);

/// The duty cycle of one session.
pub struct DutyCycle {
    controller: Controller,
    costs: HitCosts,
    scope: u32,
    /// Whether the probes attach through uprobe-multi links.
    multi: bool,
    estimator: Estimator,
    /// While attached: when the attach began and when it completed.
    attached: Option<(Instant, Instant)>,
    /// Cumulative counts per probe, by slot, when the current window began.
    at_window_start: Vec<Counts>,
    /// The same before the probes began to go live (before the attach),
    /// or where a window followed the last without detaching: what the
    /// window's cost counts from, so that the hits while the links go
    /// live and come down are priced too.
    at_cost_start: Vec<Counts>,
    /// When that was.
    cost_began: Instant,
    /// Time spent attaching and detaching, summed over windows.
    switching: Duration,
    /// When to toggle next.
    pub next: Instant,
}

/// The counts of `now` since `then`, probe by probe.
fn since(now: &[Counts], then: &[Counts]) -> Vec<Counts> {
    now.iter()
        .zip(then)
        .map(|(now, then)| Counts { calls: now.calls.saturating_sub(then.calls), bytes: now.bytes.saturating_sub(then.bytes) })
        .collect()
}

fn counts(session: &mut Session, readout: &mut Readout) -> Result<Vec<Counts>, AttachError> {
    Ok(readout.read(session)?.probes.iter().map(|c| Counts { calls: c.calls, bytes: c.bytes }).collect())
}

impl DutyCycle {
    pub fn new(
        (session, readout): (&mut Session, &mut Readout),
        budget: f64,
        costs: HitCosts,
        (scope, multi): (u32, bool),
        attach: (Instant, Instant),
    ) -> Result<Self, AttachError> {
        Ok(Self {
            controller: Controller { budget, window: BUDGET_WINDOW },
            costs,
            scope,
            multi,
            estimator: Estimator::new(session.plan().probes.len()),
            attached: Some(attach),
            at_window_start: counts(session, readout)?,
            // The counts began at zero before the first attach.
            at_cost_start: vec![Counts::default(); session.plan().probes.len()],
            cost_began: attach.0,
            switching: attach.1 - attach.0,
            next: attach.1 + BUDGET_WINDOW,
        })
    }

    /// Sets the share of the time the windows may cost the target (the
    /// profile's rates get what its other sources leave).
    pub fn set_budget(&mut self, budget: f64) {
        self.controller.budget = budget;
    }

    /// The estimated time the windows' hits cost the target so far.
    #[must_use]
    pub fn overhead(&self) -> Duration {
        self.estimator.overhead()
    }

    /// Ends the window if attached, else starts one.
    pub fn toggle(&mut self, session: &mut Session, readout: &mut Readout) -> Result<(), AttachError> {
        let Some((began, live)) = self.attached else {
            if self.multi {
                // The links go live within the attach; the window starts
                // once they are and its base is read. Its cost counts from
                // before: the links go live one site after another, and
                // with thousands of sites (an LTO build's inlined copies)
                // that takes as long as a window.
                self.at_cost_start = counts(session, readout)?;
                self.cost_began = Instant::now();
                session.attach_multi(self.scope)?;
                self.at_window_start = counts(session, readout)?;
                let live = Instant::now();
                self.switching += live - self.cost_began;
                self.attached = Some((live, live));
                self.next = live + self.controller.window;
            } else {
                // Counts do not move while detached: this is the base.
                self.at_window_start = counts(session, readout)?;
                self.at_cost_start.clone_from(&self.at_window_start);
                let began = Instant::now();
                self.cost_began = began;
                session.attach_perf(self.scope)?;
                let live = Instant::now();
                self.switching += live - began;
                self.attached = Some((began, live));
                self.next = live + self.controller.window;
            }
            return Ok(());
        };
        let counts_now = counts(session, readout)?;
        let now = Instant::now();
        let window = self.window_counts(&counts_now);
        // Half the attach counts as live: the probes went live one by one.
        let traced = now - live + (live - began) / 2;
        let priced = since(&counts_now, &self.at_cost_start);
        if self.controller.gap(now - self.cost_began, self.cost_of(session, &priced)).is_none() {
            // Within budget on its own: the next window follows at once.
            self.record(session, (&window, &priced), &vec![traced; window.len()], traced);
            self.at_window_start.clone_from(&counts_now);
            self.at_cost_start = counts_now;
            self.cost_began = now;
            self.attached = Some((now, now));
            self.next = now + self.controller.window;
            return Ok(());
        }
        let gap = self.close(session, readout)?;
        self.next = Instant::now() + gap;
        Ok(())
    }

    /// Detaches and records the window; returns the gap the budget needs.
    pub fn close(&mut self, session: &mut Session, readout: &mut Readout) -> Result<Duration, AttachError> {
        let Some((began, live)) = self.attached.take() else { return Ok(Duration::ZERO) };
        if self.multi {
            // The window ends here: hits while the links remove their
            // breakpoints (a moment) count in the totals but not here.
            let window = self.window_counts(&counts(session, readout)?);
            let ended = Instant::now();
            session.detach_multi(self.scope);
            // Every hit until the last link came down is priced, over the
            // whole span from before the attach.
            let priced = since(&counts(session, readout)?, &self.at_cost_start);
            let detached = Instant::now();
            self.switching += detached - ended;
            // (began == live: see toggle.)
            let traced = ended - live + (live - began) / 2;
            let overhead = self.record(session, (&window, &priced), &vec![traced; window.len()], traced);
            return Ok(self.controller.gap(detached - self.cost_began, overhead).unwrap_or(Duration::ZERO));
        }
        // Each detach holds the next one back (see Session::detach_in_order),
        // so the probes that cost most go first.
        let so_far = self.window_counts(&counts(session, readout)?);
        let mut order: Vec<usize> = (0..so_far.len()).collect();
        order.sort_by(|&a, &b| self.probe_cost(session, &so_far, b).total_cmp(&self.probe_cost(session, &so_far, a)));
        let detaching = Instant::now();
        let detached = session.detach_in_order(self.scope, &order);
        let done = Instant::now();
        self.switching += done - detaching;
        let lives: Vec<Duration> = detached
            .iter()
            .map(|at| at.map_or(Duration::ZERO, |at| at.saturating_duration_since(live) + (live - began) / 2))
            .collect();
        let traced = lives.iter().copied().max().unwrap_or_default();
        let counts_now = counts(session, readout)?;
        let window = self.window_counts(&counts_now);
        let priced = since(&counts_now, &self.at_cost_start);
        let overhead = self.record(session, (&window, &priced), &lives, traced);
        Ok(self.controller.gap(done - self.cost_began, overhead).unwrap_or(Duration::ZERO))
    }

    fn window_counts(&self, counts_now: &[Counts]) -> Vec<Counts> {
        since(counts_now, &self.at_window_start)
    }

    /// What the window's hits of the probe in `slot` cost: its hits times
    /// the calibrated cost of its placement.
    #[allow(clippy::cast_precision_loss, reason = "hit counts of one window")]
    fn probe_cost(&self, session: &Session, window: &[Counts], slot: usize) -> f64 {
        // Hits at inlined copies count in the same slot, and most of those
        // sites are single-stepped: priced so, the estimate errs high.
        let cost = session
            .plan()
            .probes
            .get(slot)
            .map_or(0.0, |p| self.costs.of(p.placement.emulated && p.inline_sites.is_empty()));
        window.get(slot).map_or(0.0, |c| c.calls as f64) * cost
    }

    fn cost_of(&self, session: &Session, window: &[Counts]) -> Duration {
        let ns: f64 = (0..window.len()).map(|slot| self.probe_cost(session, window, slot)).sum();
        Duration::from_secs_f64(ns / 1e9)
    }

    /// Adds a window: `window`'s counts over `lives` for the rates, the
    /// cost of `priced` (every hit from before the attach to after the
    /// detach) for the budget. Returns that cost.
    fn record(
        &mut self,
        session: &Session,
        (window, priced): (&[Counts], &[Counts]),
        lives: &[Duration],
        traced: Duration,
    ) -> Duration {
        let overhead = self.cost_of(session, priced);
        let probes: Vec<ProbeWindow> =
            window.iter().zip(lives).map(|(c, &live)| ProbeWindow { live, calls: c.calls, bytes: c.bytes }).collect();
        self.estimator.add(&probes, traced, overhead);
        overhead
    }

    /// Marks `snapshot` as estimated: what the windows traced and each
    /// probe's estimated rates.
    pub fn fill(&self, plan: &Plan, snapshot: &mut Snapshot) {
        let elapsed = snapshot.elapsed();
        let ratio = |part: Duration| {
            if elapsed.is_zero() { 0.0 } else { (part.as_secs_f64() / elapsed.as_secs_f64()).min(1.0) }
        };
        snapshot.budget = Some(model::Budget {
            estimates: true,
            percent: self.controller.budget * 100.0,
            windows: self.estimator.windows(),
            traced_s: self.estimator.traced().as_secs_f64(),
            traced_fraction: ratio(self.estimator.traced()),
            estimated_overhead_fraction: ratio(self.estimator.overhead()),
            hit_cost_ns: self.costs,
            switching_s: self.switching.as_secs_f64(),
        });
        let ci = |r: RateEstimate| r.ci95.map(|(lo, hi)| [lo, hi]);
        let rates = self.estimator.rates();
        for p in &plan.probes {
            let rate = usize::try_from(p.slot).ok().and_then(|s| rates.get(s));
            let (Some(&(calls, bytes)), Some(counts)) = (rate, snapshot.probes.get_mut(p.symbol)) else { continue };
            counts.estimate = Some(ProbeEstimate {
                calls_per_s: calls.per_s,
                calls_per_s_ci95: ci(calls),
                bytes_per_s: bytes.per_s,
                bytes_per_s_ci95: ci(bytes),
            });
        }
    }
}
