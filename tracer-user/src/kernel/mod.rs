//! The kernel side: loading tracer's BPF object for a plan, attaching it
//! ([`links`]), and reading and clearing its maps ([`maps`]). The only
//! place that touches the kernel. Dropping a [`Session`] detaches every
//! probe.

pub mod batch;
pub mod btf;
mod error;
pub mod full;
pub mod gc;
mod growth;
mod heat;
mod links;
mod mapped;
pub mod maps;
pub mod multi;

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData, PerCpuArray, PerCpuHashMap},
    programs::{ProgramFd, UProbe, uprobe::UProbeLinkId},
};
use tracer_common::{
    counter::{Counter, CounterKey},
    live::{LiveCounts, LiveEntry, LiveKey},
    names,
    returns::Returned,
    stack::{Stack, StackKey, WalkConfig},
    types::{ObjectKey, TypeCounts, TypeKey},
};

pub use self::{error::AttachError, links::LateSites, maps::Readings};
pub use crate::discover::ALL_PROCESSES;
use crate::{discover::process::Pidfd, plan::Plan, probe::Program};

/// Options of a load beyond the plan.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// How many processes the counters map has room for.
    pub max_processes: u32,
    /// `--bpf-log`: let the programs log what they do (off: the logging
    /// code is dead to the verifier).
    pub bpf_log: bool,
    /// With `--types`, how many (process, type) pairs the types map has
    /// room for, and where an object's type pointer is; `None` without.
    pub types: Option<TypesOptions>,
    /// With `--stacks`: which probes get stacks, and how.
    pub stacks: Option<StacksOptions>,
    /// With `--live`: the room of the live table (`--live-max`).
    pub live: Option<u32>,
    /// With `--growth`: how its samples are taken and kept.
    pub growth: Option<GrowthOptions>,
    /// Test-only: the maps loaded full ([`full`]); a run's session takes
    /// them from [`full::wanted`], the calibration's none.
    pub full_maps: Vec<String>,
    /// Whether the programs count where their hits land (see
    /// [`heat`]): for the budget's windows.
    pub heat: bool,
}

/// How `--growth` samples, in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthOptions {
    /// One pool taken in this many is sampled.
    pub every: u32,
    /// Room for samples.
    pub pools: u32,
    /// Room for the distinct stacks the samples walk (with `--stacks`,
    /// the larger of the two rooms).
    pub stacks: u32,
}

/// How `--stacks` walks, in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StacksOptions {
    /// The slots whose events get stacks.
    pub slots: Vec<u32>,
    /// `--sample N`: each event with probability 1/N (1: every event).
    pub sample: u64,
    /// Room for distinct stacks, and for (process, probe, stack) counts.
    pub entries: u32,
    /// With `--native-stacks`: room for the unwind rows of every module.
    pub native_rows: Option<u32>,
}

/// How `--types` counts, in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypesOptions {
    /// Room for (process, type) pairs; one more is counted as a miss.
    pub entries: u32,
    /// `offsetof(PyObject, ob_type)`, from the version module.
    pub ob_type_offset: u64,
    /// Room for objects seen created and not yet destroyed; one more is
    /// counted as a miss (`objects_full`).
    pub objects: u32,
    /// The pre-header sizes a freed block may start at before its object,
    /// from the version module.
    pub pre_headers: [u64; tracer_common::types::PRE_HEADERS],
}

/// With `--live`, each slot's role in the live table: the probes' and the
/// allocator implementations'.
fn fill_slot_live(ebpf: &mut aya::Ebpf, plan: &Plan) -> Result<(), AttachError> {
    let mut slot_live = borrowed_array(ebpf, names::SLOT_LIVE_MAP)?;
    let roles = plan.probes.iter().filter_map(|p| p.live.map(|r| (p.slot, r)));
    for (slot, role) in roles.chain(plan.live_impls.iter().map(|i| (i.slot, i.role))) {
        slot_live
            .set(slot, role, 0)
            .map_err(|cause| AttachError::Map { name: names::SLOT_LIVE_MAP, cause: Box::new(cause) })?;
    }
    Ok(())
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_processes: 1024,
            bpf_log: false,
            types: None,
            stacks: None,
            live: None,
            growth: None,
            full_maps: Vec::new(),
            heat: false,
        }
    }
}

