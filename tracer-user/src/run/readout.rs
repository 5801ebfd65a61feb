//! Reading the session's counts and filling the model's [`Snapshot`]s,
//! and, with `--exe`, the lifetime of each traced process: once a process
//! has exited, its counts are read one last time, kept here, and its
//! entries leave the kernel maps, so that the maps do not fill up over a
//! long run and a later process given the same PID starts from zero.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use indexmap::IndexMap;

use tracer_common::{gc::GcTotals, stats::Stat};

use crate::{
    discover::process::Pidfd,
    kernel::batch::Fallbacks,
    kernel::{AttachError, Session, maps::ProbeReading},
    model::{self, Counts, ExitedProcess, LateModule, Level, Note, NoteCode, ProbeCounts, Snapshot},
    plan::{Plan, gc::GcSource},
};

/// A traced process that exited, with its final counts by slot.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Exited {
    pid: u32,
    at: Duration,
    probes: Vec<ProbeReading>,
    /// With `--types`: its creations and destructions by type address.
    types: BTreeMap<u64, tracer_common::types::TypeCounts>,
    /// With `--stacks`: its counts per stack.
    stacks: Vec<(tracer_common::stack::StackKey, tracer_common::counter::Counter)>,
    /// Its garbage collections by generation.
    gc: BTreeMap<i32, GcTotals>,
}

/// Counts of every process traced so far, exited ones included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Per probe, by slot.
    pub probes: Vec<ProbeReading>,
    /// Per process, by slot: the live ones and those that exited (a PID
    /// two processes had in turn adds both).
    pub per_process: BTreeMap<u32, Vec<ProbeReading>>,
    /// The processes with entries in the maps at this read, not yet found
    /// exited: those whose CPU time is worth reading.
    pub live: Vec<u32>,
    /// With `--types`: per process, creations and destructions by type
    /// address.
    pub types: BTreeMap<u32, BTreeMap<u64, tracer_common::types::TypeCounts>>,
    /// Calls and bytes by size bucket (see [`tracer_common::sizes`]).
    pub sizes: Vec<tracer_common::counter::Counter>,
    /// With `--stacks`: counts per (process, probe, stack), exited
    /// processes' included.
    pub stacks: Vec<(tracer_common::stack::StackKey, tracer_common::counter::Counter)>,
    /// One per BPF-side stat.
    pub stats: Vec<u64>,
    pub kernel_misses: u64,
    /// The reads of tracer's maps that fell back to a key at a time.
    pub batch_fallbacks: crate::kernel::batch::Fallbacks,
    /// Per process, garbage collections by generation.
    pub gc: BTreeMap<u32, BTreeMap<i32, GcTotals>>,
    /// With `--live`, what the live table did per domain.
    pub live_table: Vec<tracer_common::live::LiveCounts>,
}

/// Reads a session's counts, keeping those of exited processes.
pub struct Readout {
    started: Instant,
    /// Whether processes come and go (`--exe`): with `--pid` the run ends
    /// when the one process does.
    reap: bool,
    /// Processes seen in the maps, by PID, while they live.
    watched: HashMap<u32, Pidfd>,
    /// Processes seen gone at the last read: their counts are final at
    /// the next.
    gone: Vec<u32>,
    exited: Vec<Exited>,
    /// Processes whose pidfd could not be opened, with why: they are tried
    /// again at each read, and the run loop tells the user once.
    unwatched: Vec<(u32, String)>,
    /// Every process put in `unwatched` once, so it is told once.
    told: std::collections::HashSet<u32>,
    /// Whether the map reads that fell back to a key at a time were told:
    /// for want of the kernel's batch lookup, and for a busy bucket.
    told_batch: (bool, bool),
    /// With `--types`: the names of the types counted.
    type_names: Option<super::types::TypeNames>,
    /// With `--stacks`: where each process's frames are, and its stacks'
    /// names.
    pub stack_names: Option<super::stacks::StackNames>,
    /// Where garbage collections are seen from, and why not or what the
    /// counts hold beyond them; `None` with `--gc off`.
    gc: Option<(GcSource, Option<String>)>,
    /// With `--live`, the live table's room.
    pub live: Option<u32>,
}

