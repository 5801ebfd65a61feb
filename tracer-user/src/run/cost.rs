//! What tracing costs the target, estimated while it runs: every interval
//! and the summary carry a [`Cost`], and a note warns once the cost passes
//! [`Cost::HIGH`].
//!
//! A uprobe hit runs in the thread that hit it, so its cost is CPU time the
//! target is charged for. The estimate is each probe's hits times the
//! calibrated cost of a hit where its uprobes sit (emulated or
//! single-stepped, see [`calibrate`]), against the CPU time
//! (`utime + stime` in `/proc/PID/stat`) the traced processes used over the
//! same span. The cost of a hit is calibrated on a thread after the probes
//! are live, so that tracing starts at once; until it is known, the
//! reports carry no cost at all rather than a wrong one.
//!
//! The hits of a process are paired with its CPU time read at the same
//! moment. A process that exits between two reads is gone from `/proc` by
//! the next (its parent reaps it), so with `--exe` tracer also listens for
//! the kernel's exit records ([`super::exits`]): a process started after
//! tracer began listening has its final CPU time from them, paired with
//! its hits read after its end. What cannot be paired is left out of both
//! sides and counted as unpriced: the hits of a process after tracer last
//! read its CPU time when it has no exit record to go by (it ran before the
//! attach, or no listener could be registered), and, with `--exe`, those of
//! a process that ran before the attach from before tracer first saw it
//! (its CPU time at the attach is unknown).

use std::{collections::HashMap, fs::File, os::unix::fs::FileExt as _, thread::JoinHandle, time::Duration};

use indexmap::IndexMap;
use procfs::Current as _;

use super::{
    exits::{ExitListener, ProcessEnd},
    readout::Totals,
};
use crate::{
    kernel::maps::ProbeReading,
    model::{Cost, Level, Note, NoteCode, SiteKinds},
    plan::{
        HitCosts, Plan, PlannedProbe,
        placement::{self, KernelVersion},
        returns::ReturnPlan,
    },
    prepare::calibrate,
};

/// See [`CostMeter::observe`].
const START_SLACK_NS: f64 = 0.5e9;

/// How long the end of a run waits for a calibration still running, so
/// that the summary of a short run has its cost: calibrating takes about a
/// second, several on a loaded machine (and in a debug build, whose own
/// ELF is large).
pub const CALIBRATION_WAIT: Duration = Duration::from_secs(30);

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

pub use crate::prepare::calibrate::Prices;

/// The (high, low) cost in ns of one hit at a probe with sites of `kinds`.
/// Its sites share one counter, so where they are of both kinds its hits
/// cannot be split by site: high prices them all single-stepped, low all
/// emulated. Where all are of one kind both are exact.
#[must_use]
pub fn hit_range(kinds: SiteKinds, hit: HitCosts) -> (f64, f64) {
    match (kinds.emulated, kinds.single_stepped) {
        (0, 0) => (0.0, 0.0),
        (_, 0) => (hit.emulated_ns, hit.emulated_ns),
        (0, _) => (hit.single_stepped_ns, hit.single_stepped_ns),
        _ => (hit.single_stepped_ns, hit.emulated_ns),
    }
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
    inline: Vec<SiteKinds>,
    /// Each probe's counting sites, inlined copies included, as of the
    /// last [`Self::refresh`] (call sites grow as late modules are probed).
    counting: Vec<SiteKinds>,
    returns: Vec<ReturnSites>,
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
        };
        for p in &plan.probes {
            let Some(slot) = usize::try_from(p.slot).ok().filter(|&s| s < slots) else { continue };
            sites.inline[slot] = p.inline_sites.iter().fold(SiteKinds::default(), |k, s| k + kind(s.emulated));
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
    fn price(&self, delta: &Reading, prices: Prices) -> (f64, f64) {
        let mut total = (0.0, 0.0);
        for (slot, (&calls, &returns)) in delta.calls.iter().zip(&delta.returns).enumerate() {
            let (ch, cl) = self.counting.get(slot).map_or((0.0, 0.0), |&k| hit_range(k, prices.hit));
            let (rh, rl) = self.returns.get(slot).map_or((0.0, 0.0), |&r| return_range(r, prices));
            #[allow(clippy::cast_precision_loss, reason = "hit counts, priced")]
            let (calls, returns) = (calls as f64, returns as f64);
            total.0 += calls * ch + returns * rh;
            total.1 += calls * cl + returns * rl;
        }
        total
    }
}

