//! Attaching a session's plan as uprobes and detaching it: perf-event
//! uprobes through aya, or uprobe-multi links through [`super::multi`].

use std::{collections::BTreeMap, num::NonZeroU32, os::fd::OwnedFd, path::PathBuf, time::Instant};

use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};

use tracer_common::site;

use super::{ALL_PROCESSES, AttachError, Session, heat::TIERS, multi};
use crate::{
    discover::modules::Module,
    plan::{
        callsites::{Found, SiteFile},
        returns::ReturnPlan,
    },
    probe::Program,
};

/// One uprobe to attach: what, where (a file and an offset in it) and its
/// cookie.
struct AttachPoint {
    symbol: &'static str,
    program: Program,
    path: PathBuf,
    /// The file as the target sees it, for errors.
    shown: PathBuf,
    offset: u64,
    cookie: u64,
}

/// One link's worth of points: of one program, in one file.
type Group = ((Program, PathBuf), Vec<AttachPoint>);

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

impl Session {
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

    /// Attaches every probe to `pid`, or with [`ALL_PROCESSES`] to every
    /// process, through perf-event uprobes.
    pub fn attach_perf(&mut self, pid: u32) -> Result<(), AttachError> {
        if pid == ALL_PROCESSES { self.attach_all_processes() } else { self.attach_process(pid) }
    }

