//! What tracing costs the target, estimated while it runs: every interval
//! and the summary carry a [`Cost`], and a note warns once the cost passes
//! [`Cost::HIGH`].
//!
//! A uprobe hit runs in the thread that hit it, so its cost is CPU time the
//! target is charged for. The estimate is each probe's hits times the
//! calibrated cost of a hit where its uprobes sit (emulated or
//! single-stepped, see [`crate::prepare::calibrate`]), against the CPU time
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
//!
//! Where each probe's hits are priced is in `price`, and the pairing of
//! each process's hits with its CPU time in `ledger`.

mod ledger;
mod price;

use std::{fmt::Write as _, thread::JoinHandle, time::Duration};

use indexmap::IndexMap;
use procfs::Current as _;

use self::ledger::read_cpu;
pub use self::{
    ledger::{Ledger, ProcessCpu, Reading},
    price::{ReturnSites, SitePlan, counting_sites, estimate, hit_range, priced_apart, priced_range, return_range},
};
use super::{
    exits::{ExitListener, ProcessEnd},
    readout::Totals,
};
pub use crate::prepare::calibrate::Prices;
use crate::{
    model::{Cost, Level, Note, NoteCode, SiteKinds},
    plan::Plan,
    prepare::kept,
};

/// See [`CostMeter::observe`].
const START_SLACK_NS: f64 = 0.5e9;

/// Clock ticks per second, as `/proc/PID/stat` counts CPU time.
#[allow(clippy::cast_precision_loss, reason = "clock ticks per second")]
fn ticks_per_s() -> f64 {
    procfs::ticks_per_second() as f64
}

/// Clock ticks since boot, as `/proc/PID/stat`'s start times are.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "ticks since boot")]
fn ticks_now() -> u64 {
    let uptime = procfs::Uptime::current().map_or(0.0, |u| u.uptime_duration().as_secs_f64());
    (uptime * ticks_per_s()) as u64
}

/// The CPU time the traced processes used from now on, summed: what the
/// budget is a share of. Each process by its exact process CPU clock
/// ([`process_cpu_ns`]): `--pid`'s; with `--exe`, those running the image
/// when this began and those that hit a probe since (a near-idle process
/// runs a clock tick in seconds, against windows of milliseconds).
#[derive(Clone, Debug)]
pub struct TargetCpu {
    ledger: Ledger,
    target: Option<u32>,
    /// With `--exe`: the processes that mapped the image when this began,
    /// read from then on whether or not they have hit a probe yet (their
    /// first window's hits would otherwise be set against no CPU time).
    running: Vec<u32>,
    /// With `--pid`: its clock at the start, and at the last reading (which
    /// stands once it is gone).
    exact: Option<(u64, u64)>,
}

impl TargetCpu {
    /// From now on, of `target`, or with `--exe` (`target` `None`) of the
    /// processes running `image` and those each reading names.
    #[must_use]
    pub fn new(target: Option<u32>, image: Option<&std::path::Path>) -> Self {
        let exact = target.and_then(process_cpu_ns).map(|ns| (ns, ns));
        let running = match (target, image) {
            (None, Some(image)) => {
                crate::discover::process::processes_mapping(image).into_iter().map(|(pid, _)| pid).collect()
            }
            _ => Vec::new(),
        };
        let mut cpu = Self { ledger: Ledger::new(0, ticks_now()), target, running, exact };
        let _ = cpu.read(&[]);
        cpu
    }