/// A loaded BPF object for one plan, attached to one process or to every
/// process that maps the image.
pub struct Session {
    // Owns the programs and their links: dropping it detaches everything.
    ebpf: Ebpf,
    /// The object loaded: the product's, or the bench object where the
    /// plan attaches a bench-only program.
    object: &'static [u8],
    counters: PerCpuHashMap<MapData, CounterKey, Counter>,
    stats: PerCpuArray<MapData, u64>,
    returns: PerCpuHashMap<MapData, CounterKey, Returned>,
    types: PerCpuHashMap<MapData, TypeKey, TypeCounts>,
    objects: aya::maps::HashMap<MapData, ObjectKey, u64>,
    sizes: PerCpuArray<MapData, Counter>,
    walks: aya::maps::HashMap<MapData, u32, WalkConfig>,
    stacks: aya::maps::HashMap<MapData, u64, Stack>,
    stack_counts: PerCpuHashMap<MapData, StackKey, Counter>,
    /// With `--live`: the outstanding blocks, and what each domain's did.
    live: aya::maps::HashMap<MapData, LiveKey, LiveEntry>,
    live_counts: PerCpuArray<MapData, LiveCounts>,
    unwind_rows: Array<MapData, tracer_common::unwind::Row>,
    native_pages: aya::maps::HashMap<MapData, tracer_common::unwind::PageKey, tracer_common::unwind::Page>,
    /// The pages told per process, to remove when it exits.
    native_page_keys: HashMap<u32, Vec<tracer_common::unwind::PageKey>>,
    native_stacks: aya::maps::HashMap<MapData, u64, tracer_common::unwind::NativeStack>,
    /// With `--bpf-log`, the reader of the programs' log.
    logger: Option<aya_log::EbpfLogger<maps::LogCollector>>,
    /// What the logger has collected (shared with it).
    log_lines: maps::LogCollector,
    /// Programs loaded through aya (for perf-event uprobes), on first use,
    /// kept to read the kernel's per-program miss counts.
    programs: HashMap<Program, ProgramFd>,
    /// What is probed.
    plan: Plan,
    /// Perf-event links per attached process ([`ALL_PROCESSES`] for
    /// system-wide), each with the slot of the probe it counts for.
    links: HashMap<u32, Vec<(Program, UProbeLinkId, usize)>>,
    /// Every map of the object by name, for programs loaded for
    /// uprobe-multi links.
    map_fds: Vec<(String, OwnedFd)>,
    /// Programs loaded for uprobe-multi links, on first use.
    multi_programs: HashMap<Program, OwnedFd>,
    /// uprobe-multi links per attached process, each with its tier of
    /// heat (see [`heat`]).
    multi_links: HashMap<u32, Vec<links::MultiLink>>,
    /// The points the kernel refused, by probe and file offset: left out.
    refused: std::collections::BTreeSet<(&'static str, u64)>,
    /// The one process counted, when it is one: an attach that fails after
    /// it exited says so (without a pidfd, a failed attach is taken for an
    /// exit).
    target: Option<Pidfd>,
    /// The GC probes' links (see [`gc`]): closing them detaches the
    /// probes and lowers the markers' semaphores.
    gc_links: Vec<OwnedFd>,
    /// Growth's links (see [`growth`]), apart from the GC's: the profile
    /// drops them alone when growth costs too much.
    growth_links: Vec<OwnedFd>,
    /// Growth's links on the mapping syscalls' tracepoints, and their
    /// perf events (see [`mapped`]).
    mapped_links: Vec<OwnedFd>,
    /// The GC and growth programs loaded, for their miss counts.
    gc_programs: Vec<(&'static str, OwnedFd)>,
    /// Whether the programs count heat ([`LoadOptions::heat`]).
    heat: bool,
}

impl Session {
    /// Loads the BPF object for `plan`. `target_tgid` restricts counting to
    /// one process (0: any process this session attaches to). Nothing is
    /// attached, and no program is loaded, until an attach needs it.
    #[allow(clippy::too_many_lines, reason = "one place sizes, fills and takes every map, in the object's order")]
    pub fn load(plan: Plan, target_tgid: u32, options: &LoadOptions) -> Result<Self, AttachError> {
        let bench = plan.probes.iter().any(|p| p.attach_program.bench_only());
        let object = if bench { crate::BENCH_OBJECT } else { crate::BPF_OBJECT };
        if object.is_empty() {
            return Err(AttachError::NoObject);
        }
        let slots = u32::try_from(plan.probes.len()).unwrap_or(u32::MAX);
        // Those with a counter of nested calls: libc's, and a free probed
        // at its implementation with marks.
        let native =
            u32::try_from(plan.probes.iter().filter(|p| p.program.is_native() || !p.nested_sites.is_empty()).count())
                .unwrap_or(u32::MAX);
        let processes = if target_tgid == 0 { options.max_processes.max(1) } else { 1 };
        // aya-log's level global: 0 turns every log statement into code the
        // verifier proves dead, so logging costs nothing while off.
        let log_level: u8 = if options.bpf_log { u8::MAX } else { 0 };
        // Without --types no program writes the map: one entry is room
        // enough.
        let (type_entries, ob_type_offset) = options.types.map_or((1, 0), |t| (t.entries.max(1), t.ob_type_offset));
        let (object_entries, pre_headers) =
            options.types.map_or((1, [0; tracer_common::types::PRE_HEADERS]), |t| (t.objects.max(1), t.pre_headers));
        let stacks_on = u32::from(options.stacks.is_some());
        let heat_on = u32::from(options.heat);
        let sample = options.stacks.as_ref().map_or(1, |s| s.sample.max(1));
        let stack_entries = options.stacks.as_ref().map_or(1, |s| s.entries.max(1));
        // Growth's samples keep their stacks' frames in the same map.
        let frame_entries = stack_entries.max(options.growth.map_or(1, |g| g.stacks));
        let growth_every = options.growth.map_or(tracer_common::growth::DEFAULT_EVERY, |g| g.every.max(1));
        let growth_pools = options.growth.map_or(1, |g| g.pools.max(1));
        // Without --live no program writes the table: one entry is room
        // enough.
        let live_on = u32::from(options.live.is_some());
        let live_entries = options.live.unwrap_or(1).max(1);
        // The implementations' slots follow the probes'.
        let live_slots = slots.saturating_add(u32::try_from(plan.live_impls.len()).unwrap_or(0));
        let native_rows = options.stacks.as_ref().and_then(|s| s.native_rows);
        let native_on = u32::from(native_rows.is_some());
        // A process maps a few MiB of code: python3.14's executable is
        // 4.3 MiB, 1,050 pages; with libc and the rest, about 2,000.
        let native_pages = if native_on == 1 { processes.min(64).saturating_mul(16_384) } else { 1 };
        // The bench-only table has the live table's default room only when
        // a bench program uses it.
        let meta_entries =
            if plan.probes.iter().any(|p| matches!(p.attach_program, Program::MetaInsert | Program::MetaLookup)) {
                crate::config::DEFAULT_LIVE_MAX
            } else {
                1
            };
        // An LRU map's room is what it keeps whatever the kernel's LRU
        // lists hold back: each CPU keeps up to 128 free entries of its own
        // (LOCAL_FREE_TARGET, kernel/bpf/bpf_lru_list.c), and a CPU that
        // finds none evicts, however many other CPUs keep: an entry still
        // in use (a call in flight) would go long before the map is full
        // on a machine of many CPUs.
        let lru = |room: u32| room.saturating_add(LRU_HELD_PER_CPU.saturating_mul(possible_cpus()));
        let live_lru = if options.live.is_some() { lru(tracer_common::live::FRAME_THREADS) } else { 1 };
        let gated = plan.probes.iter().filter(|p| p.inline_sites.iter().any(|s| s.gate.is_some())).count();
        // And each probe whose single-stepped sites count apart.
        let gated = gated + plan.probes.iter().filter(|p| p.stepped_apart()).count();
        let gated = u32::try_from(gated).unwrap_or(u32::MAX);
        // Test-only (see full): maps loaded with one entry, filled below.
        let full_maps = &options.full_maps;
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(names::META_LIVE_MAP, meta_entries)
            .override_global(names::LIVE_ON_GLOBAL, &live_on, true)
            .map_max_entries(names::LIVE_MAP, live_entries)
            .map_max_entries(names::SLOT_LIVE_MAP, live_slots.max(1))
            .override_global(names::TARGET_TGID_GLOBAL, &target_tgid, true)
            .override_global(names::STACKS_ON_GLOBAL, &stacks_on, true)
            .override_global(names::HEAT_ON_GLOBAL, &heat_on, true)
            .override_global(names::SAMPLE_EVERY_GLOBAL, &sample, true)
            .map_max_entries(names::SLOT_STACKS_MAP, slots.max(1))
            .map_max_entries(names::WALKS_MAP, processes)
            .map_max_entries(names::STACKS_MAP, frame_entries)
            .override_global(names::GROWTH_EVERY_GLOBAL, &growth_every, true)
            .map_max_entries(names::GROWTH_POOLS_MAP, growth_pools)
            .map_max_entries(names::STACK_COUNTS_MAP, stack_entries)
            .override_global(names::NATIVE_ON_GLOBAL, &native_on, true)
            .map_max_entries(names::UNWIND_ROWS_MAP, native_rows.unwrap_or(1).max(1))
            .map_max_entries(names::NATIVE_PAGES_MAP, native_pages)
            .map_max_entries(names::NATIVE_STACKS_MAP, if native_on == 1 { stack_entries } else { 1 })
            .override_global(names::OB_TYPE_OFFSET_GLOBAL, &ob_type_offset, true)
            .override_global(aya_log::LEVEL, &log_level, true)
            // Each native probe has a second counter for its nested calls,
            // each probe with gated sites one for their other passes, each
            // with sites of both kinds one for its single-stepped hits.
            .map_max_entries(
                names::COUNTERS_MAP,
                slots.saturating_add(native).saturating_add(gated).saturating_mul(processes),
            )
            .map_max_entries(names::RETURNS_MAP, slots.saturating_mul(processes))
            .map_max_entries(names::TYPES_MAP, type_entries)
            .map_max_entries(names::OBJECTS_MAP, object_entries)
            .override_global(names::PRE_HEADERS_GLOBAL, &pre_headers, true)
            .map_max_entries(names::SLOT_DOMAINS_MAP, slots.max(1))
            // Preallocated, as every LRU map is: room for one where the
            // feature is off.
            .map_max_entries(names::FRAMES_MAP, live_lru)
            .map_max_entries(names::WALKED_MAP, live_lru)
            .map_max_entries(names::GC_RUNNING_MAP, lru(tracer_common::gc::DEFAULT_GC_THREADS))
            .map_max_entries(
                names::GROWTH_CALLS_MAP,
                if options.growth.is_some() { lru(tracer_common::growth::MAPPING_THREADS) } else { 1 },
            );
        let full_maps = full_maps.iter().map(|m| full::parse(m)).collect::<Result<Vec<_>, _>>()?;
        for &(name, room) in &full_maps {
            loader.map_max_entries(name, room.unwrap_or(1));
        }
        let mut ebpf = loader.load(object).map_err(|e| AttachError::Load(Box::new(e)))?;
        for &(name, room) in &full_maps {
            let missing = || AttachError::FullMaps(format!("{name}: no such map"));
            if room.is_some() {
                // Room for N, filled by the first N that need an entry.
                ebpf.map(name).ok_or_else(missing)?;
            } else if name == names::EMPTY_FRAMES_MAP {
                full::fill_frames(name, ebpf.map_mut(name).ok_or_else(missing)?)?;
            } else if name == names::UNWIND_ROWS_MAP {
                // An array: room for one row is as full as it gets; every
                // module with more finds no room for its rows.
                ebpf.map(name).ok_or_else(missing)?;
            } else {
                full::fill(name, map_data(ebpf.map(name).ok_or_else(missing)?))?;
            }
        }
        let mut map_fds = Vec::new();
        for (name, map) in ebpf.maps() {
            let fd = map_data(map)
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause })?;
            map_fds.push((name.to_owned(), fd));
        }
        let counters = take_map(&mut ebpf, names::COUNTERS_MAP, PerCpuHashMap::try_from)?;
        let stats = take_map(&mut ebpf, names::STATS_MAP, PerCpuArray::try_from)?;
        let returns = take_map(&mut ebpf, names::RETURNS_MAP, PerCpuHashMap::try_from)?;
        let types = take_map(&mut ebpf, names::TYPES_MAP, PerCpuHashMap::try_from)?;
        let objects = take_map(&mut ebpf, names::OBJECTS_MAP, aya::maps::HashMap::try_from)?;
        let sizes = take_map(&mut ebpf, names::SIZES_MAP, PerCpuArray::try_from)?;
        // Borrowed, not taken: a map taken and dropped here closes its fd,
        // which the programs aya loads later for perf-event uprobes are
        // relocated against.
        let stack_slots = options.stacks.as_ref().map_or(&[][..], |s| s.slots.as_slice());
        let mut slot_stacks = borrowed_array::<u32>(&mut ebpf, names::SLOT_STACKS_MAP)?;
        for &slot in stack_slots {
            slot_stacks
                .set(slot, 1, 0)
                .map_err(|cause| AttachError::Map { name: names::SLOT_STACKS_MAP, cause: Box::new(cause) })?;
        }
        let walks = take_map(&mut ebpf, names::WALKS_MAP, aya::maps::HashMap::try_from)?;
        let stacks = take_map(&mut ebpf, names::STACKS_MAP, aya::maps::HashMap::try_from)?;
        let stack_counts = take_map(&mut ebpf, names::STACK_COUNTS_MAP, PerCpuHashMap::try_from)?;
        let live = take_map(&mut ebpf, names::LIVE_MAP, aya::maps::HashMap::try_from)?;
        let live_counts = take_map(&mut ebpf, names::LIVE_COUNTS_MAP, PerCpuArray::try_from)?;
        if options.live.is_some() {
            fill_slot_live(&mut ebpf, &plan)?;
        }
        let unwind_rows = take_map(&mut ebpf, names::UNWIND_ROWS_MAP, Array::try_from)?;
        let native_pages = take_map(&mut ebpf, names::NATIVE_PAGES_MAP, aya::maps::HashMap::try_from)?;
        let native_stacks = take_map(&mut ebpf, names::NATIVE_STACKS_MAP, aya::maps::HashMap::try_from)?;
        let mut domains = borrowed_array(&mut ebpf, names::SLOT_DOMAINS_MAP)?;
        for p in &plan.probes {
            let domain = p.domain.map_or(tracer_common::sizes::NO_DOMAIN, |d| d as u32);
            domains
                .set(p.slot, domain, 0)
                .map_err(|cause| AttachError::Map { name: names::SLOT_DOMAINS_MAP, cause: Box::new(cause) })?;
        }
        let log_lines = maps::LogCollector::default();
        let logger = if options.bpf_log {
            let logger = aya_log::EbpfLogger::init_with_logger(&mut ebpf, log_lines.clone())
                .map_err(|e| AttachError::Log(e.to_string()))?;
            Some(logger)
        } else {
            None
        };
        Ok(Self {
            ebpf,
            object,
            counters,
            stats,
            returns,
            types,
            objects,
            sizes,
            walks,
            stacks,
            stack_counts,
            live,
            live_counts,
            unwind_rows,
            native_pages,
            native_page_keys: HashMap::new(),
            native_stacks,
            logger,
            log_lines,
            programs: HashMap::new(),
            plan,
            links: HashMap::new(),
            map_fds,
            multi_programs: HashMap::new(),
            multi_links: HashMap::new(),
            refused: std::collections::BTreeSet::new(),
            target: (target_tgid != ALL_PROCESSES).then(|| Pidfd::open(target_tgid).ok().flatten()).flatten(),
            gc_links: Vec::new(),
            growth_links: Vec::new(),
            mapped_links: Vec::new(),
            gc_programs: Vec::new(),
            heat: options.heat,
        })
    }

