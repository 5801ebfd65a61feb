//! `--growth` in the run loop: each interval, the samples the kernel keeps
//! (see [`tracer_common::growth`]) are checked against the target's memory
//! (a sample's pool must still be a pool in use: its 48-byte header read,
//! valid, with blocks allocated), counted per stack, named, and turned into
//! each site's pools in use and their change since the previous interval:
//! its growth. What the probes saw and what they cost come with it.
//!
//! Growth runs with `--growth`, or by default in the production profile
//! with `--pid` ("auto"), which goes without it where it is unavailable
//! and stops it where it costs more than half the budget
//! ([`hold_budget`]).

// The profile's hold on growth's cost: the trial, each interval, the stops.
mod hold;
pub use hold::{TRIAL, hold_budget, trial};

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use tracer_common::{
    growth::{GrowthCounts, PoolKey, PoolSample},
    stack::{self, FIRST_HASH},
    stats::Stat,
};

use super::{
    cost::Prices,
    gcmem::thread_cpu,
    mapped::{Held, Mapped},
    stacks::StackNames,
};
use crate::{
    heap::{memory::Memory, pools::Header},
    kernel::{AttachError, Session},
    model::{
        GrowthCost, GrowthProbed, GrowthSampled as Report, GrowthSite, GrowthStack, GrowthStopped, GrowthTakes,
        SiteFrame,
    },
    plan::growth::{GrowthPlan, GrowthRole},
    python::heap::POOL_OVERHEAD,
};

/// A pool header's bytes: [`POOL_OVERHEAD`].
const HEADER: usize = 48;
const _: () = assert!(HEADER as u64 == POOL_OVERHEAD);

/// A site: the innermost Python frame of a stack.
type SiteKey = (String, String, Option<u32>);

/// One reading of the samples: the live ones per stack.
#[derive(Clone, Debug, Default)]
struct Reading {
    by_stack: BTreeMap<u64, Held>,
}

/// `--growth`'s state across intervals.
pub struct Growth {
    pid: u32,
    /// The program whose pools are sampled: another one exec'd is not
    /// read.
    stamp: Option<crate::discover::process::ProgramStamp>,
    plan: GrowthPlan,
    every: u32,
    names: StackNames,
    memory: Memory,
    /// Each site's samples in use at the last interval.
    previous: BTreeMap<SiteKey, Held>,
    /// The C library's heap.
    mapped: Mapped,
    /// The samples found dead at the last reading.
    dead: HashMap<PoolKey, PoolSample>,
    /// The last reading that could be made (the target's memory may be
    /// gone at the end).
    last: Reading,
    /// Why the last reading failed, where it did.
    stale: Option<String>,
    counts_before: GrowthCounts,
    /// The target's CPU time when the probes went live, in ns, for the
    /// [`TRIAL`].
    cpu_at_attach: Option<u64>,
    pruned: u64,
    pruned_before: u64,
    tracer_cpu: Duration,
    read_before: (Duration, u64),
    started: Instant,
    last_interval: Instant,
    /// What the summary priced, kept to price it again once the
    /// calibration ends (exact tracing's runs end before it may).
    summary_basis: Option<(GrowthCounts, Duration, (Duration, u64))>,
    /// The profile's default, not `--growth`: stopped where it costs more
    /// than half the budget ([`hold_budget`]).
    auto: bool,
    /// Where it stopped: when, why, and the sites and stacks as they were
    /// then, which every later report gives.
    stopped: Option<Stopped>,
}

/// Growth stopped.
struct Stopped {
    at: Instant,
    why: GrowthStopped,
    sites: BTreeMap<SiteKey, Held>,
    stacks: Vec<GrowthStack>,
    /// The pools each stack held at the stop; while the C library's heap
    /// is still sampled (`libc`), each reading adds its samples to them.
    pools: BTreeMap<u64, u64>,
    libc: bool,
}

