//! GC from memory, the production profile's GC source: each interval,
//! every generation's collections, collected and uncollectable objects,
//! read from the interpreter's own statistics (`generation_stats` in its
//! `struct _gc_runtime_state`, what `gc.get_stats()` returns) with
//! `process_vm_readv`. No probe: one read of 72 bytes costs tracer a few
//! microseconds and the target nothing. How long collections took is not
//! in those statistics; where the GC probes see collections (the markers,
//! or the collection function), their durations go beside the counts.
//!
//! The way there: `_PyRuntime` (exported; found and checked as `tracer
//! stack` does, [`crate::stacks::Process`]) → `interpreters.main` → the
//! interpreter's `gc` (from 3.13 the offset `_Py_DebugOffsets` publishes,
//! checked against the version's table) → `generation_stats`.

use std::time::{Duration, Instant};

use thiserror::Error;

use crate::{
    discover::process::ProgramStamp,
    model::{Gc, GcGeneration},
    plan::gc::GcSource,
    python::{
        self, PythonVersion,
        gc::{GENERATIONS, STATS_FIELDS},
    },
    stacks::{self, StackError, remote::Remote},
};

/// Why the statistics cannot be read.
#[derive(Debug, Error)]
pub enum GcMemoryError {
    #[error(transparent)]
    Stack(#[from] StackError),
    #[error("tracer knows no collector statistics of Python {version}")]
    Unknown { version: PythonVersion },
    #[error(
        "_Py_DebugOffsets of PID {pid} says the interpreter's gc is at {published}, but tracer's table for Python {version} says {table}"
    )]
    Mismatch { pid: u32, version: PythonVersion, published: u64, table: u64 },
    #[error("the collector statistics of PID {pid} at {address:#x} do not look like counts: {values:?}")]
    Implausible { pid: u32, address: u64, values: Vec<u64> },
    #[error("PID {pid} now runs another program (it called exec): its collector is not read")]
    Exec { pid: u32 },
}

/// One generation's statistics, as `gc.get_stats()` gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    pub collections: u64,
    pub collected: u64,
    pub uncollectable: u64,
}

/// The bytes one read takes.
const STATS_BYTES: usize = GENERATIONS * STATS_FIELDS * 8;

/// A count above this is not one (an address, or memory that is not the
/// statistics): 2^48 collections would take centuries.
const MAX_COUNT: u64 = 1 << 48;

/// The statistics of one process, since the attach.
#[derive(Debug)]
pub struct GcMemory {
    remote: Remote,
    pid: u32,
    /// The program the address is of: another one exec'd is not read.
    stamp: Option<ProgramStamp>,
    address: u64,
    at_attach: [GenStats; GENERATIONS],
    last: [GenStats; GENERATIONS],
    /// What the indices are, where not generations.
    caveat: Option<&'static str>,
    /// Reads refused: a count went back, or did not look like one. The
    /// last good reading stands.
    pub rejected: u64,
    /// Reads that failed (the memory unreadable: the process ending, or
    /// unmapped), each counted; the last good reading stands.
    pub failed: u64,
    /// Of those, the ones since the last good reading: where there are
    /// any, collections after that reading are not in the counts.
    failed_since: u64,
    /// When the probes went live (what the times are since), and when
    /// the last good reading was taken.
    started: Instant,
    last_good: Instant,
    /// Reads made, their bytes and the CPU time tracer spent on them.
    pub reads: u64,
    pub cpu: Duration,
}

