//! `--budget`: attaches and detaches the session in windows (see
//! [`super::budget`]) and marks what it reports as estimates.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use super::{
    budget::{Controller, Estimator, ProbeWindow, RateEstimate},
    cost::{TargetCpu, counting_sites, priced_range},
    pace::{CpuMark, Factor, Pace},
    readout::Readout,
};
use crate::{
    kernel::{AttachError, Session},
    model::{self, ProbeEstimate, Snapshot},
    plan::{HitCosts, Plan},
};

/// How long each `--budget` window stays attached before detaching starts.
/// Detaching takes the kernel about 0.13 s per probe here, one after
/// another, so that dominates a window anyway.
pub const BUDGET_WINDOW: Duration = Duration::from_millis(20);

/// How long the first window stays attached: the one the attach begins,
/// which the header's estimate comes from. It runs before the target has
/// paid for anything, so it is kept short. Most of its cost is the hits
/// while its breakpoints go in and come out, which no length changes: on
/// Debian 3.11's demo workload 1,149 hits while they went in, 4,021 while
/// live 6 ms, and 4,678 over the 47 ms they took to come out (at 5 ms).
pub const FIRST_WINDOW: Duration = Duration::from_millis(2);

/// How often a live window's counts are read: it ends early once its
/// hits so far and its detach would spend more than the target has paid
/// for (see [`Controller::goes_on`]).
pub const POLL: Duration = Duration::from_millis(5);

/// What writing one breakpoint into the target's code, or taking it out,
/// costs the target beyond the hits: the kernel changes its code pages
/// under it while it runs (page-table updates and the faults after them,
/// likely; measured as a whole). No hit count shows it. Fitted to the window-price
/// bench's twelve spans on the demo workload (BENCHMARKS.md, "The windows'
/// price against the target's kernel time", both runs): the target's extra
/// kernel time = 0.63 of its hits' price + 6.9 ms a window, whose ~1,400
/// breakpoints go in and come out, 2.5 µs a write (residuals within 0.06 s
/// a span). Priced on every target alike: one that is not running when
/// its entries change pays less.
pub const BREAKPOINT_WRITE: Duration = Duration::from_nanos(2_500);

/// The duty cycle of one session.
pub struct DutyCycle {
    controller: Controller,
    costs: HitCosts,
    scope: u32,
    /// Whether the probes attach through uprobe-multi links.
    multi: bool,
    estimator: Estimator,
    /// While attached: when the window began, every probe live and the
    /// window's base counts read.
    attached: Option<Instant>,
    /// Cumulative counts per probe, by slot, when the current window began.
    at_window_start: Vec<Tally>,
    /// The same before the probes began to go live (before the attach),
    /// or where a window followed the last without detaching: what the
    /// window's cost counts from, so that the hits while the links go
    /// live and come down are priced too.
    at_cost_start: Vec<Tally>,
    /// When that was.
    cost_began: Instant,
    /// The traced processes' clocks then, and the machine's: what a
    /// window's hits can have cost them at most is what they ran since.
    cost_mark: CpuMark,
    /// The processes with a hit by then: one with a hit since that neither
    /// that mark nor the window's last read (it began and ended between
    /// them) ran an unknown share of the window.
    cost_ever: BTreeSet<u32>,
    /// What the last window's ceiling took off its price (1: nothing):
    /// the same share comes off what its live part cost, and off the
    /// next window's price while it runs.
    scale: f64,
    /// What the hits while the probes of the current attach went live
    /// cost: with those while they come down, what switching costs.
    attach_cost: Duration,
    /// Whether the current window followed the last without detaching.
    followed: bool,
    /// The breakpoints an attach writes, and a detach takes out.
    breakpoints: u32,
    /// Time spent attaching and detaching, summed over windows.
    switching: Duration,
    /// The traced processes' CPU time, what the budget is a share of.
    cpu: TargetCpu,
    /// The processes seen at the last reading (with `--exe`).
    live: Vec<u32>,
    /// Every process with a hit so far.
    ever: BTreeSet<u32>,
    /// When the duty cycle began, and the CPU time then.
    began: (Instant, Duration),
    /// The CPU time at the last reading.
    cpu_used: Duration,
    /// The traced processes' CPU time when the current window went live.
    cpu_live_began: CpuMark,
    /// When the last window came down, and the traced processes' CPU
    /// time then: where the gap before the next one begins.
    gap_from: Option<(Instant, CpuMark)>,
    /// How much the windows slowed the target.
    pace: Pace,
    /// What the first window cost, once it is recorded.
    first_cost: Option<Duration>,
    /// When to toggle next.
    pub next: Instant,
}

