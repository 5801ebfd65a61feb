//! The production profile in the run loop: its sources each interval, what
//! each cost (the budget's ledger, [`super::share`]), the share the rates'
//! duty cycle gets of what is left, and the estimated cost the header
//! states, for both modes, from the first window.
//!
//! Sources in this version: the rates by duty cycle ([`super::duty`]), GC
//! from memory ([`super::gcmem`]) with the GC probes' durations, the heap
//! census ([`super::census`]) with `--pid`, and growth sampling's probes
//! (`--growth`, or by default with `--pid`: [`super::growth`], read by the
//! run loop first, which stops the default's once they cost more than half
//! the budget in an interval), whose cost the rates give way to.
//!
//! Every cost is a share of the target's CPU time, as the budget is.

use std::time::{Duration, Instant};

use super::{
    budget::HEADROOM,
    census::CensusSource,
    cost::{CostMeter, Prices},
    duty::DutyCycle,
    gcmem::GcMemory,
    readout::{Readout, Totals},
    share::{self, BudgetLedger},
};
use crate::{
    config::{AttachConfig, Mode},
    kernel::{AttachError, Session},
    model::{Cost, CostEstimate, Level, Note, NoteCode, Snapshot},
    plan::gc::{GcMode, GcPlan, GcSource},
};

/// How long exact tracing's first window lasts, from which the header's
/// estimate comes; the profile's is its duty cycle's first window.
pub const FIRST_WINDOW: Duration = Duration::from_millis(100);

/// The target's CPU time the profile's costs are shares of: the duty
/// cycle's exact clocks (with `--exe`, of every process running the image
/// from the start, not only those whose hits were read), else the hits'
/// ledger's.
pub fn target_cpu(duty: Option<&mut DutyCycle>, cost: &CostMeter) -> Duration {
    duty.map_or_else(|| cost.target_cpu(), DutyCycle::target_cpu)
}

/// The profile's state across intervals.
pub struct Profile {
    ledger: BudgetLedger,
    gc: Option<GcMemory>,
    /// The process whose interpreter was not initialised when the probes
    /// went live (`tracer run`'s): its statistics are looked for again
    /// each interval.
    gc_waiting: Option<u32>,
    census: Option<CensusSource>,
    /// What one collection's GC probe hits cost the target, in ns.
    gc_collection_ns: f64,
    /// The collections the GC probes had seen at the last interval.
    gc_collections: u64,
    /// The rates' cost (all windows', and the first's), and the
    /// statistics' bytes read and CPU time, at the last interval.
    rates_overhead: (Duration, Duration),
    gc_read: (u64, Duration),
    /// Growth's cost reported so far: target time, tracer time, bytes.
    growth_reported: (Duration, Duration, u64),
    last: Instant,
    /// When the probes went live.
    started: Instant,
    /// The target's CPU time at the last interval.
    cpu: Duration,
    /// tracer's CPU time, and its census thread's, at the last interval.
    own: (Duration, Duration),
    notes: Vec<Note>,
}

