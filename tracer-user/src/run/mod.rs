//! The run loop of `tracer attach`: from the prepared target ([`crate::prepare`]) to the
//! final summary, with `--budget`'s windows ([`duty`]) and how much they slow the target
//! ([`pace`]), modules mapped late ([`late`]) and exited processes ([`readout`]).

pub mod budget;
pub mod census;
pub mod cost;
mod duty;
pub mod exit;
pub mod exits;
mod finish;
mod pace;
pub use finish::wait_exit;
pub mod gcmem;
pub mod growth;
mod header;
mod late;
mod links;
pub mod live;
mod mapped;
pub mod profile;
pub mod readout;
pub mod share;
pub mod stacks;
pub mod types;

use std::{io::Write, os::fd::OwnedFd, time::Instant};

use thiserror::Error;
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    time::{MissedTickBehavior, interval_at, sleep_until},
};

use self::{
    cost::{Advice, Calibration, CostMeter},
    duty::DutyCycle,
    exit::ProcessExit,
    late::{LateModules, Watch},
    links::attach_links,
    profile::Profile,
    readout::Readout,
};
use crate::{
    config::{AttachConfig, ConfigError, LinkMode, Mode},
    discover::{
        Resolved, TargetSpec,
        process::{ProgramStamp, TargetError},
    },
    error::Classify,
    kernel::{AttachError, LoadOptions, Session},
    launch::{Child, LaunchError, signal_name, signals::Signals},
    model::{Attached, End, Event, Level, Links, Note, NoteCode, Snapshot, Summary},
    plan::{
        self,
        gc::{GcMode, GcSource},
    },
    prepare::slots::Watch as FreesWatch,
    prepare::{self, PrepareError, Prepared},
    privileges::{self, PrivilegeError},
    report::{
        self, JsonReporter, Reporter,
        exporter::{self, ListenError, MetricsReporter},
        files::OutputError,
    },
};

/// Why a run of `tracer attach` failed.
#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    Capabilities(#[from] crate::capabilities::CapabilityError),
    #[error("installing the {signal} handler")]
    Signal { signal: &'static str, source: std::io::Error },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// Following the BPF log.
    #[error(transparent)]
    BpfLog(std::io::Error),
    /// Writing the report.
    #[error(transparent)]
    Output(std::io::Error),
    #[error(transparent)]
    Written(#[from] OutputError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Listen(#[from] ListenError),
}

impl Classify for RunError {
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Privileges(e) => e.is_bad_input(),
            Self::Capabilities(e) => e.is_bad_input(),
            Self::Target(e) => e.is_bad_input(),
            Self::Prepare(e) => e.is_bad_input(),
            Self::Config(e) => e.is_bad_input(),
            Self::Attach(e) => e.is_bad_input(),
            Self::Launch(e) => e.is_bad_input(),
            Self::Listen(e) => e.is_bad_input(),
            // The files were checked when the run began; what fails at
            // its end is the system's.
            Self::Signal { .. } | Self::BpfLog(_) | Self::Output(_) | Self::Written(_) => false,
        }
    }

    fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
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

/// Room for distinct stacks, and for (process, probe, stack) counts: a
/// stack is 2 KB in the kernel, allocated as it is first seen.
const STACK_ENTRIES: u32 = 1 << 14;

/// Everything a run reports through, in order.
struct Output<'a> {
    reporter: Box<dyn Reporter + 'a>,
    attached: Option<Attached>,
    previous: Option<Snapshot>,
}

impl Output<'_> {
    fn emit(&mut self, event: &Event) -> Result<(), RunError> {
        self.reporter.event(event).map_err(RunError::Output)
    }

    fn notes(&mut self, notes: impl IntoIterator<Item = Note>) -> Result<(), RunError> {
        notes.into_iter().try_for_each(|n| self.emit(&Event::Note(n)))
    }

    /// An interval's snapshot, with its rates over the interval.
    fn interval(&mut self, mut snapshot: Snapshot) -> Result<(), RunError> {
        if let Some(attached) = &self.attached {
            snapshot.compute_rates(attached, self.previous.as_ref());
        }
        self.emit(&Event::Interval(snapshot.clone()))?;
        self.previous = Some(snapshot);
        Ok(())
    }

    /// The summary, with rates averaged over the run.
    fn summary(&mut self, mut snapshot: Snapshot, end: End) -> Result<(), RunError> {
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
    /// The frees probed at their allocator's implementation, checked.
    frees: Option<FreesWatch>,
    started: Instant,
    cost: CostMeter,
    /// In the production profile.
    profile: Option<Profile>,
    /// With growth (`--growth`, or the profile's default): its samples'
    /// readout, or why there is none.
    growth: Option<Result<growth::Growth, String>>,
}

