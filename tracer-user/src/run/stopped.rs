//! A `--pid` target that is stopped (a SIGSTOP, a job-control stop, or a
//! debugger's ptrace stop) runs no code: its calls, rates and growth are
//! zero because it runs nothing, not because it has none. Its state is
//! read from `/proc/PID/stat` at the attach and every interval, and a note
//! says why the figures are zero and how to resume it, for as long as it
//! stays so; the summary says for how long it was.

use std::time::{Duration, Instant};

use crate::model::{Level, Note, NoteCode};

/// How a process is stopped, as `/proc/PID/stat`'s state says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `T`: a stop signal (SIGSTOP, or SIGTSTP, SIGTTIN, SIGTTOU).
    Signal,
    /// `t`: stopped by a tracer (a debugger's ptrace).
    Traced,
}

impl Stop {
    /// The state field of a `/proc/PID/stat` line: the first field after
    /// the command name, whose closing parenthesis is the line's last (the
    /// name, the target's to choose, may hold any).
    #[must_use]
    pub fn of_stat(stat: &str) -> Option<Self> {
        let rest = &stat[stat.rfind(')')? + 1..];
        match rest.trim_start().chars().next()? {
            'T' => Some(Self::Signal),
            't' => Some(Self::Traced),
            _ => None,
        }
    }

    fn state(self) -> char {
        match self {
            Self::Signal => 'T',
            Self::Traced => 't',
        }
    }

    fn why(self) -> &'static str {
        match self {
            Self::Signal => "by a stop signal (SIGSTOP, or a job-control stop)",
            Self::Traced => "by a debugger or tracer holding it with ptrace",
        }
    }

    fn resume(self, pid: u32) -> String {
        match self {
            Self::Signal => format!("`kill -CONT {pid}` resumes it"),
            Self::Traced => {
                "continue or detach it in the debugger holding it (gdb's `continue` or `detach`)".to_owned()
            }
        }
    }
}

/// A process gone (a zombie, or no longer there): its exit says more.
struct Gone;

/// Reads `pid`'s state: how it is stopped, `None` where it runs.
fn stopped(pid: u32) -> Result<Option<Stop>, Gone> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|_| Gone)?;
    let state = stat.rfind(')').and_then(|at| stat[at + 1..].trim_start().chars().next()).ok_or(Gone)?;
    if matches!(state, 'Z' | 'X' | 'x') {
        return Err(Gone);
    }
    Ok(Stop::of_stat(&stat))
}

/// Watches one `--pid` target for being stopped.
pub struct StopWatch {
    pid: u32,
    /// Since when it has been seen stopped, and how.
    since: Option<(Instant, Stop)>,
    /// The time it was seen stopped, before `since`.
    total: Duration,
}

impl StopWatch {
    #[must_use]
    pub fn new(pid: u32) -> Self {
        Self { pid, since: None, total: Duration::ZERO }
    }

    /// A note where the target is stopped now (each interval it stays so,
    /// so that no interval's zeros go without their reason), or where it
    /// was and runs again.
    pub fn check(&mut self) -> Option<Note> {
        // A target gone while stopped did not run again: its exit is said
        // as any exit is.
        self.check_state(stopped(self.pid).ok()?, Instant::now())
    }

    fn check_state(&mut self, now_stopped: Option<Stop>, now: Instant) -> Option<Note> {
        let pid = self.pid;
        match (self.since, now_stopped) {
            (None, None) => None,
            (None, Some(stop)) => {
                self.since = Some((now, stop));
                Some(Note::new(
                    Level::Warning,
                    NoteCode::Stopped,
                    format!(
                        "PID {pid} is stopped (state {} in /proc/{pid}/stat: stopped {}): it runs no code, so its calls, rates and growth are zero because it runs nothing, not because it has none; {}",
                        stop.state(),
                        stop.why(),
                        stop.resume(pid)
                    ),
                ))
            }
            (Some((since, _)), Some(stop)) => {
                self.since = Some((since, stop));
                Some(Note::new(
                    Level::Warning,
                    NoteCode::Stopped,
                    format!(
                        "PID {pid} is still stopped (state {}), for {:.1} s: this interval's zeros are of a process that runs nothing; {}",
                        stop.state(),
                        now.saturating_duration_since(since).as_secs_f64(),
                        stop.resume(pid)
                    ),
                ))
            }
            (Some((since, _)), None) => {
                let span = now.saturating_duration_since(since);
                self.total += span;
                self.since = None;
                Some(Note::new(
                    Level::Note,
                    NoteCode::Stopped,
                    format!(
                        "PID {pid} runs again, after {:.1} s stopped: its figures from here on are of it running",
                        span.as_secs_f64()
                    ),
                ))
            }
        }
    }

