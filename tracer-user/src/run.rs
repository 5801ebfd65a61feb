//! `tracer attach`: the run loop from validation to the final summary.

use std::{
    io::Write,
    os::fd::{FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
    time::{MissedTickBehavior, interval_at, sleep_until},
};

use crate::{
    budget::{Controller, Estimator, HitCosts, ProbeWindow},
    calibrate,
    callsites::{self, Module},
    config::{AttachConfig, LinkMode, TargetSpec},
    interpreter::Interpreter,
    output::{self, AttachInfo, End, LateCoverage, LateModuleSample, ProbeSample, ProcessSample, Sample},
    privileges,
    process::{Target, TargetError},
    python,
    session::{ALL_PROCESSES, AttachError, ImageRef, PlacementMode, Session, SessionOptions},
};

/// How long each `--budget` window stays attached before detaching starts.
/// Detaching takes the kernel about 0.13 s per probe here, one after
/// another, so that dominates a window anyway.
const BUDGET_WINDOW: Duration = Duration::from_millis(20);

fn attach_scope(session: &mut Session, scope: u32) -> Result<(), AttachError> {
    if scope == ALL_PROCESSES { session.attach_all_processes() } else { session.attach_process(scope) }
}

/// Attaches every probe as `mode` says; returns whether through
/// uprobe-multi links.
fn attach_links(session: &mut Session, scope: u32, mode: LinkMode) -> Result<bool, AttachError> {
    match mode {
        LinkMode::Perf => attach_scope(session, scope).map(|()| false),
        LinkMode::Multi => session.attach_multi(scope).map(|()| true),
        LinkMode::Auto => match session.attach_multi(scope) {
            Ok(()) => Ok(true),
            // Thousands of perf-event uprobes would take minutes to detach.
            Err(e @ AttachError::Multi(_)) if session.has_call_sites() => Err(e),
            Err(AttachError::Multi(e)) => {
                eprintln!(
                    "tracer: note: {e}; attaching one perf-event uprobe per probe instead, which the kernel detaches about 0.13 s apart"
                );
                attach_scope(session, scope).map(|()| false)
            }
            Err(e) => Err(e),
        },
    }
}

fn estimated(mut sample: Sample, duty: Option<&DutyCycle>) -> Sample {
    sample.estimate = duty.map(DutyCycle::estimate);
    sample
}

/// `--budget`: attaches and detaches the session in windows (see
/// [`crate::budget`]).
struct DutyCycle {
    controller: Controller,
    costs: HitCosts,
    /// Per probe, the calibrated cost of one hit.
    cost_ns: Vec<f64>,
    scope: u32,
    /// Whether the probes attach through uprobe-multi links.
    multi: bool,
    estimator: Estimator,
    /// While attached: when the attach began and when it completed.
    attached: Option<(Instant, Instant)>,
    /// Cumulative (calls, bytes) per probe when the current window began.
    at_window_start: Vec<(u64, u64)>,
    /// When to toggle next.
    next: Instant,
}

impl DutyCycle {
    fn new(
        session: &Session,
        budget: f64,
        costs: HitCosts,
        (scope, multi): (u32, bool),
        attach: (Instant, Instant),
    ) -> Result<Self, AttachError> {
        Ok(Self {
            controller: Controller { budget, window: BUDGET_WINDOW },
            costs,
            cost_ns: session.attached.iter().map(|p| costs.of(p.placement.emulated)).collect(),
            scope,
            multi,
            estimator: Estimator::new(session.attached.len()),
            attached: Some(attach),
            at_window_start: counts(session)?,
            next: attach.1 + BUDGET_WINDOW,
        })
    }

    /// Ends the window if attached, else starts one.
    fn toggle(&mut self, session: &mut Session) -> Result<(), AttachError> {
        let Some((began, live)) = self.attached else {
            if self.multi {
                // The links go live within the attach; the window starts
                // once they are and its base is read.
                session.attach_multi(self.scope)?;
                self.at_window_start = counts(session)?;
                let live = Instant::now();
                self.attached = Some((live, live));
                self.next = live + self.controller.window;
            } else {
                // Counts do not move while detached: this is the base.
                self.at_window_start = counts(session)?;
                let began = Instant::now();
                attach_scope(session, self.scope)?;
                let live = Instant::now();
                self.attached = Some((began, live));
                self.next = live + self.controller.window;
            }
            return Ok(());
        };
        let counts_now = counts(session)?;
        let now = Instant::now();
        let window = self.window_counts(&counts_now);
        // Half the attach counts as live: the probes went live one by one.
        let traced = now - live + (live - began) / 2;
        if self.controller.gap(traced, self.overhead(&window)).is_none() {
            // Within budget on its own: the next window follows at once.
            self.record(&window, &vec![traced; window.len()], traced);
            self.at_window_start = counts_now;
            self.attached = Some((now, now));
            self.next = now + self.controller.window;
            return Ok(());
        }
        let gap = self.close(session)?;
        self.next = Instant::now() + gap;
        Ok(())
    }

    /// Detaches and records the window; returns the gap the budget needs.
    fn close(&mut self, session: &mut Session) -> Result<Duration, AttachError> {
        let Some((began, live)) = self.attached.take() else { return Ok(Duration::ZERO) };
        if self.multi {
            // The window ends here: hits while the links remove their
            // breakpoints (a moment) count in the totals but not here.
            let window = self.window_counts(&counts(session)?);
            let ended = Instant::now();
            session.detach_multi(self.scope);
            // (began == live: see toggle.)
            let traced = ended - live + (live - began) / 2;
            let overhead = self.record(&window, &vec![traced; window.len()], traced);
            return Ok(self.controller.gap(traced, overhead).unwrap_or(Duration::ZERO));
        }
        // Each detach holds the next one back (see Session::detach_in_order),
        // so the probes that cost most go first.
        let so_far = self.window_counts(&counts(session)?);
        let mut order: Vec<usize> = (0..so_far.len()).collect();
        order.sort_by(|&a, &b| self.probe_cost(&so_far, b).total_cmp(&self.probe_cost(&so_far, a)));
        let detached = session.detach_in_order(self.scope, &order);
        let lives: Vec<Duration> = detached
            .iter()
            .map(|at| at.map_or(Duration::ZERO, |at| at.saturating_duration_since(live) + (live - began) / 2))
            .collect();
        let traced = lives.iter().copied().max().unwrap_or_default();
        let window = self.window_counts(&counts(session)?);
        let overhead = self.record(&window, &lives, traced);
        Ok(self.controller.gap(traced, overhead).unwrap_or(Duration::ZERO))
    }

    fn window_counts(&self, counts_now: &[(u64, u64)]) -> Vec<(u64, u64)> {
        counts_now
            .iter()
            .zip(&self.at_window_start)
            .map(|(now, then)| (now.0.saturating_sub(then.0), now.1.saturating_sub(then.1)))
            .collect()
    }

    #[allow(clippy::cast_precision_loss, reason = "hit counts of one window")]
    fn probe_cost(&self, window: &[(u64, u64)], slot: usize) -> f64 {
        window.get(slot).map_or(0.0, |(calls, _)| *calls as f64) * self.cost_ns.get(slot).copied().unwrap_or(0.0)
    }

    fn overhead(&self, window: &[(u64, u64)]) -> Duration {
        let ns: f64 = (0..window.len()).map(|slot| self.probe_cost(window, slot)).sum();
        Duration::from_secs_f64(ns / 1e9)
    }

    fn record(&mut self, window: &[(u64, u64)], lives: &[Duration], traced: Duration) -> Duration {
        let overhead = self.overhead(window);
        let probes: Vec<ProbeWindow> =
            window.iter().zip(lives).map(|(&(calls, bytes), &live)| ProbeWindow { live, calls, bytes }).collect();
        self.estimator.add(&probes, traced, overhead);
        overhead
    }

    fn estimate(&self) -> output::EstimateSample {
        output::EstimateSample {
            budget: self.controller.budget,
            windows: self.estimator.windows(),
            traced: self.estimator.traced(),
            overhead: self.estimator.overhead(),
            costs: self.costs,
            rates: self.estimator.rates(),
        }
    }
}

fn counts(session: &Session) -> Result<Vec<(u64, u64)>, AttachError> {
    Ok(session.read()?.totals.iter().map(|c| (c.calls, c.bytes)).collect())
}

/// Attaches as `config` says, reports until the run ends, detaches and
/// prints the summary. Returns why the run ended.
pub async fn attach(config: &AttachConfig, out: impl Write) -> anyhow::Result<End> {
    privileges::check()?;
    // Handlers go in before anything is attached, so a Ctrl-C at any point
    // after this still detaches cleanly.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

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
    let (mut session, mut info, scope, mut late) = load_session(config, return_costs.map(|r| r.0))?;
    let attach_began = Instant::now();
    let multi = attach_links(&mut session, scope, config.links)?;
    info.links = if multi { LinkMode::Multi } else { LinkMode::Perf };
    info.return_costs = return_costs.map(|r| r.1);
    let started = Instant::now();
    let mut duty = match (config.budget, costs) {
        (Some(budget), Some(costs)) => {
            Some(DutyCycle::new(&session, budget, costs, (scope, multi), (attach_began, started))?)
        }
        _ => None,
    };
    let mut reporter = output::reporter(config.format, Box::new(out));
    reporter.attached(&info)?;

    let start = tokio::time::Instant::from_std(started);
    let mut ticker = interval_at(start + config.interval, config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    // Without --duration the deadline is never polled.
    let deadline = sleep_until(start + config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let target_exit = async {
        match &exit {
            Some(exit) => exit.exited().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(target_exit);
    let toggle_at = duty.as_ref().map_or(start, |d| tokio::time::Instant::from_std(d.next));
    let toggle = sleep_until(toggle_at);
    tokio::pin!(toggle);

    let end = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break End::Signal("SIGINT"),
            _ = sigterm.recv() => break End::Signal("SIGTERM"),
            () = &mut target_exit => break End::TargetExit,
            () = &mut deadline, if config.duration.is_some() => break End::Duration,
            () = &mut toggle, if duty.is_some() => {
                let Some(d) = duty.as_mut() else { continue };
                match d.toggle(&mut session) {
                    Ok(()) => toggle.as_mut().reset(tokio::time::Instant::from_std(d.next)),
                    Err(AttachError::TargetExited { .. }) => break End::TargetExit,
                    Err(e) => return Err(e.into()),
                }
            }
            _ = ticker.tick() => {
                if let Some(late) = late.as_mut() {
                    late.check(&mut session, started);
                }
                reporter.interval(&with_late(estimated(sample(&session, started)?, duty.as_ref()), late.as_ref()))?;
            }
        }
    };
    // Read after the end so the summary holds every hit up to the target's
    // exit, then detach before printing.
    if let Some(d) = duty.as_mut() {
        d.close(&mut session)?;
    }
    let last = with_late(estimated(sample(&session, started)?, duty.as_ref()), late.as_ref());
    drop(session);
    reporter.summary(&last, end)?;
    Ok(end)
}

fn attach_info(
    session: &Session,
    pid: Option<u32>,
    exe: Option<&std::path::Path>,
    version: python::PythonVersion,
    image: &std::path::Path,
) -> AttachInfo {
    AttachInfo {
        pid,
        exe: exe.map(|e| e.display().to_string()),
        python_version: version.to_string(),
        image: image.display().to_string(),
        probes: session.attached.iter().map(|p| p.symbol).collect(),
        placements: session.attached.iter().map(|p| (p.symbol, p.placement.clone())).collect(),
        returns: session.attached.iter().filter_map(|p| Some((p.symbol, p.returns.clone()?))).collect(),
        missing: session.missing.clone(),
        links: LinkMode::Auto,
        return_costs: None,
        call_sites: session
            .attached
            .iter()
            .filter_map(|p| Some((p.symbol, p.call_sites.as_ref().map(|c| c.emulated + c.stepped)?)))
            .collect(),
    }
}

/// `--placement call-sites`: each interval, the files mapped since the
/// attach (by the target, or with `--exe` by any process of the
/// interpreter) are scanned, and their calls to the functions at their call
/// sites are probed from then on.
struct LateModules {
    watch: Watch,
    /// Every file already scanned.
    known: std::collections::HashSet<crate::process::FileId>,
    /// What each late file contributes, for the report.
    records: Vec<LateModuleSample>,
}

/// Whose mappings [`LateModules`] watches.
enum Watch {
    /// `--pid`: one process; its links filter on it.
    Process(u32),
    /// `--exe`: every process that maps this image; links cover them all.
    Interpreter(std::path::PathBuf),
}

fn with_late(mut sample: Sample, late: Option<&LateModules>) -> Sample {
    if let Some(late) = late {
        sample.late_modules.clone_from(&late.records);
    }
    sample
}

impl LateModules {
    fn check(&mut self, session: &mut Session, started: Instant) {
        let (scope, processes) = match &self.watch {
            // An exited target is the exit branch's business.
            Watch::Process(pid) => {
                (*pid, crate::process::code_files(*pid).map(|f| vec![(*pid, f)]).unwrap_or_default())
            }
            Watch::Interpreter(image) => (ALL_PROCESSES, crate::process::processes_mapping(image)),
        };
        let modules: Vec<Module> =
            processes.iter().flat_map(|(pid, files)| callsites::new_modules(*pid, files, &mut self.known)).collect();
        for module in modules {
            let since = started.elapsed();
            let at = since.as_secs_f64();
            let shown = module.display_path.display().to_string();
            match session.attach_late_module(scope, &module) {
                Ok(late) => {
                    for l in late {
                        if l.sites > 0 {
                            eprintln!(
                                "tracer: note: {shown} was mapped after attaching; its {} calls to {} are probed from {at:.1} s on (earlier calls from it are not counted)",
                                l.sites, l.symbol
                            );
                        }
                        if let Some(e) = &l.escape {
                            eprintln!(
                                "tracer: note: {shown}, mapped after attaching, lets the address of {} escape ({e}); calls through it are not counted",
                                l.symbol
                            );
                        }
                        let coverage = LateCoverage::Sites { symbol: l.symbol, sites: l.sites, escape: l.escape };
                        self.records.push(LateModuleSample { path: shown.clone(), since, coverage });
                    }
                }
                Err(e) => {
                    eprintln!(
                        "tracer: note: {shown} was mapped after attaching, and its calls cannot be probed ({e}); calls from it are not counted"
                    );
                    let coverage = LateCoverage::Failed { error: e.to_string() };
                    self.records.push(LateModuleSample { path: shown, since, coverage });
                }
            }
        }
    }
}

/// A target resolved to its interpreter image, the probes it has and the
/// modules that may call into it: what both attaching and planning need.
struct Resolved {
    /// `--pid`'s process, or [`ALL_PROCESSES`] with `--exe`.
    scope: u32,
    /// With `--exe`, the executable asked for.
    exe: Option<std::path::PathBuf>,
    elf: crate::elf::ElfImage,
    /// The image as the target sees it.
    display_path: std::path::PathBuf,
    /// The same file from tracer's mount namespace.
    attach_path: std::path::PathBuf,
    version: python::PythonVersion,
    specs: Vec<crate::probes::ProbeSpec>,
    /// With `--placement call-sites`, the modules that may call the image.
    modules: Vec<Module>,
    /// The identities of those modules and the image.
    known: std::collections::HashSet<crate::process::FileId>,
}

impl Resolved {
    fn new(
        target: &TargetSpec,
        selection: &crate::probes::ProbeSelection,
        placement: PlacementMode,
    ) -> anyhow::Result<Self> {
        let call_sites = placement == PlacementMode::CallSites;
        Ok(match target {
            TargetSpec::Pid(pid) => {
                let target = Target::inspect(*pid)?;
                let version = python::read_version(&target)?;
                let specs = selection.select(python::abi_for(*pid, version)?.probes());
                let root = crate::process::proc_root(*pid);
                let v = (version.major, version.minor);
                let modules = if call_sites {
                    callsites::modules(&target.image_path, &root, &target.code_files, v)
                } else {
                    Vec::new()
                };
                let known = callsites::known_files(&target.host_path, &modules);
                Self {
                    scope: *pid,
                    exe: None,
                    elf: target.elf,
                    display_path: target.image_path,
                    attach_path: target.host_path,
                    version,
                    specs,
                    modules,
                    known,
                }
            }
            TargetSpec::Exe(exe) => {
                let interp = Interpreter::from_executable(exe)?;
                let specs = selection.select(python::abi_for_image(&interp.image, interp.version)?.probes());
                // Its own modules (the executable, lib-dynload), and every
                // file its running processes map executable, such as the
                // third-party extension modules they imported.
                let mut modules = interp.modules(placement);
                let mut known = callsites::known_files(&interp.image, &modules);
                if call_sites {
                    for (pid, files) in crate::process::processes_mapping(&interp.image) {
                        modules.extend(callsites::new_modules(pid, &files, &mut known));
                    }
                }
                Self {
                    scope: ALL_PROCESSES,
                    exe: Some(interp.exe),
                    elf: interp.elf,
                    display_path: interp.image.clone(),
                    attach_path: interp.image,
                    version: interp.version,
                    specs,
                    modules,
                    known,
                }
            }
        })
    }

    fn image(&self) -> ImageRef<'_> {
        ImageRef {
            elf: &self.elf,
            display_path: &self.display_path,
            attach_path: &self.attach_path,
            modules: &self.modules,
        }
    }
}

/// Resolves the target and loads a session for it (nothing attached yet);
/// returns the session, the attach header, the attach scope, and with
/// call-site probes, the watch for modules mapped later.
fn load_session(
    config: &AttachConfig,
    returns: Option<crate::returns::ReturnCosts>,
) -> anyhow::Result<(Session, AttachInfo, u32, Option<LateModules>)> {
    let options = SessionOptions { placement: config.placement, returns, ..SessionOptions::default() };
    let r = Resolved::new(&config.target, &config.probes, config.placement)?;
    let session = Session::load(r.image(), &r.specs, r.scope, options)?;
    let pid = (r.scope != ALL_PROCESSES).then_some(r.scope);
    let info = attach_info(&session, pid, r.exe.as_deref(), r.version, &r.display_path);
    let watch = match pid {
        Some(pid) => Watch::Process(pid),
        None => Watch::Interpreter(r.attach_path.clone()),
    };
    let late = session.has_call_sites().then(|| LateModules { watch, known: r.known, records: Vec::new() });
    Ok((session, info, r.scope, late))
}

/// Reads the session's counters into a [`Sample`].
pub fn sample(session: &Session, started: Instant) -> anyhow::Result<Sample> {
    let readings = session.read()?;
    let probes = session
        .attached
        .iter()
        .zip(&readings.totals)
        .zip(&readings.returns)
        .map(|((p, c), r)| ProbeSample {
            name: p.symbol,
            counts_bytes: p.program.counts_bytes(),
            calls: c.calls,
            bytes: c.bytes,
            returned: p.returns.as_ref().map(|_| *r),
        })
        .collect();
    let processes = readings
        .per_process
        .iter()
        .map(|(pid, counters)| ProcessSample {
            pid: *pid,
            counts: counters.iter().map(|c| (c.calls, c.bytes)).collect(),
        })
        .collect();
    let stats = Sample::stats_from(&readings.stats, readings.kernel_misses);
    Ok(Sample { elapsed: started.elapsed(), probes, processes, stats, estimate: None, late_modules: Vec::new() })
}

/// Becomes ready when the process exits, through a pidfd.
struct ProcessExit {
    fd: AsyncFd<OwnedFd>,
}

impl ProcessExit {
    fn watch(pid: u32) -> Result<Self, TargetError> {
        let raw_pid = libc::pid_t::try_from(pid).map_err(|_| TargetError::NoSuchProcess { pid })?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ESRCH) => TargetError::NoSuchProcess { pid },
                // A thread id rather than a thread-group leader: EINVAL on
                // older kernels, ENOENT on newer ones.
                Some(libc::EINVAL | libc::ENOENT) => match thread_group_of(pid) {
                    Some(tgid) if tgid != pid => TargetError::Thread { tid: pid, tgid },
                    _ => TargetError::Watch { pid, cause: err },
                },
                _ => TargetError::Watch { pid, cause: err },
            });
        }
        let fd = i32::try_from(fd)
            .map_err(|_| TargetError::Watch { pid, cause: std::io::Error::other("fd out of range") })?;
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `owned` is a valid open fd, moved into the AsyncFd, which
        // keeps it open (and the same fd) until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register(owned) }.map_err(|e| TargetError::Watch { pid, cause: e.into() })?;
        Ok(Self { fd })
    }

    async fn exited(&self) {
        // A pidfd turns readable once, when the process exits, and stays so.
        // Readiness is never cleared, so every later poll returns at once.
        if self.fd.readable().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn thread_group_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// The attach plan for `tracer probes`: which functions, where in each,
/// and why, without touching the target (with `returns`, after timing the
/// ways to read a return value on tracer's own child).
pub struct ProbePlan {
    pub image: std::path::PathBuf,
    pub version: python::PythonVersion,
    pub probes: Vec<crate::session::AttachedProbe>,
    pub missing: Vec<&'static str>,
    /// With `--returns`: what each way of reading a return value cost here.
    pub return_costs: Option<calibrate::ReturnMeasurement>,
}

/// Resolves the target and plans its probes.
pub fn probe_plan(
    target: &TargetSpec,
    selection: &crate::probes::ProbeSelection,
    placement: PlacementMode,
    returns: bool,
) -> anyhow::Result<ProbePlan> {
    // Which way reads a return value cheapest is measured, which loads BPF.
    let calibrated = if returns {
        privileges::check()?;
        calibrate::calibrate(true)?.returns
    } else {
        None
    };
    let return_costs = calibrated.map(|r| r.1);
    let options = SessionOptions { placement, returns: calibrated.map(|r| r.0), ..SessionOptions::default() };
    let r = Resolved::new(target, selection, placement)?;
    let (probes, missing) = crate::session::plan(r.image(), &r.specs, options)?;
    Ok(ProbePlan { image: r.display_path, version: r.version, probes, missing, return_costs })
}
