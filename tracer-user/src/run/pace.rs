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

use std::time::{Duration, Instant};

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
/// process clock ([`super::cost::process_cpu_ns`]), sorted by PID, and the
/// whole machine's busy time then ([`MachineBusy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuMark {
    at: Instant,
    each: Vec<(u32, u64)>,
    machine: Option<MachineBusy>,
}

impl Default for CpuMark {
    fn default() -> Self {
        Self { at: Instant::now(), each: Vec::new(), machine: None }
    }
}

/// What every CPU of the machine spent on anything but idling, by
/// `/proc/stat`'s ticks, less tracer's own CPU time: what bounds a cost
/// where the traced processes changed between two readings (one that
/// ended cannot be read at the second).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineBusy {
    busy_ns: u64,
    /// tracer's own CPU time (attaching thousands of sites takes it
    /// a while, and none of that is the target's).
    own_ns: u64,
    /// How many CPUs there are.
    cpus: u64,
    /// A tick's length: the ticks are counted a whole one at a time, so
    /// each end of a span may be short by up to one on every CPU, and the
    /// summed line by up to one in each of its six busy fields.
    tick_ns: u64,
}

impl MachineBusy {
    /// Reads `/proc/stat` now.
    #[must_use]
    pub fn read() -> Option<Self> {
        // SAFETY: sysconf reads a constant of the C library.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&hz| hz > 0)?;
        let own = super::cost::process_cpu_ns(std::process::id())?;
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?, hz, own)
    }

    /// The busy time in `stat` (a `/proc/stat`), its ticks `hz` a second,
    /// tracer having run `own_ns`.
    fn parse(stat: &str, hz: u64, own_ns: u64) -> Option<Self> {
        let mut lines = stat.lines();
        let all: Vec<u64> =
            lines.next()?.strip_prefix("cpu ")?.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
        // user nice system idle iowait irq softirq steal (guest time is in
        // user's already): all but idle and iowait.
        let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| all.get(i)).sum();
        let cpus = lines.filter(|l| l.starts_with("cpu")).count().max(1);
        let tick_ns = 1_000_000_000 / hz;
        Some(Self { busy_ns: busy.saturating_mul(tick_ns), own_ns, cpus: u64::try_from(cpus).ok()?, tick_ns })
    }

    /// What the machine can have run since `then` besides tracer, at
    /// most.
    fn since(self, then: Self) -> Duration {
        let ticks = self.cpus.max(then.cpus).saturating_mul(2).saturating_add(6);
        let slack = self.tick_ns.max(then.tick_ns).saturating_mul(ticks);
        let busy = self.busy_ns.saturating_sub(then.busy_ns).saturating_add(slack);
        Duration::from_nanos(busy.saturating_sub(self.own_ns.saturating_sub(then.own_ns)))
    }
}

/// The CPUs online, by the C library (1 where it cannot tell).
fn online_cpus() -> u64 {
    // SAFETY: sysconf reads a value of the C library.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).ok().filter(|&n| n > 0).unwrap_or(1)
}

impl CpuMark {
    /// The clocks of `pids` now (those gone are left out), and the
    /// machine's.
    #[must_use]
    pub fn read(pids: &[u32]) -> Self {
        // Before the clocks: the span of one that ended is then not short.
        let at = Instant::now();
        let mut each: Vec<(u32, u64)> =
            pids.iter().filter_map(|&pid| Some((pid, super::cost::process_cpu_ns(pid)?))).collect();
        each.sort_unstable();
        each.dedup_by_key(|(pid, _)| *pid);
        Self { at, each, machine: MachineBusy::read() }
    }

    /// The CPU time used since `then` by the processes in both (one that
    /// started or ended between them is left out of both ends); `None`
    /// where none is.
    #[must_use]
    pub fn since(&self, then: &Self) -> Option<Duration> {
        let mut any = false;
        let mut ns = 0u64;
        for &(pid, now) in &self.each {
            if let Ok(i) = then.each.binary_search_by_key(&pid, |&(p, _)| p) {
                any = true;
                ns = ns.saturating_add(now.saturating_sub(then.each[i].1));
            }
        }
        any.then(|| Duration::from_nanos(ns))
    }

    /// Whether `pid` was read.
    #[must_use]
    pub fn has(&self, pid: u32) -> bool {
        self.each.binary_search_by_key(&pid, |&(p, _)| p).is_ok()
    }