impl Growth {
    /// Growth for `pid`, sampled as `plan` says at one take in `every`,
    /// its stacks walked `depth` frames deep. Tells the kernel where the
    /// target's frames are (before the probes go live).
    pub fn new(
        session: &mut Session,
        pid: u32,
        plan: GrowthPlan,
        (every, depth): (u32, u32),
        auto: bool,
    ) -> Result<Self, AttachError> {
        let mut names = StackNames::new(Vec::new(), depth, 1, usize::MAX, None, false);
        names.prepare(session, pid)?;
        let now = Instant::now();
        Ok(Self {
            pid,
            stamp: crate::discover::process::ProgramStamp::of(pid),
            plan,
            every,
            names,
            memory: Memory::new(pid),
            previous: BTreeMap::new(),
            mapped: Mapped::off(pid),
            dead: HashMap::new(),
            last: Reading::default(),
            stale: None,
            counts_before: GrowthCounts::default(),
            cpu_at_attach: None,
            pruned: 0,
            pruned_before: 0,
            tracer_cpu: Duration::ZERO,
            read_before: (Duration::ZERO, 0),
            started: now,
            last_interval: now,
            summary_basis: None,
            auto,
            stopped: None,
        })
    }

    /// Attaches the probes (through uprobe-multi links with `multi`); the
    /// growth reported is from here on.
    pub fn attach(&mut self, session: &mut Session, multi: bool) -> Result<(), AttachError> {
        session.attach_growth(&self.plan, self.pid, multi)?;
        self.mapped = Mapped::attach(session, self.pid);
        (self.started, self.last_interval) = (Instant::now(), Instant::now());
        self.cpu_at_attach = super::cost::process_cpu_ns(self.pid);
        Ok(())
    }

    /// When its probes went live.
    #[must_use]
    pub const fn live_since(&self) -> Instant {
        self.started
    }

    /// The plan, for the attach header.
    #[must_use]
    pub const fn plan(&self) -> &GrowthPlan {
        &self.plan
    }

    /// Why the target's frames cannot be read, if they cannot: its samples
    /// then have no stacks (told once, by the caller).
    pub fn take_untold(&mut self) -> Vec<(u32, String)> {
        self.names.take_untold()
    }

    /// The growth since the last interval.
    pub fn interval(&mut self, session: &mut Session, prices: Option<Prices>) -> Report {
        let (now, _) = self.read_sites(session);
        let previous = std::mem::replace(&mut self.previous, now.clone());
        let counts = session.growth_counts().unwrap_or(self.counts_before);
        let takes = diff(counts, self.counts_before);
        self.counts_before = counts;
        let pruned = self.pruned - self.pruned_before;
        self.pruned_before = self.pruned;
        let at = Instant::now();
        let span = at - self.last_interval;
        self.last_interval = at;
        let (cpu, bytes) = (self.tracer_cpu, self.memory.bytes_read);
        let read = (cpu.saturating_sub(self.read_before.0), bytes - self.read_before.1);
        self.read_before = (cpu, bytes);
        self.report(&now, &previous, (takes, pruned), (span, read), prices)
    }

    /// The growth since the attach, with every stack in use.
    pub fn summary(&mut self, session: &mut Session, prices: Option<Prices>) -> Report {
        let (now, stacks) = self.read_sites(session);
        let counts = session.growth_counts().unwrap_or(self.counts_before);
        let read = (self.tracer_cpu, self.memory.bytes_read);
        let span = self.stopped.as_ref().map_or_else(|| self.started.elapsed(), |s| s.at - self.started);
        self.summary_basis = Some((counts, span, read));
        let mut report = self.report(&now, &BTreeMap::new(), (counts, self.pruned), (span, read), prices);
        report.stacks = Some(stacks);
        report
    }

