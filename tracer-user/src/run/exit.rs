//! Waiting for the traced process to exit, through its pidfd (see
//! [`crate::discover::process::Pidfd`]).

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

use crate::discover::process::{TargetError, pidfd_open, thread_group_of};

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