/// A probe's calls and bytes, for its rates, and its hits, for its cost:
/// its calls, a `--native` nested call twice, and its gated sites' passes
/// that went elsewhere (which count no call and cost a hit all the same).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    calls: u64,
    bytes: u64,
    hits: u64,
    /// Of the hits, those at single-stepped sites, where the probe counts
    /// them apart.
    stepped: u64,
}

/// The counts of `now` since `then`, probe by probe.
fn since(now: &[Tally], then: &[Tally]) -> Vec<Tally> {
    now.iter()
        .zip(then)
        .map(|(now, then)| Tally {
            calls: now.calls.saturating_sub(then.calls),
            bytes: now.bytes.saturating_sub(then.bytes),
            hits: now.hits.saturating_sub(then.hits),
            stepped: now.stepped.saturating_sub(then.stepped),
        })
        .collect()
}

impl DutyCycle {
    /// The duty cycle of `session`, whose probes went live at `attach`
    /// (when the attach began, and when it completed; and the traced
    /// processes' clocks before it began, read by `cpu`) for a first
    /// window of [`FIRST_WINDOW`];
    /// `costs` are a hit's, in the CPU time of the thread hit, and `cpu`
    /// reads the target's.
    pub fn new(
        (session, readout): (&mut Session, &mut Readout),
        budget: f64,
        costs: HitCosts,
        (scope, multi): (u32, bool),
        attach: (Instant, Instant, CpuMark),
        mut cpu: TargetCpu,
    ) -> Result<Self, AttachError> {
        let (mut live, mut ever) = (Vec::new(), BTreeSet::new());
        let at_window_start = counts(session, readout, (&mut live, &mut ever))?;
        // The first window counts from here, as every later one does from
        // its base (see toggle).
        let window_began = Instant::now();
        let used = cpu.read(&live);
        let cpu_live_began = CpuMark::read(&cpu.covered(&live));
        Ok(Self {
            controller: Controller::new(budget, BUDGET_WINDOW, used),
            costs,
            scope,
            multi,
            estimator: Estimator::new(session.plan().probes.len()),
            attached: Some(window_began),
            at_window_start,
            // The counts began at zero before the first attach.
            at_cost_start: vec![Tally::default(); session.plan().probes.len()],
            cost_began: attach.0,
            cost_mark: attach.2,
            // No process had a hit before the first attach.
            cost_ever: BTreeSet::new(),
            scale: 1.0,
            attach_cost: Duration::ZERO,
            followed: false,
            breakpoints: session.breakpoints(),
            switching: attach.1 - attach.0,
            cpu,
            live,
            ever,
            began: (attach.1, used),
            cpu_used: used,
            next: attach.1 + FIRST_WINDOW,
            cpu_live_began,
            gap_from: None,
            pace: Pace::default(),
            first_cost: None,
        })
    }

    /// Sets the share of the target's CPU time the windows may cost it
    /// (the profile's rates get what its other sources leave).
    pub fn set_budget(&mut self, budget: f64) {
        self.controller.budget = budget;
    }

    /// The estimated time the windows' hits cost the target so far.
    #[must_use]
    pub fn overhead(&self) -> Duration {
        self.estimator.overhead()
    }

    /// Of [`Self::overhead`], what the first window cost, once recorded:
    /// the attach's, which ran before the target had paid for anything.
    #[must_use]
    pub const fn first_window_cost(&self) -> Option<Duration> {
        self.first_cost
    }

    /// The traced processes' CPU time since the duty cycle began, read
    /// now.
    pub fn target_cpu(&mut self) -> Duration {
        self.observe_cpu();
        self.cpu_used.saturating_sub(self.began.1)
    }

