//! Why tracer's BPF object could not be loaded or attached, and whose
//! fault that is.

use std::path::PathBuf;

use thiserror::Error;

use crate::error::Classify;

/// Failure to load or attach.
#[derive(Debug, Error)]
pub enum AttachError {
    #[error(
        "this tracer was built without its BPF object (TRACER_EMPTY_BPF was set when it was built); build it with `cargo xtask build`"
    )]
    NoObject,
    #[error("the kernel refused tracer's BPF object: {0}")]
    Load(Box<aya::EbpfError>),
    #[error("BPF program {name} is missing from tracer's BPF object (a build problem)")]
    ProgramMissing { name: &'static str },
    #[error("BPF program {name} failed to load: {}", load_trouble(cause))]
    ProgramLoad { name: &'static str, cause: Box<aya::programs::ProgramError> },
    #[error("cannot read the kernel's statistics of BPF program {name}: {cause}")]
    ProgramInfo { name: &'static str, cause: std::io::Error },
    #[error("BPF map {name} {}", map_trouble(cause))]
    Map { name: &'static str, cause: Box<aya::maps::MapError> },
    #[error(
        "cannot attach a uprobe to {symbol} in {path} for PID {pid}: {}{}",
        crate::error::chain(&**cause),
        refused_hint(&**cause)
    )]
    Attach { symbol: &'static str, path: PathBuf, pid: u32, cause: Box<aya::programs::ProgramError> },
    #[error("process {pid} exited while tracer was attaching; start it again and pass its new PID")]
    TargetExited { pid: u32 },
    #[error("cannot duplicate the fd of BPF map {name}: {cause}")]
    MapFd { name: String, cause: std::io::Error },
    #[error(transparent)]
    Multi(#[from] super::multi::MultiError),
    #[error(
        "{cause}; the uprobes of inlined copies and call sites need uprobe-multi links (Linux 6.6+), as perf-event uprobes would take minutes to detach: pass --no-inlined and --placement inside, or trace on a newer kernel"
    )]
    ManySitesNeedMulti { cause: super::multi::MultiError },
    #[error("cannot start reading the BPF log: {0}")]
    Log(String),
    #[error(transparent)]
    Gc(#[from] super::gc::GcAttachError),
    #[error("cannot attach the growth probe {name} at file offset {offset:#x} of {path} for {scope}: {cause}")]
    Growth { name: &'static str, offset: u64, path: PathBuf, scope: String, cause: std::io::Error },
    /// The test-only `TRACER_TEST_FULL_MAPS` named a map it cannot fill.
    #[error("TRACER_TEST_FULL_MAPS (a test-only knob): {0}")]
    FullMaps(String),
}

impl Classify for AttachError {
    /// Only a target that exited meanwhile is the user's; the rest is
    /// tracer's object or the kernel's.
    fn is_bad_input(&self) -> bool {
        match self {
            Self::TargetExited { .. } => true,
            Self::NoObject
            | Self::Load(_)
            | Self::ProgramMissing { .. }
            | Self::ProgramLoad { .. }
            | Self::ProgramInfo { .. }
            | Self::Map { .. }
            | Self::Attach { .. }
            | Self::MapFd { .. }
            | Self::Multi(_)
            | Self::ManySitesNeedMulti { .. }
            | Self::Log(_)
            | Self::Gc(_)
            | Self::Growth { .. }
            | Self::FullMaps(_) => false,
        }
    }
}

/// What to do where the kernel refused a uprobe's perf event to a user
/// other than root: name the capability (here `CAP_PERFMON` alone is
/// refused a uprobe event; `CAP_SYS_ADMIN` is not). Empty otherwise.
fn refused_hint(cause: &(dyn std::error::Error + 'static)) -> &'static str {
    let text = crate::error::chain(cause);
    let refused = text.contains("(os error 13)") || text.contains("(os error 1)");
    if refused && !crate::privileges::is_root() {
        "; as another user than root, a uprobe's perf event needs CAP_SYS_ADMIN here (docs/attach.md, Privileges): grant it, or run tracer with sudo"
    } else {
        ""
    }
}

impl AttachError {
    /// Whether this is a map that had no room for another entry.
    #[must_use]
    pub fn is_map_full(&self) -> bool {
        matches!(self, Self::Map { cause, .. } if matches!(&**cause, aya::maps::MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG)))
    }
}

/// What went wrong with a map, in words: a hash map that refuses a new
/// entry is full (the kernel says `E2BIG`); else aya's own words.
fn map_trouble(cause: &aya::maps::MapError) -> String {
    match cause {
        aya::maps::MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG) => {
            format!("is full: no room for another entry ({e})")
        }
        aya::maps::MapError::InvalidMapType { .. } | aya::maps::MapError::InvalidName { .. } => {
            format!("is missing or has the wrong type: {cause}")
        }
        _ => format!("failed: {cause}"),
    }
}

/// A program's load failure on one line: the syscall's error and the
/// verifier's reason, not its whole log (thousands of lines, which aya's
/// message holds).
fn load_trouble(cause: &aya::programs::ProgramError) -> String {
    match cause {
        aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            match super::multi::verifier_reason(&log) {
                Some(reason) => format!("{io_error} (the verifier: {reason})"),
                None => io_error.to_string(),
            }
        }
        other => crate::error::chain(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{EXIT_BAD_INPUT, EXIT_FAILURE, Failure};

    #[test]
    fn only_an_exited_target_is_bad_input() {
        assert_eq!(Failure::from(AttachError::TargetExited { pid: 7 }).exit_status(), EXIT_BAD_INPUT);
        assert_eq!(Failure::from(AttachError::Log("x".into())).exit_status(), EXIT_FAILURE);
    }
}
