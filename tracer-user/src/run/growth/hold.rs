//! The profile's hold on its default growth's cost (not `--growth`'s,
//! which keeps sampling whatever it costs): priced after a short trial and
//! each interval against half the budget; where over, pymalloc's probes
//! come down first, and the C library's programs after them if they alone
//! are too dear.

use std::time::{Duration, Instant};

use super::{Growth, Stopped};
use crate::{
    kernel::Session,
    model::{GrowthStopped, Level, Note, NoteCode, Snapshot},
    run::cost::Prices,
};

/// The profile's rule for its default growth (not `--growth`, which keeps
/// sampling whatever it costs): an interval in which growth cost the
/// target more than half the budget (the ledger's `growth` source, in
/// `snapshot`'s profile) stops it. Its probes come down, apart from the
/// GC's; its samples stay reported as they were at the stop; and its
/// report, this interval's and every later one, says when and why, as the
/// note returned does.
pub fn hold_budget(
    growth: &mut Option<Result<Growth, String>>,
    session: &mut Session,
    snapshot: &mut Snapshot,
) -> Option<Note> {
    let Some(Ok(g)) = growth.as_mut() else { return None };
    if !g.auto || g.stopped.as_ref().is_some_and(|s| !s.libc) {
        return None;
    }
    let profile = snapshot.profile.as_ref()?;
    let fraction = profile.sources.get(crate::run::share::GROWTH)?.fraction;
    let budget = profile.budget_percent;
    if fraction * 100.0 <= budget / 2.0 {
        return None;
    }
    let report = match snapshot.growth.as_mut()? {
        crate::model::Growth::Sampled(r) => r,
        crate::model::Growth::Unavailable { .. } => return None,
    };
    if g.stopped.is_some() {
        // The C library's part alone, over a whole interval without the
        // pools' hits: too dear as well.
        if report.cost.is_some_and(|c| c.hits > 0) {
            return None;
        }
        return Some(g.stop_libc(session, (fraction, budget), snapshot.elapsed_s));
    }
    let takes = report.cost.map_or(0, |c| c.hits).saturating_sub(report.takes.new_arenas);
    let (note, why) = g.stop(session, (fraction, budget), (takes, profile.span_s), snapshot.elapsed_s);
    report.stopped = Some(why);
    Some(note)
}

/// How long the profile's default growth runs before it is first priced:
/// where its pool takes come at tens of thousands a second (pymalloc
/// freeing and mapping arenas each loop), a whole interval of them cost
/// the target 1 to 13% of its CPU time here.
pub const TRIAL: Duration = Duration::from_millis(50);

/// The fewest pool takes in the [`TRIAL`] it judges: under 2,000 a second,
/// whose first interval costs the target well under 1% (about 3 µs a take
/// here, a sampled take's walk shared), fewer takes price one stack walk
/// over a few milliseconds of the target's CPU time, which a loaded
/// machine doubles (a steady target's 10 takes read 0.80% against 0.5%).
/// The interval's own judgement ([`hold_budget`]) covers those.
pub const TRIAL_TAKES: u64 = 100;

/// The same where only the carves are probed: 1,000 in the trial is
/// 20,000 a second, pymalloc freeing and mapping arenas in a loop, the
/// churn the trial is for. Fewer are priced by the interval: a trial of a
/// few hundred carves prices their first stack walks, dearer than the
/// later ones (each stack new to the map), at four times an interval's
/// cost on the same target (pyenv 3.11, 1,330 carves a second: 1.20% in
/// the trial, 0.20-0.35% in each interval).
pub const TRIAL_CARVES: u64 = 1_000;

