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
    config::AttachConfig,
    output::{self, AttachInfo, End, ProbeSample, Sample},
    privileges,
    process::{Target, TargetError},
    python,
    session::Session,
};

/// Attaches to `config.pid`, reports until the run ends, detaches and
/// prints the summary. Returns why the run ended.
pub async fn attach(config: &AttachConfig, out: impl Write) -> anyhow::Result<End> {
    privileges::check()?;
    // Handlers go in before anything is attached, so a Ctrl-C at any point
    // after this still detaches cleanly.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let pid = config.pid;
    if pid == std::process::id() {
        return Err(TargetError::OwnProcess { pid }.into());
    }
    // The pidfd pins the process identity: if the PID is reused after this,
    // we still see the original process's exit.
    let exit = ProcessExit::watch(pid)?;
    let target = Target::inspect(pid)?;
    let version = python::read_version(&target)?;
    let abi = python::abi_for(pid, version)?;
    let session = Session::attach(&target, abi.probes())?;
    let started = Instant::now();

    let mut reporter = output::reporter(config.format, Box::new(out));
    reporter.attached(&AttachInfo {
        pid,
        python_version: version.to_string(),
        image: target.image_path.display().to_string(),
        probes: session.attached.iter().map(|p| p.symbol).collect(),
        missing: session.missing.clone(),
    })?;

    let start = tokio::time::Instant::from_std(started);
    let mut ticker = interval_at(start + config.interval, config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    // Without --duration the deadline is never polled.
    let deadline = sleep_until(start + config.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);

    let end = loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => break End::Signal("SIGINT"),
            _ = sigterm.recv() => break End::Signal("SIGTERM"),
            () = exit.exited() => break End::TargetExit,
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

fn sample(session: &Session, started: Instant) -> anyhow::Result<Sample> {
    let readings = session.read()?;
    let probes = session
        .attached
        .iter()
        .zip(&readings.counters)
        .map(|(p, c)| ProbeSample {
            name: p.symbol,
            counts_bytes: p.program.counts_bytes(),
            calls: c.calls,
            bytes: c.bytes,
        })
        .collect();
    let stats = Sample::stats_from(&readings.stats, readings.kernel_misses);
    Ok(Sample { elapsed: started.elapsed(), probes, stats })
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