impl Profile {
    /// The profile of `config`'s run (its budget a share of the target's
    /// CPU time), reading `pid`'s GC statistics and heap (not with
    /// `--exe`, said in the notes returned), its GC probes planned as
    /// `gc_plan` and priced at `prices`.
    #[must_use]
    pub fn new(
        config: &AttachConfig,
        budget: f64,
        pid: Option<u32>,
        gc_plan: &GcPlan,
        prices: Option<Prices>,
    ) -> (Self, Vec<Note>) {
        let mut notes = Vec::new();
        let census = pid.and_then(|pid| {
            CensusSource::start(pid, config.debug_dir.clone(), config.interval, budget).map_err(|n| notes.push(n)).ok()
        });
        let mut gc_waiting = None;
        let gc = match pid {
            None => {
                // The GC header line above says why where there are no GC
                // probes (no markers in this build, or --gc off).
                let collections = if gc_plan.source == GcSource::None {
                    "no collection is seen (no GC probes: see the gc line)"
                } else {
                    "collections come from the GC probes (as with --exact)"
                };
                notes.push(Note::new(
                    Level::Note,
                    NoteCode::Gc,
                    format!("with --exe, the profile reads no process's memory: {collections}, the rates from every process's windows, and there is no heap census; pass --pid for GC from memory and the heap by type"),
                ));
                None
            }
            Some(pid) => match GcMemory::open(pid) {
                Ok(gc) => Some(gc),
                Err(e) if GcMemory::not_initialised(&e) => {
                    gc_waiting = Some(pid);
                    None
                }
                Err(e) => {
                    notes.push(gc_unread(&e));
                    None
                }
            },
        };
        let profile = Self {
            ledger: BudgetLedger::new(budget),
            gc,
            gc_waiting,
            census,
            gc_collection_ns: prices.map_or(0.0, |p| collection_ns(gc_plan, p)),
            gc_collections: 0,
            rates_overhead: (Duration::ZERO, Duration::ZERO),
            gc_read: (0, Duration::ZERO),
            growth_reported: (Duration::ZERO, Duration::ZERO, 0),
            last: Instant::now(),
            started: Instant::now(),
            cpu: Duration::ZERO,
            own: (Duration::ZERO, Duration::ZERO),
            notes: Vec::new(),
        };
        (profile, notes)
    }

    /// The profile of a run whose probes went live at `started`, when the
    /// target had used `cpu` (as [`target_cpu`] counts it): the first
    /// census starts now.
    #[must_use]
    pub fn started(mut self, started: Instant, cpu: Duration) -> Self {
        (self.last, self.started) = (started, started);
        self.cpu = cpu;
        if let Some(c) = self.census.as_mut() {
            c.started(started);
        }
        if let Some(gc) = self.gc.as_mut() {
            gc.set_started(started);
        }
        self.own = self.own_cpu();
        self
    }

    /// One interval, when the target had used `cpu` in all: reads the
    /// sources, reports their costs to the ledger, puts the profile's
    /// figures in `snapshot` and gives the duty cycle what the others
    /// leave of the budget.
    pub fn interval(&mut self, snapshot: &mut Snapshot, duty: Option<&mut DutyCycle>, cpu: Duration) {
        let now = Instant::now();
        let (span, used) = (now - self.last, cpu.saturating_sub(self.cpu));
        self.sources(snapshot, duty.as_deref());
        snapshot.heap = self.census.as_mut().and_then(|c| c.interval(span, used));
        self.census_cost();
        self.growth(snapshot, false);
        self.loop_cost();
        snapshot.profile = Some(self.ledger.close_interval(span, used));
        (self.last, self.cpu) = (now, self.cpu.max(cpu));
        if let Some(duty) = duty {
            duty.set_budget(self.ledger.left_for_rates());
        }
    }

    /// The summary, when the target had used `cpu` in all: the sources
    /// read once more, the run's cost. The heap comes after the detach
    /// ([`Self::summary_heap`]).
    pub fn summary(&mut self, snapshot: &mut Snapshot, duty: Option<&DutyCycle>, cpu: Duration) {
        self.sources(snapshot, duty);
        self.growth(snapshot, true);
        self.loop_cost();
        let _ = self.ledger.close_interval(self.last.elapsed(), cpu.saturating_sub(self.cpu));
        (self.last, self.cpu) = (Instant::now(), self.cpu.max(cpu));
        snapshot.profile = Some(self.ledger.total());
    }

    /// Whether a census is still running, for the summary to wait for:
    /// one is started if the run has read none yet.
    pub fn census_pending(&mut self) -> bool {
        self.census.as_mut().is_some_and(|c| {
            c.ensure_one();
            c.pending()
        })
    }

    /// The summary's heap (the latest census against the run's first),
    /// and the run's cost with every census read.
    pub fn summary_heap(&mut self, snapshot: &mut Snapshot) {
        snapshot.heap = self.census.as_mut().and_then(CensusSource::summary);
        self.census_cost();
        let _ = self.ledger.close_interval(Duration::ZERO, Duration::ZERO);
        snapshot.profile = Some(self.ledger.total());
    }

