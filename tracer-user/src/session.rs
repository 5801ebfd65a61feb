//! Loading the BPF object and attaching it: the only place that touches
//! the kernel. Dropping a [`Session`] detaches every probe.

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroU32,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    path::PathBuf,
    time::Instant,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Map, MapData, PerCpuArray, PerCpuHashMap},
    programs::{
        ProgramFd, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use thiserror::Error;
use tracer_common::{
    counter::{Counter, CounterKey},
    names,
    returns::Returned,
    stats::{STAT_COUNT, Stat},
};

use crate::{
    callsites::{self, CallSites, Module},
    elf::ElfImage,
    multi,
    placement::{self, Placement},
    probes::{ProbeKind, ProbeSpec, Program},
    returns::{self, ReturnPlan},
};

/// Failure to load or attach.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error("the kernel refused tracer's BPF object: {0}")]
    Load(Box<aya::EbpfError>),
    #[error("BPF program {name} is missing from tracer's BPF object (a build problem)")]
    ProgramMissing { name: &'static str },
    #[error("BPF program {name} failed to load: {cause}")]
    ProgramLoad { name: &'static str, cause: Box<aya::programs::ProgramError> },
    #[error("cannot read the kernel's statistics of BPF program {name}: {cause}")]
    ProgramInfo { name: &'static str, cause: std::io::Error },
    #[error("BPF map {name} is missing or has the wrong type: {cause}")]
    Map { name: &'static str, cause: Box<aya::maps::MapError> },
    #[error("cannot attach a uprobe to {symbol} in {path} for PID {pid}: {cause}")]
    Attach { symbol: &'static str, path: PathBuf, pid: u32, cause: Box<aya::programs::ProgramError> },
    #[error("required symbol {symbol} is not in {path}; this build of CPython cannot be traced (was it stripped?)")]
    RequiredMissing { symbol: &'static str, path: PathBuf },
    #[error(
        "none of the requested probe symbols is in {path}; this build of CPython cannot be traced (was it stripped?)"
    )]
    NoProbes { path: PathBuf },
    #[error("process {pid} exited while tracer was attaching; start it again and pass its new PID")]
    TargetExited { pid: u32 },
    #[error("cannot duplicate the fd of BPF map {name}: {cause}")]
    MapFd { name: String, cause: std::io::Error },
    #[error("{0}")]
    Multi(#[from] crate::multi::MultiError),
    #[error("cannot read {path}: {cause}")]
    ModuleRead { path: PathBuf, cause: std::io::Error },
}

impl AttachError {
    /// Whether the cause is the target rather than tracer.
    #[must_use]
    pub const fn is_bad_input(&self) -> bool {
        matches!(self, Self::RequiredMissing { .. } | Self::NoProbes { .. } | Self::TargetExited { .. })
    }
}

/// The interpreter image to attach to.
#[derive(Clone, Copy, Debug)]
pub struct ImageRef<'a> {
    /// Its symbols.
    pub elf: &'a ElfImage,
    /// The path to show (as the target sees it).
    pub display_path: &'a std::path::Path,
    /// The path the kernel resolves (valid in tracer's mount namespace).
    pub attach_path: &'a std::path::Path,
    /// Other modules that may call into the image, for
    /// `--placement call-sites` (empty otherwise).
    pub modules: &'a [Module],
}

/// One uprobe to attach: what, where (a file and an offset in it) and its
/// cookie.
struct AttachPoint {
    symbol: &'static str,
    program: Program,
    path: PathBuf,
    offset: u64,
    cookie: u64,
}

/// One attached probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedProbe {
    pub symbol: &'static str,
    /// The counting program (for whether it reports bytes).
    pub program: Program,
    /// Counter slot, passed to the program as the attach cookie.
    pub slot: u32,
    /// Offset in the image file of the function's entry.
    pub file_offset: u64,
    /// Where in the function the uprobe sits, and why.
    pub placement: Placement,
    /// With `--returns`, for an allocating function: how its return value
    /// is read.
    pub returns: Option<ReturnPlan>,
    /// With `--placement call-sites`, for a function probed at its callers
    /// instead of inside it: where they are.
    pub call_sites: Option<CallSites>,
}

impl AttachedProbe {
    /// Offset in the image file of the probed instruction.
    #[must_use]
    pub const fn probe_offset(&self) -> u64 {
        self.file_offset + self.placement.offset
    }
}

/// Where uprobes go in each function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// At the first instruction the kernel emulates, when that counts the
    /// same calls (see [`crate::placement`]).
    #[default]
    Auto,
    /// At the function's first instruction.
    Entry,
    /// As `Auto`, except that a function whose probe would be
    /// single-stepped is probed at every call to it, when that sees every
    /// call (see [`crate::callsites`]).
    CallSites,
}

/// Call sites found in a module mapped after the attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateSites {
    pub symbol: &'static str,
    /// How many were attached.
    pub sites: usize,
    /// Where the function's address escapes in that module, if it does:
    /// calls through that pointer are not seen.
    pub escape: Option<String>,
}

/// Counts read from the kernel, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    /// Per attached probe (in attach order), summed over processes.
    pub totals: Vec<Counter>,
    /// Per process: one counter per attached probe, in attach order.
    pub per_process: BTreeMap<u32, Vec<Counter>>,
    /// One per [`Stat`], in [`Stat::ALL`] order.
    pub stats: Vec<u64>,
    /// Per attached probe: its returns, summed over processes (zero for a
    /// probe without return probes).
    pub returns: Vec<Returned>,
    /// Hits the kernel did not run a program for because another BPF
    /// program was already running on that CPU (`recursion_misses` in
    /// `bpf_prog_info`), summed over tracer's programs. Such hits are
    /// missing from the counts.
    pub kernel_misses: u64,
}