    /// Reads the target's CPU time, and gives the controller its credit.
    fn observe_cpu(&mut self) {
        self.cpu_used = self.cpu.read(&self.live);
        let elapsed = self.began.0.elapsed();
        self.controller.observe(self.cpu_used, elapsed);
    }

    /// Ends the window if attached, else starts one once the target has
    /// paid for it.
    pub fn toggle(&mut self, session: &mut Session, readout: &mut Readout) -> Result<(), AttachError> {
        let Some(live) = self.attached else {
            self.observe_cpu();
            if !self.controller.covers(false) {
                self.next = Instant::now() + self.controller.wait();
                return Ok(());
            }
            if self.multi {
                // The links go live within the attach; the window starts
                // once they are and its base is read. Its cost counts from
                // before: the links go live one site after another, and
                // with thousands of sites (an LTO build's inlined copies)
                // that takes as long as a window.
                self.at_cost_start = counts(session, readout, (&mut self.live, &mut self.ever))?;
                self.cost_began = Instant::now();
                let mark = self.mark();
                self.end_gap(&mark);
                self.cost_mark = mark;
                self.cost_ever.clone_from(&self.ever);
                session.attach_multi(self.scope)?;
                self.at_window_start = counts(session, readout, (&mut self.live, &mut self.ever))?;
                let live = Instant::now();
                self.cpu_live_began = self.mark();
                self.switching += live - self.cost_began;
                self.attached = Some(live);
                self.next = live + POLL.min(self.controller.window);
            } else {
                // Counts do not move while detached: this is the cost's
                // base. The window's starts once every probe is live, as
                // with the links above: a probe goes live late in its
                // attach (its program is set on its event last), and
                // counting half the attach as live put a
                // loaded machine's rates 5% low.
                self.at_cost_start = counts(session, readout, (&mut self.live, &mut self.ever))?;
                let began = Instant::now();
                self.cost_began = began;
                let mark = self.mark();
                self.end_gap(&mark);
                self.cost_mark = mark;
                self.cost_ever.clone_from(&self.ever);
                session.attach_perf(self.scope)?;
                self.at_window_start = counts(session, readout, (&mut self.live, &mut self.ever))?;
                let live = Instant::now();
                self.cpu_live_began = self.mark();
                self.switching += live - began;
                self.attached = Some(live);
                self.next = live + POLL.min(self.controller.window);
            }
            self.attach_cost = self.cost_of(session, &since(&self.at_window_start, &self.at_cost_start));
            self.followed = false;
            return Ok(());
        };
        let counts_now = counts(session, readout, (&mut self.live, &mut self.ever))?;
        let now = Instant::now();
        self.observe_cpu();
        let window = self.window_counts(&counts_now);
        let traced = now - live;
        let live_cost = self.cost_of(session, &window);
        // Its attach's writes, less what the last ceiling took off, as the
        // hits are (see cost_of).
        let spent =
            self.cost_of(session, &since(&counts_now, &self.at_cost_start)) + self.writes(false).mul_f64(self.scale);
        let length = self.controller.window;
        if traced < length {
            // Looked at before its end (see POLL): it goes on while the
            // credit covers it at its pace so far, and its detach.
            let per_s = if traced.is_zero() { 0.0 } else { live_cost.as_secs_f64() / traced.as_secs_f64() };
            let step = POLL.min(length.saturating_sub(traced));
            if self.controller.goes_on(spent, per_s, step) {
                self.next = now + step;
                return Ok(());
            }
        }
        if traced >= length && self.controller.follows(traced, live_cost, spent) {
            // Paid for, and the next too: it follows at once, without the
            // cost of detaching and attaching again.
            let writes = self.writes(false);
            self.record(
                session,
                (&window, &since(&counts_now, &self.at_cost_start)),
                (&vec![traced; window.len()], traced),
                writes,
            );
            self.controller.spend(traced, live_cost, spent.saturating_sub(live_cost), None);
            self.at_window_start.clone_from(&counts_now);
            self.at_cost_start = counts_now;
            self.cost_began = now;
            let mark = self.mark();
            self.pace_window(session, traced, &window, &mark);
            self.cost_mark = mark.clone();
            self.cost_ever.clone_from(&self.ever);
            self.cpu_live_began = mark;
            self.attached = Some(now);
            self.followed = true;
            self.next = now + POLL.min(self.controller.window);
            return Ok(());
        }
        self.close(session, readout)?;
        self.observe_cpu();
        self.next = Instant::now() + self.controller.wait();
        Ok(())
    }

