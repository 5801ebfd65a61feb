//! The frees at their implementations (see [`crate::plan::slots`]). With
//! `--pid`, tracer reads what the allocator's free pointers hold in the
//! target; `tracer bench` times processes pyperf starts later, each a
//! fresh process of the interpreter with its default allocators, so it
//! reads them in one such process, started for that and ended at once.

use std::process::{Command, Stdio};

use super::{
    BenchError,
    child::{KillOnDrop, wait_blocked_on_stdin},
    step,
};
use crate::{
    discover::{Inlining, Resolved},
    model::{Level, Note, NoteCode},
    plan::{
        PlacementMode, Plan,
        slots::{self, Slots},
    },
};

/// What a fresh process of the interpreter holds in its free pointers.
pub struct HeldFrees {
    slots: Slots,
    held: Vec<(&'static str, Result<u64, String>)>,
}

impl HeldFrees {
    /// Reads them in a process `interpreter` starts (a command running the
    /// interpreter of `target`, chrooted where it runs so); `None` where
    /// the image has no free that jumps through a pointer.
    pub fn read(mut interpreter: Command, target: &Resolved) -> Result<Option<Self>, BenchError> {
        let slots = slots::find(&target.elf, crate::plan::placement::running_kernel());
        if slots.frees.is_empty() {
            return Ok(None);
        }
        let child = KillOnDrop(
            interpreter
                .args(["-c", "import sys; sys.stdin.read()"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| step("starting the interpreter to read its free pointers", e))?,
        );
        // Initialised, and waiting: the pointers hold what pyperf's
        // workers will start with.
        wait_blocked_on_stdin(child.0.id(), "the interpreter started to read its free pointers")?;
        let held = crate::prepare::slots::held(child.0.id(), &target.elf, &target.display_path, &slots.frees);
        drop(child);
        Ok(Some(Self { slots, held }))
    }

    /// Moves `plan`'s frees to the implementations their pointers hold,
    /// as `--pid` does (not with `--placement entry`); returns a note
    /// naming what moved, if anything did.
    pub fn apply(&self, plan: &mut Plan, placement: PlacementMode, target: &Resolved) -> Option<Note> {
        if placement == PlacementMode::Entry {
            return None;
        }
        let copies = |name: &str| match &target.inlining {
            Inlining::Known { entries, .. } => Some(entries.get(name).map_or(0, Vec::len)),
            Inlining::Skipped | Inlining::Guards { .. } => None,
        };
        let moved = slots::apply(plan, &self.slots, &self.held, copies);
        plan.moved_frees.clone_from(&moved);
        if moved.is_empty() {
            return stayed(plan);
        }
        let names: Vec<String> = moved.iter().map(|m| format!("{} at {}", m.free.symbol, m.implementation)).collect();
        Some(Note::new(
            Level::Note,
            NoteCode::FreePointer,
            format!(
                "{}: the implementations their pointers hold in a fresh process of this interpreter, as in every process pyperf starts (their own entries are single-stepped)",
                names.join(", ")
            ),
        ))
    }
}

/// Where no free moved: a note naming each free of `plan` left at its
/// single-stepped entry, and why (its placement's reason, which
/// [`slots::apply`] completed), if there is any.
fn stayed(plan: &Plan) -> Option<Note> {
    let stepped: Vec<String> = plan
        .probes
        .iter()
        .filter(|p| slots::FREES.contains(&p.symbol) && !p.placement.emulated)
        .map(|p| format!("{}: {}", p.symbol, p.placement.reason))
        .collect();
    (!stepped.is_empty()).then(|| {
        Note::new(
            Level::Note,
            NoteCode::FreePointer,
            format!("the frees stay at their single-stepped entries ({})", stepped.join("; ")),
        )
    })
}
