//! The heap census in the production profile: `tracer heap`'s census
//! ([`crate::heap`]) taken on a thread of its own, started at an interval
//! and read at a later one, so that a census never holds up an interval, a
//! signal or a window of the rates. Each census is set against the one
//! before it, type by type ([`heap_of`]).
//!
//! A census reads the whole heap: its CPU time grows with the heap (about
//! 3 ms per MiB read here). It is tracer's CPU time, and the budget covers
//! it ([`super::share`]): the census keeps a credit of [`CENSUS_SHARE`] of
//! the budget of the target's CPU time (or of one CPU's time, whichever is
//! more) and starts one only once the credit covers what the last cost, so
//! that the target has paid for a census before it runs, from the first
//! on (priced before it from the target's resident size,
//! [`PRIOR_NS_PER_BYTE`]). A note says how often that is. Two never
//! overlap, and the thread runs at a lower priority, behind the target.

use std::{
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    time::{Duration, Instant},
};

use super::gcmem::thread_cpu;
use crate::{
    heap::{self, HeapError, model::Census},
    model::{
        Level, Note, NoteCode,
        heap::{Heap, HeapCost, HeapType, OtherTypes, TOP_GROWING, TOP_TYPES},
    },
};

/// The share of the budget the census may take.
pub const CENSUS_SHARE: f64 = 0.5;

/// What a census costs per byte of the target's resident set, before the
/// first has measured it: a census read 8 to 21 MiB of 19 to 33 MiB
/// resident in 28 to 37 ms of CPU time here (pyperformance's benchmarks on
/// Debian's 3.11), about 1.1 to 1.5 ns per resident byte; rounded up.
pub const PRIOR_NS_PER_BYTE: f64 = 1.5;

/// How long the end of a run waits for a census still running (or for
/// one, where the run read none), once the probes are detached: a census
/// of a 1 GiB heap takes about 2 s here.
pub const SUMMARY_WAIT: Duration = Duration::from_secs(10);

/// Censuses that fail one after another before the profile stops taking
/// them.
const FAILURES: u32 = 3;

/// What the census thread sends back.
enum Taken {
    /// The interpreter could not be read at all.
    Unavailable(HeapError),
    Census {
        result: Result<Box<Census>, HeapError>,
        began: Instant,
        cpu: Duration,
    },
}

/// One census, read.
struct Done {
    census: Census,
    taken_s: f64,
    cpu: Duration,
}

/// The census source of one run.
pub struct CensusSource {
    pid: u32,
    /// The census thread's CPU clock, read live.
    clock: Option<libc::clockid_t>,
    requests: Sender<()>,
    results: Receiver<Taken>,
    /// A census requested and not read back yet.
    running: bool,
    /// When the run's probes went live, which `taken_s` counts from.
    started: Instant,
    interval: Duration,
    /// The census's share of the target's CPU time (or of one CPU's).
    allowance: f64,
    /// What the census may still spend of tracer's CPU time, in seconds.
    credit: f64,
    /// What the next census is expected to cost, in seconds: the last
    /// one's, or before the first, the prior.
    expected: f64,
    /// Whether the spacing a measured census leads to was told.
    told: bool,
    /// A census is expected to start every this many intervals.
    every: u32,
    /// The spacing the notes last told of.
    noted: u32,
    first: Option<Done>,
    previous: Option<Done>,
    latest: Option<Done>,
    taken: u64,
    /// The tracer CPU time and bytes read of censuses read since the last
    /// call of [`Self::cost`].
    cpu: Duration,
    bytes: u64,
    failures: u32,
    stopped: bool,
    /// The credit's pace of late: the census earns its share of this many
    /// seconds of CPU time a second (the target's, or one CPU's where
    /// that is more: at least 1).
    pace: f64,
    notes: Vec<Note>,
}

