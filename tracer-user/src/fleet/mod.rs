//! `tracer attach --all`: every CPython process on the host, those running
//! and those started later, in any mount and PID namespace. Processes are
//! grouped by the interpreter image they run ([`scan`]); each image gets a
//! `tracer attach --exe IMAGE --json` of its own ([`child`]), whose plan,
//! probes, budget and exit handling are `--exe`'s, and `--all` reports the
//! sum of what they say ([`merge`]), with each process's namespace PID,
//! container and command line.

pub mod child;
pub mod config;
mod merge;
pub mod scan;

use std::{
    io::Write,
    time::{Duration, Instant},
};

use indexmap::IndexMap;
use thiserror::Error;
use tokio::{
    sync::mpsc::unbounded_channel,
    time::{MissedTickBehavior, interval_at, sleep_until},
};

pub use self::config::{AllConfig, AllError};
use self::{
    child::{Said, Tracer},
    scan::{Image, Scanner},
};
use crate::{
    error::Classify,
    launch::{signal_name, signals::Signals},
    model::{Attached, End, Event, InterpreterInfo, Level, Note, NoteCode, ProcessInfo, Snapshot, Summary},
    privileges::{self, PrivilegeError},
    report,
};

/// How long a child may take to attach (planning an LTO build with debug
/// info takes seconds) before `--all` reports without it.
const ATTACH_WAIT: Duration = Duration::from_mins(2);

/// How long a child may take to detach and print its summary.
const DETACH_WAIT: Duration = Duration::from_secs(30);

/// How many of a child's last stderr lines are kept, for the error it
/// died of.
const STDERR_KEPT: usize = 4;

/// Why `--all` failed.
#[derive(Debug, Error)]
pub enum FleetError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error("cannot start tracer for {image}: {cause}")]
    Start { image: String, cause: std::io::Error },
    #[error("installing the signal handlers")]
    Signal(std::io::Error),
    /// Writing the report.
    #[error(transparent)]
    Output(std::io::Error),
}

impl Classify for FleetError {
    fn is_bad_input(&self) -> bool {
        match self {
            Self::Privileges(e) => e.is_bad_input(),
            Self::Start { .. } | Self::Signal(_) | Self::Output(_) => false,
        }
    }

    // No broken pipe: a closed report ends the run (`End::OutputClosed`).
}

/// One interpreter's `tracer attach --exe`, and what it said so far.
struct Kid {
    tracer: Tracer,
    image: Image,
    attached: Option<Attached>,
    /// When its probes went live, in seconds since `--all` began.
    since_s: f64,
    latest: Option<Snapshot>,
    summary: Option<Snapshot>,
    closed: bool,
    stderr: Vec<String>,
    /// Whether its failure was reported.
    told: bool,
}

impl Kid {
    fn info(&self) -> Option<InterpreterInfo> {
        let a = self.attached.as_ref()?;
        Some(InterpreterInfo {
            image: self.image.path.display().to_string(),
            version: a.python.version.clone(),
            since_s: self.since_s,
            probes: a.probes.clone(),
            missing: a.missing.clone(),
        })
    }

    /// The last stderr line that is an error, or the last one.
    fn error(&self) -> String {
        let line = self.stderr.iter().rev().find(|l| l.contains("error:")).or(self.stderr.last());
        line.map_or_else(|| "it exited without a word".to_owned(), |l| l.trim_start_matches("tracer: ").to_owned())
    }
}

/// The run's state.
struct Fleet<'a> {
    config: &'a AllConfig,
    reporter: Box<dyn report::Reporter + 'a>,
    scanner: Scanner,
    kids: Vec<Kid>,
    processes: IndexMap<String, ProcessInfo>,
    said: tokio::sync::mpsc::UnboundedSender<Said>,
    started: Instant,
    /// The header sent, and the interpreters it named.
    attached: Option<Attached>,
    previous: Option<Snapshot>,
    /// Notes that came before the header, which goes first.
    held: Vec<Note>,
    /// The report's reader went away (`| head`): the run ends at the next
    /// turn of its loop, and the children detach as at any end.
    closed: bool,
}

