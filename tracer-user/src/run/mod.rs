//! The run loop of `tracer attach`: from the resolved target to the final
//! summary, with `--budget`'s windows ([`duty`]), modules mapped late
//! ([`late`]) and exited processes ([`readout`]).

pub mod budget;
pub mod calibrate;
pub mod cost;
mod duty;
pub mod exit;
pub mod exits;
mod late;
pub mod live;
pub mod readout;
pub mod stacks;
pub mod types;

use std::{io::Write, os::fd::OwnedFd, time::Instant};

use anyhow::Context as _;
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    signal::unix::{SignalKind, signal},
    time::{MissedTickBehavior, interval_at, sleep_until},
};

use self::{
    cost::{Advice, Calibration, CostMeter},
    duty::DutyCycle,
    exit::ProcessExit,
    late::{LateModules, Watch},
    readout::Readout,
};
use crate::{
    config::{AttachConfig, LinkMode},
    discover::{self, Resolved, TargetSpec},
    kernel::{AttachError, LoadOptions, Session},
    model::{Attached, End, Event, Level, Links, Note, NoteCode, PlanReport, PythonInfo, Snapshot, Summary},
    plan::{
        self, ImageRef, PlacementMode, PlanOptions,
        gc::{GcMode, GcPlan, GcSource},
        returns::ReturnCosts,
    },
    privileges,
    probe::ProbeSelection,
    report::{self, Reporter},
};

/// Attaches every probe as `mode` says; returns how, when the attach
/// began once the programs were loaded, and the note to give when `auto`
/// fell back.
fn attach_links(
    session: &mut Session,
    scope: u32,
    mode: LinkMode,
) -> Result<(Links, Instant, Option<Note>), AttachError> {
    let perf = |session: &mut Session, note| {
        session.prepare(false)?;
        let began = Instant::now();
        session.attach_perf(scope).map(|()| (Links::Perf, began, note))
    };
    let multi = |session: &mut Session| {
        session.prepare(true)?;
        let began = Instant::now();
        session.attach_multi(scope).map(|()| (Links::Multi, began, None))
    };
    match mode {
        LinkMode::Perf => perf(session, None),
        LinkMode::Multi => multi(session),
        LinkMode::Auto => match multi(session) {
            Ok(done) => Ok(done),
            // Thousands of perf-event uprobes would take minutes to detach.
            Err(AttachError::Multi(e)) if session.plan().has_many_sites() && e.is_unsupported() => {
                Err(AttachError::ManySitesNeedMulti { cause: e })
            }
            Err(e @ AttachError::Multi(_)) if session.plan().has_many_sites() => Err(e),
            // Only a kernel without multi links is a reason to fall back; a
            // failure of tracer's own is reported as it is.
            Err(AttachError::Multi(e)) if e.is_unsupported() => {
                let note = Note::new(
                    Level::Note,
                    NoteCode::LinkFallback,
                    format!(
                        "{e}; attaching one perf-event uprobe per probe instead, which the kernel detaches about 0.13 s apart"
                    ),
                );
                perf(session, Some(note))
            }
            Err(e) => Err(e),
        },
    }
}

/// Room for (process, type) pairs with `--types`: a large program has a few
/// thousand types; one past the room is counted (`types_full`).
const TYPE_ENTRIES: u32 = 1 << 15;

/// Room for objects `--types` saw created and not yet destroyed (not
/// preallocated: a few dozen bytes of kernel memory per object held); one
/// past the room is counted (`objects_full`), and its type's live count is
/// then too high.
const OBJECT_ENTRIES: u32 = 1 << 20;