    /// The summary's `report`, priced at `prices` where it was not (the
    /// calibration ended after it was read).
    pub fn price_summary(&self, report: &mut Report, prices: Prices) {
        let Some((counts, span, read)) = self.summary_basis else { return };
        if report.cost.as_ref().is_some_and(|c| c.hit_ns.is_none()) {
            report.cost = Some(self.cost(&counts, span, read, Some(prices)));
        }
    }

    /// Each site's samples in use, and every stack in use, most samples
    /// first: read now, or as last read where the target's memory
    /// cannot be read any more.
    fn read_sites(&mut self, session: &mut Session) -> (BTreeMap<SiteKey, Held>, Vec<GrowthStack>) {
        let began = thread_cpu();
        let reading = match &self.stopped {
            Some(s) if s.libc => {
                let pools = s.pools.clone();
                self.read_libc(session).map(|mut by_stack| {
                    for (stack, n) in pools {
                        by_stack.entry(stack).or_default().pools += n;
                    }
                    Reading { by_stack }
                })
            }
            Some(s) => return (s.sites.clone(), s.stacks.clone()),
            None => self.read(session),
        };
        match reading {
            Ok(reading) => {
                self.last = reading;
                self.stale = None;
            }
            Err(why) => self.stale = Some(why),
        }
        let named = self.name_sites(session);
        self.tracer_cpu += thread_cpu().saturating_sub(began);
        named
    }

    /// Each site's samples in use, and every stack in use, most samples
    /// first, as last read.
    fn name_sites(&mut self, session: &Session) -> (BTreeMap<SiteKey, Held>, Vec<GrowthStack>) {
        let sample_bytes = self.sample_bytes();
        let mut sites: BTreeMap<SiteKey, Held> = BTreeMap::new();
        let mut stacks = Vec::new();
        let by_stack: Vec<(u64, Held)> = self.last.by_stack.iter().map(|(h, n)| (*h, *n)).collect();
        for (hash, held) in by_stack {
            let (frames, truncated) = self.frames(session, hash);
            let inner = frames.first().cloned().unwrap_or_else(|| SiteFrame {
                function: "<no Python frame>".to_owned(),
                file: String::new(),
                line: None,
            });
            sites.entry((inner.function, inner.file, inner.line)).or_default().add(&held);
            stacks.push(GrowthStack {
                frames,
                truncated,
                samples: held.samples(),
                in_use_bytes: held.bytes(sample_bytes),
            });
        }
        stacks.sort_by(|a, b| b.in_use_bytes.cmp(&a.in_use_bytes).then_with(|| a.frames.len().cmp(&b.frames.len())));
        (sites, stacks)
    }

    /// The frames of the stack `hash`, innermost first, and whether the
    /// walk was cut; a frame that says why where there are none.
    fn frames(&mut self, session: &Session, hash: u64) -> (Vec<SiteFrame>, bool) {
        let unnamed =
            |why: String| (vec![SiteFrame { function: format!("<{why}>"), file: String::new(), line: None }], false);
        if hash < FIRST_HASH {
            let stat = hash.checked_sub(stack::why::FAILED).and_then(|i| Stat::ALL.get(usize::try_from(i).ok()?));
            return unnamed(format!("no stack: {}", stat.map_or("the walk failed", |s| s.name())));
        }
        match self.names.site(session, self.pid, hash) {
            Ok(found) => found,
            Err(why) => unnamed(format!("unresolved: {why}")),
        }
    }

    /// The C library's samples alone, per stack (pymalloc's probes are
    /// down).
    fn read_libc(&mut self, session: &mut Session) -> Result<BTreeMap<u64, Held>, String> {
        if self.stamp.is_some_and(|s| s.changed(self.pid)) {
            return Err(format!("PID {} now runs another program (it called exec)", self.pid));
        }
        self.mapped.read(session)
    }