    /// On failure nothing stays attached in that scope.
    fn attach_scope(&mut self, pid: u32, scope: UProbeScope) -> Result<(), AttachError> {
        let points = self.attach_points();
        let mut links = Vec::with_capacity(points.len());
        for AttachPoint { symbol, program, path, shown, offset, cookie } in points {
            // The probe the link counts for, by which the budget detaches.
            let slot = self.plan.probes.iter().find(|p| p.symbol == symbol).map_or(usize::MAX, |p| p.slot as usize);
            let point =
                UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(cookie) };
            let attached = self.loaded_uprobe(program).and_then(|p| {
                p.attach(point, &path, scope).map_err(|cause| AttachError::Attach {
                    symbol,
                    path: shown,
                    pid,
                    cause: Box::new(cause),
                })
            });
            let result = match attached {
                Err(AttachError::Attach { .. }) if self.gone(pid) => Err(AttachError::TargetExited { pid }),
                other => other,
            };
            match result {
                Ok(link) => links.push((program, link, slot)),
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

    /// Probes the call sites `found` in `module` (per probe slot, from
    /// [`crate::plan::late_call_sites`]), mapped after the attach by `pid`
    /// ([`ALL_PROCESSES`] with `--exe`: the links then cover every process).
    /// Returns, per function with call sites there, how many were attached
    /// and the first place its address escapes in that module, if any.
    pub fn attach_late_module(
        &mut self,
        pid: u32,
        module: &Module,
        found: Vec<(u32, Found)>,
    ) -> Result<Vec<LateSites>, AttachError> {
        let mut late = Vec::new();
        let mut groups: BTreeMap<Program, Vec<(u64, u64)>> = BTreeMap::new();
        for (slot, f) in &found {
            let Some(probe) = self.plan.probes.iter().find(|p| p.slot == *slot) else { continue };
            let points = f.emulated.iter().chain(&f.stepped).map(|&o| (o, entry_cookie(probe)));
            groups.entry(probe.attach_program).or_default().extend(points);
            late.push(LateSites {
                symbol: probe.symbol,
                sites: f.emulated.len() + f.stepped.len(),
                escape: f.first_escape.clone(),
            });
        }
        // Every link first: if one fails, those made so far close when
        // dropped here, so nothing counts for a module reported as failed.
        let mut links = Vec::new();
        for (program, points) in groups.into_iter().filter(|(_, p)| !p.is_empty()) {
            links.push(self.multi_link(program, &module.attach_path, &points, pid)?);
        }
        let made = links.into_iter().map(|fd| MultiLink { fd, tier: 0, sites: 0 });
        self.multi_links.entry(pid).or_default().extend(made);
        for (slot, f) in found {
            let Some(probe) = self.plan.probes.iter_mut().find(|p| p.slot == slot) else { continue };
            if let Some(sites) = probe.call_sites.as_mut() {
                sites.emulated += f.emulated.len();
                sites.stepped += f.stepped.len();
                sites.files.push(SiteFile::new(module, f));
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
        self.load_multi_program(program)?;
        let ret = matches!(program, Program::RetValueUret | Program::LiveRetUret);
        Ok(multi::attach(&self.multi_programs[&program], program.name(), path, (points, ret), pid)?)
    }

    /// Loads `program` for uprobe-multi links, once.
    fn load_multi_program(&mut self, program: Program) -> Result<(), AttachError> {
        if !self.multi_programs.contains_key(&program) {
            let fd = multi::load(self.object, program.name(), &self.map_fds)?;
            self.multi_programs.insert(program, fd);
        }
        Ok(())
    }

    /// Loads every program the plan attaches, for uprobe-multi links or
    /// perf-event uprobes, so that the attach that follows is only the
    /// attach (the verifier takes a while).
    pub fn prepare(&mut self, multi: bool) -> Result<(), AttachError> {
        let programs: std::collections::BTreeSet<Program> = self.attach_points().iter().map(|p| p.program).collect();
        for program in programs {
            if multi {
                self.load_multi_program(program)?;
            } else {
                self.loaded_uprobe(program)?;
            }
        }
        Ok(())
    }

    /// Detaches every probe from `pid` (its counts stay); [`ALL_PROCESSES`]
    /// for the system-wide attachment.
    pub fn detach_process(&mut self, pid: u32) {
        let slots: Vec<usize> = (0..self.plan.probes.len()).collect();
        self.detach_in_order(pid, &slots);
    }

    /// Detaches `pid`'s perf-event links one by one, probe by probe in
    /// `order` of their slots (any left out is detached last), and returns
    /// for each probe, by slot, the moment its detach began: when the
    /// kernel begins removing its breakpoints. A probe has a link for its
    /// entry (or each call site) and one for each inlined copy and return
    /// site. Detaching one waits for a grace period under a kernel-wide
    /// lock (about 0.13 s here), so the later ones in `order` stay live
    /// that much longer each.
    pub fn detach_in_order(&mut self, pid: u32, order: &[usize]) -> Vec<Option<Instant>> {
        let mut links = self.links.remove(&pid).unwrap_or_default();
        let slots = self.plan.probes.len();
        // A probe's place in `order`; those left out after it, by slot,
        // and links of no probe's slot last. The sort is stable, so a
        // probe's links keep their order.
        let rank = |slot: usize| {
            order.iter().position(|&s| s == slot).unwrap_or(if slot < slots { order.len() + slot } else { usize::MAX })
        };
        links.sort_by_key(|l| rank(l.2));
        let mut began = vec![None; slots];
        for (program, link, slot) in links {
            if let Some(b) = began.get_mut(slot) {
                b.get_or_insert_with(Instant::now);
            }
            if let Ok(p) = super::uprobe_mut(&mut self.ebpf, program) {
                // A link of a process that has exited detaches all the
                // same; an error here leaves nothing to undo.
                let _ = p.detach(link);
            }
        }
        began
    }

    /// Attaches every probe to `pid` ([`ALL_PROCESSES`]: every process)
    /// through uprobe-multi links, one per program and file (see
    /// [`super::multi`]). One offset the kernel refuses fails its whole
    /// link; the link's points are then attached in halves, down to the
    /// refused ones, which are left out and make their probe's coverage
    /// partial. On failure nothing stays attached in that scope.
    pub fn attach_multi(&mut self, pid: u32) -> Result<(), AttachError> {
        let heat = self.heat()?;
        let mut links = Vec::new();
        let mut groups: BTreeMap<(Program, PathBuf), Vec<AttachPoint>> = BTreeMap::new();
        for p in self.attach_points() {
            groups.entry((p.program, p.path.clone())).or_default().push(p);
        }
        // Where the hits landed is known (after a window), each link's
        // hottest sites go into links of their own, in tiers attached after
        // the rest, the hottest last (see super::heat), each tier in the
        // same order of programs.
        let mut tiers: Vec<Vec<Group>> = (0..=TIERS.len()).map(|_| Vec::new()).collect();
        for ((program, path), points) in groups {
            let (cold, hot) = match &heat {
                Some(h) if super::heat::splits(program) => super::heat::split(points, |p| p.offset, h),
                _ => (points, Vec::new()),
            };
            // The hottest tier is the last to go in.
            for (tier, points) in hot.into_iter().enumerate() {
                tiers[TIERS.len() - tier].push(((program, path.clone()), points));
            }
            tiers[0].push(((program, path), cold));
        }
        let mut refused = Vec::new();
        for (tier, groups) in tiers.into_iter().enumerate() {
            for ((program, path), points) in groups.into_iter().filter(|(_, p)| !p.is_empty()) {
                let before = refused.len();
                let mut made = Vec::new();
                let result = match self.attach_halves(program, &path, &points, pid, (&mut made, &mut refused)) {
                    // Every point refused: no one offset's fault (a kernel
                    // without uprobe-multi links, say).
                    Ok(Some(e)) if refused.len() - before == points.len() => Err(e),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                links.extend(made.into_iter().map(|l| MultiLink { fd: l, tier, sites: points.len() }));
                if let Err(e) = result {
                    drop(links);
                    if self.gone(pid) {
                        return Err(AttachError::TargetExited { pid });
                    }
                    return Err(e);
                }
            }
        }
        self.multi_links.insert(pid, links);
        for (symbol, offset, cause) in refused {
            self.refuse(symbol, offset, &cause);
        }
        Ok(())
    }

    /// Attaches `points` in one link, or where the kernel refuses it, each
    /// half in turn, down to single points, which are recorded in `refused`
    /// with why. Returns the first refusal, if any.
    fn attach_halves(
        &mut self,
        program: Program,
        path: &std::path::Path,
        points: &[AttachPoint],
        pid: u32,
        (links, refused): (&mut Vec<OwnedFd>, &mut Vec<(&'static str, u64, String)>),
    ) -> Result<Option<AttachError>, AttachError> {
        let pairs: Vec<(u64, u64)> = points.iter().map(|p| (p.offset, p.cookie)).collect();
        let err = match self.multi_link(program, path, &pairs, pid) {
            Ok(link) => {
                links.push(link);
                return Ok(None);
            }
            Err(AttachError::Multi(e)) if e.is_unsupported() && !self.gone(pid) => AttachError::Multi(e),
            Err(e) => return Err(e),
        };
        if let [one] = points {
            refused.push((one.symbol, one.offset, err.to_string()));
            return Ok(Some(err));
        }
        let (a, b) = points.split_at(points.len() / 2);
        self.attach_halves(program, path, a, pid, (&mut *links, &mut *refused))?;
        self.attach_halves(program, path, b, pid, (&mut *links, &mut *refused))?;
        Ok(Some(err))
    }

    /// How many breakpoints an attach writes into a process's code (and a
    /// detach takes out): one at each place, however many programs share
    /// it.
    #[must_use]
    pub fn breakpoints(&self) -> u32 {
        let points = self.attach_points();
        let places: std::collections::BTreeSet<(&PathBuf, u64)> = points.iter().map(|p| (&p.path, p.offset)).collect();
        u32::try_from(places.len()).unwrap_or(u32::MAX)
    }

    /// Every place a uprobe goes: each probe's (placed) entry or call
    /// sites, then its return probes.
    fn attach_points(&self) -> Vec<AttachPoint> {
        let mut points = Vec::new();
        for p in &self.plan.probes {
            let image = p.attach_path(&self.plan).to_owned();
            let shown = p.display_path(&self.plan).to_owned();
            let cookie = u64::from(p.slot);
            let apart = p.stepped_apart();
            let entry_cookie =
                if apart && !p.placement.emulated { site::mark_stepped(entry_cookie(p)) } else { entry_cookie(p) };
            let at = |path: &PathBuf, shown: &PathBuf, offset| AttachPoint {
                symbol: p.symbol,
                program: p.attach_program,
                path: path.clone(),
                shown: shown.clone(),
                offset,
                cookie: entry_cookie,
            };
            match &p.call_sites {
                None => points.push(at(&image, &shown, p.probe_offset())),
                Some(sites) => {
                    for file in &sites.files {
                        points.extend(
                            file.offsets.iter().map(|&offset| at(&file.attach_path, &file.display_path, offset)),
                        );
                    }
                }
            }
            // An inlined copy has no arguments in the ABI's registers: its
            // size (or object) is read where its DWARF or code says, or not
            // at all.
            points.extend(p.inline_sites.iter().map(|s| {
                let realloc = p.live.is_some_and(|r| r.api() == tracer_common::live::Role::REALLOC);
                // A copy probed at the jump into it counts where the jump
                // goes there.
                let slot = s.gate.map_or(p.slot, |condition| site::gated(p.slot, condition));
                let (program, cookie) = match (p.attach_program, s.size, s.object) {
                    (bench, _, _) if bench.is_bench() => (bench, cookie),
                    // With --live, a realloc's copy leaves its block for the
                    // implementation it calls, as its second operand, where
                    // the size needs no second one and the two share the
                    // constant.
                    (program, Some((first, site::NONE, constant)), Some((block, block_constant)))
                        if realloc && program.counts_bytes() =>
                    {
                        let cookie = match (site::uses_constant(first), site::uses_constant(block)) {
                            (true, true) if constant != block_constant => {
                                site::encode(slot, first, site::NONE, constant)
                            }
                            (false, true) => site::encode(slot, first, block, block_constant),
                            _ => site::encode(slot, first, block, constant),
                        };
                        (Program::CountSite, cookie)
                    }
                    (program, None, Some((block, constant))) if realloc && program.counts_bytes() => {
                        (Program::CountCall, site::encode(slot, site::INLINED, block, constant))
                    }
                    (program, Some((first, second, constant)), _) if program.counts_bytes() => {
                        (Program::CountSite, site::encode(slot, first, second, constant))
                    }
                    (Program::CountObject, _, Some((first, constant))) => {
                        (Program::CountObject, site::encode(slot, first, site::NONE, constant))
                    }
                    // Marked as a copy in the second operand, as below.
                    (Program::FreeObject, _, Some((first, constant))) => {
                        (Program::FreeObject, site::encode(slot, first, site::INLINED, constant))
                    }
                    // With --live, a free's copy takes its block out of the
                    // table: where the block is is its second operand.
                    (Program::CountCall, _, Some((second, constant)))
                        if p.live.is_some_and(|r| r.api() == tracer_common::live::Role::FREE) =>
                    {
                        (Program::CountCall, site::encode(slot, site::INLINED, second, constant))
                    }
                    // Marked as a copy: with --live, its call leaves its
                    // domain for the implementation it calls.
                    _ => (Program::CountCall, site::encode(slot, site::INLINED, site::NONE, 0)),
                };
                let cookie = if apart && !s.emulated { site::mark_stepped(cookie) } else { cookie };
                AttachPoint { program, cookie, ..at(&image, &shown, s.offset) }
            }));
            // A benchmarks' program replaces the marks too.
            let nested = if p.attach_program.is_bench() { p.attach_program } else { Program::NativeNested };
            points.extend(p.nested_sites.iter().map(|&offset| AttachPoint {
                program: nested,
                cookie,
                ..at(&image, &shown, offset)
            }));
        }
        self.live_points(&mut points);
        for p in &self.plan.probes {
            let image = p.attach_path(&self.plan).to_owned();
            let shown = p.display_path(&self.plan).to_owned();
            let cookie = u64::from(p.slot);
            let at = |program, offset| AttachPoint {
                symbol: p.symbol,
                program,
                path: image.clone(),
                shown: shown.clone(),
                offset,
                cookie,
            };
            match &p.returns {
                None => {}
                Some(ReturnPlan::Uretprobe { .. }) => points.push(at(Program::RetValueUret, p.file_offset)),
                Some(ReturnPlan::Sites { sites, .. }) => {
                    points.extend(sites.iter().map(|site| at(Program::RetValue, p.file_offset + site.offset)));
                }
            }
        }
        // The marks go live before the probes they mark (as the multi
        // links' order of programs has them too): a call marked before its
        // probe is live leaves one stale mark on its thread, where a probe
        // live before its marks counts every marked call in between as its
        // own.
        points.sort_by_key(|p| p.program != Program::NativeNested);
        points
    }

    /// With `--live`, the points of the live table's programs: each
    /// allocator API function's entry, and each implementation's entry and
    /// returns.
    fn live_points(&self, points: &mut Vec<AttachPoint>) {
        // With --live, each allocator API function leaves its call's
        // domain for the implementation it calls, where its counting probe
        // sits (sharing its breakpoint): the placement moves it only where
        // the stack pointer is still the entry's, the caller's, and the
        // arguments live_alloc and live_free read are intact.
        for p in &self.plan.probes {
            let Some(role) = p.live else { continue };
            let at = |program, offset| AttachPoint {
                symbol: p.symbol,
                program,
                path: p.attach_path(&self.plan).to_owned(),
                shown: p.display_path(&self.plan).to_owned(),
                offset,
                cookie: u64::from(p.slot),
            };
            if role.is_native() {
                // A libc function's entry probe pushes its frame itself;
                // its returns end it.
                match &p.live_returns {
                    None => {}
                    Some(ReturnPlan::Uretprobe { .. }) => points.push(at(Program::LiveRetUret, p.file_offset)),
                    Some(ReturnPlan::Sites { sites, .. }) => {
                        points.extend(sites.iter().map(|site| at(Program::LiveRet, p.file_offset + site.offset)));
                    }
                }
                continue;
            }
            let program =
                if role.api() == tracer_common::live::Role::FREE { Program::LiveFree } else { Program::LiveAlloc };
            let offset = if p.call_sites.is_none() { p.probe_offset() } else { p.file_offset };
            points.push(at(program, offset));
        }
        // The implementations are in the interpreter's image.
        let (image, shown) = (&self.plan.attach_path, &self.plan.display_path);
        // The implementations' entries before their returns: a return is
        // paired with its entry's frame, so none may run whose entry was
        // not seen.
        for i in &self.plan.live_impls {
            let cookie = u64::from(i.slot);
            points.push(AttachPoint {
                symbol: i.name,
                program: Program::LiveImpl,
                path: image.clone(),
                shown: shown.clone(),
                offset: i.file_offset + i.placement.offset,
                cookie,
            });
        }
        for i in &self.plan.live_impls {
            let cookie = u64::from(i.slot);
            let at = |program, offset| AttachPoint {
                symbol: i.name,
                program,
                path: image.clone(),
                shown: shown.clone(),
                offset,
                cookie,
            };
            match &i.returns {
                // Where live_impl traps: the return address is still at
                // the stack pointer there, and the two share a breakpoint.
                ReturnPlan::Uretprobe { .. } => {
                    points.push(at(Program::LiveRetUret, i.file_offset + i.placement.offset));
                }
                ReturnPlan::Sites { sites, .. } => {
                    points.extend(sites.iter().map(|site| at(Program::LiveRet, i.file_offset + site.offset)));
                }
            }
        }
    }

    /// Detaches the uprobe-multi links of `pid`, their hottest tier first
    /// (see [`super::heat`]). Each link removes its breakpoints and then
    /// waits for a grace period; closing them from threads of their own
    /// lets them wait at once, and each tier begins once the tier before
    /// it has had time to take its breakpoints out.
    pub fn detach_multi(&mut self, pid: u32) {
        let mut links = self.multi_links.remove(&pid).unwrap_or_default();
        links.sort_by_key(|l| std::cmp::Reverse(l.tier));
        std::thread::scope(|scope| {
            let mut tier = links.first().map_or(0, |l| l.tier);
            let mut sites = 0;
            for MultiLink { fd, tier: t, sites: n, .. } in links {
                if t != tier {
                    std::thread::sleep(super::heat::PER_SITE * u32::try_from(sites).unwrap_or(u32::MAX));
                    (tier, sites) = (t, 0);
                }
                sites += n;
                scope.spawn(move || drop(fd));
            }
        });
    }
}

/// A uprobe-multi link, with its tier of heat (0: the cold rest, or no
/// heat known) and how many sites it holds.
pub(super) struct MultiLink {
    fd: OwnedFd,
    tier: usize,
    sites: usize,
}

impl MultiLink {
    /// Its tier of heat: 0 for the cold rest, [`TIERS`]`.len()` for the
    /// hottest.
    #[cfg(test)]
    pub(super) const fn tier(&self) -> usize {
        self.tier
    }
}

/// The cookie of probe `p` at its function's entry or at a call of it,
/// where the arguments are in the ABI's registers: the slot, and for
/// `count_object` the object, the first argument (`%rdi`, DWARF register 5).
fn entry_cookie(p: &crate::plan::PlannedProbe) -> u64 {
    match p.attach_program {
        Program::CountObject | Program::FreeObject => {
            site::encode(p.slot, site::register(5).unwrap_or(site::NONE), site::NONE, 0)
        }
        _ => u64::from(p.slot),
    }
}