    /// The processes a reading with `live` covers: `live` and, with
    /// `--exe`, those running the image at the start.
    #[must_use]
    pub fn pids(&self, live: &[u32]) -> Vec<u32> {
        let mut pids: Vec<u32> = live.iter().chain(&self.running).copied().collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// The processes a reading with `live` covers: `--pid`'s, or
    /// [`Self::pids`].
    #[must_use]
    pub fn covered(&self, live: &[u32]) -> Vec<u32> {
        match self.target {
            Some(pid) => vec![pid],
            None => self.pids(live),
        }
    }

    /// The CPU time so far: of `--pid`'s process, or with `--exe` of the
    /// processes [`Self::pids`] gives for `live` (each from when it was
    /// first read, or from its start if it started after this began; one
    /// that exits between two readings loses what it used since the last).
    pub fn read(&mut self, live: &[u32]) -> Duration {
        if let (Some(pid), Some((base, last))) = (self.target, self.exact.as_mut()) {
            if let Some(now) = process_cpu_ns(pid) {
                *last = now.max(*last);
            }
            return Duration::from_nanos(last.saturating_sub(*base));
        }
        let pids = match self.target {
            Some(t) => vec![t],
            None => self.pids(live),
        };
        for pid in pids {
            // The ledger's unit here is the nanosecond.
            if let (Some(stat), Some(ns)) = (read_cpu(pid), process_cpu_ns(pid)) {
                self.ledger.observe(pid, None, ProcessCpu { started: stat.started, cpu_ticks: ns });
            }
        }
        Duration::from_nanos(self.ledger.paired().cpu_ticks)
    }
}

/// The CPU time `pid` has used, in nanoseconds, exactly: its process
/// CPU clock, which the kernel brings up to date for a thread running at
/// that moment (`/proc/PID/stat` counts clock ticks, and `schedstat` lags a
/// running thread by up to a tick: a window of a few milliseconds read
/// 0 ns on a target that ran through it). Falls back to the threads'
/// `schedstat` where the clock cannot be had. `None` once it is gone.
#[must_use]
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let Ok(id) = libc::pid_t::try_from(pid) else { return None };
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid place for the clock id.
    if unsafe { libc::clock_getcpuclockid(id, &raw mut clock) } == 0 {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `now` is a valid place for the time.
        if unsafe { libc::clock_gettime(clock, &raw mut now) } == 0 {
            let secs = u64::try_from(now.tv_sec).ok()?;
            let nanos = u64::try_from(now.tv_nsec).ok()?;
            return Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos));
        }
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut sum = 0u64;
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        let ns = text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        sum = sum.saturating_add(ns);
    }
    Some(sum)
}

#[cfg(test)]
mod cpu_tests {
    /// A busy child's clock moves by what it ran, finer than a tick
    /// (ticks would show a multiple of 4 ms). Over 50 ms, not 3: on a
    /// loaded machine the child may not run at all for a few
    /// milliseconds.
    #[test]
    fn the_process_clock_is_exact_for_another_process() {
        let mut child =
            std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("a busy shell");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let a = super::process_cpu_ns(child.id()).expect("its clock");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = super::process_cpu_ns(child.id()).expect("its clock");
        child.kill().expect("kill");
        child.wait().expect("reaped");
        assert!(a > 0 && b > a, "{a} then {b}");
        assert!(b - a < 200_000_000, "{a} then {b}");
        assert_ne!((b - a) % 4_000_000, 0, "a multiple of a tick: {a} then {b}");
    }
}

/// How long the end of a run waits for a calibration still running, so
/// that the summary of a short run has its cost: calibrating takes about a
/// second, several on a loaded machine (and in a debug build, whose own
/// ELF is large).
pub const CALIBRATION_WAIT: Duration = Duration::from_secs(30);

/// How long the header waits for a calibration still running before it
/// goes out without a price (the first interval then gives it).
pub const HEADER_WAIT: Duration = Duration::from_millis(500);

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
            kept::calibration(false).map(|c| c.cpu).map_err(|e| chain(&e))
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

use crate::error::chain;

/// What the warning of a high cost points to: whether `--budget` is on (as
/// a percentage) and whether the run has what it refuses; and the
/// functions whose out-of-line probe is single-stepped where call sites
/// could take its place (`--placement inside`, no `--budget`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advice {
    pub budget: Option<f64>,
    /// `--placement call-sites` given (the header's `call_sites_asked`).
    pub call_sites: bool,
    /// The flags of the run that `--budget` refuses.
    pub refuses: Vec<&'static str>,
    pub stepped: Vec<&'static str>,
}