impl CensusSource {
    /// Starts the census thread on `pid`, whose censuses may take `budget`
    /// times [`CENSUS_SHARE`] of its CPU time (or of one CPU's); the first
    /// census comes once the target has paid for it. `None`, with a note,
    /// where no thread could be started.
    pub fn start(
        pid: u32,
        debug_dir: Option<std::path::PathBuf>,
        interval: Duration,
        budget: f64,
    ) -> Result<Self, Note> {
        let (requests, wanted) = mpsc::channel::<()>();
        let (sent, results) = mpsc::channel();
        let options = heap::Options { debug_dir, catch_signals: false, ..heap::Options::default() };
        let spawned = std::thread::Builder::new().name("census".to_owned()).spawn(move || {
            // Behind the target: its CPU time is the budget's, this is
            // tracer's. Best effort.
            // SAFETY: setpriority has no memory-safety preconditions; on
            // Linux PRIO_PROCESS with this thread's ID sets this thread's
            // nice value alone.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::id_t::try_from(libc::gettid()).unwrap_or(0), 10) };
            // Opened here: what it holds is this thread's alone.
            // Its files read, this thread reads only the target's memory
            // and /proc files from now on: it keeps what that needs.
            let opened = heap::Heap::open(pid, &options).and_then(|heap| {
                crate::capabilities::keep_only(crate::capabilities::CENSUS)
                    .map(|()| heap)
                    .map_err(heap::HeapError::from)
            });
            let heap = match opened {
                Ok(heap) => heap,
                Err(e) => {
                    let _ = sent.send(Taken::Unavailable(e));
                    return;
                }
            };
            while wanted.recv().is_ok() {
                let began = Instant::now();
                let cpu = thread_cpu();
                let result = heap.census().map(Box::new);
                let cpu = thread_cpu().saturating_sub(cpu);
                if sent.send(Taken::Census { result, began, cpu }).is_err() {
                    return;
                }
            }
        });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                return Err(Note::new(
                    Level::Warning,
                    NoteCode::Heap,
                    format!("no heap census: cannot start a thread to take it on ({e})"),
                ));
            }
        };
        let source = Self {
            pid,
            clock: cpu_clock(&thread),
            requests,
            results,
            running: false,
            started: Instant::now(),
            interval,
            allowance: budget * CENSUS_SHARE,
            credit: 0.0,
            expected: prior(pid),
            told: false,
            every: 1,
            noted: 1,
            first: None,
            previous: None,
            latest: None,
            taken: 0,
            cpu: Duration::ZERO,
            bytes: 0,
            failures: 0,
            stopped: false,
            pace: 1.0,
            notes: Vec::new(),
        };
        Ok(source)
    }

    /// The run's probes went live at `started`: its first census waits
    /// for the credit, as every other, and a note says for how long at
    /// most.
    pub fn started(&mut self, started: Instant) {
        self.started = started;
        let wait = self.expected / self.allowance.max(f64::MIN_POSITIVE);
        if wait > self.interval.as_secs_f64() {
            self.notes.push(Note::new(
                Level::Note,
                NoteCode::Heap,
                format!(
                    "the first heap census comes once the target has paid for it: in at most {wait:.0} s (a census of this process is priced at {:.0} ms of tracer's CPU from its resident size, and may take {:.2}% of the target's CPU time, half the budget); `tracer heap --pid {}` takes one at once",
                    self.expected * 1e3,
                    self.allowance * 100.0,
                    self.pid
                ),
            ));
        }
        self.every = intervals(wait, self.interval);
    }

    fn request(&mut self) {
        if self.stopped || self.running {
            return;
        }
        if self.requests.send(()).is_ok() {
            self.running = true;
        } else {
            self.stop("the census thread ended".to_owned());
        }
    }

    fn stop(&mut self, why: String) {
        if !self.stopped {
            self.stopped = true;
            self.notes.push(Note::new(Level::Warning, NoteCode::Heap, why));
        }
    }

    /// Reads back a finished census, if there is one.
    fn poll(&mut self) {
        loop {
            match self.results.try_recv() {
                Ok(taken) => self.read(taken),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.running = false;
                    if !self.stopped && self.latest.is_none() {
                        self.stop("no heap census: the census thread ended".to_owned());
                    }
                    self.stopped = true;
                    return;
                }
            }
        }
    }

    fn read(&mut self, taken: Taken) {
        self.running = false;
        match taken {
            Taken::Unavailable(e) => self.stop(format!("no heap census of PID {}: {e}", self.pid)),
            Taken::Census { result: Err(e), cpu, .. } => {
                self.cpu += cpu;
                self.failures += 1;
                let what = format!("the heap census of PID {} failed: {e}", self.pid);
                if matches!(e, HeapError::Exited { .. }) {
                    // The run ends with the target; nothing to retry. The
                    // census it cut short is said, with what is shown.
                    self.stopped = true;
                    let shown = match &self.latest {
                        Some(d) => format!("the heap shown is the last whole census's, taken at {:.1} s", d.taken_s),
                        None => "no census was whole, so no heap is shown".to_owned(),
                    };
                    self.notes.push(Note::new(
                        Level::Warning,
                        NoteCode::Heap,
                        format!("the heap census of PID {} was cut short by its exit: {shown}", self.pid),
                    ));
                } else if matches!(e, HeapError::Exec { .. }) {
                    // The run ends with the program; its heap is gone.
                    self.stop(what);
                } else if self.failures >= FAILURES {
                    self.stop(format!("{what}; {FAILURES} in a row, so no more censuses this run"));
                } else {
                    self.notes.push(Note::new(
                        Level::Warning,
                        NoteCode::Heap,
                        format!("{what}; the next is taken as usual"),
                    ));
                }
            }
            Taken::Census { result: Ok(census), began, cpu } => {
                self.failures = 0;
                self.cpu += cpu;
                self.bytes += census.cost.bytes_read;
                self.taken += 1;
                self.space(cpu);
                let taken_s = began.saturating_duration_since(self.started).as_secs_f64();
                let done = Done { census: *census, taken_s, cpu };
                if self.first.is_none() {
                    self.first = Some(Done { census: done.census.clone(), ..done });
                }
                self.previous = self.latest.replace(done);
            }
        }
    }

    /// Spends the credit on a census that cost `cpu`, which the next is
    /// expected to cost too; a note says when the spacing it leads to
    /// begins, and again where it doubles.
    fn space(&mut self, cpu: Duration) {
        self.credit -= cpu.as_secs_f64();
        self.expected = cpu.as_secs_f64();
    }

    /// Tells the spacing a census that costs `expected` leads to when the
    /// credit grows by `per_interval` an interval: once measured (where it
    /// is over one interval), and again where it doubles.
    fn tell_spacing(&mut self, per_interval: f64) {
        // Not before a census has measured what one costs.
        if self.taken == 0 || per_interval <= 0.0 {
            return;
        }
        let every = intervals(self.expected / per_interval * self.interval.as_secs_f64(), self.interval);
        // Said once measured, and again where it doubles.
        if every > 1 && (!self.told || every >= 2 * self.noted) {
            (self.noted, self.told) = (every, true);
            self.notes.push(Note::new(
                Level::Note,
                NoteCode::Heap,
                format!(
                    "the heap census costs {:.0} ms of tracer's CPU, and may take {:.2}% of the target's CPU time (half the budget): taken about every {every} intervals of {:.2} s from now on; a higher --budget takes it more often",
                    self.expected * 1e3,
                    self.allowance * 100.0,
                    self.interval.as_secs_f64()
                ),
            ));
        }
        self.every = every;
    }

    /// One interval, which lasted `span` and in which the target used
    /// `cpu`: reads back a finished census, adds the census's share of
    /// the interval to its credit, starts the next census when the credit
    /// covers it and none is running, and returns the heap to report.
    pub fn interval(&mut self, span: Duration, cpu: Duration) -> Option<Heap> {
        self.poll();
        let earned = self.allowance * cpu.max(span).as_secs_f64();
        if !span.is_zero() {
            self.pace = cpu.max(span).as_secs_f64() / span.as_secs_f64();
        }
        // Capped at one census: a quiet spell does not buy a burst.
        if self.credit < self.expected {
            self.credit = (self.credit + earned).min(self.expected);
        }
        self.tell_spacing(earned);
        if !self.running && self.credit >= self.expected {
            self.request();
        }
        self.report(false)
    }

    /// The heap the summary reports: the latest census against the run's
    /// first (read once, at the end of the run).
    pub fn summary(&mut self) -> Option<Heap> {
        self.poll();
        // The spacing as the censuses measured it, not as the prior or an
        // interval before the last census had it.
        let wait = self.expected / (self.allowance * self.pace).max(f64::MIN_POSITIVE);
        if self.taken > 0 {
            self.every = intervals(wait, self.interval);
        }
        let heap = self.report(true);
        // One census has nothing to compare with: said, with when a
        // second would come, rather than a bare `-` for every change.
        if let Some(h) = heap.as_ref().filter(|h| h.since_s.is_none()) {
            self.notes.push(Note::new(Level::Note, NoteCode::Heap, one_census(h, wait, self.allowance)));
        }
        heap
    }

    /// Whether a census is running that the summary could wait for.
    pub fn pending(&mut self) -> bool {
        self.poll();
        self.running
    }

    /// Starts a census for the summary where none was ever read and none
    /// is running: a run shorter than the first census's wait takes one
    /// at its end, once its probes are down, over the budget.
    pub fn ensure_one(&mut self) {
        self.poll();
        if self.latest.is_none() {
            self.request();
        }
    }

    /// The CPU time the census thread has used so far: the census's part
    /// of tracer's, which the run loop's is told from.
    #[must_use]
    pub fn thread_cpu(&self) -> Duration {
        self.clock.map_or(Duration::ZERO, super::gcmem::clock_cpu)
    }

    /// The tracer CPU time and bytes read since the last call.
    pub fn cost(&mut self) -> (Duration, u64) {
        (std::mem::take(&mut self.cpu), std::mem::take(&mut self.bytes))
    }

    /// Notes since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    fn report(&self, summary: bool) -> Option<Heap> {
        let latest = self.latest.as_ref()?;
        let since = if summary { self.first.as_ref() } else { self.previous.as_ref() };
        // The run's first census, in the summary: against nothing.
        let since = since.filter(|s| s.taken_s < latest.taken_s);
        Some(heap_of(
            &latest.census,
            since.map(|s| (&s.census, s.taken_s)),
            (self.taken, latest.taken_s, latest.cpu),
            self.every,
        ))
    }
}