impl Readout {
    /// With `types`, the snapshots list creations by type, named as
    /// `types` says.
    #[must_use]
    pub fn new(started: Instant, reap: bool, types: Option<crate::python::ObjectOffsets>) -> Self {
        Self {
            type_names: types.map(super::types::TypeNames::new),
            stack_names: None,
            started,
            reap,
            watched: HashMap::new(),
            gone: Vec::new(),
            exited: Vec::new(),
            unwatched: Vec::new(),
            told: std::collections::HashSet::new(),
            told_batch: (false, false),
            gc: None,
            live: None,
        }
    }

    /// Makes the snapshots report garbage collections, seen from `source`,
    /// with `reason` (why not, or what the counts hold beyond them).
    pub fn report_gc(&mut self, source: GcSource, reason: Option<String>) {
        self.gc = Some((source, reason));
    }

    /// Processes tracer could not watch for exit since the last call, with
    /// why: their entries stay in the maps until they can be.
    pub fn take_unwatched(&mut self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.unwatched)
    }

    /// The first map read that fell back to a key at a time for each
    /// reason, as a note (once each; `stats` counts every one).
    pub fn batch_notes(&mut self) -> Vec<Note> {
        batch_notes(crate::kernel::batch::fallbacks(), &mut self.told_batch)
    }

    /// Removes exited process `pid`'s entries from the maps, and its reader
    /// of frames.
    fn remove(&mut self, session: &mut Session, pid: u32) -> Result<(), AttachError> {
        if let Some(names) = self.stack_names.as_mut() {
            names.forget(pid);
        }
        session.remove_process(pid)
    }

    /// Watches `pid` for its exit, from its first reading on.
    fn watch(&mut self, pid: u32) {
        if self.watched.contains_key(&pid) || self.gone.contains(&pid) {
            return;
        }
        match Pidfd::open(pid) {
            // Exited between its hits and now: its counts are final at the
            // next read.
            Ok(Some(fd)) if fd.exited() => self.gone.push(pid),
            Ok(Some(fd)) => {
                self.watched.insert(pid, fd);
            }
            Ok(None) => self.gone.push(pid),
            Err(e) => {
                if self.told.insert(pid) {
                    self.unwatched.push((pid, e.to_string()));
                }
                if let Some(names) = self.stack_names.as_mut() {
                    names.give_up(pid);
                }
            }
        }
    }

    /// Reads every count. With `reap`, a process found exited before this
    /// read (by its pidfd, at this read or, if it exited before tracer
    /// could open one, at the last) has its final counts taken from this
    /// one, since nothing can change them after its exit, and its entries
    /// removed.
    pub fn read(&mut self, session: &mut Session) -> Result<Totals, AttachError> {
        if self.reap {
            self.gone.extend(self.watched.iter().filter(|(_, fd)| fd.exited()).map(|(pid, _)| *pid));
        }
        let readings = session.read()?;
        let mut live = readings.per_process;
        let mut live_types = readings.types;
        let mut live_stacks = readings.stacks;
        let mut live_gc = readings.gc;
        if self.reap {
            let at = self.started.elapsed();
            for pid in std::mem::take(&mut self.gone) {
                self.watched.remove(&pid);
                let gc = live_gc.remove(&pid).unwrap_or_default();
                if let Some(probes) = live.remove(&pid) {
                    let types = live_types.remove(&pid).unwrap_or_default();
                    let (stacks, rest) = live_stacks.into_iter().partition(|(k, _)| k.tgid == pid);
                    live_stacks = rest;
                    self.exited.push(Exited { pid, at, probes, types, stacks, gc });
                } else if !gc.is_empty() {
                    // Collections without a hit of any other probe.
                    let probes = vec![ProbeReading::default(); readings.probes.len()];
                    let (types, stacks) = (BTreeMap::new(), Vec::new());
                    self.exited.push(Exited { pid, at, probes, types, stacks, gc });
                }
                self.remove(session, pid)?;
            }
            // A process that only collected has no other entry to be seen by.
            let seen: std::collections::BTreeSet<u32> = live.keys().chain(live_gc.keys()).copied().collect();
            for pid in seen {
                self.watch(pid);
            }
        }
        let slots = readings.probes.len();
        let live_pids: Vec<u32> = live.keys().copied().filter(|pid| !self.gone.contains(pid)).collect();
        if let Some(names) = self.type_names.as_mut() {
            names.learn(&live_types, &live_pids);
        }
        if let Some(names) = self.stack_names.as_mut() {
            for &pid in &live_pids {
                names.prepare(session, pid)?;
            }
            names.learn(session, &live_stacks, &live_pids);
        }
        let mut stacks = live_stacks;
        stacks.extend(self.exited.iter().flat_map(|e| e.stacks.iter().copied()));
        let mut types = live_types;
        for e in &self.exited {
            let merged = types.entry(e.pid).or_default();
            for (&address, &counts) in &e.types {
                let total = merged.entry(address).or_default();
                *total = total.merged(counts);
            }
        }
        let mut gc = live_gc;
        for e in &self.exited {
            let merged = gc.entry(e.pid).or_default();
            for (&generation, &totals) in &e.gc {
                let total = merged.entry(generation).or_default();
                *total = total.merged(totals);
            }
        }
        let mut per_process = live;
        for e in &self.exited {
            let merged = per_process.entry(e.pid).or_insert_with(|| vec![ProbeReading::default(); slots]);
            for (total, own) in merged.iter_mut().zip(&e.probes) {
                *total = total.merged(*own);
            }
        }
        let mut probes = vec![ProbeReading::default(); slots];
        for counts in per_process.values() {
            for (total, own) in probes.iter_mut().zip(counts) {
                *total = total.merged(*own);
            }
        }
        Ok(Totals {
            probes,
            per_process,
            live: live_pids,
            types,
            sizes: readings.sizes,
            stacks,
            stats: readings.stats,
            kernel_misses: readings.kernel_misses,
            batch_fallbacks: readings.batch_fallbacks,
            gc,
            live_table: readings.live,
        })
    }

    /// The model's snapshot of `totals` for `plan`, taken now.
    #[must_use]
    pub fn snapshot(&self, plan: &Plan, totals: &Totals, late_modules: &[LateModule]) -> Snapshot {
        let name_of = |slot: usize| plan.probes.get(slot).map_or("?", |p| p.symbol).to_owned();
        let per_probe = |counts: &[ProbeReading]| -> IndexMap<String, Counts> {
            counts
                .iter()
                .enumerate()
                .map(|(slot, c)| (name_of(slot), Counts { calls: c.calls, bytes: c.bytes }))
                .collect()
        };
        let probes = plan
            .probes
            .iter()
            .map(|p| {
                let c = usize::try_from(p.slot).ok().and_then(|s| totals.probes.get(s)).copied().unwrap_or_default();
                let returned = p.returns.as_ref().map(|_| model::Returned {
                    returns: c.returned.returns,
                    null: c.returned.null,
                    pointer_sum: c.returned.pointer_sum,
                });
                let nested = (!p.nested_sites.is_empty())
                    .then_some(model::Counts { calls: c.nested.calls, bytes: c.nested.bytes });
                let counts = ProbeCounts {
                    calls: c.calls,
                    bytes: c.bytes,
                    nested,
                    returned,
                    gate_other: c.gate_other,
                    stepped_hits: p.stepped_apart().then_some(c.stepped),
                    estimate: None,
                    calls_per_s: None,
                    bytes_per_s: None,
                };
                (p.symbol.to_owned(), counts)
            })
            .collect();
        Snapshot {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            probes,
            pids: totals.per_process.iter().map(|(pid, counts)| (pid.to_string(), per_probe(counts))).collect(),
            stats: Snapshot::stats_from(&totals.stats, totals.kernel_misses, totals.batch_fallbacks),
            late_modules: late_modules.to_vec(),
            exited: self
                .exited
                .iter()
                .map(|e| ExitedProcess { pid: e.pid, exited_s: e.at.as_secs_f64(), probes: per_probe(&e.probes) })
                .collect(),
            hits: Some(totals.probes.iter().map(ProbeReading::hits).sum()),
            types: self.type_names.as_ref().map(|n| n.counts(&totals.types)),
            sizes: sizes(plan, totals),
            live: self.live.map(|capacity| {
                let stat = |s: Stat| totals.stats.get(s as usize).copied().unwrap_or(0);
                let lost = (stat(Stat::LivePendingFull), stat(Stat::LiveUnmatched));
                super::live::report(plan, &totals.live_table, (capacity, lost.0, lost.1))
            }),
            gc: self.gc.as_ref().map(|(source, reason)| {
                let pids = if self.reap {
                    totals
                        .gc
                        .iter()
                        .map(|(pid, own)| (pid.to_string(), generations(*source, std::iter::once(own))))
                        .collect()
                } else {
                    IndexMap::new()
                };
                model::Gc {
                    source: *source,
                    reason: reason.clone(),
                    durations: None,
                    generations: generations(*source, totals.gc.values()),
                    pids,
                    probes_past_memory: None,
                    last_read_s: None,
                    unread: None,
                }
            }),
            ..self.stacks_of(plan, totals)
        }
    }

    /// With `--stacks`, the snapshot's sites, stacks and their coverage.
    fn stacks_of(&self, plan: &Plan, totals: &Totals) -> Snapshot {
        let Some(names) = &self.stack_names else { return Snapshot::default() };
        let stacks = names.stacks(plan, &totals.stacks);
        let slots: std::collections::BTreeSet<u32> = totals.stacks.iter().map(|(k, _)| k.slot).collect();
        let events = plan
            .probes
            .iter()
            .filter(|p| names.has_stacks(p.slot) || slots.contains(&p.slot))
            .filter_map(|p| totals.probes.get(usize::try_from(p.slot).ok()?))
            .map(|c| c.calls)
            .sum();
        Snapshot {
            sites: Some(names.sites(&stacks)),
            stack_coverage: Some(names.coverage(events, &stacks)),
            native_modules: names.native_modules(),
            stacks: Some(stacks),
            ..Snapshot::default()
        }
    }
}