    /// Whether an attach to `pid` failed because that process is gone
    /// (never for [`ALL_PROCESSES`]): only the error's wording depends on it.
    fn gone(&self, pid: u32) -> bool {
        pid != ALL_PROCESSES && self.target.as_ref().is_none_or(Pidfd::exited)
    }

    /// Records that the kernel refused `symbol`'s probe at `offset`: its
    /// calls there are not counted, which its coverage says.
    pub(crate) fn refuse(&mut self, symbol: &'static str, offset: u64, cause: &str) {
        if !self.refused.insert((symbol, offset)) {
            return;
        }
        let Some(probe) = self.plan.probes.iter_mut().find(|p| p.symbol == symbol) else { return };
        let c = &mut probe.coverage;
        c.calls = crate::plan::coverage::Completeness::Partial;
        if c.bytes == crate::plan::coverage::Completeness::Complete {
            c.bytes = crate::plan::coverage::Completeness::Partial;
        }
        if c.types.is_some() {
            c.types = Some(crate::plan::coverage::Completeness::Partial);
        }
        let why =
            format!("the kernel refused the probe at file offset {offset:#x}, whose calls are not counted ({cause})");
        c.reason = Some(c.reason.take().map_or(why.clone(), |r| format!("{r}; {why}")));
    }