/// What the summary says of its one census `heap`, a second coming `wait`
/// seconds after it at the census's `allowance` of the budget.
fn one_census(heap: &Heap, wait: f64, allowance: f64) -> String {
    format!(
        "the run had one heap census (at {:.1} s), so the heap has no changes (`-` in the table): a change needs a second census, which at this budget comes about {wait:.0} s after the first (a census of this process cost {:.0} ms of tracer's CPU, and the censuses may take {:.2}% of the target's CPU time, half the budget); a longer run, or a higher --budget, gives the changes",
        heap.taken_s,
        heap.cost.cpu_ms,
        allowance * 100.0
    )
}

/// The CPU clock of `thread`, which the thread exiting invalidates (a read
/// then fails, and counts as nothing).
fn cpu_clock(thread: &std::thread::JoinHandle<()>) -> Option<libc::clockid_t> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the pthread_t is of a thread this process started and has
    // not joined, and `clock` is a valid place for the result.
    (unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &raw mut clock) } == 0).then_some(clock)
}

/// What a census of `pid` is priced at before the first is measured, in
/// seconds of tracer's CPU time: [`PRIOR_NS_PER_BYTE`] of its resident
/// set (10 ms where that cannot be read).
fn prior(pid: u32) -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "a size priced")]
    crate::heap::maps::rss(pid).ok().flatten().map_or(0.01, |rss| rss as f64 * PRIOR_NS_PER_BYTE / 1e9)
}