/// Writes `--folded` and `--flamegraph` from the summary's stacks, and
/// says where.
fn write_stacks(
    stacks: &crate::config::StacksConfig,
    last: &Snapshot,
    config: &AttachConfig,
) -> anyhow::Result<Vec<Note>> {
    let all = last.stacks.as_deref().unwrap_or_default();
    let lines = report::stacks::folded(all, stacks.weight);
    let mut notes = Vec::new();
    let what = match &config.target {
        TargetSpec::Pid(pid) => format!("PID {pid}"),
        TargetSpec::Exe(exe) => exe.display().to_string(),
    };
    let sampled = if stacks.sample > 1 { format!(", 1 in {} sampled, scaled", stacks.sample) } else { String::new() };
    if let Some(file) = &stacks.folded {
        report::stacks::write_folded(file, &lines)?;
        notes.push(Note::new(
            Level::Note,
            NoteCode::Written,
            format!("wrote {} folded stacks by {} to {}", lines.len(), stacks.weight.name(), file.path.display()),
        ));
    }
    if let Some(file) = &stacks.flamegraph {
        let title = format!("tracer: allocations of {what} by {}{sampled}", stacks.weight.name());
        report::stacks::write_flamegraph(file, &lines, &title, stacks.weight)?;
        notes.push(Note::new(
            Level::Note,
            NoteCode::Written,
            format!("wrote the flame graph of {} stacks to {}", lines.len(), file.path.display()),
        ));
    }
    Ok(notes)
}

/// Room for distinct stacks, and for (process, probe, stack) counts: a
/// stack is 2 KB in the kernel, allocated as it is first seen.
const STACK_ENTRIES: u32 = 1 << 14;

/// The slots of the probes `--stacks` names, which must be probed.
fn stack_slots(
    r: &Resolved,
    plan: &crate::plan::Plan,
    stacks: &crate::config::StacksConfig,
) -> Result<Vec<u32>, crate::config::ConfigError> {
    let wanted = stacks.events.select(r.abi.probes(), &r.version.to_string())?;
    let mut slots = Vec::new();
    for spec in wanted {
        match plan.probes.iter().find(|p| p.symbol == spec.symbol) {
            Some(p) => slots.push(p.slot),
            // Not in this build, or not probed: only a named one is an error.
            None if matches!(stacks.events, crate::probe::ProbeSelection::Names(_)) => {
                return Err(crate::config::ConfigError::StacksNotProbed { name: spec.symbol.to_owned() });
            }
            None => {}
        }
    }
    if slots.is_empty() {
        return Err(crate::config::ConfigError::StacksNothingProbed);
    }
    Ok(slots)
}

/// The probe table rows `selection` picks for the resolved target. With
/// `types`, every function that creates objects the version has, since
/// where `_Py_NewReferenceNoTotal` exists (3.12+) the free lists' objects
/// pass it instead of `_Py_NewReference`, and the object domain's free,
/// where objects are seen destroyed.
fn specs(
    r: &Resolved,
    selection: &ProbeSelection,
    types: bool,
) -> Result<Vec<crate::probe::ProbeSpec>, crate::config::ConfigError> {
    let mut specs = selection.select(r.abi.probes(), &r.version.to_string())?;
    if types {
        for p in r.abi.probes() {
            let counts_objects = crate::python::object_parameter(p.symbol).is_some()
                || crate::python::freed_parameter(p.symbol).is_some();
            if counts_objects && !specs.iter().any(|s| s.symbol == p.symbol) {
                specs.push(*p);
            }
        }
    }
    Ok(specs)
}

/// The GC probes of the resolved target, as `mode` says.
fn gc_plan(r: &Resolved, mode: GcMode) -> Result<GcPlan, plan::gc::GcPlanError> {
    let version = r.version.to_string();
    let debug = match &r.inlining {
        discover::Inlining::Known { source, .. } => Some(std::path::PathBuf::from(source)),
        _ => None,
    };
    let image = plan::gc::GcImage {
        elf: &r.elf,
        display_path: &r.display_path,
        attach_path: &r.attach_path,
        version: &version,
        debug: debug.as_deref(),
    };
    plan::gc::plan(image, crate::python::gc_knowledge(r.abi), mode)
}

/// What the user should know of the GC plan: that collections are not
/// seen, and why (not with `--gc off`, which asked for it), or what the
/// function's counts hold that the markers would not count.
fn gc_note(gc: &GcPlan, mode: GcMode) -> Option<Note> {
    match (gc.source, &gc.caveat) {
        (GcSource::None, _) if mode != GcMode::Off => Some(Note::new(Level::Note, NoteCode::Gc, gc.detail.clone())),
        (GcSource::Function, Some(caveat)) => Some(Note::new(Level::Warning, NoteCode::Gc, caveat.clone())),
        _ => None,
    }
}