/// The `links` key of a system-wide attachment (no process has PID 0).
pub const ALL_PROCESSES: u32 = 0;

/// Options of an attachment beyond what and where.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Attach this program to every probe instead of its counting program
    /// (benchmarks use [`Program::Empty`] to measure the bare uprobe).
    pub program_override: Option<Program>,
    /// How many processes the counters map has room for.
    pub max_processes: u32,
    /// Where in each function to probe.
    pub placement: PlacementMode,
    /// With `--returns`: what each way of reading a return value costs, so
    /// that allocating functions get the cheapest return probes.
    pub returns: Option<returns::ReturnCosts>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self { program_override: None, max_processes: 1024, placement: PlacementMode::Auto, returns: None }
    }
}

/// A loaded BPF object, attached to one process or to every process that
/// maps the image.
pub struct Session {
    // Owns the programs and their links: dropping it detaches everything.
    ebpf: Ebpf,
    counters: PerCpuHashMap<MapData, CounterKey, Counter>,
    stats: PerCpuArray<MapData, u64>,
    returns: PerCpuHashMap<MapData, CounterKey, Returned>,
    /// Our programs, to read the kernel's per-program miss counts.
    programs: Vec<(&'static str, ProgramFd)>,
    /// Attached probes, in table order.
    pub attached: Vec<AttachedProbe>,
    /// Optional probes whose symbol the image lacks.
    pub missing: Vec<&'static str>,
    /// The program attached to each probe (its own or the override).
    probe_programs: Vec<Program>,
    display_path: PathBuf,
    attach_path: PathBuf,
    /// Links per attached process ([`ALL_PROCESSES`] for system-wide).
    links: HashMap<u32, Vec<(Program, UProbeLinkId)>>,
    /// The maps by name, for programs loaded for uprobe-multi links.
    map_fds: Vec<(String, OwnedFd)>,
    /// Programs loaded for uprobe-multi links, on first use.
    multi_programs: HashMap<Program, OwnedFd>,
    /// uprobe-multi links per attached process.
    multi_links: HashMap<u32, Vec<OwnedFd>>,
}

impl Session {
    /// Loads the BPF object for the probes in `specs` that the image has.
    /// `target_tgid` restricts counting to one process (0: any process this
    /// session attaches to). Nothing is attached yet.
    pub fn load(
        image: ImageRef<'_>,
        specs: &[ProbeSpec],
        target_tgid: u32,
        options: SessionOptions,
    ) -> Result<Self, AttachError> {
        let (attached, missing) = plan(image, specs, options)?;
        let slots = u32::try_from(attached.len()).unwrap_or(u32::MAX);
        let processes = if target_tgid == 0 { options.max_processes.max(1) } else { 1 };
        let mut ebpf = EbpfLoader::new()
            .override_global(names::TARGET_TGID_GLOBAL, &target_tgid, true)
            .map_max_entries(names::COUNTERS_MAP, slots.saturating_mul(processes))
            .map_max_entries(names::RETURNS_MAP, slots.saturating_mul(processes))
            .load(crate::BPF_OBJECT)
            .map_err(|e| AttachError::Load(Box::new(e)))?;

        let mut programs = Vec::with_capacity(Program::ALL.len());
        for program in Program::ALL {
            let name = program.name();
            let uprobe = uprobe_mut(&mut ebpf, program)?;
            let load_err = |cause| AttachError::ProgramLoad { name, cause: Box::new(cause) };
            uprobe.load().map_err(load_err)?;
            let fd = uprobe.fd().map_err(load_err)?.try_clone().map_err(|e| load_err(e.into()))?;
            programs.push((name, fd));
        }
        let probe_programs = attached.iter().map(|p| options.program_override.unwrap_or(p.program)).collect();
        let mut map_fds = Vec::new();
        for (name, map) in ebpf.maps() {
            if let Map::Array(data) | Map::PerCpuArray(data) | Map::PerCpuHashMap(data) | Map::HashMap(data) = map {
                let fd = data
                    .fd()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|cause| AttachError::MapFd { name: name.to_owned(), cause })?;
                map_fds.push((name.to_owned(), fd));
            }
        }
        let counters = take_map(&mut ebpf, names::COUNTERS_MAP, PerCpuHashMap::try_from)?;
        let stats = take_map(&mut ebpf, names::STATS_MAP, PerCpuArray::try_from)?;
        let returns = take_map(&mut ebpf, names::RETURNS_MAP, PerCpuHashMap::try_from)?;
        Ok(Self {
            ebpf,
            counters,
            stats,
            returns,
            programs,
            attached,
            missing,
            probe_programs,
            display_path: image.display_path.to_owned(),
            attach_path: image.attach_path.to_owned(),
            links: HashMap::new(),
            map_fds,
            multi_programs: HashMap::new(),
            multi_links: HashMap::new(),
        })
    }