const fn kind(emulated: bool) -> SiteKinds {
    if emulated { SiteKinds { emulated: 1, single_stepped: 0 } } else { SiteKinds { emulated: 0, single_stepped: 1 } }
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

/// CPU time and hits per slot, read together (of one process, or summed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub cpu_ticks: u64,
    pub calls: Vec<u64>,
    pub returns: Vec<u64>,
}

impl Reading {
    fn zero(slots: usize) -> Self {
        Self { cpu_ticks: 0, calls: vec![0; slots], returns: vec![0; slots] }
    }

    fn of(slots: usize, cpu_ticks: u64, hits: Option<&[ProbeReading]>) -> Self {
        let mut r = Self { cpu_ticks, ..Self::zero(slots) };
        for (slot, h) in hits.unwrap_or_default().iter().enumerate().take(slots) {
            // A nested call is two hits: its site's mark and its entry.
            r.calls[slot] = h.calls.saturating_add(h.nested.calls.saturating_mul(2));
            r.returns[slot] = h.returned.returns;
        }
        r
    }

    /// Adds what happened from `from` to `to`.
    fn add_between(&mut self, from: &Self, to: &Self) {
        self.cpu_ticks = self.cpu_ticks.saturating_add(to.cpu_ticks.saturating_sub(from.cpu_ticks));
        for (sum, (a, b)) in self.calls.iter_mut().zip(from.calls.iter().zip(&to.calls)) {
            *sum = sum.saturating_add(b.saturating_sub(*a));
        }
        for (sum, (a, b)) in self.returns.iter_mut().zip(from.returns.iter().zip(&to.returns)) {
            *sum = sum.saturating_add(b.saturating_sub(*a));
        }
    }

    /// What happened from `from` to `self`.
    fn since(&self, from: &Self) -> Self {
        let mut d = Self::zero(self.calls.len());
        d.add_between(from, self);
        d
    }

    fn hits(&self) -> u64 {
        self.calls.iter().chain(&self.returns).fold(0, |sum, &h| sum.saturating_add(h))
    }
}

/// What `/proc/PID/stat` says of a process, in clock ticks: when it started
/// (since boot) and the CPU time it has used (user and system, over all
/// its threads, those that ended included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessCpu {
    pub started: u64,
    pub cpu_ticks: u64,
}

/// A process's [`ProcessCpu`]; `None` once it is gone.
fn read_cpu(pid: u32) -> Option<ProcessCpu> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
    Some(ProcessCpu { started: stat.starttime, cpu_ticks: stat.utime.saturating_add(stat.stime) })
}

/// One traced process: its reading when tracer began counting its cost,
/// and its latest.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tracked {
    started: u64,
    base: Reading,
    last: Reading,
}

/// Every traced process's CPU time and hits, paired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    slots: usize,
    /// When the probes went live, in clock ticks since boot.
    attach_ticks: u64,
    processes: HashMap<u32, Tracked>,
    /// What processes whose PID another process took since added.
    retired: Reading,
}

impl Ledger {
    #[must_use]
    pub fn new(slots: usize, attach_ticks: u64) -> Self {
        Self { slots, attach_ticks, processes: HashMap::new(), retired: Reading::zero(slots) }
    }

    /// Pairs process `pid`'s hits so far (by slot, `None` for none yet)
    /// with its CPU time read now.
    pub fn observe(&mut self, pid: u32, hits: Option<&[ProbeReading]>, cpu: ProcessCpu) {
        let now = Reading::of(self.slots, cpu.cpu_ticks, hits);
        if let Some(t) = self.processes.get_mut(&pid).filter(|t| t.started == cpu.started) {
            t.last = now;
            return;
        }
        let before = self.processes.remove(&pid);
        let base = if cpu.started >= self.attach_ticks {
            // Traced from its start: all its CPU time counts, and all its
            // hits. A process that had the PID before shares its counters;
            // its hits are those it had at its last reading.
            Reading { cpu_ticks: 0, ..before.as_ref().map_or_else(|| Reading::zero(self.slots), |t| t.last.clone()) }
        } else {
            // Running before the attach, first seen now: its CPU time so
            // far is partly from before, so its hits so far go too.
            now.clone()
        };
        if let Some(t) = before {
            self.retired.add_between(&t.base, &t.last);
        }
        self.processes.insert(pid, Tracked { started: cpu.started, base, last: now });
    }

