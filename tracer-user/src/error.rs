//! Which failures are the user's input (exit status 2) and which are
//! tracer's own (exit status 1).

use crate::{
    bench::BenchError,
    config::ConfigError,
    discover::{ResolveError, process::TargetError},
    kernel::AttachError,
    plan::PlanError,
    privileges::PrivilegeError,
    stacks::StackError,
};

/// Exit status for bad input: a wrong PID, a non-Python target, missing
/// privileges, a bad option value.
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit status for everything else that went wrong.
pub const EXIT_FAILURE: i32 = 1;

/// Picks the exit status for an error by looking for a bad-input cause
/// anywhere in its chain.
#[must_use]
pub fn exit_status(err: &anyhow::Error) -> i32 {
    let bad_input = err.chain().any(|cause| {
        cause.is::<ConfigError>()
            || cause.is::<PrivilegeError>()
            || cause.is::<ResolveError>()
            || cause.is::<TargetError>()
            || cause.is::<PlanError>()
            || cause.is::<crate::discover::libc::LibcError>()
            || cause
                .downcast_ref::<crate::plan::gc::GcPlanError>()
                .is_some_and(crate::plan::gc::GcPlanError::is_bad_input)
            || cause.downcast_ref::<AttachError>().is_some_and(AttachError::is_bad_input)
            || cause.downcast_ref::<BenchError>().is_some_and(BenchError::is_bad_input)
            || cause.downcast_ref::<StackError>().is_some_and(StackError::is_bad_input)
            || cause.downcast_ref::<crate::heap::HeapError>().is_some_and(crate::heap::HeapError::is_bad_input)
    });
    if bad_input { EXIT_BAD_INPUT } else { EXIT_FAILURE }
}