    /// At the end of a run that lasted `run`: a note where the target was
    /// stopped for some of it: the summary's counts cover only the time it
    /// ran, and its rates, averaged over the whole run, are lowered by the
    /// stopped share.
    #[must_use]
    pub fn summary(&self, run: Duration) -> Option<Note> {
        self.summary_at(run, Instant::now())
    }

    fn summary_at(&self, run: Duration, now: Instant) -> Option<Note> {
        let current = self.since.map(|(since, stop)| (now.saturating_duration_since(since), stop));
        let total = self.total + current.map_or(Duration::ZERO, |(d, _)| d);
        if total.is_zero() && current.is_none() {
            return None;
        }
        let pid = self.pid;
        let (still, resume) = match current {
            Some((_, stop)) => (format!(" (and is still, state {})", stop.state()), format!("; {}", stop.resume(pid))),
            None => (String::new(), String::new()),
        };
        Some(Note::new(
            Level::Warning,
            NoteCode::Stopped,
            format!(
                "PID {pid} was stopped for {:.1} s of the run's {:.1} s{still}: a stopped process runs nothing, so the summary's counts and growth are of the time it ran, and its rates are averaged over the whole run, the stopped time included (lowered by that share){resume}",
                total.as_secs_f64(),
                run.as_secs_f64()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_last_parenthesis() {
        assert_eq!(Stop::of_stat("12 (python3) T 1 12 12 0"), Some(Stop::Signal));
        assert_eq!(Stop::of_stat("12 (gdb) t 1"), Some(Stop::Traced));
        assert_eq!(Stop::of_stat("12 (a) T (b) S 1 12"), None);
        assert_eq!(Stop::of_stat("12 (a) R 1"), None);
        assert_eq!(Stop::of_stat("no parenthesis"), None);
    }

    #[test]
    fn a_stop_is_told_each_interval_then_its_end_and_the_summary_sums_it() {
        let t0 = Instant::now();
        let mut w = StopWatch::new(7);
        assert!(w.check_state(None, t0).is_none());
        let first = w.check_state(Some(Stop::Signal), t0).unwrap();
        assert_eq!((first.level, first.code), (Level::Warning, NoteCode::Stopped));
        assert!(first.message.starts_with("PID 7 is stopped (state T in /proc/7/stat"), "{}", first.message);
        assert!(first.message.ends_with("`kill -CONT 7` resumes it"), "{}", first.message);
        let again = w.check_state(Some(Stop::Signal), t0 + Duration::from_secs(1)).unwrap();
        assert!(again.message.contains("still stopped (state T), for 1.0 s"), "{}", again.message);
        let resumed = w.check_state(None, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(resumed.level, Level::Note);
        assert!(resumed.message.contains("after 2.0 s stopped"), "{}", resumed.message);
        let summary = w.summary_at(Duration::from_secs(5), t0 + Duration::from_secs(3)).unwrap();
        assert!(summary.message.starts_with("PID 7 was stopped for 2.0 s of the run's 5.0 s:"), "{}", summary.message);
        assert!(
            summary.message.ends_with(
                "its rates are averaged over the whole run, the stopped time included (lowered by that share)"
            ),
            "{}",
            summary.message
        );
        w.check_state(Some(Stop::Traced), t0 + Duration::from_secs(3));
        let still = w.summary_at(Duration::from_secs(5), t0 + Duration::from_secs(4)).unwrap();
        assert!(
            still.message.starts_with("PID 7 was stopped for 3.0 s of the run's 5.0 s (and is still, state t):"),
            "{}",
            still.message
        );
        assert!(still.message.ends_with("(gdb's `continue` or `detach`)"), "{}", still.message);
        assert!(StopWatch::new(7).summary_at(Duration::from_secs(5), t0).is_none());
    }
}