    /// Pairs process `pid`'s final hits with its CPU time at its end, from
    /// its exit records, and its start estimated from them (`cpu.started`:
    /// never earlier than the truth, and at most `slack` ticks later).
    /// Only a process traced from its start is paired so: of one that ran
    /// before the attach, threads may have ended before tracer listened,
    /// and are missing from the sum. A process known under the PID with
    /// another start is not this one, and keeps its last reading.
    pub fn ended(&mut self, pid: u32, hits: Option<&[ProbeReading]>, cpu: ProcessCpu, slack: u64) {
        let started = match self.processes.get(&pid) {
            Some(t) if t.started <= cpu.started && cpu.started - t.started <= slack => t.started,
            Some(_) => return,
            // Never read: it began and ended between two reads.
            None => cpu.started,
        };
        if started >= self.attach_ticks {
            self.observe(pid, hits, ProcessCpu { started, ..cpu });
        }
    }

    /// The CPU time and hits paired so far, summed over processes.
    #[must_use]
    pub fn paired(&self) -> Reading {
        let mut sum = self.retired.clone();
        for t in self.processes.values() {
            sum.add_between(&t.base, &t.last);
        }
        sum
    }
}

/// The calibration of a hit's cost.
pub enum Calibration {
    /// Running on a thread of its own.
    Running(JoinHandle<Result<Prices, String>>),
    Known(Prices),
    /// Failed; why, until told.
    Failed(Option<String>),
}

impl Calibration {
    /// Starts calibrating on a thread of its own: the probes are live by
    /// now, and tracing does not wait for this.
    #[must_use]
    pub fn start() -> Self {
        let spawned = std::thread::Builder::new().name("calibrate".to_owned()).spawn(|| {
            // Behind the target and tracer's own work: the figures
            // used are in CPU time, which waiting for a CPU leaves
            // alone. The child it starts inherits this. Best effort:
            // at the usual priority the figures are the same.
            // SAFETY: setpriority has no memory-safety preconditions;
            // on Linux PRIO_PROCESS with this thread's ID sets the
            // nice value of this thread alone.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::id_t::try_from(libc::gettid()).unwrap_or(0), 10) };
            calibrate::calibrate(false).map(|c| c.cpu).map_err(|e| chain(&e))
        });
        match spawned {
            Ok(thread) => Self::Running(thread),
            Err(e) => Self::Failed(Some(format!("cannot start a thread to calibrate on: {e}"))),
        }
    }

    /// Takes the result of a finished calibration.
    fn settle(&mut self) {
        let Self::Running(thread) = self else { return };
        if !thread.is_finished() {
            return;
        }
        let Self::Running(thread) = std::mem::replace(self, Self::Failed(None)) else { return };
        *self = match thread.join() {
            Ok(Ok(prices)) => Self::Known(prices),
            Ok(Err(why)) => Self::Failed(Some(why)),
            Err(_) => Self::Failed(Some("the calibration thread panicked".to_owned())),
        };
    }
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// What the warning of a high cost points to: whether `--budget` is on (as
/// a percentage) and whether the run has what it refuses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Advice {
    pub budget: Option<f64>,
    pub returns: bool,
    pub call_sites: bool,
}

/// Estimates what tracing costs the target, interval by interval.
pub struct CostMeter {
    sites: SitePlan,
    ledger: Ledger,
    /// `--pid`'s process, read whether or not it has hit a probe.
    target: Option<u32>,
    /// The exit records of processes (with `--exe`, where the kernel lets
    /// tracer listen), and those taken before the latest read.
    exits: Option<ExitListener>,
    ended: Vec<ProcessEnd>,
    calibration: Calibration,
    ticks_per_s: f64,
    /// What was paired at the last interval.
    mark: Reading,
    advice: Advice,
    told_high: bool,
}