/// The attach header of a session.
fn attached_event(session: &Session, r: &Resolved, links: Links, cost: &CostMeter) -> Attached {
    let probes = &session.plan().probes;
    Attached {
        pid: r.pid(),
        exe: r.exe.as_ref().map(|e| e.display().to_string()),
        python: PythonInfo { version: r.version.to_string(), image: r.display_path.display().to_string() },
        pid_in_namespace: r.ns_pid,
        probes: probes.iter().map(|p| p.symbol.to_owned()).collect(),
        missing: session.plan().missing.iter().map(|m| (*m).to_owned()).collect(),
        links,
        returns: probes.iter().filter_map(|p| Some((p.symbol.to_owned(), p.returns.clone()?))).collect(),
        return_costs_ns: None,
        call_sites: probes
            .iter()
            .filter_map(|p| Some((p.symbol.to_owned(), p.call_sites.as_ref().map(|c| c.emulated + c.stepped)?)))
            .collect(),
        placements: probes.iter().map(|p| (p.symbol.to_owned(), p.placement.clone())).collect(),
        measures_bytes: probes.iter().filter(|p| p.program.counts_bytes()).map(|p| p.symbol.to_owned()).collect(),
        coverage: probes.iter().map(|p| (p.symbol.to_owned(), p.coverage.clone())).collect(),
        sites: cost.sites(session.plan()),
        gc: None,
        native: probes.iter().find_map(|p| p.file.as_ref()).map(|f| f.display_path.display().to_string()),
    }
}

/// Everything a run reports through, in order.
struct Output<'a> {
    reporter: Box<dyn Reporter + 'a>,
    attached: Option<Attached>,
    previous: Option<Snapshot>,
}

impl Output<'_> {
    fn emit(&mut self, event: &Event) -> std::io::Result<()> {
        self.reporter.event(event)
    }

    fn notes(&mut self, notes: impl IntoIterator<Item = Note>) -> std::io::Result<()> {
        notes.into_iter().try_for_each(|n| self.emit(&Event::Note(n)))
    }

    /// An interval's snapshot, with its rates over the interval.
    fn interval(&mut self, mut snapshot: Snapshot) -> std::io::Result<()> {
        if let Some(attached) = &self.attached {
            snapshot.compute_rates(attached, self.previous.as_ref());
        }
        self.emit(&Event::Interval(snapshot.clone()))?;
        self.previous = Some(snapshot);
        Ok(())
    }

    /// The summary, with rates averaged over the run.
    fn summary(&mut self, mut snapshot: Snapshot, end: End) -> std::io::Result<()> {
        if let Some(attached) = &self.attached {
            snapshot.compute_rates(attached, None);
        }
        self.emit(&Event::Summary(Summary::new(snapshot, end)))
    }
}

/// What the loop reads from at each step.
struct Run {
    session: Session,
    readout: Readout,
    duty: Option<DutyCycle>,
    late: Option<LateModules>,
    started: Instant,
    cost: CostMeter,
}

impl Run {
    /// The counts now, without a cost (see [`CostMeter::interval`] and
    /// [`CostMeter::total`]).
    fn snapshot(&mut self) -> Result<Snapshot, AttachError> {
        self.cost.before_read();
        let totals = self.readout.read(&mut self.session)?;
        // Right after the counts, so that each process's CPU time goes
        // with its hits.
        self.cost.observe(self.session.plan(), &totals);
        let late: &[crate::model::LateModule] = self.late.as_ref().map_or(&[], |l| &l.records);
        let mut snapshot = self.readout.snapshot(self.session.plan(), &totals, late);
        if let Some(d) = &self.duty {
            d.fill(self.session.plan(), &mut snapshot);
        }
        Ok(snapshot)
    }

    /// Late modules, processes that cannot be watched, a failed
    /// calibration and BPF log lines since the last call.
    fn notes(&mut self) -> Vec<Note> {
        let mut notes = self.late.as_mut().map(|l| l.check(&mut self.session, self.started)).unwrap_or_default();
        notes.extend(self.cost.poll());
        notes.extend(self.readout.take_unwatched().into_iter().map(|(pid, why)| {
            Note::new(
                Level::Warning,
                NoteCode::ProcessUnwatched,
                format!(
                    "cannot watch PID {pid} for its exit ({why}); its counts stay in the kernel maps, and a later process given its PID would add to them"
                ),
            )
        }));
        notes.extend(self.bpf_log());
        let untold = self.readout.stack_names.as_mut().map(crate::run::stacks::StackNames::take_untold);
        notes.extend(untold.unwrap_or_default().into_iter().map(|(pid, why)| {
            Note::new(Level::Warning, NoteCode::NoStacks, format!("no Python stacks for PID {pid}: {why}"))
        }));
        let native = self.readout.stack_names.as_mut().map(crate::run::stacks::StackNames::take_native_untold);
        notes.extend(
            native.unwrap_or_default().into_iter().map(|why| Note::new(Level::Warning, NoteCode::NoNativeStacks, why)),
        );
        notes
    }

