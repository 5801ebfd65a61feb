//! The run loop of `tracer attach`: from the resolved target to the final
//! summary, with `--budget`'s windows ([`duty`]), modules mapped late
//! ([`late`]) and exited processes ([`readout`]).

pub mod budget;
pub mod calibrate;
mod duty;
pub mod exit;
mod late;
pub mod readout;

use std::{io::Write, time::Instant};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    time::{MissedTickBehavior, interval_at, sleep_until},
};

use self::{
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
    plan::{self, ImageRef, PlacementMode, PlanOptions, returns::ReturnCosts},
    privileges,
    probe::ProbeSelection,
    report::{self, Reporter},
};

/// Attaches every probe as `mode` says; returns how, and the note to give
/// when `auto` fell back.
fn attach_links(session: &mut Session, scope: u32, mode: LinkMode) -> Result<(Links, Option<Note>), AttachError> {
    match mode {
        LinkMode::Perf => session.attach_perf(scope).map(|()| (Links::Perf, None)),
        LinkMode::Multi => session.attach_multi(scope).map(|()| (Links::Multi, None)),
        LinkMode::Auto => match session.attach_multi(scope) {
            Ok(()) => Ok((Links::Multi, None)),
            // Thousands of perf-event uprobes would take minutes to detach.
            Err(e @ AttachError::Multi(_)) if session.plan().has_call_sites() => Err(e),
            Err(AttachError::Multi(e)) => {
                let note = Note::new(
                    Level::Note,
                    NoteCode::LinkFallback,
                    format!(
                        "{e}; attaching one perf-event uprobe per probe instead, which the kernel detaches about 0.13 s apart"
                    ),
                );
                session.attach_perf(scope).map(|()| (Links::Perf, Some(note)))
            }
            Err(e) => Err(e),
        },
    }
}

/// The probe table rows `selection` picks for the resolved target.
fn specs(r: &Resolved, selection: &ProbeSelection) -> Result<Vec<crate::probe::ProbeSpec>, crate::config::ConfigError> {
    Ok(selection.select(r.abi.probes(), &r.version.to_string())?)
}

/// The attach header of a session.
fn attached_event(session: &Session, r: &Resolved, links: Links) -> Attached {
    let probes = &session.plan().probes;
    Attached {
        pid: r.pid(),
        exe: r.exe.as_ref().map(|e| e.display().to_string()),
        python: PythonInfo { version: r.version.to_string(), image: r.display_path.display().to_string() },
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
}

impl Run {
    fn snapshot(&mut self) -> Result<Snapshot, AttachError> {
        let totals = self.readout.read(&mut self.session)?;
        let late: &[crate::model::LateModule] = self.late.as_ref().map_or(&[], |l| &l.records);
        let mut snapshot = self.readout.snapshot(self.session.plan(), &totals, late);
        if let Some(d) = &self.duty {
            d.fill(&mut snapshot);
        }
        Ok(snapshot)
    }

    /// Late modules and BPF log lines since the last call.
    fn notes(&mut self) -> Vec<Note> {
        let mut notes = self.late.as_mut().map(|l| l.check(&mut self.session, self.started)).unwrap_or_default();
        notes.extend(
            self.session.drain_bpf_log().into_iter().map(|line| Note::new(Level::Note, NoteCode::BpfLog, line)),
        );
        notes
    }
}

/// Attaches as `config` says, reports until the run ends, detaches and
/// prints the summary. Returns why the run ended.
pub async fn attach(config: &AttachConfig, out: impl Write, err: impl Write) -> anyhow::Result<End> {
    privileges::check()?;
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
    let toggle_at = run.duty.as_ref().map_or(start, |d| tokio::time::Instant::from_std(d.next));
    let toggle = sleep_until(toggle_at);
    tokio::pin!(toggle);

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
            _ = ticker.tick() => {
                let notes = run.notes();
                output.notes(notes)?;
                let snapshot = run.snapshot()?;
                output.interval(snapshot)?;
            }
        }
    };
    // Read after the end so the summary holds every hit up to the target's
    // exit, then detach before printing.
    if let Some(d) = run.duty.as_mut() {
        d.close(&mut run.session, &mut run.readout)?;
    }
    let last = run.snapshot()?;
    let log = run.session.drain_bpf_log();
    drop(run);
    output.notes(log.into_iter().map(|line| Note::new(Level::Note, NoteCode::BpfLog, line)))?;
    output.summary(last, end)?;
    Ok(end)
}