    /// What the profile's sources have to say since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        let mut notes = std::mem::take(&mut self.notes);
        notes.extend(self.census.as_mut().map(CensusSource::take_notes).unwrap_or_default());
        notes
    }

    /// tracer's CPU time so far, and its census thread's.
    fn own_cpu(&self) -> (Duration, Duration) {
        (super::gcmem::process_cpu(), self.census.as_ref().map_or(Duration::ZERO, CensusSource::thread_cpu))
    }

    /// The run loop's CPU time since the last call, to the ledger: tracer's
    /// less the census thread's and what the other sources reported of
    /// theirs this interval.
    fn loop_cost(&mut self) {
        let (process, census) = self.own_cpu();
        let (process_before, census_before) = std::mem::replace(&mut self.own, (process, census));
        let sources = self.ledger.tracer_spent(share::GC_MEMORY) + self.ledger.tracer_spent(share::GROWTH);
        let own = process.saturating_sub(process_before).saturating_sub(census.saturating_sub(census_before));
        self.ledger.report(share::LOOP, Duration::ZERO, own.saturating_sub(sources), 0);
    }

    /// The censuses read since the last call, to the ledger: tracer's CPU
    /// time and bytes read, none of the target's.
    fn census_cost(&mut self) {
        if let Some(c) = self.census.as_mut() {
            let (cpu, bytes) = c.cost();
            self.ledger.report(share::CENSUS, Duration::ZERO, cpu, bytes);
        }
    }

    fn sources(&mut self, snapshot: &mut Snapshot, duty: Option<&DutyCycle>) {
        if let Some(duty) = duty {
            // The first window apart: it ran before the target had paid
            // for anything, and a short run shows it.
            let (overhead, first) = (duty.overhead(), duty.first_window_cost().unwrap_or_default());
            let first_new = first.saturating_sub(self.rates_overhead.1);
            let new = overhead.saturating_sub(self.rates_overhead.0);
            self.ledger.report(share::FIRST_WINDOW, first_new, Duration::ZERO, 0);
            self.ledger.report(share::RATES, new.saturating_sub(first_new), Duration::ZERO, 0);
            self.rates_overhead = (overhead, first);
        }
        // The GC probes' collections, each priced: they stay attached.
        let collections: u64 = snapshot
            .gc
            .iter()
            .filter(|g| g.source != GcSource::Memory)
            .flat_map(|g| &g.generations)
            .map(|g| g.collections)
            .sum();
        #[allow(clippy::cast_precision_loss, reason = "collections in an interval")]
        let probes_ns = collections.saturating_sub(self.gc_collections) as f64 * self.gc_collection_ns;
        self.gc_collections = collections;
        self.ledger.report(share::GC_PROBES, Duration::from_secs_f64(probes_ns / 1e9), Duration::ZERO, 0);
        if let Some(pid) = self.gc_waiting {
            match GcMemory::open_initialised_since(pid) {
                Ok(mut gc) => {
                    gc.set_started(self.started);
                    (self.gc, self.gc_waiting) = (Some(gc), None);
                }
                Err(e) if GcMemory::not_initialised(&e) => {}
                Err(e) => {
                    self.gc_waiting = None;
                    let ended =
                        crate::discover::process::Pidfd::open(pid).ok().is_none_or(|p| p.is_none_or(|p| p.exited()));
                    self.notes.push(if ended {
                        Note::new(
                            Level::Warning,
                            NoteCode::Gc,
                            format!("the collector's statistics were not read: PID {pid}'s interpreter was not initialised when the probes went live, and the process ended before the next interval (a shorter --interval reads it sooner); collections come from the GC probes, where there are any"),
                        )
                    } else {
                        gc_unread(&e)
                    });
                }
            }
        }
        if let Some(gc) = self.gc.as_mut() {
            // An error is the target's end, or memory that moved: the last
            // good reading stands, and `rejected` says so.
            let _ = gc.read();
            let (bytes, cpu) = (gc.bytes_read(), gc.cpu);
            let (bytes_before, cpu_before) = self.gc_read;
            self.ledger.report(share::GC_MEMORY, Duration::ZERO, cpu.saturating_sub(cpu_before), bytes - bytes_before);
            self.gc_read = (bytes, cpu);
            let report = gc.report(snapshot.gc.as_ref());
            // A reading that failed where the GC probes counted every
            // collection lost nothing: counted apart, as no loss.
            let (failed, covered) = gc.failed(snapshot.gc.as_ref());
            snapshot.stats.insert("gc_memory_rejected".to_owned(), gc.rejected);
            snapshot.stats.insert("gc_memory_failed".to_owned(), failed);
            snapshot.stats.insert(crate::model::GC_MEMORY_FAILED_COVERED.to_owned(), covered);
            snapshot.gc = Some(report);
        }
    }

    /// Growth's cost (in `snapshot`, read before): an
    /// interval's, or with `run` the run's, of which what was not reported
    /// yet is.
    fn growth(&mut self, snapshot: &Snapshot, run: bool) {
        let Some(cost) = snapshot.growth.as_ref().and_then(crate::model::Growth::cost) else { return };
        let spent = (
            Duration::from_secs_f64(cost.target_s.unwrap_or(0.0)),
            Duration::from_secs_f64(cost.tracer_cpu_s),
            cost.bytes_read,
        );
        let (target, tracer, bytes) = if run {
            let (t, c, b) = self.growth_reported;
            (spent.0.saturating_sub(t), spent.1.saturating_sub(c), spent.2.saturating_sub(b))
        } else {
            spent
        };
        self.ledger.report(share::GROWTH, target, tracer, bytes);
        let (t, c, b) = &mut self.growth_reported;
        (*t, *c, *b) = (*t + target, *c + tracer, *b + bytes);
    }
}