    /// What the BPF programs logged since the last call, as notes: their
    /// warnings (misses) as warnings.
    fn bpf_log(&mut self) -> Vec<Note> {
        let level = |l| if l <= log::Level::Warn { Level::Warning } else { Level::Note };
        self.session.drain_bpf_log().into_iter().map(|(l, line)| Note::new(level(l), NoteCode::BpfLog, line)).collect()
    }
}

/// Attaches as `config` says, reports until the run ends, detaches and
/// prints the summary. Returns why the run ended.
pub async fn attach(config: &AttachConfig, out: impl Write, err: impl Write) -> anyhow::Result<End> {
    privileges::check()?;
    // With --exe, one pidfd per traced process.
    raise_fd_limit();
    // Handlers go in before anything is attached, so a Ctrl-C at any point
    // after this still detaches cleanly.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let (mut run, mut output, exit) = start(config, out, err)?;
    let started = run.started;
    let start = tokio::time::Instant::from_std(started);
    let mut ticker = interval_at(start + config.interval, config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    // Without --duration the deadline is never polled.
    let deadline = sleep_until(start + config.duration.unwrap_or(std::time::Duration::MAX / 4));
    tokio::pin!(deadline);
    let target_exit = async {
        match &exit {
            Some(exit) => exit.exited().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(target_exit);
    let log_fd = match run.session.bpf_log_fd().transpose()? {
        // SAFETY: `fd` is a fresh duplicate of the ring buffer's fd, moved
        // into the AsyncFd, which keeps it open until it is dropped.
        Some(fd) => Some(unsafe { AsyncFd::register(fd) }?),
        None => None,
    };
    let toggle_at = run.duty.as_ref().map_or(start, |d| tokio::time::Instant::from_std(d.next));
    let toggle = sleep_until(toggle_at);
    tokio::pin!(toggle);

    // Every hit up to the last interval: what each interval's cost is set
    // against.
    let mut hits_before = 0u64;
    let end = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break End::Signal("SIGINT"),
            _ = sigterm.recv() => break End::Signal("SIGTERM"),
            () = &mut target_exit => break End::TargetExit,
            () = &mut deadline, if config.duration.is_some() => break End::Duration,
            () = &mut toggle, if run.duty.is_some() => {
                let Some(d) = run.duty.as_mut() else { continue };
                match d.toggle(&mut run.session, &mut run.readout) {
                    Ok(()) => toggle.as_mut().reset(tokio::time::Instant::from_std(d.next)),
                    Err(AttachError::TargetExited { .. }) => break End::TargetExit,
                    Err(e) => return Err(e.into()),
                }
            }
            ready = log_ready(log_fd.as_ref()) => {
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                let notes = run.bpf_log();
                output.notes(notes)?;
            }
            _ = ticker.tick() => {
                let notes = run.notes();
                output.notes(notes)?;
                let mut snapshot = run.snapshot()?;
                // Every stack only in the summary: an interval lists sites.
                snapshot.stacks = None;
                let all = snapshot.hits.unwrap_or(0);
                snapshot.cost = run.cost.interval().map(|c| c.of_all_hits(all.saturating_sub(hits_before)));
                hits_before = all;
                let high = snapshot.cost.as_ref().and_then(|c| run.cost.high_cost_note(c));
                output.interval(snapshot)?;
                output.notes(high)?;
            }
        }
    };
    // Read after the end so the summary holds every hit up to the target's
    // exit, then detach before printing.
    if let Some(d) = run.duty.as_mut() {
        d.close(&mut run.session, &mut run.readout)?;
    }
    let mut last = run.snapshot()?;
    // Before the detach, which frees the table.
    last.leaks = config
        .live
        .as_ref()
        .and_then(|l| l.leaks)
        .map(|l| live::leaks(&run.session, l, run.readout.stack_names.as_mut()));
    // Notes not told yet (a target that exited before the first interval).
    let mut log = run.notes();
    log.extend(run.bpf_log());
    let Run { session, readout, duty, late, started: _, mut cost } = run;
    drop((session, readout, duty, late));
    output.notes(log)?;
    // Detached, so waiting costs the target nothing: a run shorter than
    // the calibration still ends with its cost.
    let calibrated_by = tokio::time::Instant::now() + cost::CALIBRATION_WAIT;
    while cost.calibrating() {
        tokio::select! {
            biased;
            // Asked again to stop: at once, without a cost.
            _ = sigint.recv() => cost.give_up(None),
            _ = sigterm.recv() => cost.give_up(None),
            () = sleep_until(calibrated_by) => {
                cost.give_up(Some(format!("calibrating took over {} s", cost::CALIBRATION_WAIT.as_secs())));
            }
            () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
        }
    }
    output.notes(cost.poll())?;
    last.cost = cost.total().map(|c| c.of_all_hits(last.hits.unwrap_or(0)));
    let written = config.stacks.as_ref().map(|s| write_stacks(s, &last, config)).transpose()?.unwrap_or_default();
    output.notes(written)?;
    output.summary(last, end)?;
    Ok(end)
}

/// Resolves, plans, loads and attaches as `config` says, and reports the
/// attach: everything before the loop.
/// The `--types` options, the `--stacks` options, and the probe slots
/// whose events get stacks.
type KernelOptions = (Option<crate::kernel::TypesOptions>, Option<crate::kernel::StacksOptions>, Option<Vec<u32>>);

/// What the kernel side is sized and told for `--types` and `--stacks`,
/// and which probes' events get stacks.
fn kernel_options(config: &AttachConfig, r: &discover::Resolved, plan: &plan::Plan) -> anyhow::Result<KernelOptions> {
    let types = config.types.then(|| crate::kernel::TypesOptions {
        entries: TYPE_ENTRIES,
        ob_type_offset: r.abi.objects().ob_type,
        objects: OBJECT_ENTRIES,
        pre_headers: r.abi.objects().pre_headers,
    });
    let stack_slots = config.stacks.as_ref().map(|s| stack_slots(r, plan, s)).transpose()?;
    let stacks = config.stacks.as_ref().zip(stack_slots.clone()).map(|(s, slots)| crate::kernel::StacksOptions {
        slots,
        sample: s.sample,
        entries: STACK_ENTRIES,
        native_rows: s.native.then_some(crate::unwind::ROW_CAPACITY),
    });
    Ok((types, stacks, stack_slots))
}

/// The plan's options for `config`, with the return costs calibrated (for
/// `--returns`' probes on the API functions, and for `--live`'s on the
/// implementations, each only when asked for).
fn plan_options(config: &AttachConfig, return_costs: Option<ReturnCosts>) -> PlanOptions {
    PlanOptions {
        placement: config.placement,
        returns: return_costs.filter(|_| config.returns),
        inlined: config.inlined,
        types: config.types,
        live: config.live.is_some(),
        live_costs: return_costs.filter(|_| config.live.is_some()),
        ..PlanOptions::default()
    }
}

fn start<'a>(
    config: &AttachConfig,
    out: impl Write + 'a,
    err: impl Write + 'a,
) -> anyhow::Result<(Run, Output<'a>, Option<ProcessExit>)> {
    // Calibrated before anything is attached to the target: the child it
    // times is tracer's own.
    let returns = config.returns || config.live.is_some();
    let calibration = (config.budget.is_some() || returns).then(|| calibrate::calibrate(returns)).transpose()?;
    let costs = calibration.map(|c| c.hit);
    let return_costs = calibration.and_then(|c| c.returns);
    let cpu_costs = calibration.map(|c| c.cpu);
    let (exit, exits) = match &config.target {
        // The pidfd pins the process identity: if the PID is reused after
        // this, we still see the original process's exit.
        TargetSpec::Pid(pid) => (Some(ProcessExit::watch(*pid)?), None),
        // Listening from well before the attach, so that a process started
        // after it has every thread's exit record.
        TargetSpec::Exe(_) => (None, exits::ExitListener::start()),
    };
    let r = discover::resolve(
        &config.target,
        config.placement == PlacementMode::CallSites,
        discover::DwarfLookup { enabled: config.inlined, debug_dir: config.debug_dir.as_deref() },
    )?;
    let options = plan_options(config, return_costs.map(|r| r.0));
    let mut plan = plan::plan(ImageRef::from(&r), &specs(&r, &config.probes, config.types)?, options)?;
    if config.native {
        native(&mut plan, &r, options)?;
    }
    // Before anything is loaded: `--gc markers` on a build without them is
    // the user's to fix.
    let gc = gc_plan(&r, config.gc)?;
    let inline_sites: usize = plan.probes.iter().map(|p| p.inline_sites.len()).sum();
    if config.links == LinkMode::Perf && inline_sites > 0 {
        return Err(crate::config::ConfigError::InlinedNeedMulti { sites: inline_sites }.into());
    }
    if config.budget.is_some() && config.links == LinkMode::Perf && plan.has_many_sites() {
        let sites = plan.probes.iter().map(|p| p.inline_sites.len() + p.coverage.call_sites).sum();
        return Err(crate::config::ConfigError::BudgetPerfManySites { sites }.into());
    }
    let (types, stacks, stack_slots) = kernel_options(config, &r, &plan)?;
    let live = config.live.as_ref().map(|l| l.max);
    let load = LoadOptions { bpf_log: config.bpf_log, types, stacks, live, ..LoadOptions::default() };
    let mut session = Session::load(plan, r.scope, &load)?;
    if live.is_some()
        && let Some(pid) = r.pid()
        && let Some(pymalloc) = live::pymalloc(&r, session.plan(), pid)
    {
        session.set_pymalloc(pymalloc)?;
    }
    // The target's frames are located before the probes go live, so that
    // its first events have stacks.
    let mut stack_names = config.stacks.as_ref().zip(stack_slots).map(|(s, slots)| {
        let native = s.native.then(|| crate::unwind::Native::new(config.debug_dir.clone()));
        crate::run::stacks::StackNames::new(slots, s.depth, s.sample, s.top, native)
    });
    if let (Some(names), Some(pid)) = (stack_names.as_mut(), r.pid()) {
        names.prepare(&mut session, pid)?;
    }
    let watch = match r.pid() {
        Some(pid) => Watch::Process(pid),
        None => Watch::Interpreter(r.attach_path.clone()),
    };
    let late = session.plan().has_call_sites().then(|| LateModules::new(watch, r.known.clone()));

    let (links, attach_began, fallback) = attach_links(&mut session, r.scope, config.links)?;
    if gc.source != GcSource::None {
        session.attach_gc(&gc, r.scope, links == Links::Multi)?;
    }
    let started = Instant::now();
    // Calibrated now only if nothing before needed it: the probes are
    // live and the target is not kept waiting.
    let calibrating = cpu_costs.map_or_else(Calibration::start, Calibration::Known);
    let mut readout = Readout::new(started, r.pid().is_none(), config.types.then(|| r.abi.objects()));
    readout.stack_names = stack_names;
    readout.live = live;
    if config.gc != GcMode::Off {
        let reason = if gc.source == GcSource::None { Some(gc.detail.clone()) } else { gc.caveat.clone() };
        readout.report_gc(gc.source, reason);
    }
    let duty = match (config.budget, costs) {
        (Some(budget), Some(costs)) => Some(DutyCycle::new(
            (&mut session, &mut readout),
            budget,
            costs,
            (r.scope, links == Links::Multi),
            // A multi link goes live at once when made; perf-event uprobes
            // one by one during the attach.
            (if links == Links::Multi { started } else { attach_began }, started),
        )?),
        _ => None,
    };
    // After the first window has begun: this reads the image.
    let advice = Advice {
        budget: config.budget.map(|b| b * 100.0),
        returns: config.returns,
        call_sites: config.placement == PlacementMode::CallSites,
    };
    let cost = CostMeter::new(session.plan(), r.pid(), exits, calibrating, advice);
    let mut info = attached_event(&session, &r, links, &cost);
    info.return_costs_ns = return_costs.map(|r| r.1);
    let gc_note = gc_note(&gc, config.gc);
    info.gc = Some(gc);
    let mut output = Output {
        reporter: report::reporter(config.format, Box::new(out), Box::new(err)),
        attached: None,
        previous: None,
    };
    output.emit(&Event::Attached(info.clone()))?;
    output.attached = Some(info);
    let mismatch = debug_offsets_note(&r);
    output.notes(fallback.into_iter().chain(mismatch).chain(gc_note))?;
    Ok((Run { session, readout, duty, late, started, cost }, output, exit))
}

