//! What the run does once its probes are detached: waits for what the
//! summary still needs (a calibration, a heap census), and writes the
//! stacks' files.

use tokio::time::sleep_until;

use super::{
    census,
    cost::{self, CostMeter},
    profile::Profile,
};
use crate::{
    config::AttachConfig,
    discover::TargetSpec,
    launch::{Child, signals::Signals},
    model::{Level, Note, NoteCode, Snapshot},
    report::{self, files::OutputError},
};

/// Waits for a calibration still running and a heap census still running
/// (or a first one), each within its limit; a second `SIGINT` or
/// `SIGTERM` stops waiting at once, or with `child` (`tracer run`'s) is
/// passed on to it, as every signal is.
pub async fn wait_detached(
    cost: &mut CostMeter,
    mut profile: Option<&mut Profile>,
    signals: &mut Signals,
    child: Option<&Child>,
) {
    // Detached, so waiting costs the target nothing: a run shorter than
    // the calibration still ends with its cost, and one that ended while
    // a census was running (or before any) with its heap.
    let calibrated_by = tokio::time::Instant::now() + cost::CALIBRATION_WAIT;
    let census_by = tokio::time::Instant::now() + census::SUMMARY_WAIT;
    let mut census_wait = profile.is_some();
    loop {
        census_wait = census_wait && profile.as_deref_mut().is_some_and(Profile::census_pending);
        if !cost.calibrating() && !census_wait {
            break;
        }
        tokio::select! {
            biased;
            signal = signals.recv() => {
                if let Some(c) = child {
                    c.pass_on(signal);
                } else {
                    // Asked again to stop: at once, without a cost or the
                    // heap being read.
                    cost.give_up(None);
                    census_wait = false;
                }
            }
            () = sleep_until(calibrated_by), if cost.calibrating() => {
                cost.give_up(Some(format!("calibrating took over {} s", cost::CALIBRATION_WAIT.as_secs())));
            }
            () = sleep_until(census_by), if census_wait => census_wait = false,
            () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
        }
    }
}

/// Writes `--folded` and `--flamegraph` from the summary's stacks, and
/// says where.
pub fn write_stacks(
    stacks: &crate::config::StacksConfig,
    last: &Snapshot,
    config: &AttachConfig,
) -> Result<Vec<Note>, OutputError> {
    let all = last.stacks.as_deref().unwrap_or_default();
    let lines = report::stacks::folded(all, stacks.weight);
    let mut notes = Vec::new();
    let what = match &config.target {
        TargetSpec::Pid(pid) => format!("PID {pid}"),
        TargetSpec::Exe(exe) => exe.display().to_string(),
    };
    let sampled = if stacks.sample > 1 { format!(", 1 in {} sampled, scaled", stacks.sample) } else { String::new() };
    if let Some(file) = &stacks.folded {
        report::stacks::write_folded(file, &lines)?;
        notes.push(Note::new(
            Level::Note,
            NoteCode::Written,
            format!("wrote {} folded stacks by {} to {}", lines.len(), stacks.weight, file.path.display()),
        ));
    }
    if let Some(file) = &stacks.flamegraph {
        let title = format!("tracer: allocations of {what} by {}{sampled}", stacks.weight);
        report::stacks::write_flamegraph(file, &lines, &title, stacks.weight)?;
        notes.push(Note::new(
            Level::Note,
            NoteCode::Written,
            format!("wrote the flame graph of {} stacks to {}", lines.len(), file.path.display()),
        ));
    }
    Ok(notes)
}

/// Writes `--pprof` from the summary's stacks, and says where and what.
pub fn write_pprof(file: &report::files::OutputFile, last: &Snapshot) -> Result<Note, OutputError> {
    let profile = report::pprof::profile(last);
    let samples = report::pprof::write(file, &profile)?;
    let what = match (last.stacks.is_some(), last.growth.as_ref().and_then(crate::model::Growth::sampled)) {
        (true, Some(_)) => "the stacks' events (alloc_*) and growth's stacks (inuse_*, sampled estimates)",
        (true, None) => "the stacks' events (alloc_*)",
        (false, _) => "growth's stacks (inuse_*, sampled estimates)",
    };
    if samples == 0 {
        let why = match &last.growth {
            Some(crate::model::Growth::Unavailable { unavailable }) => format!("growth is unavailable: {unavailable}"),
            Some(crate::model::Growth::Sampled(g)) if g.stopped.is_some() => {
                format!("growth stopped before it held a sample ({})", g.stopped.as_ref().map_or("", |s| &s.reason))
            }
            _ => "no stack was recorded in the run".to_owned(),
        };
        return Ok(Note::new(
            Level::Warning,
            NoteCode::Written,
            format!("wrote a pprof profile with no sample to {}: {why}", file.path.display()),
        ));
    }
    Ok(Note::new(
        Level::Note,
        NoteCode::Written,
        format!("wrote a pprof profile of {samples} samples, {what}, to {}", file.path.display()),
    ))
}
