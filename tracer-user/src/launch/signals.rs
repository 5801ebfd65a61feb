//! The signals a run handles: SIGINT and SIGTERM end `tracer attach`; with
//! `tracer run` they and SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on
//! to the program, and the run ends when it exits. The handlers go in
//! before anything starts, so that a signal that comes while the program
//! is followed to its interpreter is passed on once it runs.

use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The run's signal handlers.
pub struct Signals {
    sigint: Signal,
    sigterm: Signal,
    others: Option<[(i32, Signal); 4]>,
}

impl Signals {
    /// SIGINT's and SIGTERM's handlers; with `pass_on` (`tracer run`)
    /// those of the other signals passed on too (tracer no longer dies of
    /// them). Within a tokio runtime.
    pub fn new(pass_on: bool) -> io::Result<Self> {
        let others = if pass_on {
            Some([
                (libc::SIGHUP, signal(SignalKind::hangup())?),
                (libc::SIGQUIT, signal(SignalKind::quit())?),
                (libc::SIGUSR1, signal(SignalKind::user_defined1())?),
                (libc::SIGUSR2, signal(SignalKind::user_defined2())?),
            ])
        } else {
            None
        };
        Ok(Self { sigint: signal(SignalKind::interrupt())?, sigterm: signal(SignalKind::terminate())?, others })
    }

    /// The next signal that came.
    pub async fn recv(&mut self) -> i32 {
        let others = async {
            let Some([(hup, a), (quit, b), (usr1, c), (usr2, d)]) = self.others.as_mut() else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = a.recv() => *hup,
                _ = b.recv() => *quit,
                _ = c.recv() => *usr1,
                _ = d.recv() => *usr2,
            }
        };
        tokio::select! {
            _ = self.sigint.recv() => libc::SIGINT,
            _ = self.sigterm.recv() => libc::SIGTERM,
            signal = others => signal,
        }
    }
}

/// Whether a signal the terminal sends its foreground process group
/// (SIGINT on Ctrl-C, SIGQUIT on Ctrl-\, SIGHUP on hangup) reached tracer's
/// child as well: tracer runs in that group, where the child is too.
/// Otherwise (`kill -INT`, no terminal) tracer passes it on.
#[must_use]
pub fn terminal_reached_child() -> bool {
    // SAFETY: getpgrp takes nothing and cannot fail.
    let group = unsafe { libc::getpgrp() };
    [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO].into_iter().any(|fd| {
        // SAFETY: tcgetpgrp takes a descriptor and returns -1 where it is
        // not a terminal.
        let foreground = unsafe { libc::tcgetpgrp(fd) };
        foreground != -1 && foreground == group
    })
}