    /// At most the CPU time the traced processes used since `then`, with
    /// `unseen` more that had hits in between but were in neither reading
    /// (each began and ended between them): an upper bound on what any hit
    /// in them since can have cost. Those in both readings count what
    /// their clocks moved; one that began since, all its clock; one that
    /// ended, or was never read, every CPU for the whole span. That, or
    /// what the machine ran besides tracer, whichever is less, but never
    /// less than the clocks of those in both (the machine's ticks are
    /// approximate, their clocks exact). `None` where no process was read
    /// and the machine could not be. A PID reused between the readings
    /// counts as one process (its clock only moves on).
    #[must_use]
    pub fn spent_since(&self, then: &Self, unseen: usize) -> Option<Duration> {
        let machine = self.machine.zip(then.machine).map(|(now, then)| now.since(then));
        if self.each.is_empty() && then.each.is_empty() && unseen == 0 {
            return machine;
        }
        let in_then = |pid| then.each.binary_search_by_key(&pid, |&(p, _)| p).ok();
        let mut ns = 0u64;
        for &(pid, now) in &self.each {
            ns = ns.saturating_add(now.saturating_sub(in_then(pid).map_or(0, |i| then.each[i].1)));
        }
        let ended = then.each.iter().filter(|&&(pid, _)| !self.has(pid)).count() + unseen;
        let cpus = self.machine.or(then.machine).map_or_else(online_cpus, |m| m.cpus);
        let span = self.at.saturating_duration_since(then.at);
        let each_ended = span.saturating_mul(u32::try_from(cpus).unwrap_or(u32::MAX));
        let own = Duration::from_nanos(ns)
            .saturating_add(each_ended.saturating_mul(u32::try_from(ended).unwrap_or(u32::MAX)));
        let both = self.since(then).unwrap_or_default();
        Some(machine.map_or(own, |m| own.min(m.max(both))))
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

    fn mark(each: Vec<(u32, u64)>) -> CpuMark {
        CpuMark { each, ..CpuMark::default() }
    }

    /// The same processes bound a cost by their own clocks; one that
    /// began by all of its clock, one that ended or was never read by
    /// every CPU over the span; and the machine's busy time besides
    /// tracer's (with a tick of slack) bounds them all, but never below
    /// the clocks of those read at both ends.
    #[test]
    fn cpu_spent_is_bounded_by_the_processes_read_and_by_the_machine() {
        let t0 = Instant::now();
        let then = CpuMark { at: t0, each: vec![(10, 1_000), (20, 5_000)], machine: None };
        let now = |each, machine| CpuMark { at: t0 + Duration::from_secs(1), each, machine };
        let ns = Duration::from_nanos;
        let two_cpus = Duration::from_secs(2);
        assert_eq!(now(vec![(10, 1_500), (20, 7_000)], None).spent_since(&then, 0), Some(ns(2_500)));
        let ended = now(vec![(10, 1_500)], None).spent_since(&then, 0).expect("a bound");
        assert!(ended >= Duration::from_secs(1) && ended <= two_cpus + ns(500), "20 ended: {ended:?}");
        let began = now(vec![(10, 1_500), (20, 7_000), (30, 9)], None).spent_since(&then, 0);
        assert_eq!(began, Some(ns(2_509)), "30 began");
        // One that began and ended between them, seen only by its hits.
        let unseen = now(vec![(10, 1_500), (20, 7_000)], None).spent_since(&then, 1).expect("a bound");
        assert!(unseen >= Duration::from_secs(1) + ns(2_500) && unseen <= two_cpus + ns(2_500), "{unseen:?}");
        assert_eq!(mark(Vec::new()).spent_since(&mark(Vec::new()), 0), None, "nothing read");
        // `since` counts those in both, for the pace.
        assert_eq!(mark(vec![(10, 1_500)]).since(&then), Some(ns(500)));
        // Two CPUs at 100 ticks a second: 30 busy ticks (idle and iowait
        // left out), 2 ticks on each CPU and 6 more of slack, less
        // tracer's 50 ms.
        let stat = |user: u64, idle: u64| {
            format!("cpu  {user} 1 2 {idle} 7 1 1 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 5\n")
        };
        let machine = |user, idle, own_ms: u64| MachineBusy::parse(&stat(user, idle), 100, own_ms * 1_000_000);
        let then = CpuMark { machine: machine(10, 500, 20), ..then };
        let busy = Duration::from_millis(300 + (2 * 2 + 6) * 10 - 50);
        assert_eq!(now(vec![(10, 1_500)], machine(40, 900, 70)).spent_since(&then, 0), Some(busy), "20 ended");
        assert_eq!(
            now(vec![(10, 1_500), (20, 7_000)], machine(40, 900, 70)).spent_since(&then, 0),
            Some(ns(2_500)),
            "the same: their clocks, the lower"
        );
        // The machine's ticks never bound below the exact clocks of those in
        // both: here they say less than 10 used.
        let idle_machine = now(vec![(10, 900_000_000), (20, 7_000)], machine(10, 900, 20));
        assert_eq!(idle_machine.spent_since(&then, 1), Some(ns(900_000_000 - 1_000 + 2_000)), "{idle_machine:?}");
        assert_eq!(MachineBusy::parse("intr 5\n", 100, 0), None);
        assert!(MachineBusy::read().is_some(), "this machine's /proc/stat");
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
        let then = mark(vec![(10, 1_000), (20, 5_000)]);
        let now = mark(vec![(20, 8_000), (30, 99_000)]);
        assert_eq!(now.since(&then), Some(Duration::from_micros(3)));
        assert_eq!(mark(vec![(30, 1)]).since(&then), None);
        // Our own clock moves as we run.
        let me = std::process::id();
        let a = CpuMark::read(&[me, me]);
        assert_eq!(a.each.len(), 1);
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
