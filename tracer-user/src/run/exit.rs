//! Knowing when a traced process exits, through pidfds: a pidfd names one
//! process, so a PID the kernel hands to a new process later does not
//! fool it, as testing whether `/proc/PID` exists would.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use tokio::io::unix::AsyncFd;

use crate::discover::process::TargetError;

/// Opens a pidfd for `pid`: `Ok(None)` when no such process exists.
fn pidfd_open(pid: u32) -> std::io::Result<Option<OwnedFd>> {
    let raw_pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ESRCH) { Ok(None) } else { Err(err) };
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("fd out of range"))?;
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A process's pidfd, polled without waiting.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// `None` when `pid` has already exited (or never existed), or when it
    /// is a thread rather than a process.
    #[must_use]
    pub fn open(pid: u32) -> Option<Self> {
        pidfd_open(pid).ok().flatten().map(Self)
    }

    /// Whether the process has exited: a pidfd turns readable then.
    #[must_use]
    pub fn exited(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no waiting.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }
}

/// Becomes ready when the process exits, through a pidfd.
pub struct ProcessExit {
    fd: AsyncFd<OwnedFd>,
}

impl ProcessExit {
    /// Watches `pid`, which must be a process (not a thread) that exists.
    pub fn watch(pid: u32) -> Result<Self, TargetError> {
        let owned = match pidfd_open(pid) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Err(TargetError::NoSuchProcess { pid }),
            // A thread id rather than a thread-group leader: EINVAL on
            // older kernels, ENOENT on newer ones.
            Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
                return Err(match thread_group_of(pid) {
                    Some(tgid) if tgid != pid => TargetError::Thread { tid: pid, tgid },
                    _ => TargetError::Watch { pid, cause: err },
                });
            }
            Err(cause) => return Err(TargetError::Watch { pid, cause }),
        };
        // SAFETY: `owned` is a valid open fd, moved into the AsyncFd, which
        // keeps it open (and the same fd) until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register(owned) }.map_err(|e| TargetError::Watch { pid, cause: e.into() })?;
        Ok(Self { fd })
    }

    pub async fn exited(&self) {
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
