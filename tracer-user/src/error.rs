//! Which failures are the user's input (exit status 2) and which are
//! tracer's own (exit status 1), decided by each error type: a command
//! fails with a [`Failure`], which only an error that implements
//! [`Classify`] becomes, so a new error type cannot reach `main` without
//! its decision, and an error enum's `match` over its variants makes a new
//! variant decide too.

use std::error::Error;

/// Exit status for bad input: a wrong PID, a non-Python target, missing
/// privileges, a bad option value.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for everything else that went wrong.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status when the output's reader went away (`tracer ... | head`):
/// 128 + SIGPIPE, what a shell reports for a program that SIGPIPE killed,
/// as `yes | head` does, so that a script (`set -o pipefail`) can tell a
/// report cut short from a whole one (0) and from a failure (1, 2).
pub const EXIT_OUTPUT_CLOSED: u8 = 141;

/// Whether a failure is the user's to fix.
pub trait Classify {
    /// The user's input is at fault (a wrong PID, a target that is not a
    /// supported CPython, missing privileges, flags that cannot work
    /// together), rather than tracer or the system: exit status 2.
    fn is_bad_input(&self) -> bool;

    /// The reader of tracer's output went away (`tracer ... | head`): the
    /// output was cut short, [`EXIT_OUTPUT_CLOSED`]. Only the errors of
    /// writing the output say so (a run's loop ends on it instead:
    /// `End::OutputClosed`).
    fn is_broken_pipe(&self) -> bool {
        false
    }
}

/// How a command failed: the error, with its exit status decided when it
/// was made.
#[derive(Debug)]
pub struct Failure {
    bad_input: bool,
    broken_pipe: bool,
    error: Box<dyn Error + Send + Sync + 'static>,
}

impl<E: Classify + Error + Send + Sync + 'static> From<E> for Failure {
    fn from(error: E) -> Self {
        Self { bad_input: error.is_bad_input(), broken_pipe: error.is_broken_pipe(), error: Box::new(error) }
    }
}

impl Failure {
    /// [`EXIT_OUTPUT_CLOSED`], [`EXIT_BAD_INPUT`] or [`EXIT_FAILURE`].
    #[must_use]
    pub const fn exit_status(&self) -> u8 {
        if self.broken_pipe {
            EXIT_OUTPUT_CLOSED
        } else if self.bad_input {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILURE
        }
    }

    /// The error, then each cause.
    pub fn chain(&self) -> impl Iterator<Item = &(dyn Error + 'static)> {
        std::iter::successors(Some(&*self.error as &(dyn Error + 'static)), |&e| e.source())
    }

    /// See [`Classify::is_broken_pipe`].
    #[must_use]
    pub const fn is_broken_pipe(&self) -> bool {
        self.broken_pipe
    }
}

impl std::fmt::Display for Failure {
    /// One line: the error and its causes joined with ": ".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.chain().enumerate() {
            if i > 0 {
                f.write_str(": ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// `e` and its causes on one line, joined with ": " (for an error held in
/// a field that is not its source).
#[must_use]
pub fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Reading and writing files and pipes: the system's, not the input's
/// (the errors that are the input's say so in their own types).
impl Classify for std::io::Error {
    fn is_bad_input(&self) -> bool {
        false
    }

    fn is_broken_pipe(&self) -> bool {
        self.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Printing JSON: tracer's own.
impl Classify for serde_json::Error {
    fn is_bad_input(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Example {
        #[error("the input")]
        Input,
        #[error("tracer's own")]
        Own(#[source] std::io::Error),
    }

    impl Classify for Example {
        fn is_bad_input(&self) -> bool {
            match self {
                Self::Input => true,
                Self::Own(_) => false,
            }
        }
    }

    #[test]
    fn status_and_one_line() {
        assert_eq!(Failure::from(Example::Input).exit_status(), EXIT_BAD_INPUT);
        let own = Failure::from(Example::Own(std::io::Error::other("gone")));
        assert_eq!(own.exit_status(), EXIT_FAILURE);
        assert_eq!(own.to_string(), "tracer's own: gone");
        assert!(!own.is_broken_pipe());
        let pipe = Failure::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(pipe.is_broken_pipe());
        assert_eq!(pipe.exit_status(), EXIT_OUTPUT_CLOSED);
    }
}