    /// The samples of the target whose pools are in use, per stack; the
    /// ones dead on two readings in a row dropped from the kernel's map.
    fn read(&mut self, session: &mut Session) -> Result<Reading, String> {
        if self.stamp.is_some_and(|s| s.changed(self.pid)) {
            return Err(format!("PID {} now runs another program (it called exec)", self.pid));
        }
        let samples: Vec<(PoolKey, PoolSample)> = session
            .growth_samples()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|(k, _)| k.tgid == self.pid)
            .collect();
        let ranges: Vec<(u64, usize)> = samples.iter().map(|(k, _)| (k.pool, HEADER)).collect();
        let mut bytes = vec![0u8; ranges.len() * HEADER];
        let mut ok = Vec::new();
        self.memory.read_ranges(&ranges, &mut bytes, &mut ok).map_err(|e| e.to_string())?;
        let mut reading = Reading::default();
        let mut dead = HashMap::new();
        for (i, (key, sample)) in samples.iter().enumerate() {
            let header = &bytes[i * HEADER..(i + 1) * HEADER];
            let in_use = ok[i] && Header::parse(key.pool, header, self.plan.pool_size).is_some_and(|h| h.count > 0);
            if in_use {
                reading.by_stack.entry(sample.stack).or_default().pools += 1;
            } else if self.dead.get(key) == Some(sample) {
                if session.remove_growth_sample(key, sample).map_err(|e| e.to_string())? {
                    self.pruned += 1;
                }
            } else {
                dead.insert(*key, *sample);
            }
        }
        self.dead = dead;
        for (stack, held) in self.mapped.read(session)? {
            reading.by_stack.entry(stack).or_default().add(&held);
        }
        Ok(reading)
    }

    fn sample_bytes(&self) -> u64 {
        u64::from(self.every).saturating_mul(self.plan.pool_size)
    }

    /// The report of sites `now` against `previous` (samples per site),
    /// with what the probes saw and what tracer read over `span`.
    fn report(
        &self,
        now: &BTreeMap<SiteKey, Held>,
        previous: &BTreeMap<SiteKey, Held>,
        (counts, pruned): (GrowthCounts, u64),
        (span, (tracer_cpu, bytes_read)): (Duration, (Duration, u64)),
        prices: Option<Prices>,
    ) -> Report {
        let sample_bytes = self.sample_bytes();
        let in_use = |held: &Held| held.bytes(sample_bytes);
        let signed = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        let mut sites: Vec<GrowthSite> = now
            .iter()
            .map(|(k, held)| (k, *held))
            .chain(previous.iter().filter(|(k, _)| !now.contains_key(*k)).map(|(k, _)| (k, Held::default())))
            .map(|((function, file, line), held)| {
                let before = previous.get(&(function.clone(), file.clone(), *line)).copied().unwrap_or_default();
                GrowthSite {
                    function: function.clone(),
                    file: file.clone(),
                    line: *line,
                    bytes: signed(in_use(&held)) - signed(in_use(&before)),
                    samples: held.samples(),
                    in_use_bytes: in_use(&held),
                    libc_bytes: held.mapped_bytes,
                    libc_samples: held.mapped,
                    in_use_ci95: held.ci95(self.every, self.plan.pool_size),
                }
            })
            .filter(|s| s.samples > 0 || s.bytes != 0)
            .collect();
        sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| b.in_use_bytes.cmp(&a.in_use_bytes)));
        let total = |sites: &BTreeMap<SiteKey, Held>| sites.values().map(in_use).fold(0u64, u64::saturating_add);
        let (total_now, total_before) = (total(now), total(previous));
        let libc_bytes = now.values().map(|h| h.mapped_bytes).fold(0u64, u64::saturating_add);
        let mut held = Held::default();
        for h in now.values() {
            held.add(h);
        }
        let in_use_ci95 = in_use_ci95(&held, (self.every, self.plan.pool_size), sample_bytes);
        let mut caveats: Vec<String> = self.plan.caveat.iter().cloned().collect();
        caveats.extend(self.mapped.caveat());
        if let Some(why) = &self.stale {
            caveats.push(format!("the target's memory could not be read ({why}): the last reading stands"));
        }
        // Samples lost to a full map are missing from every figure after,
        // so the run's count so far is what the caveat gives.
        let lost = counts.lost.max(self.counts_before.lost);
        if lost > 0 {
            caveats.push(format!(
                "{lost} sampled pools found the samples map full (room for {}) and are not in these figures (takes.lost)",
                tracer_common::growth::DEFAULT_POOL_ENTRIES
            ));
        }
        let grown_lost = counts.grown_lost.max(self.counts_before.grown_lost);
        if grown_lost > 0 {
            caveats.push(format!(
                "{grown_lost} samples of the C library's heap found their map full (room for {}) and are not in these figures (takes.grown_lost)",
                tracer_common::growth::DEFAULT_MAPPED_ENTRIES
            ));
        }
        let missed = counts.mapped_missed.max(self.counts_before.mapped_missed);
        if missed > 0 {
            caveats.push(format!(
                "{missed} of the target's mapping calls could not be judged (their arguments or outcome unread, or a call in flight at the attach): the C library's heap figures may lack their growths (takes.mapped_missed)"
            ));
        }
        Report {
            estimate: true,
            sample_every: self.every,
            sample_bytes,
            bytes: signed(total_now) - signed(total_before),
            in_use_bytes: total_now,
            libc_bytes,
            in_use_ci95: Some(in_use_ci95),
            sites,
            stacks: None,
            takes: GrowthTakes {
                probed: if self.plan.carves() { GrowthProbed::Carves } else { GrowthProbed::Takes },
                reused: counts.reused,
                carved: counts.carved,
                new_arenas: counts.arenas,
                no_arena: counts.new_arena,
                sampled: counts.sampled,
                ended: counts.ended,
                pruned,
                walk_failed: counts.walk_failed,
                truncated: counts.truncated,
                lost: counts.lost,
                unread: counts.unread,
                syscalls: counts.syscalls,
                grown: counts.grown,
                grown_sampled: counts.grown_sampled,
                unmapped: counts.unmapped,
                mapped_pruned: self.mapped.pruned,
                grown_lost: counts.grown_lost,
                mapped_missed: counts.mapped_missed,
            },
            cost: Some(self.cost(&counts, span, (tracer_cpu, bytes_read), prices)),
            caveat: (!caveats.is_empty()).then(|| caveats.join("; ")),
            stopped: self.stopped.as_ref().map(|s| s.why.clone()),
        }
    }

    /// Whether the growth point of `role` sits on an instruction the kernel
    /// emulates (a point the plan has not is priced as emulated).
    fn emulated(&self, role: GrowthRole) -> bool {
        self.plan.points.iter().find(|p| p.role == role).is_none_or(|p| p.emulated)
    }

    /// pymalloc's probes' hits in `counts`: takes, carves and arenas.
    const fn pool_hits(counts: &GrowthCounts) -> u64 {
        counts.takes.saturating_add(counts.carve_hits).saturating_add(counts.arenas)
    }

    /// What pymalloc's probes' hits in `counts` cost the target, in ns,
    /// priced at `prices` (a carve at a single-stepped block as such).
    fn hits_ns(&self, counts: &GrowthCounts, prices: Prices) -> f64 {
        let stepped = counts.carve_stepped.min(counts.carve_hits);
        #[allow(clippy::cast_precision_loss, reason = "hits and ns in an interval")]
        let ns = counts.takes as f64 * prices.hit.of(self.emulated(GrowthRole::Take))
            + counts.arenas as f64 * prices.hit.of(self.emulated(GrowthRole::Arena))
            + (counts.carve_hits - stepped) as f64 * prices.hit.of(true)
            + stepped as f64 * prices.hit.of(false);
        ns
    }

    /// What pymalloc's probes in `counts` cost the target, in ns, priced at
    /// `prices`: their hits and their programs, not the C library's.
    fn pools_ns(&self, counts: &GrowthCounts, prices: Prices) -> f64 {
        #[allow(clippy::cast_precision_loss, reason = "ns in an interval")]
        let ns = self.hits_ns(counts, prices) + counts.run_ns as f64;
        ns
    }

    /// What `counts` cost the target over `span`, priced at `prices`.
    fn cost(
        &self,
        counts: &GrowthCounts,
        span: Duration,
        (tracer_cpu, bytes_read): (Duration, u64),
        prices: Option<Prices>,
    ) -> GrowthCost {
        let hits = Self::pool_hits(counts);
        let run_ns = counts.run_ns.saturating_add(counts.mapped_run_ns);
        #[allow(clippy::cast_precision_loss, reason = "ns in an interval")]
        let target_ns = prices.map(|p| self.pools_ns(counts, p) + counts.mapped_run_ns as f64);
        // Their mean where the probes' prices differ (a carve block
        // single-stepped): `hits` times it is what they cost.
        #[allow(clippy::cast_precision_loss, reason = "a price")]
        let hit_ns = prices.map(|p| {
            if hits == 0 {
                p.hit.of(self.plan.points.first().is_none_or(|p| p.emulated))
            } else {
                self.hits_ns(counts, p) / hits as f64
            }
        });
        let span_s = span.as_secs_f64();
        #[allow(clippy::cast_precision_loss, reason = "ns in an interval")]
        GrowthCost {
            hits,
            hit_ns,
            programs_s: run_ns as f64 / 1e9,
            target_s: target_ns.map(|ns| ns / 1e9),
            per_s: target_ns.filter(|_| span_s > 0.0).map(|ns| ns / 1e9 / span_s),
            tracer_cpu_s: tracer_cpu.as_secs_f64(),
            bytes_read,
        }
    }
}