impl Advice {
    /// What a run attached as `config` says and `plan` shows.
    #[must_use]
    pub fn of(config: &crate::config::AttachConfig, plan: &Plan) -> Self {
        use crate::{config::LinkMode, plan::PlacementMode};
        // `auto` resolved to call sites where it could (config): only a
        // run placed `inside` by choice could move them.
        let movable = config.placement == PlacementMode::Inside
            && config.budget.is_none()
            && config.links != LinkMode::Perf
            && crate::kernel::multi::available();
        // Not the frees: their addresses sit in type objects (`tp_free`)
        // and the allocator tables, so calls through those have no call
        // site and call-site placement leaves them at their entries
        // (probes.md). Nor libc's functions, which it does not move.
        let stepped = plan.probes.iter().filter(|p| {
            movable
                && !p.placement.emulated
                && p.call_sites.is_none()
                && p.file.is_none()
                && !p.symbol.ends_with("Free")
        });
        Self {
            budget: config.budget.map(|b| b * 100.0),
            call_sites: config.call_sites_asked,
            refuses: crate::model::BudgetRefuses {
                types: config.types,
                stacks: config.stacks.is_some(),
                live: config.live.is_some(),
                native: config.native,
                returns: config.returns,
                call_sites: config.call_sites_asked,
            }
            .flags(),
            stepped: stepped.map(|p| p.symbol).collect(),
        }
    }
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
        let ticks_per_s = ticks_per_s();
        let attach_ticks = ticks_now();
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
        // The target's CPU time from the attach on. With `--exe`, that of
        // every process already running the image too: one first read at
        // its first hit would have its hits up to that reading set against
        // CPU time partly from before the attach, so left unpriced (and said
        // to be of processes that exited), though it never exited.
        let running = match target {
            Some(pid) => vec![pid],
            None => {
                crate::discover::process::processes_mapping(&plan.attach_path).into_iter().map(|(pid, _)| pid).collect()
            }
        };
        for pid in running {
            if let Some(cpu) = read_cpu(pid) {
                meter.ledger.observe(pid, None, cpu);
            }
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

    /// The calibrated prices, once known.
    #[must_use]
    pub const fn prices(&self) -> Option<Prices> {
        match self.calibration {
            Calibration::Known(prices) => Some(prices),
            _ => None,
        }
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

    /// The (high, low) cost in ns of `calls` and `returns` hits, by slot
    /// (`stepped` of the calls at single-stepped sites, where a probe
    /// counts them apart), where this plan's probes sit; `None` until a
    /// hit's cost is known.
    #[must_use]
    pub fn price_hits(&self, calls: &[u64], returns: &[u64], stepped: &[u64]) -> Option<(f64, f64)> {
        let Calibration::Known(prices) = self.calibration else { return None };
        let reading =
            Reading { cpu_ticks: 0, calls: calls.to_vec(), returns: returns.to_vec(), stepped: stepped.to_vec() };
        Some(self.sites.price(&reading, prices))
    }

    /// Waits, at most `limit`, for the calibration still running, and
    /// leaves it running past that: the header's estimate must not hold up
    /// a run whose probes are already live (under load the calibration's
    /// child can take seconds), and the intervals price their hits once it
    /// is done.
    pub fn wait_calibrated(&mut self, limit: Duration) {
        let until = std::time::Instant::now() + limit;
        while self.calibrating() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
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

    /// The CPU time the traced processes used from the attach to the last
    /// reading (paired with hits, see [`Self::observe`]).
    #[must_use]
    pub fn target_cpu(&self) -> Duration {
        #[allow(clippy::cast_precision_loss, reason = "clock ticks of CPU time")]
        Duration::from_secs_f64(self.ledger.paired().cpu_ticks as f64 / self.ticks_per_s)
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

    /// Whether the user asked for call sites (`--placement call-sites`),
    /// which `--budget` refuses, as against `auto` taking them.
    #[must_use]
    pub const fn call_sites_asked(&self) -> bool {
        self.advice.call_sites
    }

    /// The production profile's warning, once, when its cost went over
    /// its budget (`over`: by what, [`crate::model::ProfileCost::over_budget`]).
    pub fn over_budget_note(&mut self, over: Option<String>) -> Option<Note> {
        if self.told_high {
            return None;
        }
        let over = over?;
        self.told_high = true;
        Some(Note::new(Level::Warning, NoteCode::HighCost, over))
    }

    /// The warning to give, once, when `cost` is high.
    pub fn high_cost_note(&mut self, cost: &Cost) -> Option<Note> {
        if self.told_high {
            return None;
        }
        let Advice { budget, ref refuses, ref stepped, .. } = self.advice;
        let mut warning = cost.warning(budget, refuses)?;
        self.told_high = true;
        // A single-stepped hit costs about ten times an emulated one (the
        // calibration's figures): where call sites may move such a probe,
        // that is the first thing to try (exact still, but for modules
        // mapped later: probes.md).
        if !stepped.is_empty() {
            let _ = write!(
                warning,
                "; or --placement call-sites, which probes each call of {} instead of the single-stepped entry, where the address never escapes (`tracer probes --placement call-sites` shows where it would)",
                stepped.join(", ")
            );
        }
        Some(Note::new(Level::Warning, NoteCode::HighCost, warning))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{kernel::maps::ProbeReading, plan::HitCosts};

    pub(super) const HIT: HitCosts =
        HitCosts { single_stepped_ns: 15_000.0, emulated_ns: 500.0, calibrated_unix_s: None };
    pub(super) const PRICES: Prices = Prices { hit: HIT, uretprobe_return_ns: Some(200.0) };

    pub(super) const fn sites(emulated: usize, single_stepped: usize) -> SiteKinds {
        SiteKinds { emulated, single_stepped }
    }

    pub(super) fn hits(calls: &[u64], returns: &[u64]) -> Vec<ProbeReading> {
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
    fn intervals_pair_hits_with_cpu_time_of_the_same_reading() {
        let slots = 2;
        let price = |r: &Reading| {
            let sites = SitePlan {
                inline: vec![SiteKinds::default(); slots],
                counting: vec![sites(1, 0), sites(0, 1)],
                returns: vec![ReturnSites::None; slots],
                apart: vec![false; slots],
            };
            sites.price(r, PRICES)
        };
        // Attached at tick 1000; process 7 ran before, 8 starts after.
        let mut ledger = Ledger::new(slots, 1000);
        ledger.observe(7, None, ProcessCpu { started: 10, cpu_ticks: 500 });
        ledger.observe(7, Some(&hits(&[100, 10], &[0, 0])), ProcessCpu { started: 10, cpu_ticks: 600 });
        ledger.observe(8, Some(&hits(&[40, 0], &[0, 0])), ProcessCpu { started: 1200, cpu_ticks: 30 });
        let first = ledger.paired();
        assert_eq!(first, Reading { cpu_ticks: 130, calls: vec![140, 10], returns: vec![0, 0], stepped: vec![0, 0] });
        assert_eq!(price(&first), (140.0 * 500.0 + 10.0 * 15_000.0, 140.0 * 500.0 + 10.0 * 15_000.0));
        // Process 8 exited unread: its last reading stands. Process 7 goes on.
        ledger.observe(7, Some(&hits(&[300, 20], &[0, 0])), ProcessCpu { started: 10, cpu_ticks: 700 });
        let second = ledger.paired();
        assert_eq!(
            second.since(&first),
            Reading { cpu_ticks: 100, calls: vec![200, 10], returns: vec![0, 0], stepped: vec![0, 0] }
        );
        // A process that ran before the attach and is first seen now adds
        // nothing until its next reading.
        ledger.observe(9, Some(&hits(&[1000, 1000], &[0, 0])), ProcessCpu { started: 20, cpu_ticks: 5000 });
        assert_eq!(ledger.paired(), second);
        // PID 8 reused by a new process: 8's counts stay, the new one's
        // start from them.
        ledger.observe(8, Some(&hits(&[45, 0], &[0, 0])), ProcessCpu { started: 1300, cpu_ticks: 3 });
        assert_eq!(
            ledger.paired().since(&second),
            Reading { cpu_ticks: 3, calls: vec![5, 0], returns: vec![0, 0], stepped: vec![0, 0] }
        );
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
            apart: vec![false],
        };
        assert_eq!(sites.price(&paired, PRICES), (10.0 * 500.0 + 8.0 * 200.0, 10.0 * 500.0 + 8.0 * 200.0));
    }

    /// A probe with sites of both kinds is a range, unless it counts its
    /// single-stepped hits apart: each is then priced as what it cost.
    #[test]
    fn hits_counted_apart_by_kind_are_priced_each_as_it_cost() {
        let reading = Reading { cpu_ticks: 0, calls: vec![100], returns: vec![0], stepped: vec![30] };
        let mut sites = SitePlan {
            inline: vec![sites(200, 1)],
            counting: vec![sites(200, 2)],
            returns: vec![ReturnSites::None],
            apart: vec![false],
        };
        assert_eq!(sites.price(&reading, PRICES), (100.0 * 15_000.0, 100.0 * 500.0));
        sites.apart = vec![true];
        let exact = 30.0 * 15_000.0 + 70.0 * 500.0;
        assert_eq!(sites.price(&reading, PRICES), (exact, exact));
        // More stepped than hits (read a moment apart) is all of them.
        assert!((priced_apart(10, 12, PRICES.hit) - 10.0 * 15_000.0).abs() < 1e-9);
    }
}