/// The collections of `processes`, by generation: 0, 1 and 2 always (none
/// where nothing is probed), then the others seen, the unknown one last.
fn generations<'a>(
    source: GcSource,
    processes: impl Iterator<Item = &'a BTreeMap<i32, GcTotals>>,
) -> Vec<model::GcGeneration> {
    let mut by_generation: BTreeMap<i32, GcTotals> = BTreeMap::new();
    if source != GcSource::None {
        by_generation.extend((0..3).map(|g| (g, GcTotals::default())));
    }
    for totals in processes {
        for (&generation, &t) in totals {
            let total = by_generation.entry(generation).or_default();
            *total = total.merged(t);
        }
    }
    let mut generations: Vec<model::GcGeneration> = by_generation
        .into_iter()
        .map(|(generation, t)| model::GcGeneration {
            generation: u32::try_from(generation).ok(),
            collections: t.collections,
            #[allow(clippy::cast_precision_loss, reason = "seconds from nanoseconds")]
            duration_s: Some(t.duration_ns as f64 / 1e9),
            collected: t.collected,
            uncollectable: None,
            collections_per_s: None,
        })
        .collect();
    // Known generations in order, then the unknown one.
    generations.sort_by_key(|g| g.generation.map_or((1, 0), |n| (0, n)));
    generations
}