impl Run {
    /// The counts now, without a cost (see [`CostMeter::interval`] and
    /// [`CostMeter::total`]); at the `end`, with the live table's calls
    /// left unseen on top of their threads' stacks ([`live::left_unseen`]).
    fn snapshot(&mut self, end: bool) -> Result<Snapshot, AttachError> {
        self.cost.before_read();
        let mut totals = self.readout.read(&mut self.session)?;
        if end && self.readout.live.is_some() {
            live::left_unseen(&mut self.session, &mut totals.live_table)?;
        }
        // Right after the counts, so that each process's CPU time goes
        // with its hits.
        self.cost.observe(self.session.plan(), &totals);
        let late: &[crate::model::LateModule] = self.late.as_ref().map_or(&[], |l| &l.records);
        let mut snapshot = self.readout.snapshot(self.session.plan(), &totals, late);
        if let Some(d) = self.duty.as_mut() {
            d.fill(self.session.plan(), &mut snapshot);
        }
        Ok(snapshot)
    }

    /// The summary's counts, read after the end (the last window closed),
    /// so that they hold every hit up to the target's exit; before detaching.
    fn last(&mut self, config: &AttachConfig) -> Result<Snapshot, AttachError> {
        if let Some(d) = self.duty.as_mut() {
            d.close(&mut self.session, &mut self.readout)?;
        }
        let mut last = self.snapshot(true)?;
        // Before the detach, which frees the table.
        last.leaks = config
            .live
            .as_ref()
            .and_then(|l| l.leaks)
            .map(|l| live::leaks(&self.session, l, self.readout.stack_names.as_mut()));
        last.growth = growth::report(self.growth.as_mut(), &mut self.session, self.cost.prices(), true);
        let cpu = profile::target_cpu(self.duty.as_mut(), &self.cost);
        if let Some(p) = self.profile.as_mut() {
            p.summary(&mut last, self.duty.as_ref(), cpu);
        }
        Ok(last)
    }

    /// The profile's sources and costs in an interval's `snapshot`.
    fn profile_interval(&mut self, snapshot: &mut Snapshot) {
        let cpu = profile::target_cpu(self.duty.as_mut(), &self.cost);
        if let Some(p) = self.profile.as_mut() {
            p.interval(snapshot, self.duty.as_mut(), cpu);
        }
    }

    /// The warning of a high cost, once: in the profile, of its own cost
    /// (the one figure its table shows), else of the hits' estimate.
    fn high_cost_note(&mut self, snapshot: &Snapshot) -> Option<Note> {
        let mut cost = snapshot.cost?;
        if let Some(p) = &snapshot.profile {
            cost.overhead_fraction = Some(p.fraction);
            cost.overhead_fraction_low = None;
        }
        self.cost.high_cost_note(&cost)
    }

    /// The files mapped since the last check, probed.
    fn late_notes(&mut self) -> Vec<Note> {
        self.late.as_mut().map(|l| l.check(&mut self.session, self.started)).unwrap_or_default()
    }