/// Resolves, plans, loads and attaches as `config` says, and reports the
/// attach: everything before the loop.
fn start<'a>(
    config: &AttachConfig,
    out: impl Write + 'a,
    err: impl Write + 'a,
) -> anyhow::Result<(Run, Output<'a>, Option<ProcessExit>)> {
    // Calibrated before anything is attached to the target: the child it
    // times is tracer's own.
    let calibration =
        (config.budget.is_some() || config.returns).then(|| calibrate::calibrate(config.returns)).transpose()?;
    let costs = calibration.map(|c| c.hit);
    let return_costs = calibration.and_then(|c| c.returns);
    let exit = match &config.target {
        // The pidfd pins the process identity: if the PID is reused after
        // this, we still see the original process's exit.
        TargetSpec::Pid(pid) => Some(ProcessExit::watch(*pid)?),
        TargetSpec::Exe(_) => None,
    };
    let r = discover::resolve(&config.target, config.placement == PlacementMode::CallSites)?;
    let options =
        PlanOptions { placement: config.placement, returns: return_costs.map(|r| r.0), ..PlanOptions::default() };
    let plan = plan::plan(ImageRef::from(&r), &specs(&r, &config.probes)?, options)?;
    let load = LoadOptions { bpf_log: config.bpf_log, ..LoadOptions::default() };
    let mut session = Session::load(plan, r.scope, load)?;
    let watch = match r.pid() {
        Some(pid) => Watch::Process(pid),
        None => Watch::Interpreter(r.attach_path.clone()),
    };
    let late = session.plan().has_call_sites().then(|| LateModules::new(watch, r.known.clone()));

    let attach_began = Instant::now();
    let (links, fallback) = attach_links(&mut session, r.scope, config.links)?;
    let started = Instant::now();
    let mut readout = Readout::new(started, r.pid().is_none());
    let duty = match (config.budget, costs) {
        (Some(budget), Some(costs)) => Some(DutyCycle::new(
            (&mut session, &mut readout),
            budget,
            costs,
            (r.scope, links == Links::Multi),
            (attach_began, started),
        )?),
        _ => None,
    };
    let mut info = attached_event(&session, &r, links);
    info.return_costs_ns = return_costs.map(|r| r.1);
    let mut output = Output {
        reporter: report::reporter(config.format, Box::new(out), Box::new(err)),
        attached: None,
        previous: None,
    };
    output.emit(&Event::Attached(info.clone()))?;
    output.attached = Some(info);
    let mismatch = r.debug_offsets_mismatch.as_ref().map(|why| {
        Note::new(
            Level::Warning,
            NoteCode::DebugOffsets,
            format!(
                "{}: {why}; tracer's knowledge of Python {} may not fit this build",
                r.display_path.display(),
                r.version
            ),
        )
    });
    output.notes(fallback.into_iter().chain(mismatch))?;
    Ok((Run { session, readout, duty, late, started }, output, exit))
}

/// Resolves the target and plans its probes for `tracer probes`, without
/// touching the target (with `returns`, after timing the ways to read a
/// return value on tracer's own child).
pub fn probe_plan(
    target: &TargetSpec,
    selection: &ProbeSelection,
    placement: PlacementMode,
    returns: bool,
) -> anyhow::Result<PlanReport> {
    // Which way reads a return value cheapest is measured, which loads BPF.
    let calibrated = if returns {
        privileges::check()?;
        calibrate::calibrate(true)?.returns
    } else {
        None
    };
    let return_costs: Option<ReturnCosts> = calibrated.map(|r| r.0);
    let options = PlanOptions { placement, returns: return_costs, ..PlanOptions::default() };
    let r = discover::resolve(target, placement == PlacementMode::CallSites)?;
    let plan = plan::plan(ImageRef::from(&r), &specs(&r, selection)?, options)?;
    Ok(PlanReport::new(&plan, &r.version.to_string(), calibrated.map(|r| r.1)))
}