    /// Detaches and records the window, and spends its cost from the
    /// credit.
    pub fn close(&mut self, session: &mut Session, readout: &mut Readout) -> Result<(), AttachError> {
        let Some(live) = self.attached.take() else { return Ok(()) };
        if self.multi {
            // The window ends here: hits while the links remove their
            // breakpoints (a moment) count in the totals but not here.
            let now = counts(session, readout, (&mut self.live, &mut self.ever))?;
            let window = self.window_counts(&now);
            let ended = Instant::now();
            let cpu_ended = self.mark();
            session.detach_multi(self.scope);
            // Every hit until the last link came down is priced, over the
            // whole span from before the attach.
            let priced = since(&counts(session, readout, (&mut self.live, &mut self.ever))?, &self.at_cost_start);
            let detached = Instant::now();
            self.switching += detached - ended;
            let traced = ended - live;
            self.pace_window(session, traced, &window, &cpu_ended);
            self.gap_from = Some((detached, self.mark()));
            let writes = self.writes(true);
            let overhead = self.record(session, (&window, &priced), (&vec![traced; window.len()], traced), writes);
            self.spend_closed(traced, self.cost_of(session, &window), overhead);
            return Ok(());
        }
        // Each detach holds the next one back (see Session::detach_in_order),
        // so the probes that cost most go first.
        let now = counts(session, readout, (&mut self.live, &mut self.ever))?;
        let so_far = self.window_counts(&now);
        let mut order: Vec<usize> = (0..so_far.len()).collect();
        order.sort_by(|&a, &b| self.probe_cost(session, &so_far, b).total_cmp(&self.probe_cost(session, &so_far, a)));
        let detaching = Instant::now();
        // The pace is of the span every probe was live, as with the links
        // above: the probes come down one after another (the costliest
        // first), each detach waiting out the last.
        let mark = self.mark();
        self.pace_window(session, detaching - live, &so_far, &mark);
        let detached = session.detach_in_order(self.scope, &order);
        let done = Instant::now();
        let cpu_done = self.mark();
        self.switching += done - detaching;
        let lives: Vec<Duration> =
            detached.iter().map(|at| at.map_or(Duration::ZERO, |at| at.saturating_duration_since(live))).collect();
        let traced = lives.iter().copied().max().unwrap_or_default();
        let counts_now = counts(session, readout, (&mut self.live, &mut self.ever))?;
        let window = self.window_counts(&counts_now);
        let priced = since(&counts_now, &self.at_cost_start);
        self.gap_from = Some((done, cpu_done));
        let writes = self.writes(true);
        let overhead = self.record(session, (&window, &priced), (&lives, traced), writes);
        self.spend_closed(traced, self.cost_of(session, &window), overhead);
        Ok(())
    }

    /// Spends a closed window's cost, `overhead` in all and `live_cost`
    /// while live for `traced`: what its attach and detach cost is what
    /// the next one's switching is expected to cost.
    fn spend_closed(&mut self, traced: Duration, live_cost: Duration, overhead: Duration) {
        // An attach costs its hits and its writes (less what the ceiling
        // took off, as record priced them); a window that followed others
        // paid for it with the first of them. The rest, beyond the live
        // part, is the detach's: its hits and its writes.
        let attach = self.attach_cost + self.write_pass().mul_f64(self.scale);
        let paid = if self.followed { Duration::ZERO } else { attach };
        let detach = overhead.saturating_sub(live_cost).saturating_sub(paid);
        self.controller.spend(traced, live_cost, overhead.saturating_sub(live_cost), Some((attach, detach)));
    }