/// `wait` seconds in intervals of `interval`, rounded up, at least 1.
fn intervals(wait: f64, interval: Duration) -> u32 {
    let i = interval.as_secs_f64();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a small count of intervals")]
    if i > 0.0 { (wait / i).ceil().clamp(1.0, 1e6) as u32 } else { 1 }
}

/// The reported heap of `census`, taken at `taken_s` as the run's
/// `number`th with `cpu` of tracer's time, against `since` where there is
/// one: the types bounded to the [`TOP_TYPES`] with most bytes and the
/// [`TOP_GROWING`] that grew most besides, the rest summed.
#[must_use]
pub fn heap_of(
    census: &Census,
    since: Option<(&Census, f64)>,
    (number, taken_s, cpu): (u64, f64, Duration),
    every: u32,
) -> Heap {
    let mut rows: Vec<HeapType> = match since {
        Some((before, _)) => heap::model::diff(before, census)
            .into_iter()
            .map(|c| HeapType {
                name: c.name,
                count: c.count,
                bytes: c.bytes,
                count_change: Some(c.count_change),
                bytes_change: Some(c.bytes_change),
            })
            .collect(),
        None => census
            .types
            .iter()
            .map(|t| HeapType {
                name: t.name.clone(),
                count: t.count,
                bytes: t.bytes,
                count_change: None,
                bytes_change: None,
            })
            .collect(),
    };
    // Most bytes first; what went (no bytes) by how much it had.
    rows.sort_by(|a, b| {
        b.bytes.cmp(&a.bytes).then_with(|| a.bytes_change.cmp(&b.bytes_change)).then_with(|| a.name.cmp(&b.name))
    });
    let mut keep = vec![false; rows.len()];
    keep.iter_mut().take(TOP_TYPES).for_each(|k| *k = true);
    let mut growing: Vec<usize> =
        (TOP_TYPES..rows.len()).filter(|&i| rows[i].bytes_change.is_some_and(|c| c > 0)).collect();
    growing.sort_by_key(|&i| std::cmp::Reverse(rows[i].bytes_change));
    for i in growing.into_iter().take(TOP_GROWING) {
        keep[i] = true;
    }
    let mut types = Vec::new();
    let mut other: Option<OtherTypes> = None;
    for (row, keep) in rows.into_iter().zip(keep) {
        if keep {
            types.push(row);
            continue;
        }
        let o = other.get_or_insert_with(|| OtherTypes {
            count_change: since.map(|_| 0),
            bytes_change: since.map(|_| 0),
            ..OtherTypes::default()
        });
        o.types += 1;
        o.count = o.count.saturating_add(row.count);
        o.bytes = o.bytes.saturating_add(row.bytes);
        o.count_change = o.count_change.zip(row.count_change).map(|(a, b)| a.saturating_add(b));
        o.bytes_change = o.bytes_change.zip(row.bytes_change).map(|(a, b)| a.saturating_add(b));
    }
    Heap {
        census: number,
        taken_s,
        since_s: since.map(|(_, s)| s),
        every,
        types,
        other,
        totals: census.totals.clone(),
        partial: census.partial.clone(),
        cost: HeapCost {
            elapsed_ms: census.cost.elapsed_ms,
            cpu_ms: cpu.as_secs_f64() * 1000.0,
            bytes_read: census.cost.bytes_read,
            reads: census.cost.reads,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::model::{Cost, Totals, TypeRow};

    fn census(types: &[(String, u64, u64)]) -> Census {
        Census {
            pid: 1,
            python: "3.11.7".into(),
            image: "python".into(),
            exact: false,
            stopped_ms: None,
            types: types
                .iter()
                .map(|(n, c, b)| TypeRow { name: n.clone(), count: *c, bytes: *b, outside: 0 })
                .collect(),
            totals: Totals { rss: Some(1 << 20), accounted: 1 << 19, unaccounted: Some(1 << 19), ..Totals::default() },
            partial: Vec::new(),
            cost: Cost { elapsed_ms: 5.0, bytes_read: 4096, reads: 2, types_read: 3, failed_reads: 0 },
        }
    }

    #[test]
    fn the_types_are_bounded_and_what_grows_is_kept() {
        // 300 types of 1,000 bytes and more; then one small one that grew.
        let mut before: Vec<(String, u64, u64)> = (0..300).map(|i| (format!("t{i:03}"), 10, 1000 + 300 - i)).collect();
        before.push(("small".into(), 1, 16));
        let mut after = before.clone();
        after[300] = ("small".into(), 101, 516);
        after.push(("new".into(), 2, 32));
        // One that went.
        before.push(("gone".into(), 4, 64));
        let (before, after) = (census(&before), census(&after));
        let h = heap_of(&after, Some((&before, 1.0)), (2, 2.0, Duration::from_millis(3)), 1);
        assert_eq!(h.types.len(), TOP_TYPES + 2, "the top by bytes, and the two that grew besides");
        assert_eq!(h.types[0].name, "t000");
        let small = h.types.iter().find(|t| t.name == "small").unwrap();
        assert_eq!((small.count_change, small.bytes_change), (Some(100), Some(500)));
        let other = h.other.unwrap();
        // 100 of the 300 big ones, and the one that went.
        assert_eq!(
            (other.types, other.count, other.count_change, other.bytes_change),
            (101, 1000, Some(-4), Some(-64))
        );
        let listed: u64 = h.types.iter().map(|t| t.count).sum();
        assert_eq!(listed + other.count, after.types.iter().map(|t| t.count).sum::<u64>());
        assert_eq!((h.census, h.since_s, h.cost.bytes_read), (2, Some(1.0), 4096));
        assert!((h.cost.cpu_ms - 3.0).abs() < 1e-9);
        // The first census: no changes anywhere.
        let first = heap_of(&after, None, (1, 0.1, Duration::ZERO), 1);
        assert!(first.types.iter().all(|t| t.count_change.is_none() && t.bytes_change.is_none()));
        assert_eq!(first.other.map(|o| (o.types, o.count_change)), Some((102, None)));
        let json = serde_json::to_string(&first.types[0]).unwrap();
        assert_eq!(json, r#"{"name":"t000","count":10,"bytes":1300}"#);
    }

    /// The summary's one census says why it has no changes, and when a
    /// second would come.
    #[test]
    fn one_census_says_when_a_second_would_come() {
        let c = census(&[("str".into(), 10, 1000)]);
        let h = heap_of(&c, None, (1, 15.5, Duration::from_millis(222)), 44);
        assert_eq!(h.since_s, None);
        assert_eq!(
            one_census(&h, 222e-3 / 0.005, 0.005),
            "the run had one heap census (at 15.5 s), so the heap has no changes (`-` in the table): a change needs a second census, which at this budget comes about 44 s after the first (a census of this process cost 222 ms of tracer's CPU, and the censuses may take 0.50% of the target's CPU time, half the budget); a longer run, or a higher --budget, gives the changes"
        );
    }
}