/// The GC probes of `config`'s run, planned as `plan`: in the profile,
/// only the markers time collections (two emulated `nop`s each) unless
/// `--gc function` asked for the function, whose uretprobe costs each
/// collection a trap; its counts come from memory anyway.
#[must_use]
pub fn gc_probes(config: &AttachConfig, plan: GcPlan) -> GcPlan {
    if config.mode != Mode::Profile || plan.source != GcSource::Function || config.gc == GcMode::Function {
        return plan;
    }
    GcPlan::none(
        "the production profile times collections by the gc__start and gc__done markers only, and this build has none; probing the collection function instead would cost each collection a uretprobe's trap: pass --gc function for that, or --exact",
    )
}

/// What one collection's GC probe hits cost: its start and its done, each
/// at the dearest of its sites (one fires per collection), with a
/// uretprobe's return where the done is one.
fn collection_ns(plan: &GcPlan, prices: Prices) -> f64 {
    use crate::plan::gc::GcRole;
    let role = |role: GcRole| {
        plan.points
            .iter()
            .filter(|p| p.role == role)
            .map(|p| {
                let ret = if p.ret { prices.uretprobe_return_ns.unwrap_or(prices.hit.single_stepped_ns) } else { 0.0 };
                prices.hit.of(p.emulated) + ret
            })
            .fold(0.0, f64::max)
    };
    role(GcRole::Start) + role(GcRole::Done)
}

/// The first window, from which the header's estimate comes: the duty
/// cycle's first (short: the target has paid for nothing yet), ended at
/// once, or exact tracing's first moments. The probes went live at
/// `started`, when `pid` had used `cpu_began` ns of CPU time.
pub fn first_window(
    config: &AttachConfig,
    pid: Option<u32>,
    (session, readout): (&mut Session, &mut Readout),
    duty: Option<&mut DutyCycle>,
    cost: &mut CostMeter,
    (started, cpu_began): (Instant, Option<u64>),
) -> Result<CostEstimate, AttachError> {
    cost.wait_calibrated(super::cost::HEADER_WAIT);
    let window = if duty.is_some() { super::duty::FIRST_WINDOW } else { FIRST_WINDOW };
    std::thread::sleep(window.saturating_sub(started.elapsed()));
    let first = readout.read(session)?;
    let span = started.elapsed();
    // Exactly: too short for /proc/PID/stat's clock ticks.
    let cpu = cpu_began
        .zip(pid.and_then(super::cost::process_cpu_ns))
        .map(|(a, b)| Duration::from_nanos(b.saturating_sub(a)));
    if let Some(d) = duty {
        // Every moment more is the target's.
        d.toggle(session, readout)?;
    }
    Ok(estimate(config, cost, &first, (span, cpu)))
}