/// The warning to give when the interpreter's `_Py_DebugOffsets` disagrees
/// with what tracer expects of its version.
#[must_use]
pub fn debug_offsets_note(r: &Resolved) -> Option<Note> {
    r.debug_offsets_mismatch.as_ref().map(|why| {
        Note::new(
            Level::Warning,
            NoteCode::DebugOffsets,
            format!(
                "{}: {why}; tracer's knowledge of Python {} may not fit this build",
                r.display_path.display(),
                r.version
            ),
        )
    })
}

/// Becomes ready when the BPF log has lines to read; never without
/// `--bpf-log`.
async fn log_ready(fd: Option<&AsyncFd<OwnedFd>>) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// Raises the soft limit on open files to the hard one: `--exe` holds a
/// pidfd per traced process, and the default soft limit (1024) is the
/// counter map's room for processes. A failure leaves the limit as it was,
/// and a process that then cannot be watched is reported.
fn raise_fd_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0 && limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads one valid rlimit.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) };
    }
}

/// What `tracer probes` is asked to plan, beyond the target and probes.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::struct_excessive_bools, reason = "each is one of `tracer probes`' switches")]
pub struct PlanRequest<'a> {
    pub placement: PlacementMode,
    /// Also plan how return values are read (calibrates first).
    pub returns: bool,
    pub debug_dir: Option<&'a std::path::Path>,
    /// Probe inlined copies too.
    pub inlined: bool,
    /// How garbage collections would be seen.
    pub gc: GcMode,
    /// `--native`: also plan libc's allocator.
    pub native: bool,
    /// `--live`: also plan the allocator implementations the live table
    /// probes, with their returns (calibrates first, as `returns`).
    pub live: bool,
}