    /// The points the kernel refused, by probe and file offset.
    #[must_use]
    pub const fn refused(&self) -> &std::collections::BTreeSet<(&'static str, u64)> {
        &self.refused
    }

    /// What this session probes.
    #[must_use]
    pub const fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Loads `program` through aya (for perf-event uprobes), once.
    fn loaded_uprobe(&mut self, program: Program) -> Result<&mut UProbe, AttachError> {
        let name = program.name();
        let load_err = |cause| AttachError::ProgramLoad { name, cause: Box::new(cause) };
        if !self.programs.contains_key(&program) {
            let uprobe = uprobe_mut(&mut self.ebpf, program)?;
            multi::retry_interrupted(|| uprobe.load(), multi::aya_eagain).map_err(load_err)?;
            let fd = uprobe.fd().map_err(load_err)?.try_clone().map_err(|e| load_err(e.into()))?;
            self.programs.insert(program, fd);
        }
        uprobe_mut(&mut self.ebpf, program)
    }
}

impl Drop for Session {
    /// Closes the uprobe-multi links in parallel (see [`Session::detach_multi`]);
    /// the rest goes with the fields.
    fn drop(&mut self) {
        let pids: Vec<u32> = self.multi_links.keys().copied().collect();
        for pid in pids {
            self.detach_multi(pid);
        }
    }
}