impl GcMemory {
    /// Finds the statistics of `pid`'s main interpreter and reads them
    /// once, as the base later reads count from.
    pub fn open(pid: u32) -> Result<Self, GcMemoryError> {
        let stamp = ProgramStamp::of(pid);
        let process = stacks::Process::open(pid)?;
        let version = process.version;
        let abi = python::abi_for(pid, version).map_err(StackError::from)?;
        let state = python::gc_knowledge(abi).ok_or(GcMemoryError::Unknown { version })?.state;
        let remote = Remote::open(pid);
        // `struct pyinterpreters { mutex; head; main; next_id }`: `main`
        // follows `head` (a pointer, or 3.13's PyMutex padded to 8), in
        // Include/internal/pycore_runtime.h at v3.11.7, v3.12.1, v3.13.0,
        // and pycore_runtime_structs.h at v3.14.8.
        let main_at = process.runtime + abi.frames().runtime.interpreters_head + 8;
        let main = remote.u64(main_at, "_PyRuntime.interpreters.main")?;
        if main == 0 {
            return Err(StackError::NoInterpreter { pid }.into());
        }
        let interp_gc = match abi.debug_offsets_layout() {
            None => state.interp_gc,
            Some(layout) => {
                let bytes = remote.bytes(process.runtime, layout.size(), "_Py_DebugOffsets")?;
                match layout.read(&bytes, "interpreter_state.gc") {
                    Some(published) if published == state.interp_gc => published,
                    Some(published) => {
                        return Err(GcMemoryError::Mismatch { pid, version, published, table: state.interp_gc });
                    }
                    None => state.interp_gc,
                }
            }
        };
        let address = main + interp_gc + state.generation_stats;
        let mut gc = Self {
            remote,
            pid,
            stamp,
            address,
            at_attach: [GenStats::default(); GENERATIONS],
            last: [GenStats::default(); GENERATIONS],
            caveat: state.caveat(version.micro),
            rejected: 0,
            failed: 0,
            failed_since: 0,
            started: Instant::now(),
            last_good: Instant::now(),
            reads: 0,
            cpu: Duration::ZERO,
        };
        let first = gc.read_once()?;
        (gc.at_attach, gc.last) = (first, first);
        Ok(gc)
    }

    /// As [`Self::open`], for an interpreter that was not initialised yet
    /// when the probes went live (`tracer run`'s): every collection it
    /// made is since then.
    pub fn open_initialised_since(pid: u32) -> Result<Self, GcMemoryError> {
        let mut gc = Self::open(pid)?;
        gc.at_attach = [GenStats::default(); GENERATIONS];
        Ok(gc)
    }

    /// The probes went live at `started`: the times reported are since.
    pub fn set_started(&mut self, started: Instant) {
        self.started = started;
    }

    /// Whether `e` says the interpreter is not initialised (yet).
    #[must_use]
    pub const fn not_initialised(e: &GcMemoryError) -> bool {
        matches!(e, GcMemoryError::Stack(StackError::NoInterpreter { .. }))
    }

    /// The process read.
    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// The bytes read so far.
    #[must_use]
    pub const fn bytes_read(&self) -> u64 {
        self.reads * STATS_BYTES as u64
    }

    fn read_once(&mut self) -> Result<[GenStats; GENERATIONS], GcMemoryError> {
        if self.stamp.is_some_and(|s| s.changed(self.pid)) {
            return Err(GcMemoryError::Exec { pid: self.pid });
        }
        let started = thread_cpu();
        let bytes = self.remote.bytes(self.address, STATS_BYTES, "the collector's generation_stats");
        self.reads += 1;
        self.cpu += thread_cpu().saturating_sub(started);
        let values: Vec<u64> =
            bytes?.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect();
        if values.iter().any(|&v| v >= MAX_COUNT) {
            return Err(GcMemoryError::Implausible { pid: self.pid, address: self.address, values });
        }
        let mut out = [GenStats::default(); GENERATIONS];
        for (g, fields) in out.iter_mut().zip(values.chunks_exact(STATS_FIELDS)) {
            *g = GenStats { collections: fields[0], collected: fields[1], uncollectable: fields[2] };
        }
        Ok(out)
    }

    /// Reads the statistics now; a reading in which a count went back is
    /// refused (counted in `rejected`) and the last good one stands. An
    /// error is the process's end, or memory that is not the statistics.
    pub fn read(&mut self) -> Result<(), GcMemoryError> {
        let now = match self.read_once() {
            Ok(now) => now,
            Err(e @ GcMemoryError::Implausible { .. }) => {
                self.rejected += 1;
                return Err(e);
            }
            Err(e) => {
                self.failed += 1;
                self.failed_since += 1;
                return Err(e);
            }
        };
        (self.failed_since, self.last_good) = (0, Instant::now());
        let back = now.iter().zip(&self.last).any(|(n, l)| {
            n.collections < l.collections || n.collected < l.collected || n.uncollectable < l.uncollectable
        });
        if back {
            self.rejected += 1;
        } else {
            self.last = now;
        }
        Ok(())
    }