/// With `--native`, adds the C library's allocator functions of the
/// target to `plan` (with `--pid` only: the configuration refuses
/// `--exe`).
fn native(plan: &mut plan::Plan, r: &Resolved, options: PlanOptions) -> anyhow::Result<()> {
    let pid = r.pid().ok_or(crate::config::ConfigError::NativeWithExe)?;
    let libc = discover::libc::find(pid)?;
    plan::native::extend(plan, &libc, options)?;
    Ok(())
}

/// Resolves the target and plans its probes for `tracer probes`, without
/// touching the target (with `returns`, after timing the ways to read a
/// return value on tracer's own child).
pub fn probe_plan(
    target: &TargetSpec,
    selection: &ProbeSelection,
    request: &PlanRequest<'_>,
) -> anyhow::Result<PlanReport> {
    let PlanRequest { placement, returns, debug_dir, inlined, gc, native: _, live } = *request;
    // Which way reads a return value cheapest is measured, which loads BPF.
    let calibrated = if returns || live {
        privileges::check()?;
        calibrate::calibrate(true)?.returns
    } else {
        None
    };
    let return_costs: Option<ReturnCosts> = calibrated.map(|r| r.0);
    let options = PlanOptions {
        placement,
        returns: return_costs.filter(|_| returns),
        inlined,
        live,
        live_costs: return_costs.filter(|_| live),
        ..PlanOptions::default()
    };
    let dwarf = discover::DwarfLookup { enabled: inlined, debug_dir };
    let r = discover::resolve(target, placement == PlacementMode::CallSites, dwarf)?;
    let mut plan = plan::plan(ImageRef::from(&r), &specs(&r, selection, false)?, options)?;
    if request.native {
        native(&mut plan, &r, options)?;
    }
    let mut report = PlanReport::new(&plan, &r.version.to_string(), calibrated.map(|r| r.1));
    report.notes.extend(debug_offsets_note(&r));
    let gc_plan = gc_plan(&r, gc)?;
    report.notes.extend(gc_note(&gc_plan, gc));
    report.gc = Some(gc_plan);
    Ok(report)
}