/// `tracer attach --all` until `--duration`, SIGINT or SIGTERM.
pub async fn attach_all<'a>(
    config: &AllConfig,
    signals: &mut Signals,
    out: impl Write + 'a,
    err: impl Write + 'a,
) -> Result<End, FleetError> {
    privileges::check()?;
    let (said, mut heard) = unbounded_channel();
    let mut fleet = Fleet {
        config,
        reporter: report::reporter(config.format, Box::new(out), Box::new(err)),
        scanner: Scanner::default(),
        kids: Vec::new(),
        processes: IndexMap::new(),
        said,
        started: Instant::now(),
        attached: None,
        previous: None,
        held: Vec::new(),
        closed: false,
    };
    fleet.rescan()?;
    if fleet.kids.is_empty() {
        fleet.note(Level::Note, "no CPython process is running yet: each one that starts is traced".to_owned())?;
    }
    // --duration counts from the header, as `attach --exe`'s does from its
    // attach: the children's start (calibrating, planning thousands of
    // sites) can take longer than a short --duration, which ended the run
    // before any interval (`--duration 2` gave a summary after 22 s on a
    // loaded machine, and no interval). With no CPython running at the
    // start, it counts from the start; while the first interpreters attach
    // it does not run (ATTACH_WAIT bounds that). Times (`elapsed_s`) still
    // count from the start.
    let mut deadline =
        if fleet.kids.is_empty() { config.duration.map(|d| tokio::time::Instant::now() + d) } else { None };
    let attach_by = tokio::time::Instant::now() + ATTACH_WAIT;
    let mut tick = interval_at(tokio::time::Instant::now() + config.interval, config.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let end = loop {
        if fleet.closed {
            break End::OutputClosed;
        }
        // A copy: the tick's branch may move the deadline.
        let until_deadline = deadline;
        let until = async move {
            match until_deadline {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = until => break End::Duration,
            signal = signals.recv() => break End::Signal(signal_name(signal)),
            _ = tick.tick() => {
                fleet.rescan()?;
                // The first report waits for every interpreter found at the
                // start to attach (or fail), for at most ATTACH_WAIT.
                let waiting = fleet.kids.iter().any(|k| k.attached.is_none() && !k.closed);
                if fleet.attached.is_none() && (!waiting || tokio::time::Instant::now() >= attach_by) {
                    fleet.header()?;
                    if deadline.is_none() {
                        deadline = config.duration.map(|d| tokio::time::Instant::now() + d);
                    }
                }
                if fleet.attached.is_some() {
                    fleet.interval()?;
                }
            }
            Some(said) = heard.recv() => fleet.hear(said)?,
        }
    };
    fleet.finish(&mut heard, end).await?;
    // Closed while the summary was written: the reader has not all of it.
    Ok(if fleet.closed { End::OutputClosed } else { end })
}

impl Fleet<'_> {
    fn emit(&mut self, event: &Event) -> Result<(), FleetError> {
        match self.reporter.event(event) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            written => written.map_err(FleetError::Output),
        }
    }

    fn note(&mut self, level: Level, message: String) -> Result<(), FleetError> {
        self.say(Note::new(level, NoteCode::Interpreter, message))
    }

    /// A note, after the header where one is coming.
    fn say(&mut self, note: Note) -> Result<(), FleetError> {
        if self.attached.is_none() && !self.kids.is_empty() {
            self.held.push(note);
            return Ok(());
        }
        self.emit(&Event::Note(note))
    }

    fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Looks for processes not seen before, and starts a child for each new
    /// interpreter.
    fn rescan(&mut self) -> Result<(), FleetError> {
        let found = self.scanner.scan();
        for image in found.images {
            let mut args = self.config.passed_on.clone();
            if let (Some(dir), false) = (&image.debug_dir, self.config.debug_dir) {
                args.extend(["--debug-dir".into(), dir.clone().into_os_string()]);
            }
            let tracer = Tracer::start(self.kids.len(), (&image.path, image.held.as_deref()), &args, &self.said)
                .map_err(|cause| FleetError::Start { image: image.path.display().to_string(), cause })?;
            self.kids.push(Kid {
                tracer,
                image,
                attached: None,
                since_s: 0.0,
                latest: None,
                summary: None,
                closed: false,
                stderr: Vec::new(),
                told: false,
            });
        }
        // After the children start: notes then wait for the header.
        for (pid, info) in found.processes {
            if let Some(reason) = &info.skipped {
                let message = format!("--all: PID {pid} is not traced: {reason}");
                self.note(Level::Warning, message)?;
            }
            self.processes.insert(pid.to_string(), info);
        }
        if let Some((pid, reason)) = found.unknown.first() {
            // Once per scan that finds any: how many, and the first's why.
            let more = match found.unknown.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            let message =
                format!("--all: PID {pid}{more} cannot be looked into, so is not traced if it runs Python: {reason}");
            self.note(Level::Warning, message)?;
        }
        Ok(())
    }

    /// Handles one thing a child said.
    fn hear(&mut self, said: Said) -> Result<(), FleetError> {
        match said {
            Said::Event(i, event) => match *event {
                Event::Attached(a) => {
                    let since_s = self.elapsed_s();
                    let kid = &mut self.kids[i];
                    kid.since_s = since_s;
                    kid.attached = Some(a);
                    if self.attached.is_some() {
                        // An interpreter first seen after the header.
                        let info = self.kids[i].info();
                        if let Some(info) = info {
                            let message = format!(
                                "--all: now also tracing {} (Python {}, {} probes) from {:.1} s on",
                                crate::text::display(&info.image),
                                info.version,
                                info.probes.len(),
                                info.since_s
                            );
                            self.note(Level::Note, message)?;
                        }
                        self.header_update();
                    }
                }
                Event::Interval(s) => self.kids[i].latest = Some(s),
                Event::Summary(s) => self.kids[i].summary = Some(s.snapshot),
                Event::Note(mut n) => {
                    n.message = format!(
                        "{}: {}",
                        crate::text::display(&self.kids[i].image.path.display().to_string()),
                        n.message
                    );
                    self.say(n)?;
                }
            },
            Said::Stderr(i, line) => {
                let kid = &mut self.kids[i];
                if kid.stderr.len() == STDERR_KEPT {
                    kid.stderr.remove(0);
                }
                kid.stderr.push(line);
            }
            Said::Garbled(i, why) => {
                let message = format!(
                    "--all: a line from the tracer of {} was not an event: {why}",
                    self.kids[i].image.path.display()
                );
                self.note(Level::Warning, message)?;
            }
            Said::Closed(i) => {
                self.kids[i].closed = true;
                self.told_failed(i)?;
            }
        }
        Ok(())
    }

    /// Says once that child `i` ended before it was asked to, and why.
    fn told_failed(&mut self, i: usize) -> Result<(), FleetError> {
        let kid = &mut self.kids[i];
        if kid.told || kid.summary.is_some() {
            return Ok(());
        }
        kid.told = true;
        let status = kid.tracer.wait();
        let message = format!(
            "--all: the tracer of {} ended ({}): {}; its processes are not traced from then on",
            kid.image.path.display(),
            status.map_or_else(|| "status unknown".to_owned(), |s| s.to_string()),
            kid.error()
        );
        self.note(Level::Warning, message)
    }

    /// The header, once the interpreters found at the start attached.
    fn header(&mut self) -> Result<(), FleetError> {
        self.header_update();
        let Some(a) = self.attached.clone() else { return Ok(()) };
        self.emit(&Event::Attached(a))?;
        for note in std::mem::take(&mut self.held) {
            self.emit(&Event::Note(note))?;
        }
        Ok(())
    }

    /// The joined header of every interpreter attached so far.
    fn header_update(&mut self) {
        let parts: Vec<(&Attached, InterpreterInfo)> =
            self.kids.iter().filter_map(|k| Some((k.attached.as_ref()?, k.info()?))).collect();
        if let Some(a) = merge::attached(&parts) {
            self.attached = Some(a);
        }
    }

    /// The sum of the children's latest snapshots (or summaries), with
    /// each process described.
    fn merged(&mut self, final_: bool) -> Snapshot {
        let parts: Vec<&Snapshot> = self
            .kids
            .iter()
            .filter_map(|k| if final_ { k.summary.as_ref().or(k.latest.as_ref()) } else { k.latest.as_ref() })
            .collect();
        let mut merged = merge::snapshots(&parts, self.elapsed_s());
        // Every process counted, described when first seen (or now, for
        // one that came and went between two scans).
        for (i, kid) in self.kids.iter().enumerate() {
            let shown = if final_ { kid.summary.as_ref().or(kid.latest.as_ref()) } else { kid.latest.as_ref() };
            let Some(s) = shown else { continue };
            for pid in s.pids.keys() {
                let info = self.processes.entry(pid.clone()).or_insert_with(|| {
                    let mut info = pid.parse().map(scan::describe).unwrap_or_default();
                    info.image = self.kids[i].image.path.display().to_string();
                    info
                });
                merged.processes.insert(pid.clone(), info.clone());
            }
        }
        // Then every other process found, of an interpreter whose tracer
        // reports: one whose calls all fell between the windows (or that
        // made none yet) is still listed, so it does not vanish from the
        // report. One whose tracer has not reported yet, or ended without
        // a summary, is not said to be traced; the skipped are listed.
        let reporting: std::collections::HashSet<String> = self
            .kids
            .iter()
            .filter(|k| k.summary.is_some() || (!k.closed && k.latest.is_some()))
            .map(|k| k.image.path.display().to_string())
            .collect();
        for (pid, info) in &self.processes {
            if !merged.processes.contains_key(pid) && (info.skipped.is_some() || reporting.contains(&info.image)) {
                merged.processes.insert(pid.clone(), info.clone());
            }
        }
        merged
    }

    fn interval(&mut self) -> Result<(), FleetError> {
        // Each child reports from its own attach on, at its own interval:
        // until one has, there is nothing to add up, and an interval then
        // would be a table with no function in it, as if nothing ran.
        if self.kids.iter().all(|k| k.latest.is_none()) {
            return Ok(());
        }
        let mut merged = self.merged(false);
        self.check_unmerged(&merged)?;
        if let Some(a) = &self.attached {
            merged.compute_rates(a, self.previous.as_ref());
        }
        self.emit(&Event::Interval(merged.clone()))?;
        self.previous = Some(merged);
        Ok(())
    }

    fn check_unmerged(&mut self, merged: &Snapshot) -> Result<(), FleetError> {
        let left: Vec<&str> = self.kids.iter().filter_map(|k| k.latest.as_ref()).flat_map(merge::unmerged).collect();
        let _ = merged;
        if left.is_empty() {
            return Ok(());
        }
        self.note(Level::Warning, format!("--all does not add up {}: not shown", left.join(", ")))
    }

    /// Ends every child as Ctrl-C would, waits for its summary, and
    /// reports their sum.
    async fn finish(
        &mut self,
        heard: &mut tokio::sync::mpsc::UnboundedReceiver<Said>,
        end: End,
    ) -> Result<(), FleetError> {
        for kid in self.kids.iter().filter(|k| !k.closed) {
            kid.tracer.interrupt();
        }
        let by = tokio::time::Instant::now() + DETACH_WAIT;
        while self.kids.iter().any(|k| !k.closed) {
            tokio::select! {
                () = sleep_until(by) => break,
                said = heard.recv() => match said {
                    Some(said) => self.hear(said)?,
                    None => break,
                },
            }
        }
        for i in 0..self.kids.len() {
            if !self.kids[i].closed {
                self.kids[i].tracer.kill();
                let message = format!(
                    "--all: the tracer of {} did not detach within {} s and was killed; its last interval stands for its summary",
                    self.kids[i].image.path.display(),
                    DETACH_WAIT.as_secs()
                );
                self.note(Level::Warning, message)?;
            }
            let _ = self.kids[i].tracer.wait();
        }
        if self.attached.is_none() {
            self.header()?;
        }
        // No interpreter ever attached: what was held is all there is.
        for note in std::mem::take(&mut self.held) {
            self.emit(&Event::Note(note))?;
        }
        let mut merged = self.merged(true);
        if let Some(a) = &self.attached {
            merged.compute_rates(a, None);
        }
        if self.attached.is_some() {
            self.emit(&Event::Summary(Summary::new(merged, end)))?;
        }
        Ok(())
    }
}