impl CostMeter {
    /// A meter for `plan`, whose probes just went live, tracing `target`
    /// (`None` with `--exe`), with `exits` listening since before the
    /// attach.
    #[must_use]
    pub fn new(
        plan: &Plan,
        target: Option<u32>,
        exits: Option<ExitListener>,
        calibration: Calibration,
        advice: Advice,
    ) -> Self {
        #[allow(clippy::cast_precision_loss, reason = "clock ticks per second")]
        let ticks_per_s = procfs::ticks_per_second() as f64;
        // Since boot, as /proc/PID/stat's start times are.
        let uptime = procfs::Uptime::current().map_or(0.0, |u| u.uptime_duration().as_secs_f64());
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "ticks since boot")]
        let attach_ticks = (uptime * ticks_per_s) as u64;
        let slots = plan.probes.len();
        let mut meter = Self {
            sites: SitePlan::new(plan),
            ledger: Ledger::new(slots, attach_ticks),
            target,
            exits,
            ended: Vec::new(),
            calibration,
            ticks_per_s,
            mark: Reading::zero(slots),
            advice,
            told_high: false,
        };
        // The target's CPU time from the attach on.
        if let Some(cpu) = target.and_then(read_cpu) {
            meter.ledger.observe(target.unwrap_or_default(), None, cpu);
        }
        meter
    }

    /// Each probe's counting sites by kind, for the attach header.
    #[must_use]
    pub fn sites(&self, plan: &Plan) -> IndexMap<String, SiteKinds> {
        self.sites.by_probe(plan)
    }

    /// Takes the processes that ended so far, to pair with the counts
    /// about to be read: those of a process that had ended are final.
    pub fn before_read(&mut self) {
        if let Some(exits) = &self.exits {
            self.ended.extend(exits.take());
        }
    }

    /// Reads the CPU time of every traced process now alive, and takes that
    /// of those that ended before the read, to pair with `totals`, read
    /// just before.
    pub fn observe(&mut self, plan: &Plan, totals: &Totals) {
        self.sites.refresh(plan);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clock ticks")]
        let ticks = |ns: f64| (ns * self.ticks_per_s / 1e9) as u64;
        // How much later than the truth an end's start may be: the time
        // its record took to be read, well under this.
        let slack = ticks(START_SLACK_NS);
        for end in std::mem::take(&mut self.ended) {
            // A process that never hit a probe is none of tracer's.
            let Some(hits) = totals.per_process.get(&end.tgid) else { continue };
            #[allow(clippy::cast_precision_loss, reason = "ns since boot and µs of CPU time")]
            let cpu = ProcessCpu { started: ticks(end.started_ns as f64), cpu_ticks: ticks(end.cpu_us as f64 * 1e3) };
            match read_cpu(end.tgid) {
                // Not yet reaped: /proc still says, exactly.
                Some(now) if now.started <= cpu.started && cpu.started - now.started <= slack => {
                    self.ledger.observe(end.tgid, Some(hits), now);
                }
                _ => self.ledger.ended(end.tgid, Some(hits), cpu, slack),
            }
        }
        let pids: Vec<u32> = match self.target {
            Some(pid) => vec![pid],
            None => totals.live.clone(),
        };
        for pid in pids {
            if let Some(cpu) = read_cpu(pid) {
                self.ledger.observe(pid, totals.per_process.get(&pid).map(Vec::as_slice), cpu);
            }
        }
    }

    /// The warning to give if calibration has failed since the last call.
    pub fn poll(&mut self) -> Option<Note> {
        self.calibration.settle();
        let Calibration::Failed(why) = &mut self.calibration else { return None };
        why.take().map(|why| {
            Note::new(
                Level::Warning,
                NoteCode::CostUnknown,
                format!("cannot estimate what tracing costs the target: {why}; the reports carry no cost"),
            )
        })
    }

    /// Whether the calibration is still running.
    pub fn calibrating(&mut self) -> bool {
        self.calibration.settle();
        matches!(self.calibration, Calibration::Running(_))
    }

    /// Stops waiting for a calibration still running, which is left to
    /// finish on its own (its child ends with tracer), and goes on without
    /// a cost: with `why` a warning says so, without (the user asked to
    /// stop) nothing does.
    pub fn give_up(&mut self, why: Option<String>) {
        if let Calibration::Running(_) = self.calibration {
            self.calibration = Calibration::Failed(why);
        }
    }

    /// The cost since the last call (or the attach); `None` until a hit's
    /// cost is known.
    pub fn interval(&mut self) -> Option<Cost> {
        let now = self.ledger.paired();
        let delta = now.since(&self.mark);
        self.mark = now;
        self.cost_of(&delta)
    }

    /// The cost over the whole run.
    #[must_use]
    pub fn total(&self) -> Option<Cost> {
        self.cost_of(&self.ledger.paired())
    }

    fn cost_of(&self, delta: &Reading) -> Option<Cost> {
        let Calibration::Known(prices) = self.calibration else { return None };
        let (high, low) = self.sites.price(delta, prices);
        #[allow(clippy::cast_precision_loss, reason = "clock ticks of CPU time")]
        let cpu_ns = delta.cpu_ticks as f64 * 1e9 / self.ticks_per_s;
        Some(estimate(high, low, cpu_ns, delta.hits(), prices.hit))
    }

    /// The warning to give, once, when `cost` is high.
    pub fn high_cost_note(&mut self, cost: &Cost) -> Option<Note> {
        if self.told_high {
            return None;
        }
        let Advice { budget, returns, call_sites } = self.advice;
        let warning = cost.warning(budget, returns, call_sites)?;
        self.told_high = true;
        Some(Note::new(Level::Warning, NoteCode::HighCost, warning))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIT: HitCosts = HitCosts { single_stepped_ns: 15_000.0, emulated_ns: 500.0 };
    const PRICES: Prices = Prices { hit: HIT, uretprobe_return_ns: Some(200.0) };

    const fn sites(emulated: usize, single_stepped: usize) -> SiteKinds {
        SiteKinds { emulated, single_stepped }
    }

    fn hits(calls: &[u64], returns: &[u64]) -> Vec<ProbeReading> {
        calls
            .iter()
            .zip(returns)
            .map(|(&calls, &returns)| ProbeReading {
                calls,
                returned: tracer_common::returns::Returned { returns, ..Default::default() },
                ..ProbeReading::default()
            })
            .collect()
    }

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
            c.warning(None, false, false).unwrap(),
            "tracing costs the target an estimated 50% of its CPU time (a CPU-bound target runs about 2.0× slower); --budget PERCENT keeps the cost near PERCENT% by tracing in windows"
        );
        assert!(c.warning(None, true, false).unwrap().contains("without --returns and --placement call-sites"));
        assert!(c.warning(Some(20.0), false, false).unwrap().contains("--budget 20% is on"));
        assert!(estimate(0.99e9, 0.99e9, 1e9, 1, HIT).warning(None, false, false).unwrap().contains("over 10×"));
        assert_eq!(estimate(0.1e9, 0.1e9, 1e9, 1, HIT).warning(None, false, false), None, "10% is not above 10%");
    }

    #[test]
    fn intervals_pair_hits_with_cpu_time_of_the_same_reading() {
        let slots = 2;
        let price = |r: &Reading| {
            let sites = SitePlan {
                inline: vec![SiteKinds::default(); slots],
                counting: vec![sites(1, 0), sites(0, 1)],
                returns: vec![ReturnSites::None; slots],
            };
            sites.price(r, PRICES)
        };
        // Attached at tick 1000; process 7 ran before, 8 starts after.
        let mut ledger = Ledger::new(slots, 1000);
        ledger.observe(7, None, ProcessCpu { started: 10, cpu_ticks: 500 });
        ledger.observe(7, Some(&hits(&[100, 10], &[0, 0])), ProcessCpu { started: 10, cpu_ticks: 600 });
        ledger.observe(8, Some(&hits(&[40, 0], &[0, 0])), ProcessCpu { started: 1200, cpu_ticks: 30 });
        let first = ledger.paired();
        assert_eq!(first, Reading { cpu_ticks: 130, calls: vec![140, 10], returns: vec![0, 0] });
        assert_eq!(price(&first), (140.0 * 500.0 + 10.0 * 15_000.0, 140.0 * 500.0 + 10.0 * 15_000.0));
        // Process 8 exited unread: its last reading stands. Process 7 goes on.
        ledger.observe(7, Some(&hits(&[300, 20], &[0, 0])), ProcessCpu { started: 10, cpu_ticks: 700 });
        let second = ledger.paired();
        assert_eq!(second.since(&first), Reading { cpu_ticks: 100, calls: vec![200, 10], returns: vec![0, 0] });
        // A process that ran before the attach and is first seen now adds
        // nothing until its next reading.
        ledger.observe(9, Some(&hits(&[1000, 1000], &[0, 0])), ProcessCpu { started: 20, cpu_ticks: 5000 });
        assert_eq!(ledger.paired(), second);
        // PID 8 reused by a new process: 8's counts stay, the new one's
        // start from them.
        ledger.observe(8, Some(&hits(&[45, 0], &[0, 0])), ProcessCpu { started: 1300, cpu_ticks: 3 });
        assert_eq!(ledger.paired().since(&second), Reading { cpu_ticks: 3, calls: vec![5, 0], returns: vec![0, 0] });
    }

    #[test]
    fn an_end_from_exit_records_prices_what_a_process_did_after_its_last_reading() {
        // Attached at tick 1000, a slack of 50 ticks.
        let mut ledger = Ledger::new(1, 1000);
        // Started after the attach, read once, then ended: its end's CPU
        // time and its final hits replace its last reading.
        ledger.observe(8, Some(&hits(&[40], &[0])), ProcessCpu { started: 1200, cpu_ticks: 30 });
        ledger.ended(8, Some(&hits(&[100], &[0])), ProcessCpu { started: 1203, cpu_ticks: 80 }, 50);
        assert_eq!(ledger.paired(), Reading { cpu_ticks: 80, calls: vec![100], returns: vec![0] });
        // Begun and ended between two reads: never read, paired whole.
        ledger.ended(9, Some(&hits(&[10], &[0])), ProcessCpu { started: 1300, cpu_ticks: 5 }, 50);
        assert_eq!(ledger.paired(), Reading { cpu_ticks: 85, calls: vec![110], returns: vec![0] });
        let before = ledger.paired();
        // Another start than the one known under the PID (beyond the slack,
        // or earlier): another process, which keeps its last reading.
        ledger.observe(10, Some(&hits(&[1], &[0])), ProcessCpu { started: 1400, cpu_ticks: 1 });
        let with_10 = ledger.paired();
        ledger.ended(10, Some(&hits(&[50], &[0])), ProcessCpu { started: 1451, cpu_ticks: 90 }, 50);
        ledger.ended(10, Some(&hits(&[50], &[0])), ProcessCpu { started: 1399, cpu_ticks: 90 }, 50);
        assert_eq!(ledger.paired(), with_10);
        assert_eq!(with_10.since(&before), Reading { cpu_ticks: 1, calls: vec![1], returns: vec![0] });
        // Running before the attach: its threads that ended before tracer
        // listened are not in the sum, so its end is not used, read or not.
        ledger.observe(7, None, ProcessCpu { started: 10, cpu_ticks: 500 });
        ledger.observe(7, Some(&hits(&[5], &[0])), ProcessCpu { started: 10, cpu_ticks: 510 });
        let with_7 = ledger.paired();
        ledger.ended(7, Some(&hits(&[9], &[0])), ProcessCpu { started: 12, cpu_ticks: 900 }, 50);
        ledger.ended(6, Some(&hits(&[9], &[0])), ProcessCpu { started: 900, cpu_ticks: 900 }, 50);
        assert_eq!(ledger.paired(), with_7);
    }

    #[test]
    fn returns_are_hits_too() {
        let mut ledger = Ledger::new(1, 0);
        ledger.observe(7, Some(&hits(&[10], &[8])), ProcessCpu { started: 5, cpu_ticks: 1 });
        let paired = ledger.paired();
        assert_eq!(paired.hits(), 18);
        let sites = SitePlan {
            inline: vec![SiteKinds::default()],
            counting: vec![sites(1, 0)],
            returns: vec![ReturnSites::Uretprobe { entry: None }],
        };
        assert_eq!(sites.price(&paired, PRICES), (10.0 * 500.0 + 8.0 * 200.0, 10.0 * 500.0 + 8.0 * 200.0));
    }
}