/// The 95% interval of the bytes `held` over every site, each pool take
/// sampled 1 in `every` of `pool_size` bytes: where no sample is held, a 0
/// says only that the growth was likely under
/// [`crate::model::ZERO_SAMPLES_UPPER`] samples' bytes (a normal
/// approximation of no sample would say `[0, 0]`, a zero where the heap
/// may have grown by a megabyte).
#[allow(clippy::cast_precision_loss, reason = "an interval, not a count")]
fn in_use_ci95(held: &Held, (every, pool_size): (u32, u64), sample_bytes: u64) -> [f64; 2] {
    if held.samples() == 0 {
        return [0.0, crate::model::ZERO_SAMPLES_UPPER * sample_bytes as f64];
    }
    held.ci95(every, pool_size)
}

/// How `--growth` samples and keeps its samples in the kernel.
pub const KERNEL: crate::kernel::GrowthOptions = crate::kernel::GrowthOptions {
    every: tracer_common::growth::DEFAULT_EVERY,
    pools: tracer_common::growth::DEFAULT_POOL_ENTRIES,
    stacks: super::STACK_ENTRIES,
};

/// With `--growth`, attaches its probes (through uprobe-multi links with
/// `multi`) where it is available; what the attach header says of it.
pub fn attach(
    growth: &mut Option<Result<Growth, String>>,
    session: &mut Session,
    multi: bool,
) -> Result<Option<crate::plan::growth::GrowthPlan>, AttachError> {
    Ok(match growth {
        Some(Ok(g)) => match g.attach(session, multi) {
            Ok(()) => Some(g.plan().clone()),
            // The profile's default goes without where the kernel refuses
            // its probes (nothing of them stays attached); --growth fails.
            Err(e) if g.auto && !matches!(e, AttachError::TargetExited { .. }) => {
                let why = format!("its probes could not be attached: {e}");
                let plan = crate::plan::growth::GrowthPlan::unavailable(why.clone());
                *growth = Some(Err(why));
                Some(plan)
            }
            Err(e) => return Err(e),
        },
        Some(Err(why)) => Some(crate::plan::growth::GrowthPlan::unavailable(why.clone())),
        None => None,
    })
}