    /// Late modules, unwatchable processes, a failed calibration and BPF
    /// log lines since the last call.
    fn notes(&mut self) -> Vec<Note> {
        let mut notes = self.late_notes();
        notes.extend(self.frees.as_mut().and_then(|w| w.check(self.started.elapsed().as_secs_f64())));
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
        notes.extend(self.profile.as_mut().map(Profile::take_notes).unwrap_or_default());
        if let Some(Ok(g)) = self.growth.as_mut() {
            notes.extend(g.take_untold().into_iter().map(|(pid, why)| {
                Note::new(
                    Level::Warning,
                    NoteCode::Growth,
                    format!("growth samples of PID {pid} have no Python stacks: {why}"),
                )
            }));
        }
        let started = self.started;
        notes.extend(self.readout.stack_names.as_mut().map(|n| n.take_notes(started)).unwrap_or_default());
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
/// prints the summary. Returns why the run ended. With `child` (`tracer
/// run`'s, held before its interpreter's first instruction), lets it go
/// once the probes are live, and passes signals on to it rather than
/// ending: the run ends when it exits.
#[allow(clippy::too_many_lines, reason = "the run loop: one select! arm per event, each a few lines")]
pub async fn attach(
    config: &AttachConfig,
    mut child: Option<&mut Child>,
    signals: &mut Signals,
    out: impl Write,
    err: impl Write,
) -> Result<End, RunError> {
    privileges::check()?;
    // With --exe, one pidfd per traced process.
    exits::raise_fd_limit();
    // The handlers (`signals`) are in: a Ctrl-C from here on detaches.
    let (exit, exits) = watch_exits(&config.target)?;
    // The program `--pid` runs: one it exec's ends the run, as an exit does.
    let program = match &config.target {
        TargetSpec::Pid(pid) => ProgramStamp::of(*pid).map(|s| (*pid, s)),
        TargetSpec::Exe(_) => None,
    };
    let execed = || program.is_some_and(|(pid, s)| s.changed(pid));
    // Bound before anything is attached: a port in use is the user's.
    let listener = config.listen.map(exporter::bind).transpose()?;
    let (prepared, early) = prepare_run(config, child.is_some())?;
    let mut reporter = report::reporter(config.format, Box::new(out), Box::new(err));
    // As bound: `--listen 127.0.0.1:0` takes a free port.
    let serving = listener.as_ref().and_then(|l| l.local_addr().ok()).map(|addr| {
        Note::new(Level::Note, NoteCode::Metrics, format!("serving Prometheus metrics at http://{addr}/metrics"))
    });
    if let Some(file) = &config.record {
        // Notes go to stderr once, from the report a person reads.
        let record = JsonReporter::new(report::files::LazyFile::new(file.clone()), std::io::sink());
        reporter = Box::new(report::Tee(reporter, Box::new(record)));
    }
    if let Some(listener) = listener {
        let page = exporter::Page::default();
        exporter::serve(listener, std::sync::Arc::clone(&page)).map_err(RunError::Output)?;
        reporter = Box::new(MetricsReporter::new(reporter, page));
    }
    let (mut run, mut output) = start(config, prepared, (exits, early), child.as_deref_mut(), reporter)?;
    // Every probe is attached and the one-time setup done: what only the
    // setup used goes, from this thread and every thread it starts later
    // (the threads started before narrow themselves: see capabilities).
    crate::capabilities::keep_only(crate::capabilities::RUNNING)?;
    output.notes(serving)?;
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
    let log_fd = match run.session.bpf_log_fd().transpose().map_err(RunError::BpfLog)? {
        // SAFETY: `fd` is a fresh duplicate of the ring buffer's fd, moved
        // into the AsyncFd, which keeps it open until it is dropped.
        Some(fd) => Some(unsafe { AsyncFd::register(fd) }.map_err(|e| RunError::BpfLog(e.into()))?),
        None => None,
    };
    let toggle_at = run.duty.as_ref().map_or(start, |d| tokio::time::Instant::from_std(d.next));
    // The profile's default growth is priced once early, before a whole
    // interval of it may cost the target several times the budget.
    // From when its probes went live, which may be well after the run
    // began (the C library's programs load after the attach).
    let growth_live = match &run.growth {
        Some(Ok(g)) => tokio::time::Instant::from_std(g.live_since()),
        _ => start,
    };
    let trial = sleep_until(growth_live + growth::TRIAL);
    tokio::pin!(trial);
    let mut trial_due = config.budget.is_some() && matches!(run.growth, Some(Ok(_)));
    let toggle = sleep_until(toggle_at);
    tokio::pin!(toggle);
    let mut late_ticker = interval_at(start + late::QUICK_CHECK, late::QUICK_CHECK);
    late_ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let quick_late = run.late.as_ref().is_some_and(LateModules::quick);

    // Every hit up to the last interval: what each interval's cost is set
    // against.
    let mut hits_before = 0u64;
    let end = loop {
        tokio::select! {
            biased;
            signal = signals.recv() => match child.as_deref() {
                Some(c) => c.pass_on(signal),
                None => break End::Signal(signal_name(signal)),
            },
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
            () = &mut trial, if trial_due => {
                trial_due = false;
                let budget = config.budget.unwrap_or(0.0);
                output.notes(growth::trial(&mut run.growth, &mut run.session, run.cost.prices(), budget))?;
            }
            _ = late_ticker.tick(), if quick_late => {
                let notes = run.late_notes();
                output.notes(notes)?;
            }
            ready = log_ready(log_fd.as_ref()) => {
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                let notes = run.bpf_log();
                output.notes(notes)?;
            }
            _ = ticker.tick() => {
                if execed() {
                    break End::TargetExec;
                }
                let notes = run.notes();
                output.notes(notes)?;
                let mut snapshot = run.snapshot(false)?;
                // Every stack only in the summary: an interval lists sites.
                snapshot.stacks = None;
                let all = snapshot.hits.unwrap_or(0);
                snapshot.cost = run.cost.interval().map(|c| c.of_all_hits(all.saturating_sub(hits_before)));
                hits_before = all;
                snapshot.growth = growth::report(run.growth.as_mut(), &mut run.session, run.cost.prices(), false);
                run.profile_interval(&mut snapshot);
                let stopped = growth::hold_budget(&mut run.growth, &mut run.session, &mut snapshot);
                let high = run.high_cost_note(&snapshot);
                output.interval(snapshot)?;
                output.notes(stopped.into_iter().chain(high))?;
            }
        }
    };
    let end = if end != End::TargetExit && execed() { End::TargetExec } else { end };
    // Read after the end so the summary holds every hit up to the target's
    // exit, then detach before printing.
    let mut last = run.last(config)?;
    // Notes not told yet (a target that exited before the first interval).
    let mut log = run.notes();
    log.extend(run.bpf_log());
    let Run { session, readout, duty, late, frees: _, started: _, mut cost, mut profile, growth } = run;
    drop((session, readout, duty, late));
    output.notes(log)?;
    finish::wait_detached(&mut cost, profile.as_mut(), signals, child.as_deref()).await;
    if let Some(p) = profile.as_mut() {
        p.summary_heap(&mut last);
        output.notes(p.take_notes())?;
    }
    output.notes(cost.poll())?;
    if let (Some(Ok(g)), Some(crate::model::Growth::Sampled(report)), Some(prices)) =
        (&growth, last.growth.as_mut(), cost.prices())
    {
        g.price_summary(report, prices);
    }
    last.cost = cost.total().map(|c| c.of_all_hits(last.hits.unwrap_or(0)));
    let what = config.target.to_string();
    for (folded, flamegraph, stacks) in [
        config.stacks.as_ref().map(|s| (s.folded.as_ref(), s.flamegraph.as_ref(), Some((s.weight, s.sample)))),
        config.growth.as_ref().map(|g| (g.folded.as_ref(), g.flamegraph.as_ref(), None)),
    ]
    .into_iter()
    .flatten()
    {
        let files = report::written::StackFiles { folded, flamegraph };
        let notes = match stacks {
            Some(weight) => report::written::stacks(files, weight, &what, &last)?,
            None => report::written::growth(files, &what, &last)?,
        };
        output.notes(notes)?;
    }
    // Live, the profile ends now: its start is now less its duration.
    output.notes(config.pprof.as_ref().map(|f| report::written::pprof(f, &last, None)).transpose()?)?;
    output.summary(last, end)?;
    Ok(end)
}

/// The `--types` options, the `--stacks` options, and the probe slots
/// whose events get stacks.
type KernelOptions = (Option<crate::kernel::TypesOptions>, Option<crate::kernel::StacksOptions>, Option<Vec<u32>>);

/// What the kernel side is sized and told for `--types` and `--stacks`,
/// and which probes' events get stacks.
fn kernel_options(config: &AttachConfig, r: &Resolved, plan: &plan::Plan) -> Result<KernelOptions, ConfigError> {
    let types = config.types.then(|| crate::kernel::TypesOptions {
        entries: TYPE_ENTRIES,
        ob_type_offset: r.abi.objects().ob_type,
        objects: OBJECT_ENTRIES,
        pre_headers: r.abi.objects().pre_headers,
    });
    let stack_slots = config.stacks.as_ref().map(|s| stacks::slots(r, plan, s)).transpose()?;
    let stacks = config.stacks.as_ref().zip(stack_slots.clone()).map(|(s, slots)| crate::kernel::StacksOptions {
        slots,
        sample: s.sample,
        entries: STACK_ENTRIES,
        native_rows: s.native.then_some(crate::unwind::ROW_CAPACITY),
    });
    Ok((types, stacks, stack_slots))
}

/// Prepares `config`'s target. The header states the run's cost, which
/// needs a hit's: calibrated on a thread of its own meanwhile, where
/// preparing does not calibrate it anyway.
fn prepare_run(config: &AttachConfig, launched: bool) -> Result<(Prepared, Option<Calibration>), RunError> {
    let mut options = prepare::Options::attach(config);
    // A program held at its entry point has the built-in allocator's
    // pointers, which its startup may replace (PYTHONMALLOC, -X dev).
    options.frees_at_implementations &= !launched;
    let early = (!options.hit_costs && !options.planning.reads_returns()).then(Calibration::start);
    Ok((prepare::prepare(&config.target, &options)?, early))
}

/// Watches the end of the target: its pidfd with `--pid`, every process's
/// exit record with `--exe`.
fn watch_exits(target: &TargetSpec) -> Result<(Option<ProcessExit>, Option<exits::ExitListener>), TargetError> {
    Ok(match target {
        // The pidfd pins the process identity: if the PID is reused after
        // this, we still see the original process's exit.
        TargetSpec::Pid(pid) => (Some(ProcessExit::watch(*pid)?), None),
        // Listening from well before the attach, so that a process started
        // after it has every thread's exit record.
        TargetSpec::Exe(_) => (None, exits::ExitListener::start()),
    })
}

/// Loads and attaches the prepared plan as `config` says, and reports the
/// attach: everything before the loop.
#[allow(clippy::too_many_lines, reason = "everything before the loop, in the order it must happen")]
fn start<'a>(
    config: &AttachConfig,
    prepared: Prepared,
    (exits, early): (Option<exits::ExitListener>, Option<Calibration>),
    child: Option<&mut Child>,
    reporter: Box<dyn Reporter + 'a>,
) -> Result<(Run, Output<'a>), RunError> {
    let Prepared { target: r, specs: _, plan, gc, growth: growth_plan, calibration, notes } = prepared;
    // In the CPU time of the thread hit: the budget is a share of the
    // target's CPU time.
    let costs = calibration.map(|c| c.cpu.hit);
    let return_costs = calibration.and_then(|c| c.returns);
    let cpu_costs = calibration.map(|c| c.cpu);
    let inline_sites: usize = plan.probes.iter().map(|p| p.inline_sites.len()).sum();
    if config.links == LinkMode::Perf && inline_sites > 0 {
        return Err(ConfigError::InlinedNeedMulti { sites: inline_sites }.into());
    }
    if config.budget.is_some() && config.links == LinkMode::Perf && plan.has_many_sites() {
        let sites = plan.probes.iter().map(|p| p.inline_sites.len() + p.coverage.call_sites).sum();
        return Err(ConfigError::BudgetPerfManySites { sites }.into());
    }
    let (types, stacks, stack_slots) = kernel_options(config, &r, &plan)?;
    let live = config.live.as_ref().map(|l| l.max);
    let growth = growth_plan.as_ref().filter(|g| g.unavailable.is_none()).map(|_| growth::KERNEL);
    let full_maps = crate::kernel::full::wanted();
    // The budget's windows put each link's hottest sites in last and take
    // them out first (see kernel::heat).
    let heat = config.budget.is_some();
    let load =
        LoadOptions { bpf_log: config.bpf_log, types, stacks, live, growth, full_maps, heat, ..LoadOptions::default() };
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
        crate::run::stacks::StackNames::new(slots, s.depth, s.sample, s.top, native, r.pid().is_none())
    });
    if let (Some(names), Some(pid)) = (stack_names.as_mut(), r.pid()) {
        names.prepare(&mut session, pid)?;
    }
    let mut growth = growth::setup(config, &mut session, growth_plan, r.pid())?;
    let watch = match r.pid() {
        Some(pid) => Watch::Process(pid),
        None => Watch::Interpreter(r.attach_path.clone()),
    };
    let late = session.plan().has_call_sites().then(|| LateModules::new(watch, r.known.clone()));
    let frees = r.pid().and_then(|pid| FreesWatch::new(pid, &r.elf, &r.display_path, &session.plan().moved_frees));
    // The profile's sources find what they read before anything is live,
    // so that the first window is no longer than it should be.
    let gc = profile::gc_probes(config, gc);
    let (profile, profile_notes) = match (config.mode, config.budget) {
        (Mode::Profile, Some(budget)) => {
            let (p, notes) = Profile::new(config, budget, r.pid(), &gc, cpu_costs);
            (Some(p), notes)
        }
        _ => (None, Vec::new()),
    };

    // Before the attach: this reads the image, which the first window
    // should not wait for.
    let mut cost = cost_meter(config, &session, r.pid(), exits, (cpu_costs, early));
    // The probes that stay attached (the GC's, growth's) go live first:
    // the rates' first window then goes live once, after them, and is no
    // longer than it should be (attaching growth's took tens of
    // milliseconds, which the window's probes would have been live for).
    // Through uprobe-multi links unless told otherwise; where the kernel
    // has none, `--links auto` falls back for these as for the rates.
    let growth_header = links::always_on(config.links, &mut session, r.scope, (&gc, &mut growth))?;
    // What the first window's hits can have cost the traced processes at
    // most is what they run from here.
    let before_attach = config.budget.map(|_| {
        let cpu = cost::TargetCpu::new(r.pid(), Some(&r.attach_path));
        let mark = pace::CpuMark::read(&cpu.covered(&[]));
        (cpu, mark)
    });
    let (links, attach_began, fallback) = attach_links(&mut session, r.scope, config.links)?;
    if let Some(c) = child {
        // Calibrated while it is held, not while its startup runs traced:
        // the header's first window is then as short as it should be.
        cost.wait_calibrated(cost::HEADER_WAIT);
        c.release()?;
    }
    let started = Instant::now();
    // The same moment by the wall clock, for the header: what a report
    // made later dates itself by (live, now less the elapsed time is it).
    let started_unix_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
    // The target's CPU time over the first window, exactly: too short for
    // /proc/PID/stat's clock ticks.
    let cpu_began = r.pid().and_then(cost::process_cpu_ns);
    let mut readout = Readout::new(started, r.pid().is_none(), config.types.then(|| r.abi.objects()));
    readout.stack_names = stack_names;
    readout.live = live;
    if config.gc != GcMode::Off {
        let reason = if gc.source == GcSource::None { Some(gc.detail.clone()) } else { gc.caveat.clone() };
        readout.report_gc(gc.source, reason);
    }
    let mut duty = match (config.budget, costs, before_attach) {
        (Some(budget), Some(costs), Some((target_cpu, cpu_before_attach))) => Some(DutyCycle::new(
            (&mut session, &mut readout),
            budget,
            costs,
            (r.scope, links == Links::Multi),
            // A multi link goes live at once when made; perf-event uprobes
            // one by one during the attach.
            (if links == Links::Multi { started } else { attach_began }, started, cpu_before_attach),
            target_cpu,
        )?),
        _ => None,
    };
    let estimate = profile::first_window(
        config,
        r.pid(),
        (&mut session, &mut readout),
        duty.as_mut(),
        &mut cost,
        (started, cpu_began),
    )?;
    let profile_cpu = profile::target_cpu(duty.as_mut(), &cost);
    let profile = profile.map(|p| p.started(started, profile_cpu));
    let mut info = header::attached_event(&session, &r, links, &cost);
    info.started_unix_s = started_unix_s;
    info.mode = Some(config.mode.name().to_owned());
    if let Mode::Exact { because } = config.mode {
        info.exact_because = because.map(str::to_owned);
    }
    info.estimated_cost = Some(estimate);
    info.return_costs_ns = return_costs.map(|r| r.1);
    info.gc = Some(gc);
    info.growth = growth_header;
    let mut output = Output { reporter, attached: None, previous: None };
    output.emit(&Event::Attached(info.clone()))?;
    output.attached = Some(info);
    output.notes(fallback.into_iter().chain(notes).chain(profile_notes))?;
    Ok((Run { session, readout, duty, late, frees, started, cost, profile, growth }, output))
}

/// The meter of the run's cost, its hit's cost calibrated while preparing
/// (`prices`), or on a thread of its own meanwhile (`early`), or from now.
fn cost_meter(
    config: &AttachConfig,
    session: &Session,
    pid: Option<u32>,
    exits: Option<exits::ExitListener>,
    (prices, early): (Option<cost::Prices>, Option<Calibration>),
) -> CostMeter {
    let calibrating = match (prices, early) {
        (Some(prices), _) => Calibration::Known(prices),
        (None, Some(early)) => early,
        (None, None) => Calibration::start(),
    };
    let advice = Advice::of(config, session.plan());
    CostMeter::new(session.plan(), pid, exits, calibrating, advice)
}

/// Becomes ready when the BPF log has lines to read; never without
/// `--bpf-log`.
async fn log_ready(fd: Option<&AsyncFd<OwnedFd>>) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}
