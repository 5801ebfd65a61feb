//! The run loop of `tracer attach`: from the prepared target ([`crate::prepare`]), attached
//! by [`start`], to the final summary, with `--budget`'s windows ([`duty`]) and how much
//! they slow the target ([`pace`]), modules mapped late ([`late`]) and exited processes
//! ([`readout`]).

pub mod budget;
pub mod census;
pub mod cost;
mod duty;
pub mod exit;
pub mod exits;
mod finish;
mod pace;
mod start;
mod stopped;
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
    cost::CostMeter,
    duty::DutyCycle,
    late::LateModules,
    profile::Profile,
    readout::Readout,
    start::{STACK_ENTRIES, prepare_run, start, watch_exits},
};
use crate::{
    config::{AttachConfig, ConfigError},
    discover::{
        TargetSpec,
        process::{ProgramStamp, TargetError},
    },
    error::Classify,
    kernel::{AttachError, Session},
    launch::{Child, LaunchError, signal_name, signals::Signals},
    model::{Attached, End, Event, Level, Note, NoteCode, Snapshot, Summary},
    prepare::PrepareError,
    prepare::slots::Watch as FreesWatch,
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
    // No broken pipe: a closed report ends the run (`End::OutputClosed`).
}

/// Everything a run reports through, in order.
struct Output<'a> {
    reporter: Box<dyn Reporter + 'a>,
    attached: Option<Attached>,
    previous: Option<Snapshot>,
    /// The reader of the report went away (`tracer attach | head`): the
    /// run ends at the next turn of its loop ([`End::OutputClosed`]), and
    /// its summary still goes to `--record`, which a [`report::Tee`] feeds
    /// whatever the report's pipe does.
    closed: bool,
}

impl Output<'_> {
    fn emit(&mut self, event: &Event) -> Result<(), RunError> {
        match self.reporter.event(event) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            written => written.map_err(RunError::Output),
        }
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
    /// over its budget (the one figure its table shows), else of the hits'
    /// estimate.
    fn high_cost_note(&mut self, snapshot: &Snapshot) -> Option<Note> {
        // In the profile, once its cost is high, by what it went over, and
        // not a lower --budget, which would not lower what the first
        // window, the census or tracer's own work cost (the first window
        // alone is said on the table's cost line, and paid for by a longer
        // run). A short run a little over its budget is said in the table
        // only: its start-up costs spread over a longer one. Of the run so
        // far, as the budget holds over a run.
        if let Some(p) = &snapshot.profile {
            let high = p.so_far.as_deref().unwrap_or(p).fraction > crate::model::Cost::HIGH;
            return self.cost.over_budget_note(p.over_budget().filter(|_| high));
        }
        self.cost.high_cost_note(&snapshot.cost?)
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
        notes.extend(self.readout.batch_notes());
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
    // Served from now on, from a thread of its own: a scrape while the
    // attach plans and calibrates (seconds on an LTO build) is answered
    // at once, with `tracer_attached 0`.
    // As bound: `--listen 127.0.0.1:0` takes a free port.
    let serving = listener.as_ref().and_then(|l| l.local_addr().ok()).map(|addr| {
        Note::new(Level::Note, NoteCode::Metrics, format!("serving Prometheus metrics at http://{addr}/metrics"))
    });
    let page = match listener {
        Some(listener) => {
            let pid = match &config.target {
                TargetSpec::Pid(pid) => Some(*pid),
                TargetSpec::Exe(_) => None,
            };
            Some(exporter::serve(listener, pid).map_err(RunError::Output)?)
        }
        None => None,
    };
    let (prepared, early) = prepare_run(config, child.is_some())?;
    let mut reporter = report::reporter(config.format, Box::new(out), Box::new(err));
    if let Some(file) = &config.record {
        // Notes go to stderr once, from the report a person reads.
        let record = JsonReporter::new(report::files::LazyFile::new(file.clone()), std::io::sink());
        reporter = Box::new(report::Tee(reporter, Box::new(record)));
    }
    if let Some(page) = page {
        reporter = Box::new(MetricsReporter::new(reporter, page));
    }
    let (mut run, mut output) = start(config, prepared, (exits, early), child.as_deref_mut(), reporter)?;
    // Every probe is attached and the one-time setup done: what only the
    // setup used goes, from this thread and every thread it starts later
    // (the threads started before narrow themselves: see capabilities).
    crate::capabilities::keep_only(crate::capabilities::RUNNING)?;
    output.notes(serving)?;
    // A target stopped (SIGSTOP, a debugger) shows zeros: said at once and
    // every interval it stays so. `tracer run`'s child is its own.
    let mut stop_watch = match (&config.target, &child) {
        (TargetSpec::Pid(pid), None) => Some(stopped::StopWatch::new(*pid)),
        _ => None,
    };
    output.notes(stop_watch.as_mut().and_then(stopped::StopWatch::check))?;
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
        if output.closed {
            break End::OutputClosed;
        }
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
                let mut notes = run.notes();
                notes.extend(stop_watch.as_mut().and_then(stopped::StopWatch::check));
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
    log.extend(stop_watch.as_ref().and_then(|w| w.summary(started.elapsed())));
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
    // A file that cannot be written fails the run, after the summary: the
    // counts are not lost with it. The first such failure is the run's
    // error; any later one is told as a warning.
    let mut unwritten: Option<OutputError> = None;
    let mut failed = |e: OutputError| match &unwritten {
        None => {
            unwritten = Some(e);
            None
        }
        Some(_) => Some(Note::new(Level::Warning, NoteCode::Written, e.to_string())),
    };
    for (folded, flamegraph, stacks) in [
        config.stacks.as_ref().map(|s| (s.folded.as_ref(), s.flamegraph.as_ref(), Some((s.weight, s.sample)))),
        config.growth.as_ref().map(|g| (g.folded.as_ref(), g.flamegraph.as_ref(), None)),
    ]
    .into_iter()
    .flatten()
    {
        let files = report::written::StackFiles { folded, flamegraph };
        let notes = match stacks {
            Some(weight) => report::written::stacks(files, weight, &what, &last),
            None => report::written::growth(files, &what, &last),
        };
        match notes {
            Ok(notes) => output.notes(notes)?,
            Err(e) => output.notes(failed(e))?,
        }
    }
    // Live, the profile ends now: its start is now less its duration.
    match config.pprof.as_ref().map(|f| report::written::pprof(f, &last, None)).transpose() {
        Ok(note) => output.notes(note)?,
        Err(e) => output.notes(failed(e))?,
    }
    output.summary(last, end)?;
    // Closed while the summary was written: the reader has not all of it
    // (`--record` has).
    let end = if output.closed { End::OutputClosed } else { end };
    unwritten.map_or(Ok(end), |e| Err(e.into()))
}

/// Becomes ready when the BPF log has lines to read; never without
/// `--bpf-log`.
async fn log_ready(fd: Option<&AsyncFd<OwnedFd>>) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}