/// The size histograms of `totals`, with the calls of each domain that are
/// in no bucket; `None` when `plan` probes no allocating function.
fn sizes(plan: &Plan, totals: &Totals) -> Option<model::Sizes> {
    use tracer_common::sizes::{BUCKETS, Domain, bounds, index};
    let allocating: Vec<(Domain, usize)> =
        plan.probes.iter().filter_map(|p| Some((p.domain?, usize::try_from(p.slot).ok()?))).collect();
    if allocating.is_empty() {
        return None;
    }
    let mut out = model::Sizes::default();
    for domain in Domain::ALL {
        let buckets: Vec<[u64; 4]> = (0..BUCKETS)
            .filter_map(|b| {
                let c = totals.sizes.get(usize::try_from(index(domain as u32, b)).ok()?)?;
                let (lo, hi) = bounds(b);
                (c.calls > 0).then_some([lo, hi, c.calls, c.bytes])
            })
            .collect();
        let bucketed: u64 = buckets.iter().map(|b| b[2]).sum();
        let calls: u64 = allocating
            .iter()
            .filter(|(d, _)| *d == domain)
            .filter_map(|(_, slot)| totals.probes.get(*slot))
            .map(|c| c.calls)
            .sum();
        if calls > bucketed {
            out.unsized_calls.insert(domain.name().to_owned(), calls - bucketed);
        }
        match domain {
            Domain::Object => out.object = buckets,
            Domain::Mem => out.mem = buckets,
            Domain::Raw => out.raw = buckets,
            Domain::Native => out.native = allocating.iter().any(|(d, _)| *d == Domain::Native).then_some(buckets),
        }
    }
    Some(out)
}