    /// Whether the GC probes (`probes`, their report) count every
    /// collection, by the statistics' generations: then a reading that
    /// failed loses nothing, the probes' counts standing in for it.
    #[must_use]
    pub fn probes_cover(&self, probes: Option<&Gc>) -> bool {
        let durations = probes.map_or(GcSource::None, |p| p.source);
        matches!(durations, GcSource::Markers | GcSource::Function) && self.caveat.is_none()
    }

    /// The readings that failed, as `(not covered, covered)` by the GC
    /// probes (`probes`, their report): `stats.gc_memory_failed` and
    /// `stats.gc_memory_failed_covered`.
    #[must_use]
    pub fn failed(&self, probes: Option<&Gc>) -> (u64, u64) {
        if self.probes_cover(probes) { (0, self.failed) } else { (self.failed, 0) }
    }

    /// The collections since the attach, by generation, from memory, with
    /// the durations the GC probes measured (`probes`, their report) where
    /// they see collections.
    #[must_use]
    pub fn report(&self, probes: Option<&Gc>) -> Gc {
        let durations = probes.map_or(GcSource::None, |p| p.source);
        // The probes see every collection they time, by the same
        // generations as the statistics (where those are generations):
        // where they saw more than the last good reading, the statistics
        // are behind (the process ended, or its memory went, before the
        // next reading), and the probes' count is the nearer.
        let whole = self.probes_cover(probes);
        let mut past = Vec::new();
        let generations = (0..GENERATIONS)
            .map(|g| {
                let (now, then) = (self.last[g], self.at_attach[g]);
                let since = now.uncollectable - then.uncollectable;
                let generation = u32::try_from(g).ok();
                let seen = probes.and_then(|p| p.generations.iter().find(|s| s.generation == generation));
                // Found unreachable, as gc__done and gc.collect() count
                // them: gc.get_stats()'s collected and uncollectable.
                let (mut collections, mut collected) =
                    (now.collections - then.collections, now.collected - then.collected + since);
                let mut uncollectable = Some(since);
                if let Some(s) = seen.filter(|s| whole && s.collections > collections) {
                    past.push(format!("gen {g}: {} more", s.collections - collections));
                    // The probes see what was found unreachable, not
                    // which of it was uncollectable.
                    (collections, collected, uncollectable) = (s.collections, collected.max(s.collected), None);
                }
                GcGeneration {
                    generation,
                    collections,
                    duration_s: if durations == GcSource::None { None } else { seen.and_then(|s| s.duration_s) },
                    collected,
                    uncollectable,
                    collections_per_s: None,
                }
            })
            .collect();
        let probes_past_memory = (!past.is_empty()).then(|| {
            format!(
                "the GC probes counted collections after the collector's statistics were last read ({}): those generations' collections and unreachable objects are the probes' counts, and which of those were uncollectable is not known; the statistics could not be read again ({} reads failed: the process ended, or its memory could not be read; {} readings refused)",
                past.join(", "),
                self.failed,
                self.rejected
            )
        });
        let why_no_durations = match (durations, probes) {
            (GcSource::None, Some(p)) => p.reason.clone().map(|r| format!("no durations: {r}")),
            (GcSource::None, None) => Some("no durations: the GC probes are off (--gc off)".to_owned()),
            _ => None,
        };
        let reason = [self.caveat.map(str::to_owned), why_no_durations].into_iter().flatten().collect::<Vec<_>>();
        // Readings failed since the last good one, and no probe counts
        // what came after it: those collections are missing, and said so.
        let last_read_s = (self.failed_since > 0 && !whole)
            .then(|| self.last_good.saturating_duration_since(self.started).as_secs_f64());
        let unread = last_read_s.map(|at| {
            let why = if durations == GcSource::None {
                "no GC probe counts them (this build has no GC markers, or --gc off); --gc function counts every collection, at a trap each, or a shorter --interval reads closer to the end"
            } else {
                "the GC probes' counts are not by the statistics' generations; a shorter --interval reads closer to the end"
            };
            let failed = match self.failed_since {
                1 => "the reading since failed".to_owned(),
                n => format!("the {n} readings since failed"),
            };
            format!(
                "collections after the statistics' last reading, at {at:.1} s, are NOT counted: {failed} (the process ended, or its memory could not be read), and {why}"
            )
        });
        Gc {
            source: GcSource::Memory,
            reason: (!reason.is_empty()).then(|| reason.join("; ")),
            durations: Some(durations),
            generations,
            pids: indexmap::IndexMap::new(),
            probes_past_memory,
            last_read_s,
            unread,
        }
    }
}