/// Growth's report since the last interval (or with `summary`, since the
/// attach), or why there is none; `None` without growth.
pub fn report(
    growth: Option<&mut Result<Growth, String>>,
    session: &mut Session,
    prices: Option<Prices>,
    summary: bool,
) -> Option<crate::model::Growth> {
    Some(match growth? {
        Ok(g) if summary => crate::model::Growth::Sampled(Box::new(g.summary(session, prices))),
        Ok(g) => crate::model::Growth::Sampled(Box::new(g.interval(session, prices))),
        Err(why) => crate::model::Growth::Unavailable { unavailable: why.clone() },
    })
}

/// With `--growth`: its readout (told where the target's frames are, so
/// that its first samples have stacks), or why there is none.
pub fn setup(
    config: &crate::config::AttachConfig,
    session: &mut Session,
    plan: Option<crate::plan::growth::GrowthPlan>,
    pid: Option<u32>,
) -> Result<Option<Result<Growth, String>>, AttachError> {
    // `--stacks`' depth where given.
    let depth = config.stacks.as_ref().map_or(tracer_common::stack::DEFAULT_DEPTH, |s| s.depth);
    let auto = config.growth.as_ref().is_some_and(|g| g.auto);
    Ok(match (plan, pid) {
        (None, _) => None,
        (Some(plan), _) if plan.unavailable.is_some() => plan.unavailable.map(Err),
        (Some(plan), Some(pid)) => {
            match Growth::new(session, pid, plan, (KERNEL.every, depth), auto) {
                Ok(g) => Some(Ok(g)),
                // The profile's default goes without where the target's
                // frames cannot be found; --growth fails as it always did.
                Err(e) if auto && !matches!(e, AttachError::TargetExited { .. }) => {
                    Some(Err(format!("the target's frames cannot be found for growth's stacks: {e}")))
                }
                Err(e) => return Err(e),
            }
        }
        (Some(_), None) => Some(Err("with --exe, no process's memory is read; pass --pid".to_owned())),
    })
}

