//! The signals `tracer run` passes on to its child, which keeps tracer
//! running until the child exits: SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
//! SIGUSR2 always, SIGINT unless the terminal sent it to both.

use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The signals passed on besides SIGINT and SIGTERM (which the run loop
/// has handlers for anyway).
pub struct Forward {
    streams: Option<[(i32, Signal); 4]>,
}

impl Forward {
    /// With `active`, handlers for the signals passed on (tracer no longer
    /// dies of them); without, none.
    pub fn new(active: bool) -> io::Result<Self> {
        if !active {
            return Ok(Self { streams: None });
        }
        Ok(Self {
            streams: Some([
                (libc::SIGHUP, signal(SignalKind::hangup())?),
                (libc::SIGQUIT, signal(SignalKind::quit())?),
                (libc::SIGUSR1, signal(SignalKind::user_defined1())?),
                (libc::SIGUSR2, signal(SignalKind::user_defined2())?),
            ]),
        })
    }

    /// The next signal to pass on; never without handlers.
    pub async fn recv(&mut self) -> i32 {
        let Some([(hup, a), (quit, b), (usr1, c), (usr2, d)]) = self.streams.as_mut() else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = a.recv() => *hup,
            _ = b.recv() => *quit,
            _ = c.recv() => *usr1,
            _ = d.recv() => *usr2,
        }
    }
}

/// Whether a SIGINT that reached tracer reached its child as well: tracer
/// runs in the foreground process group of its terminal, to which Ctrl-C
/// sends it (the child is in that group too). Otherwise (`kill -INT`, no
/// terminal) tracer passes it on.
#[must_use]
pub fn interrupt_reached_child() -> bool {
    // SAFETY: getpgrp takes nothing and cannot fail.
    let group = unsafe { libc::getpgrp() };
    [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO].into_iter().any(|fd| {
        // SAFETY: tcgetpgrp takes a descriptor and returns -1 where it is
        // not a terminal.
        let foreground = unsafe { libc::tcgetpgrp(fd) };
        foreground != -1 && foreground == group
    })
}

/// Waits for `child` to exit, passing signals on meanwhile: after a run
/// that ended before it did (`--duration`).
pub async fn wait_exit(child: &super::Child) -> Result<(), crate::run::RunError> {
    use crate::run::RunError;
    let exit = crate::run::exit::ProcessExit::watch(child.pid())?;
    let handler = |signal, kind| self::signal(kind).map_err(|source| RunError::Signal { signal, source });
    let mut sigint = handler("SIGINT", SignalKind::interrupt())?;
    let mut sigterm = handler("SIGTERM", SignalKind::terminate())?;
    let mut others = Forward::new(true).map_err(|source| RunError::Signal { signal: "SIGHUP", source })?;
    loop {
        tokio::select! {
            () = exit.exited() => return Ok(()),
            _ = sigint.recv() => child.interrupt(),
            _ = sigterm.recv() => child.signal(libc::SIGTERM),
            signal = others.recv() => child.signal(signal),
        }
    }
}