/// The notes of the map reads in `fallbacks` not yet `told` (for want of
/// the kernel's batch lookup, for a busy bucket): once each, with the
/// errno the first came with.
fn batch_notes(fallbacks: Fallbacks, told: &mut (bool, bool)) -> Vec<Note> {
    let mut notes = Vec::new();
    if fallbacks.unsupported > 0 && !told.0 {
        told.0 = true;
        notes.push(Note::new(
            Level::Note,
            NoteCode::MapBatch,
            format!(
                "the kernel has no batch lookup for one of tracer's map types ({} at the first read; Linux 5.6 added it for hash and array maps): those maps are read a key at a time, which costs tracer a syscall or two a key instead of one a map; no count is missing (stats: {})",
                Fallbacks::errno_name(fallbacks.first_unsupported),
                model::MAP_BATCH_UNSUPPORTED
            ),
        ));
    }
    if fallbacks.busy > 0 && !told.1 {
        told.1 = true;
        notes.push(Note::new(
            Level::Note,
            NoteCode::MapBatch,
            format!(
                "a batch read of one of tracer's maps found a bucket busy ({}): that read was made a key at a time, and the next tries a batch again; no count is missing (stats: {})",
                Fallbacks::errno_name(fallbacks.first_busy),
                model::MAP_BATCH_BUSY
            ),
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_for_a_map_read_a_key_at_a_time_is_told_once() {
        let mut told = (false, false);
        assert!(batch_notes(Fallbacks::default(), &mut told).is_empty());
        let busy = Fallbacks { busy: 2, first_busy: libc::EBUSY, ..Fallbacks::default() };
        let notes = batch_notes(busy, &mut told);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!((notes[0].level, notes[0].code), (Level::Note, NoteCode::MapBatch));
        assert!(notes[0].message.contains("found a bucket busy (EBUSY (16))"), "{}", notes[0].message);
        assert!(notes[0].message.ends_with("(stats: map_batch_busy)"), "{}", notes[0].message);
        // Told once: more of the same says nothing.
        assert!(batch_notes(Fallbacks { busy: 5, ..busy }, &mut told).is_empty());
        let both = Fallbacks { unsupported: 1, first_unsupported: 524, ..busy };
        let notes = batch_notes(both, &mut told);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0]
                .message
                .starts_with("the kernel has no batch lookup for one of tracer's map types (ENOTSUPP (524)")
        );
        assert!(batch_notes(both, &mut told).is_empty());
    }
}