/// The profile's default growth after its [`TRIAL`]: stopped, with the
/// note returned, where pymalloc's hits so far, [`TRIAL_TAKES`] or more
/// ([`TRIAL_CARVES`] where only the carves are probed),
/// cost more than half of `budget` (a share) of the target's CPU time
/// meanwhile.
pub fn trial(
    growth: &mut Option<Result<Growth, String>>,
    session: &mut Session,
    prices: Option<Prices>,
    budget: f64,
) -> Option<Note> {
    let Some(Ok(g)) = growth.as_mut() else { return None };
    if !g.auto || g.stopped.is_some() {
        return None;
    }
    // Exactly: the trial is too short for /proc/PID/stat's clock ticks.
    let now = crate::run::cost::process_cpu_ns(g.pid)?;
    let cpu = Duration::from_nanos(now.saturating_sub(g.cpu_at_attach?));
    let span = g.started.elapsed();
    // Priced over less than the trial (woken early): not yet.
    if span < TRIAL {
        return None;
    }
    let counts = session.growth_counts().ok()?;
    let takes = counts.takes.saturating_add(counts.carve_hits);
    if takes < if g.plan.carves() { TRIAL_CARVES } else { TRIAL_TAKES } {
        return None;
    }
    // pymalloc's probes alone: they are what the trial is for, and what
    // it stops. The C library's programs (a list's first reallocations
    // cost the trial a walk each) are judged over whole intervals.
    let target = g.pools_ns(&counts, prices?) / 1e9;
    // The hits ran on the target's CPU: at least what they cost.
    let fraction = target / cpu.as_secs_f64().max(target).max(f64::MIN_POSITIVE);
    if fraction <= budget / 2.0 {
        return None;
    }
    let (note, _) = g.stop(session, (fraction, budget * 100.0), (takes, span.as_secs_f64()), span.as_secs_f64());
    Some(note)
}

impl Growth {
    /// Stops the profile's default growth at `at_s` because it cost
    /// `fraction` of the target's CPU time against a budget of
    /// `budget_percent`, from `takes` pool takes in `span_s`: its probes
    /// detached, the sites and stacks kept as they are now. The note to
    /// give, and why, for the report.
    fn stop(
        &mut self,
        session: &mut Session,
        (fraction, budget_percent): (f64, f64),
        (takes, span_s): (u64, f64),
        at_s: f64,
    ) -> (Note, GrowthStopped) {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a rate shown"
        )]
        let per_s = if span_s > 0.0 { (takes as f64 / span_s).round() as u64 } else { 0 };
        let reason = format!(
            "growth sampling cost {:.2}% of the target's CPU time ({} pool {}/s), over half the {budget_percent}% budget: stopped at {at_s:.2} s; --growth keeps it on",
            fraction * 100.0,
            crate::report::group(per_s),
            if self.plan.carves() { "carves" } else { "takes" },
        );
        // pymalloc's probes come down; the C library's programs, which
        // cost no trap, stay where they are attached.
        let libc = self.mapped.unavailable.is_none();
        // Where the flag cannot be set, the C library's programs would
        // take each new arena for the C library's: they come down too.
        let libc = libc && session.detach_growth_pools().is_ok();
        if !libc {
            session.detach_growth();
        }
        let reason = if libc {
            format!("{reason}; the C library's heap is still sampled (its syscalls' tracepoints cost no trap)")
        } else {
            reason
        };
        let why = GrowthStopped { at_s, reason: reason.clone() };
        // The pools' samples as they are now: every later report holds
        // them as of the stop.
        let pools = self.last.by_stack.iter().filter(|(_, h)| h.pools > 0).map(|(s, h)| (*s, h.pools)).collect();
        let (sites, stacks) = self.name_sites(session);
        self.stopped = Some(Stopped { at: Instant::now(), why: why.clone(), sites, stacks, pools, libc });
        let note = Note::new(
            Level::Note,
            NoteCode::Growth,
            format!("{reason}; the pools' samples taken stay reported, as of the stop"),
        );
        (note, why)
    }

    /// Stops the C library's part too, after the pools' stop, because it
    /// alone cost `fraction` of the target's CPU time: everything as of
    /// now, and the note to give.
    fn stop_libc(&mut self, session: &mut Session, (fraction, budget_percent): (f64, f64), at_s: f64) -> Note {
        session.detach_mapped();
        let (sites, stacks) = self.name_sites(session);
        let reason = format!(
            "the C library's heap sampling cost {:.2}% of the target's CPU time, over half the {budget_percent}% budget: stopped at {at_s:.2} s too",
            fraction * 100.0
        );
        if let Some(s) = self.stopped.as_mut() {
            (s.sites, s.stacks, s.libc) = (sites, stacks, false);
            s.why.reason = format!("{}; {reason}", s.why.reason);
        }
        Note::new(Level::Note, NoteCode::Growth, format!("{reason}; its samples stay reported, as of the stop"))
    }
}
