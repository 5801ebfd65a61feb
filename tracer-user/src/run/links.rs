//! Attaching a session's probes, through uprobe-multi links where the
//! kernel has them, else perf-event uprobes (`--links`).

use std::time::Instant;

use super::growth::{self, Growth};
use crate::{
    config::LinkMode,
    kernel::{AttachError, Session},
    model::{Level, Links, Note, NoteCode},
    plan::{
        gc::{GcPlan, GcSource},
        growth::GrowthPlan,
    },
};

/// Attaches the probes that stay attached, the GC's (`gc`) and growth's,
/// as `mode` says: through uprobe-multi links, falling back with `auto`
/// to perf-event uprobes where the kernel has none (as the rates' then
/// do). Returns growth's plan for the header.
pub(super) fn always_on(
    mode: LinkMode,
    session: &mut Session,
    scope: u32,
    (gc, growth): (&GcPlan, &mut Option<Result<Growth, String>>),
) -> Result<Option<GrowthPlan>, AttachError> {
    let attach = |session: &mut Session, growth: &mut Option<Result<Growth, String>>, multi| {
        if gc.source != GcSource::None {
            session.attach_gc(gc, scope, multi)?;
        }
        growth::attach(growth, session, multi)
    };
    match mode {
        LinkMode::Perf => attach(session, growth, false),
        LinkMode::Multi => attach(session, growth, true),
        LinkMode::Auto => match attach(session, growth, true) {
            Err(AttachError::Multi(e)) if e.is_unsupported() => {
                session.detach_gc();
                session.detach_growth();
                attach(session, growth, false)
            }
            other => other,
        },
    }
}

/// Attaches every probe as `mode` says; returns how, when the attach
/// began once the programs were loaded, and the note to give when `auto`
/// fell back.
pub(super) fn attach_links(
    session: &mut Session,
    scope: u32,
    mode: LinkMode,
) -> Result<(Links, Instant, Option<Note>), AttachError> {
    // With --live, the frames pushed while the probes went live may be of
    // calls whose returns came before their return probes: forgotten.
    let perf = |session: &mut Session, note| {
        session.prepare(false)?;
        let began = Instant::now();
        session.attach_perf(scope)?;
        session.forget_frames().map(|()| (Links::Perf, began, note))
    };
    let multi = |session: &mut Session| {
        session.prepare(true)?;
        let began = Instant::now();
        session.attach_multi(scope)?;
        session.forget_frames().map(|()| (Links::Multi, began, pid_filter_note(scope)))
    };
    match mode {
        LinkMode::Perf => perf(session, None),
        LinkMode::Multi => multi(session),
        LinkMode::Auto => match multi(session) {
            Ok(done) => Ok(done),
            // Thousands of perf-event uprobes would take minutes to detach.
            Err(AttachError::Multi(e)) if session.plan().has_many_sites() && e.is_unsupported() => {
                Err(AttachError::ManySitesNeedMulti { cause: e })
            }
            Err(e @ AttachError::Multi(_)) if session.plan().has_many_sites() => Err(e),
            // Only a kernel without multi links is a reason to fall back; a
            // failure of tracer's own is reported as it is.
            Err(AttachError::Multi(e)) if e.is_unsupported() => {
                let note = Note::new(
                    Level::Note,
                    NoteCode::LinkFallback,
                    format!(
                        "{e}; attaching one perf-event uprobe per probe instead, which the kernel detaches about 0.13 s apart"
                    ),
                );
                perf(session, Some(note))
            }
            Err(e) => Err(e),
        },
    }
}

/// Where the kernel's uprobe-multi links cannot keep one process
/// ([`crate::kernel::multi::pid_filter_keeps_process`]), they were made for
/// every process: what that costs whom.
fn pid_filter_note(scope: u32) -> Option<Note> {
    (scope != crate::kernel::ALL_PROCESSES && !crate::kernel::multi::pid_filter_keeps_process()).then(|| {
        Note::new(
            Level::Note,
            NoteCode::PidFilter,
            format!(
                "this kernel's uprobe-multi links filter by thread, not process (Linux 6.6 to 6.9 before \"bpf: fix multi-uprobe PID filtering logic\"): attached for every process that maps the probed files, and PID {scope}'s hits kept by the programs, so the counts are whole; other processes running those files pay the probes' hits while tracer is attached, and have their GC markers' semaphores raised (--links perf avoids that)"
            ),
        )
    })
}
