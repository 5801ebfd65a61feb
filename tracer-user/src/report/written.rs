//! The files written from a run's summary: folded stacks and flame graphs
//! of the events (`--folded`, `--flamegraph`) and of growth
//! (`--growth-folded`, `--growth-flamegraph`), and pprof (`--pprof`); at
//! the end of `attach` and `run`, or later by `tracer report` from a
//! record. Each says where it wrote what, as a note.

use super::files::{OutputError, OutputFile};
use crate::{
    config::Weight,
    model::{Growth, Level, Note, NoteCode, Snapshot, StackCount},
};

/// The two files a set of stacks can go to.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackFiles<'a> {
    pub folded: Option<&'a OutputFile>,
    pub flamegraph: Option<&'a OutputFile>,
}

/// Writes the summary's event stacks, weighed by `weight`, of `what` (the
/// target, as the title says it), one event in `sample` recorded.
pub fn stacks(
    files: StackFiles<'_>,
    (weight, sample): (Weight, u64),
    what: &str,
    last: &Snapshot,
) -> Result<Vec<Note>, OutputError> {
    let all = last.stacks.as_deref().unwrap_or_default();
    let lines = super::stacks::folded(all, weight);
    let mut notes = Vec::new();
    let sampled = if sample > 1 { format!(", 1 in {sample} sampled, scaled") } else { String::new() };
    if let Some(file) = files.folded {
        super::stacks::write_folded(file, &lines)?;
        notes.push(written(format!("wrote {} folded stacks by {weight} to {}", lines.len(), file.path.display())));
    }
    if let Some(file) = files.flamegraph {
        let title = format!("tracer: allocations of {what} by {weight}{sampled}");
        super::stacks::write_flamegraph(file, &lines, &title, weight)?;
        notes.push(written(format!("wrote the flame graph of {} stacks to {}", lines.len(), file.path.display())));
    }
    Ok(notes)
}

/// Writes the summary's growth stacks (the pools each holds, in bytes).
pub fn growth(files: StackFiles<'_>, what: &str, last: &Snapshot) -> Result<Vec<Note>, OutputError> {
    let sampled = last.growth.as_ref().and_then(Growth::sampled);
    let stacks: Vec<StackCount> = sampled
        .and_then(|g| g.stacks.as_ref())
        .into_iter()
        .flatten()
        .map(|s| StackCount {
            probe: "[heap grown]".to_owned(),
            frames: s.frames.clone(),
            truncated: s.truncated,
            calls: s.samples,
            bytes: s.in_use_bytes,
            ..StackCount::default()
        })
        .collect();
    let lines = super::stacks::folded(&stacks, Weight::Bytes);
    let mut notes = Vec::new();
    if let Some(file) = files.folded {
        super::stacks::write_folded(file, &lines)?;
        notes.push(written(format!(
            "wrote {} folded growth stacks by bytes (sampled estimates) to {}",
            lines.len(),
            file.path.display()
        )));
    }
    if let Some(file) = files.flamegraph {
        let every = sampled.map_or(0, |g| g.sample_every);
        let title =
            format!("tracer: heap growth of {what} by Python stack, pools in use by taker (1 take in {every} sampled)");
        super::stacks::write_flamegraph(file, &lines, &title, Weight::Bytes)?;
        notes.push(written(format!(
            "wrote the flame graph of {} growth stacks to {}",
            lines.len(),
            file.path.display()
        )));
    }
    Ok(notes)
}

/// Writes `--pprof` from the summary's stacks, and says where and what.
pub fn pprof(file: &OutputFile, last: &Snapshot, started_unix_s: Option<f64>) -> Result<Note, OutputError> {
    let profile = super::pprof::profile(last, started_unix_s);
    let samples = super::pprof::write(file, &profile)?;
    let what = match (last.stacks.is_some(), last.growth.as_ref().and_then(Growth::sampled)) {
        (true, Some(_)) => "the stacks' events (alloc_*) and growth's stacks (inuse_*, sampled estimates)",
        (true, None) => "the stacks' events (alloc_*)",
        (false, _) => "growth's stacks (inuse_*, sampled estimates)",
    };
    if samples == 0 {
        let why = match &last.growth {
            Some(Growth::Unavailable { unavailable }) => format!("growth is unavailable: {unavailable}"),
            Some(Growth::Sampled(g)) if g.stopped.is_some() => {
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
    Ok(written(format!("wrote a pprof profile of {samples} samples, {what}, to {}", file.path.display())))
}

fn written(message: String) -> Note {
    Note::new(Level::Note, NoteCode::Written, message)
}