    /// Adds the window live for `wall`, with `window`'s hits, to the pace,
    /// the traced processes' CPU time being `cpu_end` at its end.
    #[allow(clippy::cast_precision_loss, reason = "hit counts of one window")]
    fn pace_window(&mut self, session: &Session, wall: Duration, window: &[Tally], cpu_end: &CpuMark) {
        let Some(cpu) = cpu_end.since(&self.cpu_live_began) else { return };
        // Each hit at its probe's sites; a probe with sites of both kinds
        // as if every hit were at an emulated one (what it costs at least:
        // which site was hit is not counted).
        let placed: f64 = session
            .plan()
            .probes
            .iter()
            .filter_map(|p| {
                let tally = window.get(usize::try_from(p.slot).ok()?)?;
                let (_, low) =
                    priced_range(counting_sites(p), p.stepped_apart(), (tally.hits, tally.stepped), self.costs);
                Some(low)
            })
            .sum();
        let placed = Duration::from_secs_f64(placed.max(0.0) / 1e9);
        self.pace.add_window(wall, cpu, placed, self.priced(session, window));
    }

    /// Ends the gap since the last window at `now`, as the next one's cost
    /// begins.
    fn end_gap(&mut self, now: &CpuMark) {
        if let Some((at, then)) = self.gap_from.take()
            && let Some(cpu) = now.since(&then)
        {
            self.pace.add_gap(self.cost_began.saturating_duration_since(at), cpu);
        }
    }

    /// The traced processes' CPU time now, each by its exact clock:
    /// `--pid`'s, or with `--exe` those with entries and those running
    /// the image when tracing began.
    fn mark(&self) -> CpuMark {
        CpuMark::read(&self.cpu.covered(&self.live))
    }

    fn window_counts(&self, counts_now: &[Tally]) -> Vec<Tally> {
        since(counts_now, &self.at_window_start)
    }

    /// What the window's hits of the probe in `slot` cost the budget: each
    /// at what a hit costs where it sits, as the cost line prices it
    /// (single-stepped where it may be and is not counted apart).
    fn probe_cost(&self, session: &Session, window: &[Tally], slot: usize) -> f64 {
        // Until 2026-12-06 every hit at a probe with inlined copies was
        // priced as single-stepped, about 3.5 times its price on Debian
        // 3.11, against a cost of attaching and detaching that no hit
        // count shows (each of about 1,400 breakpoints written into the
        // target's code and out again). Measured apart, over whole windows
        // (attach, live, detach) the target's extra kernel time came to
        // 0.72-0.84 times its hits at this price over 16 spans of 30 s
        // (BENCHMARKS.md, "The windows' price against the target's kernel
        // time"). Priced so high, the attach's first window alone took a
        // 5 s demo to 3.7% of a 1% budget. The writes, which showed once
        // the windows came more often, are priced apart (BREAKPOINT_WRITE).
        let Some(p) = session.plan().probes.get(slot) else { return 0.0 };
        let tally = window.get(slot).copied().unwrap_or_default();
        priced_range(counting_sites(p), p.stepped_apart(), (tally.hits, tally.stepped), self.costs).0
    }

    /// What `window`'s hits cost, priced, less what the last ceiling took
    /// off (`scale`).
    fn cost_of(&self, session: &Session, window: &[Tally]) -> Duration {
        self.priced(session, window).mul_f64(self.scale)
    }

    /// What `window`'s hits cost, priced.
    fn priced(&self, session: &Session, window: &[Tally]) -> Duration {
        let ns: f64 = (0..window.len()).map(|slot| self.probe_cost(session, window, slot)).sum();
        Duration::from_secs_f64(ns / 1e9)
    }

    /// What the current window's breakpoint writes cost the target: its
    /// attach's, where it did not follow another, and (`detach`) its
    /// detach's.
    fn writes(&self, detach: bool) -> Duration {
        self.write_pass() * (u32::from(!self.followed) + u32::from(detach))
    }

    /// What one attach's (or one detach's) breakpoint writes cost the
    /// target, in each traced process (with `--exe`, each running the
    /// image, or that did when tracing began, gets every breakpoint).
    fn write_pass(&self) -> Duration {
        let processes = u32::try_from(self.cpu.covered(&self.live).len()).unwrap_or(u32::MAX).max(1);
        BREAKPOINT_WRITE * self.breakpoints.saturating_mul(processes)
    }