/// The free entries the kernel's shared LRU lists may hold back per CPU
/// (`LOCAL_FREE_TARGET` in `kernel/bpf/bpf_lru_list.c`; since 6.16 fewer
/// where the map is small, never more).
const LRU_HELD_PER_CPU: u32 = 128;

/// The CPUs the kernel may run a program on (each has its LRU lists), 1
/// where that cannot be read: the map then keeps its declared room.
fn possible_cpus() -> u32 {
    aya::util::nr_cpus().ok().and_then(|n| u32::try_from(n).ok()).unwrap_or(1)
}

/// Every map's data, whatever its type: a program loaded for uprobe-multi
/// links is relocated against all of them, so a map type left out here
/// would make that load fail. The match is exhaustive so that a type aya
/// adds fails to compile here rather than at run time.
const fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

fn uprobe_mut(ebpf: &mut Ebpf, program: Program) -> Result<&mut UProbe, AttachError> {
    let name = program.name();
    ebpf.program_mut(name)
        .ok_or(AttachError::ProgramMissing { name })?
        .try_into()
        .map_err(|cause| AttachError::ProgramLoad { name, cause: Box::new(cause) })
}

/// The array map `name` of `ebpf`, borrowed (see [`Session::load`]).
fn borrowed_array<'a, T: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<Array<&'a mut MapData, T>, AttachError> {
    let map = ebpf.map_mut(name).ok_or_else(|| AttachError::Map {
        name,
        cause: Box::new(aya::maps::MapError::InvalidName { name: name.to_owned() }),
    })?;
    Array::try_from(map).map_err(|cause| AttachError::Map { name, cause: Box::new(cause) })
}

fn take_map<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<M, aya::maps::MapError>,
) -> Result<M, AttachError> {
    let map = ebpf.take_map(name).ok_or(AttachError::Map {
        name,
        cause: Box::new(aya::maps::MapError::InvalidName { name: name.to_owned() }),
    })?;
    convert(map).map_err(|cause| AttachError::Map { name, cause: Box::new(cause) })
}

#[cfg(test)]
mod tests;