/// This thread's CPU time: what a read costs tracer.
pub(super) fn thread_cpu() -> Duration {
    clock_cpu(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// tracer's CPU time, every thread's.
pub(super) fn process_cpu() -> Duration {
    clock_cpu(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The time of the CPU clock `clock`; 0 where it cannot be read.
pub(super) fn clock_cpu(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(clock, &raw mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    /// Two readings' worth of a process's statistics, `at_attach` and
    /// `last`, with `failed` readings failed in all and `since` since the
    /// last good one.
    fn reading(
        (at_attach, last): ([GenStats; GENERATIONS], [GenStats; GENERATIONS]),
        (failed, failed_since): (u64, u64),
    ) -> GcMemory {
        GcMemory {
            stamp: None,
            remote: Remote::open(std::process::id()),
            pid: 1,
            address: 0,
            at_attach,
            last,
            caveat: None,
            rejected: 0,
            failed,
            failed_since,
            started: Instant::now(),
            last_good: Instant::now(),
            reads: 2,
            cpu: Duration::ZERO,
        }
    }
    use super::*;

    #[test]
    fn a_failed_read_is_counted_and_the_last_reading_stands() {
        let stats = |c| GenStats { collections: c, collected: 0, uncollectable: 0 };
        let mut gc = GcMemory {
            stamp: None,
            remote: Remote::open(std::process::id()),
            pid: std::process::id(),
            // The first page: never mapped.
            address: 0x10,
            at_attach: [stats(1); GENERATIONS],
            last: [stats(2); GENERATIONS],
            caveat: None,
            rejected: 0,
            failed: 0,
            failed_since: 0,
            started: Instant::now(),
            last_good: Instant::now(),
            reads: 0,
            cpu: Duration::ZERO,
        };
        assert!(gc.read().is_err());
        assert!(gc.read().is_err());
        assert_eq!((gc.failed, gc.rejected, gc.reads), (2, 0, 2));
        assert_eq!(gc.last, [stats(2); GENERATIONS]);
        // Without GC probes, the collections after the last good reading
        // are not counted, and the report says so, with when it was.
        let report = gc.report(None);
        let at = report.last_read_s.expect("the last reading's time");
        assert!((0.0..60.0).contains(&at), "{at}");
        let why = report.unread.expect("said");
        assert!(
            why.starts_with(&format!(
                "collections after the statistics' last reading, at {at:.1} s, are NOT counted: the 2 readings since failed"
            )),
            "{why}"
        );
        assert!(why.contains("--gc function counts every collection"), "{why}");
        assert_eq!(gc.failed(None), (2, 0));
        // A good reading (this process's own memory, counts that went up)
        // ends the gap: nothing is said, the failures still counted.
        let own: [u64; GENERATIONS * STATS_FIELDS] = [3; GENERATIONS * STATS_FIELDS];
        gc.address = own.as_ptr() as u64;
        gc.read().expect("a good reading");
        assert_eq!(
            (gc.failed, gc.failed_since, gc.last),
            (2, 0, [GenStats { collections: 3, collected: 3, uncollectable: 3 }; GENERATIONS])
        );
        let report = gc.report(None);
        assert_eq!((report.last_read_s, report.unread), (None, None));
    }

    /// Where the GC probes count every collection (the markers), a failed
    /// reading loses nothing: it is counted as covered, not as failed, and
    /// the probes' counts stand in.
    #[test]
    fn a_failed_reading_the_probes_covered_is_not_a_failure() {
        let gc = reading(([GenStats::default(); GENERATIONS], [GenStats::default(); GENERATIONS]), (1, 1));
        let probes = |source| Gc {
            source,
            reason: None,
            durations: None,
            generations: Vec::new(),
            pids: indexmap::IndexMap::new(),
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
        };
        for source in [GcSource::Markers, GcSource::Function] {
            assert_eq!(gc.failed(Some(&probes(source))), (0, 1), "{source:?}");
            let report = gc.report(Some(&probes(source)));
            assert_eq!((report.last_read_s, report.unread), (None, None), "{source:?}");
        }
        assert_eq!(gc.failed(Some(&probes(GcSource::None))), (1, 0));
        assert!(gc.report(Some(&probes(GcSource::None))).unread.is_some());
        // Not by the statistics' generations (3.14's increments): the
        // probes do not stand in.
        let odd = GcMemory { caveat: Some("not generations"), ..gc };
        assert_eq!(odd.failed(Some(&probes(GcSource::Markers))), (1, 0));
        let why = odd.report(Some(&probes(GcSource::Markers))).unread.expect("said");
        assert!(why.ends_with("the GC probes' counts are not by the statistics' generations; a shorter --interval reads closer to the end"), "{why}");
    }

    #[test]
    fn report_counts_since_the_attach_with_the_probes_durations() {
        let stats = |c, d, u| GenStats { collections: c, collected: d, uncollectable: u };
        let gc = reading(
            ([stats(10, 100, 1), stats(2, 5, 0), stats(1, 0, 0)], [stats(15, 130, 3), stats(2, 5, 0), stats(4, 70, 0)]),
            (0, 0),
        );
        let probes = Gc {
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
            source: GcSource::Markers,
            reason: None,
            durations: None,
            generations: vec![GcGeneration {
                generation: Some(2),
                collections: 3,
                duration_s: Some(0.5),
                collected: 70,
                uncollectable: None,
                collections_per_s: None,
            }],
            pids: indexmap::IndexMap::new(),
        };
        let report = gc.report(Some(&probes));
        assert_eq!(
            (report.source, report.durations, report.reason.as_deref()),
            (GcSource::Memory, Some(GcSource::Markers), None)
        );
        let got: Vec<_> =
            report.generations.iter().map(|g| (g.collections, g.collected, g.uncollectable, g.duration_s)).collect();
        assert_eq!(got, [(5, 32, Some(2), None), (0, 0, Some(0), None), (3, 70, Some(0), Some(0.5))]);
        let off = gc.report(None);
        assert_eq!(off.durations, Some(GcSource::None));
        assert_eq!(off.reason.as_deref(), Some("no durations: the GC probes are off (--gc off)"));
        assert_eq!(gc.bytes_read(), 144);
        assert_eq!(report.probes_past_memory, None);
    }

    #[test]
    fn collections_the_probes_counted_past_the_last_reading_are_the_probes() {
        // The process ended after the statistics' last reading: its last
        // collections are the markers' alone.
        let stats = |c, d| GenStats { collections: c, collected: d, uncollectable: 0 };
        let gc =
            reading(([stats(10, 100), stats(2, 5), stats(1, 0)], [stats(10, 100), stats(2, 5), stats(1, 0)]), (1, 1));
        let seen = |generation, collections, collected| GcGeneration {
            generation: Some(generation),
            collections,
            duration_s: Some(0.25),
            collected,
            uncollectable: None,
            collections_per_s: None,
        };
        let probes = Gc {
            source: GcSource::Markers,
            reason: None,
            durations: None,
            generations: vec![seen(0, 50, 0), seen(1, 0, 0), seen(2, 1, 7)],
            pids: indexmap::IndexMap::new(),
            probes_past_memory: None,
            last_read_s: None,
            unread: None,
        };
        let report = gc.report(Some(&probes));
        let got: Vec<_> = report.generations.iter().map(|g| (g.collections, g.collected, g.uncollectable)).collect();
        assert_eq!(got, [(50, 0, None), (0, 0, Some(0)), (1, 7, None)]);
        let why = report.probes_past_memory.expect("said");
        assert!(why.starts_with("the GC probes counted collections after the collector's statistics were last read (gen 0: 50 more, gen 2: 1 more)"), "{why}");
        assert!(why.contains("(1 reads failed"), "{why}");
        // Without durations the probes count nothing: the statistics stand.
        let none = Gc { source: GcSource::None, ..probes.clone() };
        let report = gc.report(Some(&none));
        assert_eq!(report.generations[0].collections, 0);
        assert_eq!(report.probes_past_memory, None);
        // Nor where the statistics' indices are not generations (3.14's
        // increments).
        let odd = GcMemory { caveat: Some("not generations"), ..gc };
        assert_eq!(odd.report(Some(&probes)).generations[0].collections, 0);
    }
}
