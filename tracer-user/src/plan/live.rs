//! With `--live`, the plan's part: what each probe does in the live table,
//! where a free's probe goes so that `live_free`, sharing its breakpoint,
//! still reads the block, and the allocator implementations probed, with
//! their returns.

use super::{
    ImageRef, Inlining, LiveImpl, MAX_FUNCTION, PlannedProbe,
    placement::{self, Placement},
    returns::{self, ReturnCosts, ReturnPlan},
};
use crate::probe::{ProbeSpec, Program};

/// What gives the allocator implementations where none was found.
pub(super) fn live_fix(inlining: Option<&Inlining>) -> String {
    match inlining {
        Some(Inlining::Guards { fix, .. }) => format!("the interpreter's debug info ({fix})"),
        Some(Inlining::Skipped) => "drop --no-inlined, which also skips the debug file".to_owned(),
        _ => "the interpreter's debug info, or pass its debug file's directory with --debug-dir".to_owned(),
    }
}

/// With `--live`, the allocator implementations to probe, in slots after
/// `probes`'. Every one gets its return probed, frees too: its frame must
/// end for a later call on the thread to be paired right.
pub(super) fn live_impls(
    image: ImageRef<'_>,
    probes: &[PlannedProbe],
    costs: Option<&ReturnCosts>,
    kernel: placement::KernelVersion,
) -> Vec<LiveImpl> {
    let first = u32::try_from(probes.len()).unwrap_or(u32::MAX);
    (first..)
        .zip(image.implementations)
        .map(|(slot, i)| {
            let len = usize::try_from(i.size.min(MAX_FUNCTION)).unwrap_or(0);
            let code = image.elf.read_at(i.file_offset, len);
            let placement = match &code {
                Ok(code) => placement::place(code, i.address, Program::LiveImpl, kernel),
                Err(e) => Placement::at_entry(format!("entry: the code could not be read ({e})")),
            };
            let returns = match (costs, code) {
                // A uretprobe goes where live_impl traps, so its
                // breakpoint is free: as at offset 0 for a counting probe.
                (Some(costs), Ok(code)) if i.size <= MAX_FUNCTION => {
                    returns::plan(&code, i.address, 0, costs, (kernel, true))
                }
                (None, _) => ReturnPlan::Uretprobe { reason: "no return costs measured".to_owned() },
                (_, Ok(_)) => ReturnPlan::Uretprobe { reason: format!("the function is over {MAX_FUNCTION} bytes") },
                (_, Err(e)) => ReturnPlan::Uretprobe { reason: format!("the code could not be read ({e})") },
            };
            LiveImpl {
                name: i.name,
                slot,
                file_offset: i.file_offset,
                role: i.role.implementation(),
                returns,
                placement,
            }
        })
        .collect()
}

/// Where `program` goes in the function whose code is `code`; with a live
/// role (`--live`), `live_alloc` (`live_free`) shares that breakpoint and
/// reads the call's arguments, so a place where they are gone is the
/// entry's for both. An allocation's counting program reads the same
/// arguments (the role follows from it); a free's reads none, and
/// `live_free` reads the block.
pub(super) fn place_with_live(
    code: &[u8],
    address: u64,
    (program, live): (Program, Option<tracer_common::live::Role>),
    kernel: placement::KernelVersion,
) -> Placement {
    let place = placement::place(code, address, program, kernel);
    if live.is_none_or(|role| role.api() != tracer_common::live::Role::FREE) {
        return place;
    }
    let theirs = placement::place(code, address, Program::LiveFree, kernel);
    if theirs.offset < place.offset { theirs } else { place }
}

/// With `--live`, what probe `spec` does in the live table
/// (`tracer_common::live::Role`), if anything.
pub(super) fn live_role(spec: &ProbeSpec) -> Option<tracer_common::live::Role> {
    use tracer_common::live::Role;
    let family = crate::python::family(spec.symbol)?;
    match spec.program {
        Program::SizeArg0 => Some(Role::MALLOC),
        Program::Calloc => Some(Role::CALLOC),
        Program::SizeArg1 => Some(Role::REALLOC),
        // `family` took only the four names: `PyMem_RawFree` ends in `Free`,
        // not `_Free`.
        Program::CountCall if spec.symbol.ends_with("Free") => Some(Role::free_of(family as u32)),
        _ => None,
    }
}