/// The header's estimate, from the first window: `totals` read `window`
/// after the probes went live, in which the target used `cpu`, priced by
/// `meter`. Exact tracing costs what
/// the window's rate of hits costs; the profile holds that to its budget.
#[must_use]
pub fn estimate(
    config: &AttachConfig,
    meter: &CostMeter,
    totals: &Totals,
    (window, cpu): (Duration, Option<Duration>),
) -> CostEstimate {
    // Priced as the ledger prices them: every hit of the window.
    let calls: Vec<u64> = totals.probes.iter().map(crate::kernel::maps::ProbeReading::priced_calls).collect();
    let returns: Vec<u64> = totals.probes.iter().map(|p| p.returned.returns).collect();
    let hits = calls.iter().chain(&returns).sum();
    let window_s = window.as_secs_f64();
    // A share of the target's CPU time over the window, which is at least
    // what the hits cost (they ran on it); without it (`--exe`, whose
    // processes are not known before their first hit), of the window's.
    // The hits counted may have come a little before the window (during
    // the attach, or of the probes that went live first) while the target
    // then slept through it: its clock then shows less than they cost.
    let stepped: Vec<u64> = totals.probes.iter().map(|p| p.stepped).collect();
    let high_ns = meter.price_hits(&calls, &returns, &stepped).map(|(high, _)| high).filter(|_| hits > 0);
    let over = cpu.map(|c| c.as_secs_f64().max(high_ns.unwrap_or(0.0) / 1e9));
    let of = |ns: f64| {
        let over = over.unwrap_or(window_s);
        if over > 0.0 { ns / 1e9 / over } else { 0.0 }
    };
    // No hit in the window says nothing of the cost (the target was idle
    // then, or between bursts): not a cost of 0.
    let exact = high_ns.map(of);
    let budget = config.budget;
    // With a budget (always in the profile) the windows aim at HEADROOM of
    // it, and a quiet target costs less than that traced in full.
    let fraction = exact.map(|full| budget.map_or(full, |b| full.min(b * HEADROOM)));
    let reason = match (exact, hits) {
        (Some(_), _) => None,
        (None, 0) => Some(format!(
            "no probe hit in the first {:.1} ms (the target ran no traced code then): the intervals give the cost",
            window_s * 1e3
        )),
        (None, _) => Some(
            "the cost of a probe hit is still being measured (the intervals give the cost once it is) or could not be (see the warning)"
                .to_owned(),
        ),
    };
    CostEstimate {
        fraction,
        exact_fraction: exact,
        budget_fraction: budget,
        window_s,
        cpu_s: over,
        hits,
        reason,
        warning: fraction.filter(|f| *f > Cost::HIGH).map(|f| warning(f, config)),
    }
}

/// What the header says of a cost above [`Cost::HIGH`].
fn warning(fraction: f64, config: &AttachConfig) -> String {
    let slowdown = if fraction <= 0.9 {
        format!("a CPU-bound target runs about {:.1}× slower", 1.0 / (1.0 - fraction))
    } else {
        "a CPU-bound target runs over 10× slower".to_owned()
    };
    let fix = match config.mode {
        Mode::Exact { because: None } => {
            "drop --exact for the production profile, which holds its cost within --budget"
        }
        Mode::Exact { because: Some(_) } => {
            "the production profile (without exact-only flags) holds its cost within --budget"
        }
        Mode::Profile => "a lower --budget lowers it",
    };
    format!("ABOVE {:.0}%: {slowdown}; {fix}", Cost::HIGH * 100.0)
}

/// Why the collector's statistics are not read from memory.
fn gc_unread(e: &super::gcmem::GcMemoryError) -> Note {
    Note::new(
        Level::Warning,
        NoteCode::Gc,
        format!(
            "cannot read the collector's statistics from memory ({e}); collections come from the GC probes, where there are any"
        ),
    )
}