/// The counts of `now` since `before`.
fn diff(now: GrowthCounts, before: GrowthCounts) -> GrowthCounts {
    GrowthCounts {
        takes: now.takes.saturating_sub(before.takes),
        reused: now.reused.saturating_sub(before.reused),
        carved: now.carved.saturating_sub(before.carved),
        carve_hits: now.carve_hits.saturating_sub(before.carve_hits),
        carve_stepped: now.carve_stepped.saturating_sub(before.carve_stepped),
        new_arena: now.new_arena.saturating_sub(before.new_arena),
        arenas: now.arenas.saturating_sub(before.arenas),
        sampled: now.sampled.saturating_sub(before.sampled),
        ended: now.ended.saturating_sub(before.ended),
        walk_failed: now.walk_failed.saturating_sub(before.walk_failed),
        truncated: now.truncated.saturating_sub(before.truncated),
        lost: now.lost.saturating_sub(before.lost),
        unread: now.unread.saturating_sub(before.unread),
        run_ns: now.run_ns.saturating_sub(before.run_ns),
        syscalls: now.syscalls.saturating_sub(before.syscalls),
        grown: now.grown.saturating_sub(before.grown),
        grown_sampled: now.grown_sampled.saturating_sub(before.grown_sampled),
        unmapped: now.unmapped.saturating_sub(before.unmapped),
        grown_lost: now.grown_lost.saturating_sub(before.grown_lost),
        mapped_missed: now.mapped_missed.saturating_sub(before.mapped_missed),
        mapped_run_ns: now.mapped_run_ns.saturating_sub(before.mapped_run_ns),
    }
}
