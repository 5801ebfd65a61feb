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
    config::{AttachConfig, TargetSpec},
    interpreter::Interpreter,
    output::{self, AttachInfo, End, ProbeSample, ProcessSample, Sample},
    privileges,
    process::{Target, TargetError},
    python,
    session::{ImageRef, Session, SessionOptions},
};

/// Attaches as `config` says, reports until the run ends, detaches and
/// prints the summary. Returns why the run ended.
pub async fn attach(config: &AttachConfig, out: impl Write) -> anyhow::Result<End> {
    privileges::check()?;
    // Handlers go in before anything is attached, so a Ctrl-C at any point
    // after this still detaches cleanly.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let mut exit = None;
    let (session, info) = match &config.target {
        TargetSpec::Pid(pid) => {
            let pid = *pid;
            // The pidfd pins the process identity: if the PID is reused
            // after this, we still see the original process's exit.
            exit = Some(ProcessExit::watch(pid)?);
            let target = Target::inspect(pid)?;
            let version = python::read_version(&target)?;
            let specs = config.probes.select(python::abi_for(pid, version)?.probes());
            let image = ImageRef { elf: &target.elf, display_path: &target.image_path, attach_path: &target.host_path };
            let options = SessionOptions { placement: config.placement, ..SessionOptions::default() };
            let mut session = Session::load(image, &specs, pid, options)?;
            session.attach_process(pid)?;
            let info = attach_info(&session, Some(pid), None, version, &target.image_path);
            (session, info)
        }
        TargetSpec::Exe(exe) => {
            let interp = Interpreter::from_executable(exe)?;
            let specs = config.probes.select(python::abi_for_image(&interp.image, interp.version)?.probes());
            let image = ImageRef { elf: &interp.elf, display_path: &interp.image, attach_path: &interp.image };
            let options = SessionOptions { placement: config.placement, ..SessionOptions::default() };
            let mut session = Session::load(image, &specs, 0, options)?;
            session.attach_all_processes()?;
            let info = attach_info(&session, None, Some(&interp.exe), interp.version, &interp.image);
            (session, info)
        }
    };
    let started = Instant::now();
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

    let end = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break End::Signal("SIGINT"),
            _ = sigterm.recv() => break End::Signal("SIGTERM"),
            () = &mut target_exit => break End::TargetExit,
            () = &mut deadline, if config.duration.is_some() => break End::Duration,
            _ = ticker.tick() => reporter.interval(&sample(&session, started)?)?,
        }
    };
    // Read after the end so the summary holds every hit up to the target's
    // exit, then detach before printing.
    let last = sample(&session, started)?;
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
        missing: session.missing.clone(),
    }
}

/// Reads the session's counters into a [`Sample`].
pub fn sample(session: &Session, started: Instant) -> anyhow::Result<Sample> {
    let readings = session.read()?;
    let probes = session
        .attached
        .iter()
        .zip(&readings.totals)
        .map(|(p, c)| ProbeSample {
            name: p.symbol,
            counts_bytes: p.program.counts_bytes(),
            calls: c.calls,
            bytes: c.bytes,
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
    Ok(Sample { elapsed: started.elapsed(), probes, processes, stats })
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
/// and why, without loading anything into the kernel.
pub struct ProbePlan {
    pub image: std::path::PathBuf,
    pub version: python::PythonVersion,
    pub probes: Vec<crate::session::AttachedProbe>,
    pub missing: Vec<&'static str>,
}

/// Resolves the target and plans its probes.
pub fn probe_plan(
    target: &TargetSpec,
    selection: &crate::probes::ProbeSelection,
    placement: crate::session::PlacementMode,
) -> anyhow::Result<ProbePlan> {
    let options = SessionOptions { placement, ..SessionOptions::default() };
    match target {
        TargetSpec::Pid(pid) => {
            let target = Target::inspect(*pid)?;
            let version = python::read_version(&target)?;
            let specs = selection.select(python::abi_for(*pid, version)?.probes());
            let image = ImageRef { elf: &target.elf, display_path: &target.image_path, attach_path: &target.host_path };
            let (probes, missing) = crate::session::plan(image, &specs, options)?;
            Ok(ProbePlan { image: target.image_path.clone(), version, probes, missing })
        }
        TargetSpec::Exe(exe) => {
            let interp = Interpreter::from_executable(exe)?;
            let specs = selection.select(python::abi_for_image(&interp.image, interp.version)?.probes());
            let image = ImageRef { elf: &interp.elf, display_path: &interp.image, attach_path: &interp.image };
            let (probes, missing) = crate::session::plan(image, &specs, options)?;
            Ok(ProbePlan { image: interp.image.clone(), version: interp.version, probes, missing })
        }
    }
}