    /// Adds a window: `window`'s counts over `lives` (`traced` in all) for
    /// the rates, the cost of `priced` (every hit from before the attach
    /// to after the detach) and of its breakpoint `writes` for the budget.
    /// Returns that cost.
    fn record(
        &mut self,
        session: &Session,
        (window, priced): (&[Tally], &[Tally]),
        (lives, traced): (&[Duration], Duration),
        writes: Duration,
    ) -> Duration {
        // Priced high (see probe_cost), but the hits ran on the traced
        // processes' CPU time since the cost began: at most that (an LTO
        // build whose hot copies are emulated was priced at many times its
        // CPU time, with --pid and with --exe or --all alike: a window
        // priced at a whole second of a busy container's CPU time held
        // the next ones back until its workload had ended). Bounded too
        // where a process ended in the window (see CpuMark::spent_since):
        // unbounded, such a window was priced at 3 s and held the next
        // ones back for 20.
        let now = self.mark();
        let unseen = self
            .ever
            .iter()
            .filter(|&&pid| !self.cost_ever.contains(&pid) && !now.has(pid) && !self.cost_mark.has(pid))
            .count();
        let ceiling = now.spent_since(&self.cost_mark, unseen);
        let priced_cost = self.priced(session, priced) + writes;
        let overhead = ceiling.map_or(priced_cost, |c| priced_cost.min(c));
        self.scale = if priced_cost.is_zero() { 1.0 } else { overhead.as_secs_f64() / priced_cost.as_secs_f64() };
        let probes: Vec<ProbeWindow> =
            window.iter().zip(lives).map(|(c, &live)| ProbeWindow { live, calls: c.calls, bytes: c.bytes }).collect();
        self.estimator.add(&probes, traced, overhead);
        self.first_cost.get_or_insert(overhead);
        overhead
    }

    /// Marks `snapshot` as estimated: what the windows traced and each
    /// probe's estimated rates.
    pub fn fill(&mut self, plan: &Plan, snapshot: &mut Snapshot) {
        let elapsed = snapshot.elapsed();
        let ratio = |part: Duration| {
            if elapsed.is_zero() { 0.0 } else { (part.as_secs_f64() / elapsed.as_secs_f64()).min(1.0) }
        };
        self.observe_cpu();
        // The windows ran on the target's CPU time: it is at least what
        // they cost, where /proc's clock ticks show less.
        let cpu = self.cpu_used.saturating_sub(self.began.1).max(self.estimator.overhead());
        let of_cpu = if cpu.is_zero() { 0.0 } else { self.estimator.overhead().as_secs_f64() / cpu.as_secs_f64() };
        snapshot.budget = Some(model::Budget {
            estimates: true,
            percent: self.controller.budget * 100.0,
            windows: self.estimator.windows(),
            traced_s: self.estimator.traced().as_secs_f64(),
            traced_fraction: ratio(self.estimator.traced()),
            estimated_overhead_fraction: of_cpu,
            hit_cost_ns: self.costs,
            switching_s: self.switching.as_secs_f64(),
            target_cpu_s: Some(cpu.as_secs_f64()),
            slowdown: self.pace.factor().map(|f| model::Slowdown {
                at_least: f.low,
                likely: f.likely,
                at_most: f.high,
            }),
        });
        let factor = self.pace.factor();
        let rates = self.estimator.rates();
        // Every moment a probe was attached: live, and going live or
        // coming down.
        let attached = (self.estimator.traced() + self.switching).as_secs_f64();
        #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let over_attached = |n: u64| if attached > 0.0 { n as f64 / attached } else { 0.0 };
        for p in &plan.probes {
            let rate = usize::try_from(p.slot).ok().and_then(|s| rates.get(s));
            let (Some(&(calls, bytes)), Some(counts)) = (rate, snapshot.probes.get_mut(p.symbol)) else { continue };
            let (mut calls_per_s, mut calls_per_s_ci95) = untraced(calls, factor);
            let (mut bytes_per_s, mut bytes_per_s_ci95) = untraced(bytes, factor);
            // Calls counted, none while a window was live (a short one, or
            // a target between bursts): a rate of 0 would hide them. Over
            // every moment it was attached, the rate was at least this,
            // and nothing bounds it from above (the live windows' bound
            // does not: these calls fell outside them).
            let unseen_live = calls.per_s == 0.0 && counts.calls > 0;
            if unseen_live {
                calls_per_s = over_attached(counts.calls);
                bytes_per_s = bytes_per_s.max(over_attached(counts.bytes));
                calls_per_s_ci95 = Some([calls_per_s, f64::INFINITY]);
                bytes_per_s_ci95 = Some([bytes_per_s, f64::INFINITY]);
            }
            // No call seen and nothing to bound its rate by (one window, or
            // none live; or a bound the slowdown took past knowing): no
            // figure, rather than a zero the target's calls between the
            // windows would belie, in the JSON as every output shows it.
            let unbounded_zero = !model::rate_told(calls_per_s, calls_per_s_ci95);
            if (calls.per_s == 0.0 && calls.ci95.is_none() && !unseen_live) || unbounded_zero {
                counts.estimate = None;
                continue;
            }
            counts.estimate = Some(ProbeEstimate {
                calls_per_s,
                calls_per_s_ci95,
                bytes_per_s,
                bytes_per_s_ci95,
                lower_bound: unseen_live || factor.is_some_and(|f| f.high.is_none()),
            });
        }
    }
}

