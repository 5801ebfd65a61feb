//! Pausing the target for an exact census (`--stop`), and always letting
//! it go.
//!
//! Every thread is seized with `PTRACE_SEIZE` and stopped with
//! `PTRACE_INTERRUPT`, again until no new thread appears (a thread can
//! start one while the others stop). ptrace rather than `SIGSTOP`:
//! a ptrace stop is invisible to the target's parent and to job control,
//! and if tracer dies, even by `SIGKILL`, the kernel detaches it and every
//! thread runs on, where a `SIGSTOP`ped process would stay stopped. The
//! threads are let go when the [`Stopped`] is dropped: after the census,
//! on every error, and on `SIGINT`, `SIGTERM` or `SIGHUP`, which
//! [`Interrupts`] turns into an error the census returns at its next step.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use super::HeapError;

/// Rounds of listing the threads at most.
const MAX_ROUNDS: u32 = 100;

/// Test-only: fewer rounds (at least 1), so that a test reaches the limit
/// without a target that makes threads faster than they can be stopped.
/// One round always finds new threads (all of them), so 1 fails every
/// stop.
pub const ROUNDS_VARIABLE: &str = "TRACER_TEST_STOP_ROUNDS";

fn max_rounds() -> u32 {
    std::env::var(ROUNDS_VARIABLE).ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(MAX_ROUNDS)
}

/// A target whose threads are all stopped.
#[derive(Debug)]
pub struct Stopped {
    pid: u32,
    tids: Vec<libc::pid_t>,
    since: Instant,
}

impl Stopped {
    /// Stops every thread of `pid`.
    pub fn stop(pid: u32) -> Result<Self, HeapError> {
        let mut stopped = Self { pid, tids: Vec::new(), since: Instant::now() };
        let rounds = max_rounds();
        for _ in 0..rounds {
            let tids = threads(pid)?;
            let new: Vec<libc::pid_t> = tids.into_iter().filter(|t| !stopped.tids.contains(t)).collect();
            if new.is_empty() {
                stopped.since = Instant::now();
                return Ok(stopped);
            }
            for tid in new {
                match seize(tid) {
                    Ok(()) => stopped.tids.push(tid),
                    // A thread that exited between the listing and now.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(cause) => return Err(HeapError::Stop { pid, tid: tid.unsigned_abs(), cause }),
                }
            }
        }
        // Dropping `stopped` lets go of every thread seized.
        Err(HeapError::Multiplying { pid, rounds })
    }

    /// How long the target has been stopped.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.since.elapsed()
    }

    /// Lets the target go; how long it was stopped.
    #[must_use]
    pub fn resume(self) -> Duration {
        self.elapsed()
        // Drop detaches.
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &tid in &self.tids {
            // SAFETY: PTRACE_DETACH of a task this process seized takes no
            // pointers; a task that has exited in the meantime fails with
            // ESRCH, and nothing is left to let go.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        }
        log::debug!("PID {} resumed ({} threads)", self.pid, self.tids.len());
    }
}

/// Seizes `tid` and waits until it has stopped.
fn seize(tid: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: PTRACE_SEIZE and PTRACE_INTERRUPT take no pointers (addr and
    // data 0).
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) } < 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: detaching the task seized just above.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        return Err(err);
    }
    let mut status = 0;
    // SAFETY: status is a valid int to write; __WALL waits for a thread of
    // another process, which seizing made this process's tracee.
    if unsafe { libc::waitpid(tid, &raw mut status, libc::__WALL) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The thread IDs of `pid`.
fn threads(pid: u32) -> Result<Vec<libc::pid_t>, HeapError> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).map_err(|cause| {
        if cause.kind() == std::io::ErrorKind::NotFound {
            HeapError::Exited { pid }
        } else {
            HeapError::Proc { pid, path: dir.clone(), cause }
        }
    })?;
    Ok(entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

/// Set by the handlers [`Interrupts`] installs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// `SIGINT`, `SIGTERM` and `SIGHUP` caught while it lives, so that a census
/// stops at its next step and lets a stopped target go; the previous
/// handlers come back when it is dropped.
#[derive(Debug)]
pub struct Interrupts {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

impl Interrupts {
    #[must_use]
    pub fn catch() -> Self {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let mut previous = Vec::new();
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction is plain data; all zeroes is a valid value
            // that the fields set below complete.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both point to valid sigactions; the handler only
            // stores to an atomic, which is async-signal-safe.
            if unsafe { libc::sigaction(signal, &raw const action, &raw mut old) } == 0 {
                previous.push((signal, old));
            }
        }
        Self { previous }
    }

    /// Whether one of the signals came.
    #[must_use]
    pub fn happened() -> bool {
        INTERRUPTED.load(Ordering::SeqCst)
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores the action saved when it was replaced.
            unsafe { libc::sigaction(*signal, old, std::ptr::null_mut()) };
        }
    }
}