    /// Attaches every probe to every process that maps the image, running
    /// now or started later (the kernel installs the breakpoints when a new
    /// process maps the file).
    pub fn attach_all_processes(&mut self) -> Result<(), AttachError> {
        self.attach_scope(ALL_PROCESSES, UProbeScope::AllProcesses)
    }

    /// Attaches every probe to `pid` (all its threads, no other process).
    pub fn attach_process(&mut self, pid: u32) -> Result<(), AttachError> {
        let nz = NonZeroU32::new(pid).ok_or(AttachError::TargetExited { pid })?;
        self.attach_scope(pid, UProbeScope::OneProcess(nz))
    }

    /// On failure nothing stays attached in that scope.
    fn attach_scope(&mut self, pid: u32, scope: UProbeScope) -> Result<(), AttachError> {
        let points = self.attach_points();
        let mut links = Vec::with_capacity(points.len());
        for AttachPoint { symbol, program, path, offset, cookie } in points {
            let point =
                UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(cookie) };
            let result = uprobe_mut(&mut self.ebpf, program).and_then(|p| {
                p.attach(point, &path, scope).map_err(|cause| {
                    if gone(pid) {
                        AttachError::TargetExited { pid }
                    } else {
                        AttachError::Attach { symbol, path: self.display_path.clone(), pid, cause: Box::new(cause) }
                    }
                })
            });
            match result {
                Ok(link) => links.push((program, link)),
                Err(err) => {
                    self.links.insert(pid, links);
                    self.detach_process(pid);
                    return Err(err);
                }
            }
        }
        self.links.insert(pid, links);
        Ok(())
    }

    /// Probes the call sites in `module`, mapped after the attach by `pid`
    /// ([`ALL_PROCESSES`] with `--exe`: the links then cover every process);
    /// a module in `lib-dynload`, or mapped at the attach, is covered already.
    /// Returns, per function with call sites there, how many were attached
    /// and the first place its address escapes in that module, if any.
    pub fn attach_late_module(&mut self, pid: u32, module: &Module) -> Result<Vec<LateSites>, AttachError> {
        let moved: Vec<usize> = (0..self.attached.len()).filter(|&i| self.attached[i].call_sites.is_some()).collect();
        let names: Vec<&str> = moved.iter().map(|&i| self.attached[i].symbol).collect();
        let data = std::fs::read(&module.attach_path)
            .map_err(|cause| AttachError::ModuleRead { path: module.display_path.clone(), cause })?;
        let kernel = placement::running_kernel();
        // A file that is not ELF holds no calls.
        let Ok(found) = callsites::scan(&data, &names, &vec![None; names.len()], kernel) else { return Ok(Vec::new()) };
        let mut late = Vec::new();
        let mut found_in: Vec<(usize, callsites::Found)> = Vec::new();
        let mut groups: BTreeMap<Program, Vec<(u64, u64)>> = BTreeMap::new();
        for (&i, f) in moved.iter().zip(found) {
            if f.emulated.is_empty() && f.stepped.is_empty() && f.escapes == 0 {
                continue;
            }
            let probe = &self.attached[i];
            let points = f.emulated.iter().chain(&f.stepped).map(|&o| (o, u64::from(probe.slot)));
            groups.entry(self.probe_programs[i]).or_default().extend(points);
            late.push(LateSites {
                symbol: probe.symbol,
                sites: f.emulated.len() + f.stepped.len(),
                escape: f.first_escape.clone(),
            });
            found_in.push((i, f));
        }
        // Every link first: if one fails, those made so far close when
        // dropped here, so nothing counts for a module reported as failed.
        let mut links = Vec::new();
        for (program, points) in groups.into_iter().filter(|(_, p)| !p.is_empty()) {
            links.push(self.multi_link(program, &module.attach_path, &points, pid)?);
        }
        self.multi_links.entry(pid).or_default().extend(links);
        for (i, f) in found_in {
            if let Some(sites) = self.attached[i].call_sites.as_mut() {
                sites.emulated += f.emulated.len();
                sites.stepped += f.stepped.len();
                sites.files.push(callsites::SiteFile::new(module, f));
            }
        }
        Ok(late)
    }

    /// One uprobe-multi link of `program` on `points` (offset, cookie) in
    /// `path`, loading the program for such links on first use.
    fn multi_link(
        &mut self,
        program: Program,
        path: &std::path::Path,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<OwnedFd, AttachError> {
        if !self.multi_programs.contains_key(&program) {
            let fd = multi::load(crate::BPF_OBJECT, program.name(), &self.map_fds)?;
            self.multi_programs.insert(program, fd);
        }
        let ret = program == Program::RetValueUret;
        Ok(multi::attach(&self.multi_programs[&program], program.name(), path, (points, ret), pid)?)
    }

    /// Whether any probe sits at its function's call sites.
    #[must_use]
    pub fn has_call_sites(&self) -> bool {
        self.attached.iter().any(|p| p.call_sites.is_some())
    }

    /// Detaches every probe from `pid` (its counts stay); [`ALL_PROCESSES`]
    /// for the system-wide attachment.
    pub fn detach_process(&mut self, pid: u32) {
        let slots: Vec<usize> = (0..self.attached.len()).collect();
        self.detach_in_order(pid, &slots);
    }

    /// Detaches `pid`'s probes one by one, in `order` of slots (any slot
    /// left out is detached last), and returns for each slot the moment its
    /// detach began: when the kernel removes its breakpoints. Detaching a
    /// probe then waits for a grace period under a kernel-wide lock (about
    /// 0.13 s here), so the later ones in `order` stay live that much longer
    /// each.
    pub fn detach_in_order(&mut self, pid: u32, order: &[usize]) -> Vec<Option<Instant>> {
        let mut links: Vec<Option<(Program, UProbeLinkId)>> =
            self.links.remove(&pid).unwrap_or_default().into_iter().map(Some).collect();
        let mut began = vec![None; links.len()];
        let rest: Vec<usize> = (0..links.len()).filter(|s| !order.contains(s)).collect();
        for &slot in order.iter().chain(&rest) {
            let Some((program, link)) = links.get_mut(slot).and_then(Option::take) else { continue };
            began[slot] = Some(Instant::now());
            if let Ok(p) = uprobe_mut(&mut self.ebpf, program) {
                // A link of a process that has exited detaches all the same;
                // an error here leaves nothing to undo.
                let _ = p.detach(link);
            }
        }
        began
    }

    /// Attaches every probe to `pid` ([`ALL_PROCESSES`]: every process)
    /// through uprobe-multi links, one per program (see [`crate::multi`]).
    /// On failure nothing stays attached in that scope.
    pub fn attach_multi(&mut self, pid: u32) -> Result<(), AttachError> {
        let mut links = Vec::new();
        // One link per program and file.
        let mut groups: BTreeMap<(Program, PathBuf), Vec<(u64, u64)>> = BTreeMap::new();
        for p in self.attach_points() {
            groups.entry((p.program, p.path)).or_default().push((p.offset, p.cookie));
        }
        for ((program, path), points) in groups {
            match self.multi_link(program, &path, &points, pid) {
                Ok(link) => links.push(link),
                Err(e) => {
                    drop(links);
                    if gone(pid) {
                        return Err(AttachError::TargetExited { pid });
                    }
                    return Err(e);
                }
            }
        }
        self.multi_links.insert(pid, links);
        Ok(())
    }

    /// Every place a uprobe goes: each probe's (placed) entry, then its
    /// return probes.
    fn attach_points(&self) -> Vec<AttachPoint> {
        let mut points = Vec::new();
        for (p, &program) in self.attached.iter().zip(&self.probe_programs) {
            let cookie = u64::from(p.slot);
            match &p.call_sites {
                None => points.push(AttachPoint {
                    symbol: p.symbol,
                    program,
                    path: self.attach_path.clone(),
                    offset: p.probe_offset(),
                    cookie,
                }),
                Some(sites) => {
                    for file in &sites.files {
                        points.extend(file.offsets.iter().map(|&offset| AttachPoint {
                            symbol: p.symbol,
                            program,
                            path: file.attach_path.clone(),
                            offset,
                            cookie,
                        }));
                    }
                }
            }
        }
        for p in &self.attached {
            let cookie = u64::from(p.slot);
            match &p.returns {
                None => {}
                Some(ReturnPlan::Uretprobe { .. }) => points.push(AttachPoint {
                    symbol: p.symbol,
                    program: Program::RetValueUret,
                    path: self.attach_path.clone(),
                    offset: p.file_offset,
                    cookie,
                }),
                Some(ReturnPlan::Sites { sites, .. }) => points.extend(sites.iter().map(|site| AttachPoint {
                    symbol: p.symbol,
                    program: Program::RetValue,
                    path: self.attach_path.clone(),
                    offset: p.file_offset + site.offset,
                    cookie,
                })),
            }
        }
        points
    }

    /// Detaches the uprobe-multi links of `pid`. Each link removes its
    /// breakpoints and then waits for a grace period; closing them from
    /// threads of their own lets every link remove its breakpoints at once.
    pub fn detach_multi(&mut self, pid: u32) {
        let links = self.multi_links.remove(&pid).unwrap_or_default();
        std::thread::scope(|scope| {
            for link in links {
                scope.spawn(move || drop(link));
            }
        });
    }

    /// Reads every counter, summing the per-CPU values.
    pub fn read(&self) -> Result<Readings, AttachError> {
        let map_err = |name| move |cause| AttachError::Map { name, cause: Box::new(cause) };
        let slots = self.attached.len();
        let mut totals = vec![Counter::default(); slots];
        let mut per_process: BTreeMap<u32, Vec<Counter>> = BTreeMap::new();
        // Hits whose slot names no probe: tracer only ever sets cookies to
        // probe slots, so this stays 0 unless tracer itself is wrong.
        let mut stray = 0u64;
        for entry in &self.counters {
            let (key, per_cpu) = entry.map_err(map_err(names::COUNTERS_MAP))?;
            let sum = per_cpu.iter().fold(Counter::default(), |sum, c| sum.merged(*c));
            let Some(slot) = usize::try_from(key.slot).ok().filter(|&s| s < slots) else {
                stray = stray.saturating_add(sum.calls);
                continue;
            };
            per_process.entry(key.tgid).or_insert_with(|| vec![Counter::default(); slots])[slot] = sum;
            totals[slot] = totals[slot].merged(sum);
        }
        let mut returns = vec![Returned::default(); slots];
        for entry in &self.returns {
            let (key, per_cpu) = entry.map_err(map_err(names::RETURNS_MAP))?;
            let sum = per_cpu.iter().fold(Returned::default(), |sum, r| sum.merged(*r));
            match usize::try_from(key.slot).ok().and_then(|s| returns.get_mut(s)) {
                Some(total) => *total = total.merged(sum),
                None => stray = stray.saturating_add(sum.returns),
            }
        }
        let mut stats = Vec::with_capacity(Stat::ALL.len());
        for index in 0..STAT_COUNT {
            let per_cpu = self.stats.get(&index, 0).map_err(map_err(names::STATS_MAP))?;
            stats.push(per_cpu.iter().fold(0u64, |sum, v| sum.saturating_add(*v)));
        }
        stats[Stat::SlotOutOfRange as usize] = stats[Stat::SlotOutOfRange as usize].saturating_add(stray);
        let mut kernel_misses = 0u64;
        let multi = self.multi_programs.iter().map(|(p, fd)| (p.name(), fd.as_fd()));
        for (name, fd) in self.programs.iter().map(|(n, fd)| (*n, fd.as_fd())).chain(multi) {
            let misses = recursion_misses(fd).map_err(|cause| AttachError::ProgramInfo { name, cause })?;
            kernel_misses = kernel_misses.saturating_add(misses);
        }
        Ok(Readings { totals, per_process, stats, returns, kernel_misses })
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

/// Whether an attach failed because its process `pid` is gone (never for
/// [`ALL_PROCESSES`]).
fn gone(pid: u32) -> bool {
    pid != ALL_PROCESSES && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The largest function whose `ret` instructions tracer looks for.
const MAX_FUNCTION: u64 = 1 << 16;

/// Resolves `specs` in the image and places each probe, without touching
/// the kernel: the attach plan `tracer probes` prints. Returns the probes in
/// slot order and the optional symbols the image lacks.
pub fn plan(
    image: ImageRef<'_>,
    specs: &[ProbeSpec],
    options: SessionOptions,
) -> Result<(Vec<AttachedProbe>, Vec<&'static str>), AttachError> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for spec in specs {
        match image.elf.function(spec.symbol) {
            Some(sym) => found.push((spec, sym.clone())),
            None if spec.required => {
                let path = image.display_path.to_owned();
                return Err(AttachError::RequiredMissing { symbol: spec.symbol, path });
            }
            None => missing.push(spec.symbol),
        }
    }
    if found.is_empty() {
        return Err(AttachError::NoProbes { path: image.display_path.to_owned() });
    }
    let kernel = placement::running_kernel();
    let mut attached = Vec::with_capacity(found.len());
    for (slot, (spec, sym)) in (0u32..).zip(&found) {
        let program = options.program_override.unwrap_or(spec.program);
        let len = if sym.size > 0 { sym.size.min(4096) } else { 64 };
        let code = image.elf.read_at(sym.file_offset, usize::try_from(len).unwrap_or(64));
        let place = match (spec.kind, code, options.placement) {
            (ProbeKind::Function, Ok(code), PlacementMode::Entry) => {
                placement::at_entry_of(&code, sym.address, kernel, "entry (--placement entry)")
            }
            (ProbeKind::Function, Ok(code), PlacementMode::Auto | PlacementMode::CallSites) => {
                placement::place(&code, sym.address, program, kernel)
            }
            (ProbeKind::Function, Err(e), _) => Placement::at_entry(format!("entry: the code could not be read ({e})")),
        };
        let returns = options.returns.filter(|_| spec.program.allocates()).map(|costs| {
            let len = usize::try_from(sym.size.min(MAX_FUNCTION)).unwrap_or(0);
            match image.elf.read_at(sym.file_offset, len) {
                Ok(code) if sym.size <= MAX_FUNCTION => returns::plan(&code, sym.address, place.offset, &costs, kernel),
                Ok(_) => ReturnPlan::Uretprobe { reason: format!("the function is over {MAX_FUNCTION} bytes") },
                Err(e) => ReturnPlan::Uretprobe { reason: format!("the code could not be read ({e})") },
            }
        });
        attached.push(AttachedProbe {
            symbol: spec.symbol,
            program: spec.program,
            slot,
            file_offset: sym.file_offset,
            placement: place,
            returns,
            call_sites: None,
        });
    }
    if options.placement == PlacementMode::CallSites {
        place_at_call_sites(image, &mut attached, kernel);
    }
    Ok((attached, missing))
}

/// Moves each probe that would be single-stepped to its function's call
/// sites, where those see every call; the rest keep their placement, with
/// the reason added.
fn place_at_call_sites(image: ImageRef<'_>, attached: &mut [AttachedProbe], kernel: placement::KernelVersion) {
    let stepped: Vec<usize> = (0..attached.len()).filter(|&i| !attached[i].placement.emulated).collect();
    if stepped.is_empty() {
        return;
    }
    let names: Vec<&str> = stepped.iter().map(|&i| attached[i].symbol).collect();
    let defined: Vec<Option<u64>> = names.iter().map(|n| image.elf.function(n).map(|s| s.address)).collect();
    let own = Module { display_path: image.display_path.to_owned(), attach_path: image.attach_path.to_owned() };
    let plans = callsites::plan(&own, &names, &defined, image.modules, kernel);
    for (&i, plan) in stepped.iter().zip(plans) {
        let probe = &mut attached[i];
        match plan {
            Ok(sites) => {
                probe.placement = Placement {
                    offset: 0,
                    instruction: format!("{} calls", sites.emulated + sites.stepped),
                    emulated: sites.stepped == 0,
                    reason: sites.describe(),
                };
                probe.call_sites = Some(sites);
            }
            Err(why) => probe.placement.reason = format!("{}; not at its call sites: {why}", probe.placement.reason),
        }
    }
}

fn uprobe_mut(ebpf: &mut Ebpf, program: Program) -> Result<&mut UProbe, AttachError> {
    let name = program.name();
    ebpf.program_mut(name)
        .ok_or(AttachError::ProgramMissing { name })?
        .try_into()
        .map_err(|cause| AttachError::ProgramLoad { name, cause: Box::new(cause) })
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

/// `recursion_misses` of a loaded program, from `BPF_OBJ_GET_INFO_BY_FD`
/// (aya does not expose this field).
fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    /// The `info` member of `union bpf_attr` (include/uapi/linux/bpf.h).
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // SAFETY: bpf_prog_info is plain integers, for which all-zero is valid.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoByFd {
        bpf_fd: u32::try_from(fd.as_raw_fd()).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?,
        info_len: u32::try_from(size_of_val(&info)).unwrap_or(u32::MAX),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: attr points to a valid InfoByFd whose `info` points to a
    // writable bpf_prog_info of `info_len` bytes; both outlive the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, std::ptr::from_mut(&mut attr), size_of::<InfoByFd>())
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.recursion_misses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{DEFAULT_PROBES, ProbeSelection};

    fn test_binary() -> ElfImage {
        ElfImage::open(&std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn a_missing_required_symbol_fails_before_any_bpf_is_loaded() {
        let elf = test_binary();
        let path = std::path::Path::new("/usr/lib/libnotpython.so");
        let image = ImageRef { elf: &elf, display_path: path, attach_path: path, modules: &[] };
        let err = plan(image, DEFAULT_PROBES, SessionOptions::default()).expect_err("no PyObject_Malloc here");
        assert_eq!(
            err.to_string(),
            "required symbol PyObject_Malloc is not in /usr/lib/libnotpython.so; this build of CPython cannot be traced (was it stripped?)"
        );
        assert!(err.is_bad_input());
        let refs = ProbeSelection::Refs.select(DEFAULT_PROBES);
        let err = plan(image, &refs, SessionOptions::default()).expect_err("no probe symbol here");
        assert!(matches!(err, AttachError::NoProbes { .. }), "{err}");
    }
}