/// A rate while traced taken to the target's untraced, by `factor`, with
/// an interval from the low end of the rate's by the low factor to the
/// high end's by the high (infinite, `null` in the JSON, where the factor
/// has none). The figure is the likely factor's (else the low end's)
/// only where even the low end says the windows slowed the target: where
/// it is 1, a target that kept up with its load (whose factor is 1) cannot
/// be told from one slowed a little, and a paced loop's rate came out 8%
/// high by the likely factor.
fn untraced(rate: RateEstimate, factor: Option<Factor>) -> (f64, Option<[f64; 2]>) {
    let Some(f) = factor else { return (rate.per_s, rate.ci95.map(|(lo, hi)| [lo, hi])) };
    let high = f.high.unwrap_or(f64::INFINITY);
    let ci = rate.ci95.map(|(lo, hi)| [lo * f.low, if hi > 0.0 { hi * high } else { 0.0 }]);
    let by = if f.low > 1.0 { f.likely.unwrap_or(f.low) } else { 1.0 };
    (rate.per_s * by, ci)
}

/// Each probe's calls, bytes and hits so far, and the processes with entries
/// (into `live`) and every one with a hit so far, those that exited too
/// (into `ever`).
fn counts(
    session: &mut Session,
    readout: &mut Readout,
    (live, ever): (&mut Vec<u32>, &mut BTreeSet<u32>),
) -> Result<Vec<Tally>, AttachError> {
    let totals = readout.read(session)?;
    live.clone_from(&totals.live);
    ever.extend(totals.per_process.keys());
    Ok(totals
        .probes
        .iter()
        .map(|c| Tally { calls: c.calls, bytes: c.bytes, hits: c.priced_calls(), stepped: c.stepped })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_move_by_the_likely_factor_only_where_the_low_end_is_above_one() {
        let rate = RateEstimate { per_s: 100.0, ci95: Some((90.0, 110.0)) };
        let slowed = Factor { low: 2.0, likely: Some(3.0), high: Some(5.0) };
        assert_eq!(untraced(rate, Some(slowed)), (300.0, Some([180.0, 550.0])));
        let unknown_top = Factor { high: None, ..slowed };
        assert_eq!(untraced(rate, Some(unknown_top)), (300.0, Some([180.0, f64::INFINITY])));
        let unknown_likely = Factor { likely: None, high: None, ..slowed };
        assert!((untraced(rate, Some(unknown_likely)).0 - 200.0).abs() < 1e-9);
        let maybe_not = Factor { low: 1.0, likely: Some(1.1), high: Some(1.4) };
        assert_eq!(untraced(rate, Some(maybe_not)), (100.0, Some([90.0, 154.0])));
        assert_eq!(untraced(rate, None), (100.0, Some([90.0, 110.0])));
    }
}
